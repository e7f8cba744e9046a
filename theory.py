"""
Numerical check of the paper's theory: at uniform attention, label supervision
through a mean-pooled readout is first-order blind to "attend to your
neighbours"; masked reconstruction is not. This script checks that statement
exactly, measures how far it reaches beyond the abstraction, and claims nothing
that does not hold across seeds.

The statement (Coser et al. 2026, the zero-gradient argument). One attention layer with
scores S (T x T), A = softmax_rows(S), outputs o_i = sum_j A_ij v_j. At uniform
initialisation S = 0, so A_ij = 1/T.

Supervised loss through a linear readout of the mean, L = loss(y), y = W mean_i(o_i W_O):
    dL/do_i = (1/T) g  for every i, where g = W_O W^T dL/dy does not depend on i,
    dL/dA_ij = <dL/do_i, v_j> = (1/T) <g, v_j> =: c_j           (the same for every row i)
    dL/dS_ij = A_ij (c_j - sum_k A_ik c_k) = (1/T)(c_j - mean(c)) =: (1/T) r_j
so dL/dS = (1/T) 1 r^T: EVERY ROW OF THE GRADIENT IS THE SAME. For any pattern P
whose column sums vanish (P^T 1 = 0),
    <dL/dS, P> = (1/T) sum_j r_j sum_i P_ij = 0.
A row- and column-centred proximity pattern (1 where |i-j| <= w, then centred)
is such a P. Masked reconstruction reads the outputs at the masked positions i
themselves, y_i = o_i W_O W_lm, so dL/do_i differs from row to row, and so do
the rows of dL/dS: its projection on the same P is not zero.

Two limits of the statement, both measured below:
  - "Not zero" is not "towards neighbours". Any per-position loss has rows that
    differ, so reconstruction projects on P even on i.i.d. tokens with no local
    structure; only the excess over that control comes from local structure,
    and the SIGN of the projection (does descent add or remove proximity?) is a
    claim of its own that must hold seed after seed.
  - The statement is about the scores S, not the parameters. The scores are
    bilinear in the queries and keys: S = Q K^T / sqrt(d_head), Q = h W_Q^T + b_Q,
    K = h W_K^T + b_K (h = ln_1(x)). dL/dQ = dL/dS K / sqrt(d_head) and
    dL/dK = dL/dS^T Q / sqrt(d_head), so at W_Q = W_K = 0 (biases too: Q = K = 0)
    both losses have EXACTLY zero gradient on W_Q and W_K, whatever the other
    weights: a saddle that gradient descent never leaves, so the score-space
    statement says nothing about what W_Q, W_K learn from there. At the model's real initialisation (W_Q, W_K not zero,
    attention not exactly uniform) a step dW_Q, dW_K changes the scores by
    dS = (dQ K^T + Q dK^T) / sqrt(d_head), which need not be row-constant for the
    supervised loss either; part 3 measures what such a step does.

What is measured, in float64, with real model.py weights on synthetic.py random
walks and, as the control, i.i.d. uniform tokens of the same length and
vocabulary; every figure over --seeds seeds (model, data and masks all change
with the seed), as mean, std and min..max:
  part 1  the abstraction (attention -> W_O -> mean pool -> linear), W_Q = W_K = 0
          (the other weights drawn with --init):
          supervised |cos(dL/dS, P)| per example and head (must be < 1e-10 for
          every seed, width, example and head), reconstruction's (must be
          clearly non-zero), the batch-averaged gradient's, its descent sign,
          and the exact zero of dL/dW_Q, dL/dW_K (the saddle).
  part 2  the full 1-layer model (residual, MLP, LayerNorms before the pooling)
          at W_Q = W_K = 0: the supervised projection is small but not zero;
          the ratio reconstruction / supervised.
  part 3  the full model at its real initialisation, init="torch" (PyTorch's
          layer defaults), init="gpt2" (N(0, 0.02)) and init="amos" (PyTorch's
          with W_Q = W_K = W_V = W_O, Amos et al.'s code): one gradient step on
          W_Q, W_K (weights and biases), the first-order change of the scores dS,
          row-centred (a constant added to a row moves no attention), projected
          on P; next to a random step's projection.
  part 4  the abstraction of part 1 at each init's own scores S instead of S = 0:
          where attention is not uniform (amos: local from the start, since
          W_Q = W_K makes every head's scores q_i . q_j / sqrt(d_head)),
              dL/dS_ij = A_ij (c_ij - sum_k A_ik c_ik),  c_ij = <dL/do_i, v_j>,
          and the rows of A differ, so the supervised gradient's rows differ
          too and its projection on P is no longer zero: how large, against
          reconstruction's, and in which direction, seed by seed.
cos = <G, P> / (|G| |P|). A row-centred random T x T matrix has
E|cos| = sqrt(2 / (pi T (T-1))) (0.0080 at T = 100): the chance level.
Exit status 1 if part 1 fails.

    python theory.py [--seeds=8] [--n_batches=2] [--batch_size=32] [--width=2] [--init=torch]
"""

