"""
The zero-gradient statement of Coser et al. (2026), checked with autograd in float64.

One attention layer: scores S (T x T), A = softmax_rows(S), outputs o_i = sum_j A_ij v_j.
At uniform attention (S = 0, A_ij = 1/T) a loss read through the MEAN of the outputs,
L = loss(W mean_i(o_i W_O)), has
    dL/do_i  = (1/T) g                            the same g for every position i
    dL/dA_ij = <dL/do_i, v_j> = (1/T) <g, v_j> =: c_j          the same for every row i
    dL/dS_ij = A_ij (c_j - sum_k A_ik c_k) = (1/T) r_j
so every row of dL/dS is the same, and <dL/dS, P> = (1/T) sum_j r_j sum_i P_ij = 0 for a
centred proximity pattern P (1 where |i-j| <= w, rows and columns centred): supervision
is first-order blind to "attend to your neighbours". Masked reconstruction reads o_i at
each hidden position, so its rows, and its projection on P, differ. At W_Q = W_K = 0
(S = 0 exactly) both losses have zero gradient on W_Q, W_K: S = Q K^T / sqrt(d) is bilinear.

Checked on a real model.py layer, on lazy random walks and on i.i.d. tokens, in every seed
(exit 1 if not). Beyond it (a full layer, the real inits): tools/theory_beyond.py.

    python theory.py [--seeds=8] [--batch_size=32]
"""

import math
import sys

import torch
import torch.nn.functional as F

from model import Transformer, TransformerConfig

T, V, MASK_RATIO = 100, 32, 0.15   # length, token values (+ pad V, mask V + 1), as synthetic.py
WIDTHS = (1, 2, 5, 10)             # proximity patterns |i-j| <= w
ZERO_TOL, NONZERO_TOL = 1e-10, 1e-3   # supervised |cos| must stay below, reconstruction's above


def sequences(n, seed):
    """Lazy random walks on Z_V (x_{i+1} = x_i + s_i mod V, s_i in {-1, 0, 1}), random labels,
    and the control: i.i.d. uniform tokens of the same shape, with no local structure."""
    g = torch.Generator().manual_seed(seed)
    steps = torch.randint(-1, 2, (n, T), generator=g)
    steps[:, 0] = torch.randint(0, V, (n,), generator=g)
    return steps.cumsum(1) % V, torch.randint(0, V, (n, T), generator=g), torch.randint(0, 2, (n,), generator=g)


def centred_proximity(T, width):
    """P_ij = 1[|i-j| <= w], then row- and column-centred (so P^T 1 = 0 and P 1 = 0)."""
    i = torch.arange(T)
    P = ((i[:, None] - i[None, :]).abs() <= width).double()
    return P - P.mean(0, keepdim=True) - P.mean(1, keepdim=True) + P.mean()


def build_model(vocab_size, T, seed, init, uniform):
    """A 1-layer model.py Transformer in float64; uniform=True zeroes W_Q, W_K (and biases): S = 0."""
    torch.manual_seed(seed)
    model = Transformer(TransformerConfig(vocab_size=vocab_size, n_classes=2, max_len=T, n_layer=1,
                                          n_head=4, n_embd=64, pos_enc="sinusoidal", init=init))
    if uniform:
        for p in (*model.blocks[0].attn.W_Q.parameters(), *model.blocks[0].attn.W_K.parameters()):
            torch.nn.init.zeros_(p)
    return model.double().eval()


def own_scores(model, tokens):
    """S = Q K^T / sqrt(d_head) as a leaf to differentiate by (exactly 0 when W_Q = W_K = 0)."""
    attn = model.blocks[0].attn
    with torch.no_grad():
        h = model.blocks[0].ln_1(model.embed(tokens))
        Q, K = attn.split_heads(attn.W_Q(h)), attn.split_heads(attn.W_K(h))
    return (Q @ K.transpose(-2, -1) / math.sqrt(attn.head_dim)).requires_grad_()


def abstraction(model, idx, S):
    """The statement's layer run from the scores S: o W_O, o_i = sum_j A_ij v_j."""
    block, attn = model.blocks[0], model.blocks[0].attn
    v = attn.split_heads(attn.W_V(block.ln_1(model.embed(idx))))
    o = (torch.softmax(S, dim=-1) @ v).transpose(1, 2).flatten(2)
    return attn.W_O(o)


