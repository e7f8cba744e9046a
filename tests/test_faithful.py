"""Each model held to the equations its docstring states, written out here again from plain
torch ops with the weights read from the state dict: nothing of looped.py or model.py is
called but the model itself. Float64, so a moved norm, a dropped residual or a swapped
query and key shows as an error of order 1 against agreement to 1e-12.

Also the RoPE convention of the FLT authors' code (FuRuF-11/FullyLoopedTransformer,
nanochat/gpt.py, apply_rotary_emb): their half-split rotation, written from its equation,
gives looped.py's logits once the rows of W_Q and W_K are permuted per head."""

import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from looped import LoopedConfig, LoopedTransformer  # noqa: E402
from model import Transformer, TransformerConfig  # noqa: E402

V, T, B = 32, 12, 2


# -----------------------------------------------------------------------------
# looped.py's equations, by hand

def rms(x, eps):
    """Parameter-free RMSNorm: x / sqrt(mean(x^2) + eps)."""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def cos_sin(hd):
    """cos and sin of p * theta_i for positions p < T and pairs i < hd/2, theta_i = 10000^(-2i/hd);
    made in float32, as both models make their position tables (in float64 they differ by 1e-7)."""
    theta = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    a = torch.arange(T, dtype=torch.float32)[:, None] * theta
    return a.cos().double(), a.sin().double()


def rope_ours(x):
    """looped.py: pair (x[2i], x[2i+1]) rotated by +p*theta_i."""
    cos, sin = cos_sin(x.size(-1))
    y = x.clone()
    y[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
    y[..., 1::2] = x[..., 0::2] * sin + x[..., 1::2] * cos
    return y


def rope_authors(x):
    """The FLT authors' gpt.py: pair (x[i], x[i + hd/2]) rotated by -p*theta_i."""
    (cos, sin), d = cos_sin(x.size(-1)), x.size(-1) // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], dim=-1)


def attention(w, xq, xkv, c, rope):
    """out = W_O softmax(Q K^T / sqrt(hd) + causal) V,
    Q = qknorm(rope(W_Q xq)), K = qknorm(rope(W_K xkv)), V = W_V xkv."""
    hd = c.n_embd // c.n_head
    heads = lambda y: y.view(B, T, c.n_head, hd).transpose(1, 2)   # noqa: E731
    q = rms(rope(heads(xq @ w["W_Q"].T)), c.norm_eps)
    k = rms(rope(heads(xkv @ w["W_K"].T)), c.norm_eps)
    v = heads(xkv @ w["W_V"].T)
    s = q @ k.transpose(-2, -1) / math.sqrt(hd)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, c.n_embd) @ w["W_O"].T


def block(w, x, c, rope, h=None):
    """x += attn(q = norm(h) if h is given else norm(x), kv = norm(x)); x += proj(relu(fc(norm(x)))^2)."""
    xn = rms(x, c.norm_eps)
    x = x + attention(w, xn if h is None else rms(h, c.norm_eps), xn, c, rope)
    return x + (torch.relu(rms(x, c.norm_eps) @ w["fc"].T) ** 2) @ w["proj"].T


def two_loops(sd, c, idx, rope=rope_ours):
    """Loop 1 plain on norm(x0), then loop 2 as the variant table says: its final state h and softcapped logits."""
    blocks = [{k: sd[f"blocks.{i}.attn.{k}.weight"] for k in ("W_Q", "W_K", "W_V", "W_O")}
              | {k: sd[f"blocks.{i}.mlp.{k}.weight"] for k in ("fc", "proj")} for i in range(c.n_layer)]
    eps, x0 = c.norm_eps, sd["tok_emb.weight"][idx]
    x = rms(x0, eps)                                   # loop 1: norm(x0), plain self-attention
    for w in blocks:
        x = block(w, x, c, rope)
    h = rms(x, eps)                                    # h = norm(x_L^(1))
    if c.variant == "LT":                              # starts from h
        x = h
        for w in blocks:
            x = block(w, x, c, rope)
    elif c.variant == "LT_i":                          # starts from norm(x0 + h), h nowhere else
        x = rms(x0 + h, eps)
        for w in blocks:
            x = block(w, x, c, rope)
    elif c.variant == "LT_ia":                         # norm(x0); h the query of layer 0 only
        x = block(blocks[0], rms(x0, eps), c, rope, h)
        for w in blocks[1:]:
            x = block(w, x, c, rope)
    elif c.variant == "FLT_res":                       # norm(x0); x = norm(x + h) before each block
        x = rms(x0, eps)
        for w in blocks:
            x = block(w, rms(x + h, eps), c, rope)
    elif c.variant == "FLT":                           # norm(x0); h the query of every layer
        x = rms(x0, eps)
        for w in blocks:
            x = block(w, x, c, rope, h)
    h = rms(x, eps)                                    # h = norm(x_L^(2)), the final norm
    return h, c.softcap * torch.tanh(h @ sd["lm_head.weight"].T / c.softcap)


def random_looped(variant, seed=0):
    """Every weight random (the real init zeroes W_O and the MLP's out projection: every block
    would be the identity and the test vacuous), float64."""
    torch.manual_seed(seed)
    c = LoopedConfig(vocab_size=V, block_size=T, n_layer=2, n_loops=2, n_head=2, n_embd=16, variant=variant)
    model = LoopedTransformer(c).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (1.0 if name == "tok_emb.weight" else 0.5 / math.sqrt(p.size(1))))
    return model