import math
import sys

import torch
import torch.nn.functional as F

from model import Transformer, TransformerConfig
from synthetic import load_split
from configurator import configure, run_cli

WIDTHS = (1, 2, 5, 10)   # part 1 is checked at every width; the table shows --width
MASK_RATIO = 0.15
ZERO_TOL = 1e-10         # part 1: |cos(supervised dL/dS, P)| must stay below this
NONZERO_TOL = 1e-3       # part 1: mean |cos(reconstruction dL/dS, P)| must exceed this
INITS = ("torch", "gpt2", "amos")


def centred_proximity(T, width):
    """P_ij = 1[|i-j| <= w], then row- and column-centred (so P^T 1 = 0 and P 1 = 0)."""
    i = torch.arange(T)
    P = ((i[:, None] - i[None, :]).abs() <= width).double()
    return P - P.mean(0, keepdim=True) - P.mean(1, keepdim=True) + P.mean()


def chance_abs_cos(T):
    """E|cos(G, P)| for a row-centred Gaussian T x T matrix G: cos ~ N(0, 1/(T(T-1)))."""
    return math.sqrt(2 / (math.pi * T * (T - 1)))


def iid_tokens(data, seed):
    """The control: i.i.d. uniform tokens, same shape and values as the walks, no local structure."""
    g = torch.Generator().manual_seed(10_000 + seed)
    return torch.randint(0, data.n_values, data.tokens.shape, generator=g)


def build_model(vocab_size, T, seed, init, uniform):
    """A real 1-layer model.py Transformer in float64. uniform=True zeroes W_Q and W_K
    (weights and biases), so S = 0 and A_ij = 1/T exactly."""
    torch.manual_seed(seed)
    model = Transformer(TransformerConfig(vocab_size=vocab_size, n_classes=2, max_len=T, n_layer=1,
                                          n_head=4, n_embd=64, pos_enc="sinusoidal", init=init))
    if uniform:
        attn = model.blocks[0].attn
        for p in (*attn.W_Q.parameters(), *attn.W_K.parameters()):
            torch.nn.init.zeros_(p)
    return model.double().eval()


# -----------------------------------------------------------------------------
# Parts 1, 2 and 4: dL/dS at the layer's own scores (S = 0 when W_Q = W_K = 0)

def queries_keys(model, tokens):
    """h = ln_1(x) and the layer's Q = h W_Q^T + b_Q, K = h W_K^T + b_K, per head (no gradient)."""
    block, attn = model.blocks[0], model.blocks[0].attn
    with torch.no_grad():
        h = block.ln_1(model.embed(tokens))
        return h, attn.split_heads(attn.W_Q(h)), attn.split_heads(attn.W_K(h))


def own_scores(model, tokens):
    """The layer's scores S = Q K^T / sqrt(d_head), as a leaf we can differentiate by.
    Exactly 0 when W_Q = W_K = 0 (biases too), so A_ij = 1/T."""
    _, Q, K = queries_keys(model, tokens)
    return (Q @ K.transpose(-2, -1) / math.sqrt(model.blocks[0].attn.head_dim)).requires_grad_()


def outputs_from_scores(model, idx, S, full):
    """Run layer 0 with the scores S given as a tensor we can differentiate.
    full=False: the abstraction, o W_O (no residual, no MLP, no norms after it).
    full=True:  the whole 1-layer model, as model.forward computes it."""
    block, attn = model.blocks[0], model.blocks[0].attn
    x = model.embed(idx)
    v = attn.split_heads(attn.W_V(block.ln_1(x)))
    A = torch.softmax(S, dim=-1)                                  # A = softmax_rows(S)
    o = (A @ v).transpose(1, 2).reshape(x.shape)                  # o_i = sum_j A_ij v_j
    out = attn.W_O(o)
    if not full:
        return out
    x = x + out
    x = x + block.mlp(block.ln_2(x))
    return model.ln_f(x)


