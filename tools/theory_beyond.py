"""
How far theory.py's zero-gradient statement reaches beyond its abstraction, on
synthetic.py's random walks and, as the control, i.i.d. tokens of the same length and
vocabulary; every figure over --seeds seeds (model, data and masks change with the seed),
as mean, std and min..max. The statement's own check is theory.py; part 1 is repeated here
on the task's real rows and labels, beside:

  part 2  the full 1-layer model (residual, MLP, LayerNorms before the pooling) at
          W_Q = W_K = 0: the supervised projection is small but not zero; the ratio
          reconstruction / supervised.
  part 3  the full model at its real initialisation, init="torch" (PyTorch's layer
          defaults), "gpt2" (N(0, 0.02)) and "amos" (W_Q = W_K = W_V = W_O, Amos et al.'s
          code): one gradient step on W_Q, W_K (weights and biases); the first-order change
          of the scores dS = (dQ K^T + Q dK^T) / sqrt(d_head), row-centred (a constant added
          to a row moves no attention), projected on P; next to a random step's.
  part 4  the abstraction at each init's own scores S instead of S = 0: where attention
          is not uniform, dL/dS_ij = A_ij (c_ij - sum_k A_ik c_ik), c_ij = <dL/do_i, v_j>,
          and the rows of A differ, so the supervised projection on P is no longer zero:
          how large against reconstruction's, and in which direction, seed by seed.

Two limits this measures: "not zero" is not "towards neighbours" (any per-position loss
projects on P, even on i.i.d. tokens: only the excess over that control, and a sign that
holds seed after seed, say "proximity"); and the statement is about the scores S, not the
parameters: at W_Q = W_K = 0 both losses are at a saddle, and at a real init a step on
W_Q, W_K moves S in a way that need not be row-constant, even for supervision.
cos = <G, P> / (|G| |P|); a row-centred random T x T matrix has E|cos| = sqrt(2 / (pi T (T-1)))
(0.0080 at T = 100), the chance level. Exit status 1 if part 1 fails.

    python tools/theory_beyond.py [--seeds=8] [--n_batches=2] [--batch_size=32] [--width=2] [--init=torch]
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configurator import configure, run_cli  # noqa: E402  (the repository root, added just above)
from synthetic import load_split  # noqa: E402
from theory import (MASK_RATIO, NONZERO_TOL, WIDTHS, ZERO_TOL, abstraction, build_model,  # noqa: E402
                    centred_proximity, cosine, qk_gradients, rows_identical, score_gradients)

INITS = ("torch", "gpt2", "amos")


def chance_abs_cos(T):
    """E|cos(G, P)| for a row-centred Gaussian T x T matrix G: cos ~ N(0, 1/(T(T-1)))."""
    return math.sqrt(2 / (math.pi * T * (T - 1)))


def iid_tokens(data, seed):
    """The control: i.i.d. uniform tokens, same shape and values as the walks, no local structure."""
    g = torch.Generator().manual_seed(10_000 + seed)
    return torch.randint(0, data.n_values, data.tokens.shape, generator=g)


# -----------------------------------------------------------------------------
# Part 2: the whole layer; part 3: what a gradient step on W_Q, W_K does to the scores

def full_layer(model, idx, S):
    """The whole 1-layer model run from the scores S (residual, MLP, norms), as model.forward."""
    block = model.blocks[0]
    x = model.embed(idx) + abstraction(model, idx, S)
    return model.ln_f(x + block.mlp(block.ln_2(x)))


def score_change(model, tokens, step):
    """First-order change of the scores S = Q K^T / sqrt(d_head), Q = h W_Q^T + b_Q,
    K = h W_K^T + b_K, h = ln_1(x), for the step (dW_Q, db_Q, dW_K, db_K):
        dS = (dQ K^T + Q dK^T) / sqrt(d_head)   (exact: S is bilinear in Q, K),
    row-centred, since a constant added to a row of S changes no attention."""
    attn, (dWq, dbq, dWk, dbk) = model.blocks[0].attn, step
    with torch.no_grad():
        h = model.blocks[0].ln_1(model.embed(tokens))
        Q, K = attn.split_heads(attn.W_Q(h)), attn.split_heads(attn.W_K(h))
        dQ, dK = attn.split_heads(h @ dWq.T + dbq), attn.split_heads(h @ dWk.T + dbk)
        dS = (dQ @ K.transpose(-2, -1) + Q @ dK.transpose(-2, -1)) / math.sqrt(attn.head_dim)
    return dS - dS.mean(-1, keepdim=True)


# -----------------------------------------------------------------------------
# One seed, one data source: every figure of the table

def measure(tokens, data, seed, n_batches, batch_size, width, init):
    """A dict name -> number for one seed on one data source (walks or i.i.d. tokens).
    Parts 1 and 2 use a model made with `init`, then W_Q = W_K = 0; parts 3 and 4 every init."""
    T = data.max_len
    P = centred_proximity(T, width)
    uniform = build_model(data.vocab_size, T, seed, init, uniform=True)
    real = {name: build_model(data.vocab_size, T, seed, name, uniform=False) for name in INITS}
    g = torch.Generator().manual_seed(seed)                  # the masks, and apart from them the
    g_step = torch.Generator().manual_seed(20_000 + seed)    # random steps (one init more moves no mask)
    out = {}
    add = lambda k, v: out.setdefault(k, []).append(float(v))
    for b in range(n_batches):
        x = tokens[b * batch_size:(b + 1) * batch_size]
        y = data.labels[b * batch_size:(b + 1) * batch_size]
        masked = torch.rand(x.shape, generator=g) < MASK_RATIO

        s1, r1 = score_gradients(uniform, x, y, masked, data.mask_id)                   # part 1
        add("p1_sup_max", max(cosine(s1, centred_proximity(T, w)).abs().max() for w in WIDTHS))
        add("p1_rec_min", min(cosine(r1, centred_proximity(T, w)).abs().mean() for w in WIDTHS))
        add("p1_rows", rows_identical(s1))                       # dL/dS = (1/T) 1 r^T
        add("p1_rec", cosine(r1, P).abs().mean())
        add("p1_rec_avg", cosine(r1.mean((0, 1)), P).abs())
        add("p1_rec_descent", -cosine(r1.mean((0, 1)), P))          # > 0: descent adds proximity
        gs, gr = qk_gradients(uniform, x, y, masked, data.mask_id)
        add("saddle", max(t.abs().max() for t in (*gs, *gr)))

        s2, r2 = score_gradients(uniform, x, y, masked, data.mask_id, full_layer)       # part 2
        add("p2_sup", cosine(s2, P).abs().mean())
        add("p2_rec", cosine(r2, P).abs().mean())

        for name, model in real.items():                                             # part 3
            gs, gr = qk_gradients(model, x, y, masked, data.mask_id)
            attn = model.blocks[0].attn
            rand = [torch.randn(p.shape, generator=g_step, dtype=p.dtype)
                    for p in (attn.W_Q.weight, attn.W_Q.bias, attn.W_K.weight, attn.W_K.bias)]
            c_sup = cosine(score_change(model, x, [-t for t in gs]), P)
            c_rec = cosine(score_change(model, x, [-t for t in gr]), P)
            add(f"{name}_sup", c_sup.abs().mean())
            add(f"{name}_rec", c_rec.abs().mean())
            add(f"{name}_rand", cosine(score_change(model, x, rand), P).abs().mean())
            add(f"{name}_sup_descent", c_sup.mean())                # > 0: the step adds proximity
            add(f"{name}_rec_descent", c_rec.mean())

            s4, r4 = score_gradients(model, x, y, masked, data.mask_id)               # part 4
            add(f"{name}_S_rows", rows_identical(s4))
            add(f"{name}_S_sup", cosine(s4, P).abs().mean())
            add(f"{name}_S_rec", cosine(r4, P).abs().mean())
            add(f"{name}_S_sup_descent", -cosine(s4.mean((0, 1)), P))  # > 0: descent adds proximity
            add(f"{name}_S_rec_descent", -cosine(r4.mean((0, 1)), P))
    worst = {"p1_sup_max": max, "p1_rows": max, "saddle": max, "p1_rec_min": min}
    out = {k: worst[k](v) if k in worst else sum(v) / len(v) for k, v in out.items()}
    out["p2_ratio"] = out["p2_rec"] / out["p2_sup"]
    for name in INITS:
        out[f"{name}_S_ratio"] = out[f"{name}_S_rec"] / out[f"{name}_S_sup"]
    return out


def run_seeds(n_seeds, n_batches, batch_size, width, init):
    """{source: {name: [value per seed]}} for source in walks, iid."""
    per = {"walks": {}, "iid": {}}
    for seed in range(n_seeds):
        data = load_split("val", n=n_batches * batch_size, seed=seed)
        for source, tokens in (("walks", data.tokens), ("iid", iid_tokens(data, seed))):
            for k, v in measure(tokens, data, seed, n_batches, batch_size, width, init).items():
                per[source].setdefault(k, []).append(v)
    return per


# -----------------------------------------------------------------------------
# The table

PART3 = (("sup", "3 real init {}, one step on W_Q, W_K: supervised abs cos(dS, P)"),
         ("rec", "3   reconstruction abs cos(dS, P)"),
         ("rand", "3   a random step's abs cos(dS, P) (reference)"),
         ("sup_descent", "3   supervised signed cos, mean over examples (> 0: towards neighbours)"),
         ("rec_descent", "3   reconstruction signed cos, mean over examples (> 0: towards neighbours)"))
PART4 = (("S_rows", "4 abstraction at init {}'s own scores: rows of supervised dL/dS differ by"),
         ("S_sup", "4   supervised mean abs cos per example, head"),
         ("S_rec", "4   reconstruction mean abs cos"),
         ("S_ratio", "4   ratio reconstruction / supervised"),
         ("S_sup_descent", "4   supervised descent cos, batch-averaged (> 0: towards neighbours)"),
         ("S_rec_descent", "4   reconstruction descent cos, batch-averaged (> 0: towards neighbours)"))


# (key, label) of every row of the table, in its order: parts 1-2, then 3 and 4 per init
ROWS = [("p1_sup_max", "1 abstraction, W_Q=W_K=0: supervised max abs cos (all widths, examples, heads)"),
        ("p1_rec", "1   reconstruction mean abs cos per example, head"),
        ("p1_rec_avg", "1   reconstruction abs cos of the batch-averaged dL/dS"),
        ("p1_rec_descent", "1   reconstruction descent cos, batch-averaged (> 0: towards neighbours)"),
        ("saddle", "1   max abs dL/dW_Q, dL/dW_K, both losses (the saddle)"),
        ("p2_sup", "2 full layer, W_Q=W_K=0: supervised mean abs cos"),
        ("p2_rec", "2   reconstruction mean abs cos"),
        ("p2_ratio", "2   ratio reconstruction / supervised"),
        ] + [(f"{init}_{key}", label.format(init)) for part in (PART3, PART4) for init in INITS for key, label in part]


def spread(xs, signed=False):
    """'mean ± std [min, max]' over seeds."""
    t = torch.tensor(xs, dtype=torch.float64)
    std = t.std().item() if len(xs) > 1 else 0.0
    sign = "+" if signed else ""
    return f"{t.mean():{sign}.2e} ± {std:.1e} [{t.min():{sign}.1e}, {t.max():{sign}.1e}]"


def sign_verdict(xs):
    """A direction holds only if every seed agrees on it."""
    if all(x > 0 for x in xs):
        return "towards neighbours in every seed"
    if all(x < 0 for x in xs):
        return "away from neighbours in every seed"
    return f"> 0 in {sum(x > 0 for x in xs)} of {len(xs)} seeds: no direction"


def main(argv=None):
    cfg = configure({"seeds": 8, "n_batches": 2, "batch_size": 32, "width": 2, "init": "torch"},
                    argv, __doc__)
    if cfg["seeds"] < 1 or cfg["n_batches"] < 1 or cfg["batch_size"] < 2 or cfg["width"] < 1:
        raise ValueError("need --seeds >= 1, --n_batches >= 1, --batch_size >= 2, --width >= 1")
    if cfg["init"] not in INITS:
        raise ValueError(f"--init={cfg['init']!r} is unknown; choose one of {INITS}")
    per = run_seeds(cfg["seeds"], cfg["n_batches"], cfg["batch_size"], cfg["width"], cfg["init"])
    print(f"\nmean ± std [min, max] over {cfg['seeds']} seeds; P = centred proximity pattern, |i-j| <= "
          f"{cfg['width']}; parts 1-2 from init={cfg['init']}; chance abs cos = "
          f"{chance_abs_cos(load_split('val', n=2).max_len):.4f}")
    print("| part / quantity | random walks (synthetic.py) | i.i.d. tokens (control) |\n|---|---|---|")
    signed_keys = [k for k, _ in ROWS if k.endswith("descent")]            # directions
    for key, label in ROWS:
        print(f"| {label} | {spread(per['walks'][key], key in signed_keys)} | "
              f"{spread(per['iid'][key], key in signed_keys)} |")
    print("\ndirections, by seed:")
    for key in signed_keys:
        print(f"  {key}: walks {sign_verdict(per['walks'][key])}; i.i.d. {sign_verdict(per['iid'][key])}")
    print("share of each abs cos above the i.i.d. control, 1 - iid/walks, paired by seed:")
    for key in ["p1_rec", "p2_rec"] + [f"{i}_rec" for i in INITS] + [f"{i}_S_{x}" for i in INITS
                                                                     for x in ("sup", "rec")]:
        print(f"  {key}: {spread([1 - i / w for w, i in zip(per['walks'][key], per['iid'][key])], True)}")

    worst = lambda key, pick: pick(pick(per[s][key]) for s in per)     # over seeds and sources
    ok = (worst("p1_sup_max", max) < ZERO_TOL and worst("p1_rec_min", min) > NONZERO_TOL
          and worst("saddle", max) == 0.0)
    print(f"\npart 1 {'PASSES' if ok else 'FAILS'} (every seed, width {WIDTHS}, walks and i.i.d.): "
          f"supervised abs cos {worst('p1_sup_max', max):.1e} < {ZERO_TOL:g} (rows of its dL/dS "
          f"identical to {worst('p1_rows', max):.0e}); reconstruction mean abs cos "
          f"{worst('p1_rec_min', min):.1e} > {NONZERO_TOL:g}; dL/dW_Q, dL/dW_K at W_Q = W_K = 0: "
          f"{worst('saddle', max):g} (exactly 0 required)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run_cli(main))
