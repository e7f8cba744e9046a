"""
Numerical check of the paper's theory: at uniform attention, label supervision
through a mean-pooled readout is first-order blind to "attend to your
neighbours"; masked reconstruction is not.

The statement (SPEC.md, "Theory, stated exactly"). One attention layer with
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
is such a P: gradient descent on S (hence on W_Q, W_K, since dL/dW_Q and dL/dW_K
are linear in dL/dS) has no first-order component towards proximity.

Masked reconstruction reads the outputs at the masked positions i themselves,
y_i = o_i W_O W_lm, so dL/do_i is non-zero only on masked rows and differs from
row to row: the rows of dL/dS differ, and the projection on the same patterns is
non-zero (and, on locally correlated data, its descent direction points towards
proximity).

What this script checks, in float64, with real model.py weights (W_V, W_O,
readouts) on synthetic.py data, with W_Q = W_K = 0 (so S = 0 exactly):
  part 1  the abstraction above: supervised projection ~1e-16 relative to the
          gradient norm, reconstruction projection clearly non-zero; per head,
          per example and for the batch-averaged gradient; several widths w.
  part 2  the full 1-layer model (residual stream, MLP, LayerNorms before the
          pooling): there dL/do_i depends on i through the per-token
          nonlinearities, so the supervised projection is small but not zero.
          We report how much smaller it is than the reconstruction one.
Exit status 1 if part 1 fails.

    python theory.py [--n_batches=4] [--batch_size=32] [--seed=0]
"""

import sys

import torch
import torch.nn.functional as F

from model import Transformer, TransformerConfig
from synthetic import load_split
from training import configure

WIDTHS = (1, 2, 5, 10)
MASK_RATIO = 0.15
ZERO_TOL = 1e-10     # part 1: |cos(supervised gradient, P)| must stay below this
NONZERO_TOL = 1e-3   # part 1: mean |cos(reconstruction gradient, P)| must exceed this


def centred_proximity(T, width):
    """P_ij = 1[|i-j| <= w], then row- and column-centred (so P^T 1 = 0 and P 1 = 0)."""
    i = torch.arange(T)
    P = ((i[:, None] - i[None, :]).abs() <= width).double()
    return P - P.mean(0, keepdim=True) - P.mean(1, keepdim=True) + P.mean()


def uniform_attention_model(vocab_size, T, seed):
    """A real 1-layer model.py Transformer in float64 with W_Q = W_K = 0, so S = 0."""
    torch.manual_seed(seed)
    model = Transformer(TransformerConfig(vocab_size=vocab_size, n_classes=2, max_len=T,
                                          n_layer=1, n_head=4, n_embd=64, pos_enc="sinusoidal"))
    attn = model.blocks[0].attn
    for p in (*attn.W_Q.parameters(), *attn.W_K.parameters()):
        torch.nn.init.zeros_(p)
    return model.double().eval()


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


def score_gradients(model, tokens, labels, mask_id, full, generator):
    """dL/dS at S = 0 for the supervised loss and for the masked-reconstruction loss."""
    B, T = tokens.shape
    H = model.config.n_head

    S = torch.zeros(B, H, T, T, dtype=torch.float64, requires_grad=True)
    logits = model.head(outputs_from_scores(model, tokens, S, full).mean(1))   # mean pool, linear head
    (g_sup,) = torch.autograd.grad(F.cross_entropy(logits, labels), S)

    masked = torch.rand(B, T, generator=generator) < MASK_RATIO
    S = torch.zeros(B, H, T, T, dtype=torch.float64, requires_grad=True)
    h = outputs_from_scores(model, tokens.masked_fill(masked, mask_id), S, full)
    loss = F.cross_entropy(model.lm_head(h)[masked], tokens[masked])          # read at masked i
    (g_rec,) = torch.autograd.grad(loss, S)
    return g_sup, g_rec


def cosine(G, P):
    """<G, P> / (|G| |P|) over the last two dims: the relative projection."""
    return (G * P).sum((-2, -1)) / (G.norm(dim=(-2, -1)) * P.norm()).clamp(min=1e-300)


def rows_identical(G):
    """max_i |G_i - G_0| / max |G| per (example, head): 0 when every row is the same."""
    return ((G - G[..., :1, :]).abs().amax((-2, -1)) / G.abs().amax((-2, -1)).clamp(min=1e-300)).max().item()