def score_gradients(model, tokens, labels, masked, mask_id, full):
    """dL/dS at the layer's own scores (each loss's own input: the masked one for
    reconstruction) for the supervised loss and for the masked-reconstruction loss.
    With W_Q = W_K = 0 that is S = 0, uniform attention."""
    S = own_scores(model, tokens)
    logits = model.head(outputs_from_scores(model, tokens, S, full).mean(1))   # mean pool, linear head
    (g_sup,) = torch.autograd.grad(F.cross_entropy(logits, labels), S)

    hidden = tokens.masked_fill(masked, mask_id)
    S = own_scores(model, hidden)
    h = outputs_from_scores(model, hidden, S, full)
    loss = F.cross_entropy(model.lm_head(h)[masked], tokens[masked])          # read at masked i
    (g_rec,) = torch.autograd.grad(loss, S)
    return g_sup, g_rec


def cosine(G, P):
    """<G, P> / (|G| |P|) over the last two dims: the relative projection."""
    return (G * P).sum((-2, -1)) / (G.norm(dim=(-2, -1)) * P.norm()).clamp(min=1e-300)


def rows_identical(G):
    """max_i |G_i - G_0| / max |G| per (example, head): 0 when every row is the same."""
    return ((G - G[..., :1, :]).abs().amax((-2, -1)) / G.abs().amax((-2, -1)).clamp(min=1e-300)).max().item()


# -----------------------------------------------------------------------------
# Part 3: what a gradient step on W_Q, W_K does to the scores

def qk_params(model):
    attn = model.blocks[0].attn
    return [attn.W_Q.weight, attn.W_Q.bias, attn.W_K.weight, attn.W_K.bias]


def qk_gradients(model, tokens, labels, masked, mask_id):
    """dL/d(W_Q, b_Q, W_K, b_K) through the real forward pass, supervised and reconstruction."""
    sup = F.cross_entropy(model.classify(tokens), labels)
    g_sup = torch.autograd.grad(sup, qk_params(model))
    logits = model.reconstruct(tokens.masked_fill(masked, mask_id))
    g_rec = torch.autograd.grad(F.cross_entropy(logits[masked], tokens[masked]), qk_params(model))
    return g_sup, g_rec


def score_change(model, tokens, step):
    """First-order change of the scores S = Q K^T / sqrt(d_head), Q = h W_Q^T + b_Q,
    K = h W_K^T + b_K, h = ln_1(x), for the step (dW_Q, db_Q, dW_K, db_K):
        dS = (dQ K^T + Q dK^T) / sqrt(d_head)   (exact: S is bilinear in Q, K),
    row-centred, since a constant added to a row of S changes no attention."""
    attn = model.blocks[0].attn
    dWq, dbq, dWk, dbk = step
    h, Q, K = queries_keys(model, tokens)
    with torch.no_grad():
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

        s1, r1 = score_gradients(uniform, x, y, masked, data.mask_id, full=False)     # part 1
        add("p1_sup_max", max(cosine(s1, centred_proximity(T, w)).abs().max() for w in WIDTHS))
        add("p1_rec_min", min(cosine(r1, centred_proximity(T, w)).abs().mean() for w in WIDTHS))
        add("p1_rows", rows_identical(s1))                       # dL/dS = (1/T) 1 r^T
        add("p1_rec", cosine(r1, P).abs().mean())
        add("p1_rec_avg", cosine(r1.mean((0, 1)), P).abs())
        add("p1_rec_descent", -cosine(r1.mean((0, 1)), P))          # > 0: descent adds proximity
        gs, gr = qk_gradients(uniform, x, y, masked, data.mask_id)
        add("saddle", max(t.abs().max() for t in (*gs, *gr)))

        s2, r2 = score_gradients(uniform, x, y, masked, data.mask_id, full=True)      # part 2
        add("p2_sup", cosine(s2, P).abs().mean())
        add("p2_rec", cosine(r2, P).abs().mean())

        for name, model in real.items():                                             # part 3
            gs, gr = qk_gradients(model, x, y, masked, data.mask_id)
            rand = [torch.randn(p.shape, generator=g_step, dtype=p.dtype) for p in qk_params(model)]
            c_sup = cosine(score_change(model, x, [-t for t in gs]), P)
            c_rec = cosine(score_change(model, x, [-t for t in gr]), P)
            add(f"{name}_sup", c_sup.abs().mean())
            add(f"{name}_rec", c_rec.abs().mean())
            add(f"{name}_rand", cosine(score_change(model, x, rand), P).abs().mean())
            add(f"{name}_sup_descent", c_sup.mean())                # > 0: the step adds proximity
            add(f"{name}_rec_descent", c_rec.mean())

            s4, r4 = score_gradients(model, x, y, masked, data.mask_id, full=False)  # part 4
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