def score_gradients(model, tokens, labels, masked, mask_id, layer=abstraction):
    """dL/dS of the supervised loss (mean pool, linear head) and of masked reconstruction
    (read at the hidden positions), each at the layer's own scores for its own input."""
    S = own_scores(model, tokens)
    logits = model.head(layer(model, tokens, S).mean(1))
    (g_sup,) = torch.autograd.grad(F.cross_entropy(logits, labels), S)
    hidden = tokens.masked_fill(masked, mask_id)
    S = own_scores(model, hidden)
    h = model.lm_head(layer(model, hidden, S))
    (g_rec,) = torch.autograd.grad(F.cross_entropy(h[masked], tokens[masked]), S)
    return g_sup, g_rec


def qk_gradients(model, tokens, labels, masked, mask_id):
    """dL/d(W_Q, b_Q, W_K, b_K) through the real forward pass: supervised, reconstruction."""
    params = [*model.blocks[0].attn.W_Q.parameters(), *model.blocks[0].attn.W_K.parameters()]
    g_sup = torch.autograd.grad(F.cross_entropy(model.classify(tokens), labels), params)
    logits = model.reconstruct(tokens.masked_fill(masked, mask_id))
    return g_sup, torch.autograd.grad(F.cross_entropy(logits[masked], tokens[masked]), params)


def cosine(G, P):
    """<G, P> / (|G| |P|) over the last two dims."""
    return (G * P).sum((-2, -1)) / (G.norm(dim=(-2, -1)) * P.norm()).clamp(min=1e-300)


def rows_identical(G):
    """max_i |G_i - G_0| / max |G| per (example, head): 0 when every row is the same."""
    return ((G - G[..., :1, :]).abs().amax((-2, -1)) / G.abs().amax((-2, -1)).clamp(min=1e-300)).max().item()


def check(seed, batch_size):
    """The three checks on walks and on i.i.d. tokens, one seed -> {source: numbers}."""
    model = build_model(V + 2, T, seed, "torch", uniform=True)
    walks, iid, labels = sequences(batch_size, seed)
    masked = torch.rand(walks.shape, generator=torch.Generator().manual_seed(seed)) < MASK_RATIO
    out = {}
    for source, x in (("walks", walks), ("iid", iid)):
        g_sup, g_rec = score_gradients(model, x, labels, masked, V + 1)
        sup, rec = zip(*[(cosine(g_sup, P).abs().max().item(), cosine(g_rec, P).abs().mean().item())
                         for P in (centred_proximity(T, w) for w in WIDTHS)])
        grads = sum(qk_gradients(model, x, labels, masked, V + 1), ())
        out[source] = dict(sup=max(sup), rows=rows_identical(g_sup), rec_min=min(rec), rec_w2=rec[1],
                           saddle=max(g.abs().max().item() for g in grads))
    return out


def main(argv):
    cfg = dict(seeds=8, batch_size=32)
    for key, _, value in (a.removeprefix("--").partition("=") for a in argv):
        if key not in cfg or not value.isdigit() or int(value) < (1 if key == "seeds" else 2):
            sys.exit(f"error: --{key}={value}: expected --seeds=N (N >= 1) or --batch_size=N (N >= 2)")
        cfg[key] = int(value)
    runs = [check(seed, cfg["batch_size"]) for seed in range(cfg["seeds"])]
    at = lambda src, k: torch.tensor([r[src][k] for r in runs], dtype=torch.float64)
    chance = math.sqrt(2 / (math.pi * T * (T - 1)))     # E|cos| of a row-centred Gaussian T x T matrix
    print(f"{cfg['seeds']} seeds x {cfg['batch_size']} sequences of {T}; chance |cos| {chance:.2e}\n"
          f"| tokens | supervised: max |cos| (widths 1-10) | its rows differ by | reconstruction: mean |cos|, "
          f"|i-j| <= 2 | dL/dW_Q, dL/dW_K |\n|---|---|---|---|---|")
    for src, w2 in ((src, at(src, "rec_w2")) for src in ("walks", "iid")):
        print(f"| {src} | {at(src, 'sup').max():.1e} | {at(src, 'rows').max():.0e} | {w2.mean():.2e} ± "
              f"{w2.std() if len(w2) > 1 else 0:.1e} | {at(src, 'saddle').max():g} |")
    ok = all(at(s, "sup").max() < ZERO_TOL and at(s, "rec_min").min() > NONZERO_TOL
             and at(s, "saddle").max() == 0 for s in ("walks", "iid"))
    print(f"the statement {'HOLDS' if ok else 'FAILS'} in every seed: supervised |cos| < {ZERO_TOL:g}, "
          f"reconstruction's > {NONZERO_TOL:g}, and W_Q = W_K = 0 is a saddle of both losses")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