def measure(model, data, full, n_batches, batch_size, seed):
    """Per width, over examples and heads: max and mean |cos| (supervised), mean |cos|
    and mean descent cos (reconstruction); plus |cos| of the batch-averaged gradients."""
    g = torch.Generator().manual_seed(seed)
    T = data.max_len
    rows = {w: {"sup_max": 0.0, "sup_abs": [], "rec_abs": [], "rec_descent": [], "sup_avg": [], "rec_avg": []} for w in WIDTHS}
    same_rows = 0.0
    for b in range(n_batches):
        tokens = data.tokens[b * batch_size:(b + 1) * batch_size]
        labels = data.labels[b * batch_size:(b + 1) * batch_size]
        g_sup, g_rec = score_gradients(model, tokens, labels, data.mask_id, full, g)
        same_rows = max(same_rows, rows_identical(g_sup))
        for w in WIDTHS:
            P = centred_proximity(T, w)
            r = rows[w]
            r["sup_max"] = max(r["sup_max"], cosine(g_sup, P).abs().max().item())
            r["sup_abs"].append(cosine(g_sup, P).abs().mean().item())
            r["rec_abs"].append(cosine(g_rec, P).abs().mean().item())
            r["rec_descent"].append(-cosine(g_rec, P).mean().item())   # > 0: descent adds proximity
            r["sup_avg"].append(cosine(g_sup.mean((0, 1)), P).abs().item())
            r["rec_avg"].append(cosine(g_rec.mean((0, 1)), P).abs().item())
    mean = lambda xs: sum(xs) / len(xs)
    return same_rows, {w: {k: (v if k == "sup_max" else mean(v)) for k, v in r.items()} for w, r in rows.items()}


def print_table(title, same_rows, rows):
    print(f"\n{title}   (rows of the supervised dL/dS identical to {same_rows:.1e})")
    print("| pattern | sup. max abs cos | sup. mean abs cos | recon. mean abs cos | recon/sup | "
          "recon. descent cos | batch-avg sup. | batch-avg recon. |")
    print("|---|---|---|---|---|---|---|---|")
    for w, r in rows.items():
        print(f"| abs(i-j)<={w} | {r['sup_max']:.1e} | {r['sup_abs']:.1e} | {r['rec_abs']:.2e} | "
              f"{ratio(r):.1e} | {r['rec_descent']:+.1e} | {r['sup_avg']:.1e} | {r['rec_avg']:.2e} |")


def ratio(r):
    """How many times larger the reconstruction projection is than the supervised one."""
    return r["rec_abs"] / max(r["sup_abs"], 1e-300)


def main(argv=None):
    cfg = configure({"n_batches": 4, "batch_size": 32, "seed": 0}, argv, __doc__)
    data = load_split("val", n=cfg["n_batches"] * cfg["batch_size"], seed=cfg["seed"])
    model = uniform_attention_model(data.vocab_size, data.max_len, cfg["seed"])
    with torch.no_grad():   # our written-out layer is the model's own function at S = 0
        S0 = torch.zeros(2, model.config.n_head, data.max_len, data.max_len, dtype=torch.float64)
        same = model.head(outputs_from_scores(model, data.tokens[:2], S0, True).mean(1))
        assert torch.allclose(same, model.classify(data.tokens[:2]), atol=1e-12)

    same1, part1 = measure(model, data, False, cfg["n_batches"], cfg["batch_size"], cfg["seed"])
    print_table("Part 1: the abstraction (attention -> W_O -> mean pool -> linear), float64, W_Q = W_K = 0",
                same1, part1)
    same2, part2 = measure(model, data, True, cfg["n_batches"], cfg["batch_size"], cfg["seed"])
    print_table("Part 2: the full 1-layer model (residual, MLP, LayerNorm before pooling)", same2, part2)
    print("\ncos = <dL/dS, P> / (|dL/dS| |P|) per example and head; P = centred proximity pattern;")
    print("'recon descent cos' > 0 means a gradient-descent step on S moves attention towards neighbours.")

    ok = all(r["sup_max"] < ZERO_TOL and r["rec_abs"] > NONZERO_TOL for r in part1.values())
    print(f"\npart 1 {'PASSES' if ok else 'FAILS'}: supervised projection < {ZERO_TOL:g}, "
          f"reconstruction projection > {NONZERO_TOL:g} for every width")
    print("part 2: reconstruction / supervised projection (means) = "
          + ", ".join(f"w={w}: {ratio(r):.1f}x" for w, r in part2.items()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