ROWS = [   # (key, label), in the order of the table
    ("p1_sup_max", "1 abstraction, W_Q=W_K=0: supervised max abs cos (all widths, examples, heads)"),
    ("p1_rec", "1   reconstruction mean abs cos per example, head"),
    ("p1_rec_avg", "1   reconstruction abs cos of the batch-averaged dL/dS"),
    ("p1_rec_descent", "1   reconstruction descent cos, batch-averaged (> 0: towards neighbours)"),
    ("saddle", "1   max abs dL/dW_Q, dL/dW_K, both losses (the saddle)"),
    ("p2_sup", "2 full layer, W_Q=W_K=0: supervised mean abs cos"),
    ("p2_rec", "2   reconstruction mean abs cos"),
    ("p2_ratio", "2   ratio reconstruction / supervised"),
]
for _init in INITS:
    ROWS += [
        (f"{_init}_sup", f"3 real init {_init}, one step on W_Q, W_K: supervised abs cos(dS, P)"),
        (f"{_init}_rec", "3   reconstruction abs cos(dS, P)"),
        (f"{_init}_rand", "3   a random step's abs cos(dS, P) (reference)"),
        (f"{_init}_sup_descent", "3   supervised signed cos, mean over examples (> 0: towards neighbours)"),
        (f"{_init}_rec_descent", "3   reconstruction signed cos, mean over examples (> 0: towards neighbours)"),
    ]
for _init in INITS:
    ROWS += [
        (f"{_init}_S_rows", f"4 abstraction at init {_init}'s own scores: rows of supervised dL/dS differ by"),
        (f"{_init}_S_sup", "4   supervised mean abs cos per example, head"),
        (f"{_init}_S_rec", "4   reconstruction mean abs cos"),
        (f"{_init}_S_ratio", "4   ratio reconstruction / supervised"),
        (f"{_init}_S_sup_descent", "4   supervised descent cos, batch-averaged (> 0: towards neighbours)"),
        (f"{_init}_S_rec_descent", "4   reconstruction descent cos, batch-averaged (> 0: towards neighbours)"),
    ]
SIGNED = [k for k, _ in ROWS if k.endswith("descent")]          # directions
LOCAL = (["p1_rec", "p2_rec"] + [f"{i}_rec" for i in INITS]      # walks vs the i.i.d. control
         + [f"{i}_S_{loss}" for i in INITS for loss in ("sup", "rec")])


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


def print_table(per, n_seeds, width, T, init):
    print(f"\nmean ± std [min, max] over {n_seeds} seeds; P = centred proximity pattern, |i-j| <= {width}; "
          f"parts 1-2 from init={init}; chance abs cos = {chance_abs_cos(T):.4f}")
    print("| part / quantity | random walks (synthetic.py) | i.i.d. tokens (control) |")
    print("|---|---|---|")
    for key, label in ROWS:
        signed = key in SIGNED
        print(f"| {label} | {spread(per['walks'][key], signed)} | {spread(per['iid'][key], signed)} |")
    print("\ndirections, by seed:")
    for key in SIGNED:
        print(f"  {key}: walks {sign_verdict(per['walks'][key])}; i.i.d. {sign_verdict(per['iid'][key])}")
    print("share of each abs cos above the i.i.d. control, 1 - iid/walks, paired by seed:")
    for key in LOCAL:
        print(f"  {key}: {spread([1 - i / w for w, i in zip(per['walks'][key], per['iid'][key])], True)}")


def main(argv=None):
    cfg = configure({"seeds": 8, "n_batches": 2, "batch_size": 32, "width": 2, "init": "torch"},
                    argv, __doc__)
    if cfg["seeds"] < 1 or cfg["n_batches"] < 1 or cfg["batch_size"] < 2 or cfg["width"] < 1:
        raise ValueError("need --seeds >= 1, --n_batches >= 1, --batch_size >= 2, --width >= 1")
    if cfg["init"] not in INITS:
        raise ValueError(f"--init={cfg['init']!r} is unknown; choose one of {INITS}")
    data = load_split("val", n=2, seed=0)
    model = build_model(data.vocab_size, data.max_len, 0, cfg["init"], uniform=True)
    real = [build_model(data.vocab_size, data.max_len, 0, name, uniform=False) for name in INITS]
    for m in [model] + real:   # our written-out layer is the model's own function at its own scores
        S = own_scores(m, data.tokens).detach()
        same = m.head(outputs_from_scores(m, data.tokens, S, True).mean(1))
        assert torch.allclose(same, m.classify(data.tokens), atol=1e-10)

    per = run_seeds(cfg["seeds"], cfg["n_batches"], cfg["batch_size"], cfg["width"], cfg["init"])
    print_table(per, cfg["seeds"], cfg["width"], data.max_len, cfg["init"])

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