@pytest.mark.parametrize("variant", ["FLT", "LT_ia", "LT_i", "FLT_res", "LT"])
def test_second_loop_is_the_variant_tables_equation(variant):
    model = random_looped(variant)
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        (_, _), (h, _) = model.loops(idx)
        logits, _ = model(idx)
        h_ref, logits_ref = two_loops(model.state_dict(), model.config, idx)
    assert (h - h_ref).abs().max() < 1e-10, (h - h_ref).abs().max()
    assert (logits - logits_ref).abs().max() < 1e-5    # the model returns float32 logits


# -----------------------------------------------------------------------------
# The authors' RoPE: the same function up to a permutation of W_Q and W_K rows

def authors_to_ours(w, n_head):
    """An authors' c_q or c_k weight (n_head * hd, C) in looped.py's row order. Their pair
    (i, i + hd/2), rotated by -theta_i, is our pair (2i + 1, 2i), rotated by +theta_i:
    our row 2i is their row i + hd/2, our row 2i + 1 their row i, in every head."""
    hd = w.size(0) // n_head
    i = torch.arange(hd // 2)
    perm = torch.stack([i + hd // 2, i], dim=1).flatten()          # [hd/2, 0, hd/2+1, 1, ...]
    return w.view(n_head, hd, -1)[:, perm].reshape(w.shape)


def test_authors_half_split_rope_gives_our_logits_after_the_row_permutation():
    model = random_looped("FLT", seed=3)
    c, idx = model.config, torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(2))
    theirs = {k: v.clone() for k, v in model.state_dict().items()}  # random weights in the authors' layout
    ours = {k: authors_to_ours(v, c.n_head) if k.endswith(("W_Q.weight", "W_K.weight")) else v
            for k, v in theirs.items()}
    with torch.no_grad():
        h_theirs, want = two_loops(theirs, c, idx, rope=rope_authors)   # the authors' model, their convention
        model.load_state_dict(ours)
        (_, _), (h, _) = model.loops(idx)
        got, _ = model(idx)
        _, unpermuted = two_loops(theirs, c, idx, rope=rope_ours)       # their weights read without the permutation
    assert (h - h_theirs).abs().max() < 1e-10, (h - h_theirs).abs().max()
    assert (got - want).abs().max() < 1e-5                             # float32 logits
    assert (unpermuted - want).abs().max() > 1e-2                      # the permutation is needed


# -----------------------------------------------------------------------------
# model.py: one attention layer with Amos et al.'s tied init, by hand

def layer_norm(x, w, b):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + 1e-5) * w + b


def one_layer_encoder(sd, c, idx, pe):
    """ln_f(y + mlp(LN2(y))), y = x + W_O softmax(Q K^T / sqrt(hd)) V with Q, K, V = W_{Q,K,V} LN1(x),
    x = token embedding + pe, the sinusoidal table."""
    d, hd = c.n_embd, c.n_embd // c.n_head
    lin = lambda x, name: x @ sd[name + ".weight"].T + sd[name + ".bias"]   # noqa: E731
    heads = lambda y: y.view(B, T, c.n_head, hd).transpose(1, 2)           # noqa: E731
    x = sd["tok_emb.weight"][idx] + pe
    xn = layer_norm(x, sd["blocks.0.ln_1.weight"], sd["blocks.0.ln_1.bias"])
    q, k, v = (heads(lin(xn, f"blocks.0.attn.{n}")) for n in ("W_Q", "W_K", "W_V"))
    att = (q @ k.transpose(-2, -1) / math.sqrt(hd)).softmax(-1)
    y = x + lin((att @ v).transpose(1, 2).reshape(B, T, d), "blocks.0.attn.W_O")
    yn = layer_norm(y, sd["blocks.0.ln_2.weight"], sd["blocks.0.ln_2.bias"])
    y = y + lin(torch.nn.functional.gelu(lin(yn, "blocks.0.mlp.fc")), "blocks.0.mlp.proj")
    return layer_norm(y, sd["ln_f.weight"], sd["ln_f.bias"])


def test_attention_layer_with_tied_init_is_its_equation():
    torch.manual_seed(0)
    c = TransformerConfig(vocab_size=V, max_len=T, n_layer=1, n_head=2, n_embd=16, init="amos")
    model = Transformer(c).double().eval()
    sd = model.state_dict()
    for n in ("W_K", "W_V", "W_O"):                                 # the tied init: four copies of one layer
        for p in ("weight", "bias"):
            assert torch.equal(sd[f"blocks.0.attn.{n}.{p}"], sd[f"blocks.0.attn.W_Q.{p}"])
    cos, sin = cos_sin(c.n_embd)
    pe = torch.stack([sin, cos], dim=-1).flatten(-2)  # PE[p, 2i] = sin(p theta_i), [p, 2i+1] = cos
    assert (model.pe[:T] - pe).abs().max() < 1e-6                   # made in float32 by another formula
    pe = model.pe[:T]                                               # so the layer is held at float64 precision
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        err = (model(idx) - one_layer_encoder(sd, c, idx, pe)).abs().max()
        assert err < 1e-10, err
        # W_Q = W_K makes the scores symmetric: a query swapped with its key would pass at init.
        # Untie them (as the first step of training does) and hold the same equation.
        model.blocks[0].attn.W_K.weight.add_(0.5 * torch.randn_like(model.blocks[0].attn.W_K.weight))
        err = (model(idx) - one_layer_encoder(model.state_dict(), c, idx, pe)).abs().max()
        assert err < 1e-10, err
