"""
A looped Transformer language model with the two switches of "Simply Stabilizing
the Loop via a Fully Looped Transformer" (FLT, 2026).

A looped Transformer reuses one stack of n_layer blocks for n_loops loops. The
paper reports that plain looping collapses at 9-12 loops (loss back to the unigram
level, the residual stream's norm exploding, oscillating gradients); train_flt.py
measures whether it does here. FLT adds two parameter-free changes, here two
booleans of one loop body:

  fla  Full-Loop Access: the previous loop's final state h = norm(x_L^(t-1))
       reaches EVERY layer of the next loop, not only its start.
  ai   Attention Injection: h enters a layer as the attention QUERY,
       Q = W_Q norm(h), while keys and values come from the stream,
       K, V = W_K norm(x), W_V norm(x); instead of being added to the stream.

In the paper's symbols, h^(t)_l is the stream after layer l of loop t (x here, after
self.blocks[l - 1]) and h^(t-1)_L the previous loop's final state (h here, taken after
the final norm); z^(t)_l, the input of layer l's keys and values, is norm(x) here.

The five variants of the paper are presets of three settings of that loop body
(VARIANTS): `start`, where loop t>1 starts (h, norm(x0 + h) or norm(x0): what tells
the baselines LT and LT_i apart), and the two switches fla and ai:

| variant | loop t>1 starts from | previous final state h = norm(x_L^(t-1)) enters | at which layers |
|---|---|---|---|
| LT (original) | h | not at all (it is the start) | - |
| LT_i (input injection) | norm(x0 + h) | added at the start | first |
| LT_ia (AI, first layer) | norm(x0) | as attention query | layer 0 only |
| FLT_res (FLA only) | norm(x0) | x = norm(x + h) before each block | every layer |
| FLT (FLA + AI) | norm(x0) | attention with Q = W_Q norm(h), K,V = W_K,W_V norm(x) | every layer |

Loop 1 is always plain self-attention on norm(x0), x0 = token embedding, so with
n_loops=1 the five variants are the same function of the same weights and all
have the same parameters (no setting adds any).

Read top to bottom:
  LoopedConfig        sizes, the variant, the loss over loops (END / STEP / FEW)
  rope_tables, apply_rope   rotary positions (RoPE)
  norm                parameter-free RMSNorm
  Attention           separate query input and key/value input; RoPE; causal SDPA
  MLP, Block          pre-norm residual block, zero-initialised output projections
  LoopedTransformer   loops() is THE loop (all five variants), forward() adds the
                      loss, generate() samples, configure_optimizers() is the AdamW
                      baseline's (the authors' Muon recipe is train_flt.py's)

Choices, following the authors' nanochat-based code: rotary positions (RoPE) in
every attention (nothing is added to the stream, so looping never re-adds a
position vector); QK-norm, the parameter-free norm of each head's queries and keys
after RoPE (qk_norm); the logits soft-capped, softcap * tanh(logits / softcap),
softcap = 15; no biases; zero-initialised output projections, so at
initialisation every block is the identity; an untied lm head initialised
N(0, lm_head_std^2), lm_head_std = 1e-3 (nearly uniform logits). QK-norm and the
softcap add no parameters; qk_norm=False, softcap=0, lm_head_std=0 switch the three
off (a plain pre-norm Transformer with a zero lm head, the model of train_flt.py's
AdamW baseline recipe). The final norm is the same parameter-free norm, so the
final state h of loop t is also what the shared lm head reads to give that loop's
logits.

RoPE convention: apply_rope rotates the interleaved pairs (x[2i], x[2i+1]) of each
head by +p*theta_i. The authors' nanochat/gpt.py (apply_rotary_emb) rotates the
half-split pairs (x[i], x[i + hd/2]) by -p*theta_i: the same attention once the rows
of W_Q and W_K are permuted in every head, our row 2i their row i + hd/2, our row
2i+1 their row i (tests/test_faithful.py checks it). To load their checkpoint, map
c_q, c_k, c_v, c_proj, c_fc, mlp.c_proj, wte to W_Q, W_K, W_V, W_O, fc, proj, tok_emb,
drop the padded vocabulary rows of wte and lm_head, and permute (hd = n_embd / n_head):
    i = torch.arange(hd // 2); perm = torch.stack([i + hd // 2, i], dim=1).flatten()
    W_Q = c_q.view(n_head, hd, n_embd)[:, perm].reshape(n_embd, n_embd)   # W_K from c_k alike
Their RMSNorm eps is F.rms_norm's default, the dtype's machine epsilon (float32: 1.2e-7).

This file imports only torch and the standard library (it carries its own RoPE),
so it can be copied alone into another project.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

# variant -> (start: what loop t>1 starts from, fla, ai): one setting and two switches; the table above.
# The authors' sixth variant, FLT_rl (FLT with every loop's loss), is variant="FLT", loss_type="STEP".
VARIANTS = {
    "LT":      ("h",    False, False),
    "LT_i":    ("x0+h", False, False),
    "LT_ia":   ("x0",   False, True),
    "FLT_res": ("x0",   True,  False),
    "FLT":     ("x0",   True,  True),
}
LOSS_TYPES = ("END", "STEP", "FEW")


@dataclass
class LoopedConfig:
    vocab_size: int = 256      # bytes by default
    block_size: int = 1024     # longest context
    n_layer: int = 2           # blocks in the shared stack (L)
    n_loops: int = 12          # times the stack is applied in training (K)
    n_head: int = 4
    n_embd: int = 128
    ffn_mult: int = 4          # MLP hidden width = ffn_mult * n_embd
    variant: str = "FLT"       # LT, LT_i, LT_ia, FLT_res, FLT (the table above)
    loss_type: str = "END"     # END: last loop; STEP: mean over loops; FEW: last third (not LT_i, LT_ia)
    norm_eps: float = 1e-6
    qk_norm: bool = True       # norm(q), norm(k) per head after RoPE
    softcap: float = 15.0      # logits -> softcap * tanh(logits / softcap); 0 = no cap
    lm_head_std: float = 1e-3  # lm head init N(0, std^2); 0 = zero

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"variant={self.variant!r} is unknown; choose one of {list(VARIANTS)}")
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type={self.loss_type!r} is unknown; choose one of {LOSS_TYPES}")
        if self.n_embd % self.n_head != 0 or (self.n_embd // self.n_head) % 2 != 0:
            raise ValueError(f"n_embd={self.n_embd} / n_head={self.n_head} must be an even "
                             f"integer head size (RoPE rotates pairs)")
        for name in ("vocab_size", "block_size", "n_layer", "n_loops", "n_head", "n_embd", "ffn_mult"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")
        for name in ("softcap", "lm_head_std"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0 (0 switches it off)")

    @property
    def start(self):
        return VARIANTS[self.variant][0]

    @property
    def fla(self):
        return VARIANTS[self.variant][1]

    @property
    def ai(self):
        return VARIANTS[self.variant][2]


def loss_loops(loss_type, n_loops, variant="FLT"):
    """Indices (0-based) of the loops whose losses are averaged:
    END -> [K-1];  STEP -> 0..K-1;  FEW -> the last ceil(K/3) loops.
    LT_i and LT_ia always take the last loop only, as in the authors' code."""
    if loss_type == "END" or variant in ("LT_i", "LT_ia"):
        return [n_loops - 1]
    if loss_type == "STEP":
        return list(range(n_loops))
    if loss_type == "FEW":
        return list(range(n_loops - math.ceil(n_loops / 3), n_loops))
    raise ValueError(f"loss_type={loss_type!r}; choose one of {LOSS_TYPES}")


def rope_tables(n_pos, head_dim):
    """RoPE (Su et al. 2021): the cos and sin of angle p * theta_i for position p and
    pair i, theta_i = 10000^(-2i / head_dim); two tensors (n_pos, head_dim / 2)."""
    theta = 10000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.arange(n_pos, dtype=torch.float32)[:, None] * theta
    return torch.cos(angles), torch.sin(angles)


def apply_rope(x, cos, sin):
    """Rotate each pair (x[..., 2i], x[..., 2i+1]) of x (B, H, T, head_dim) by its angle."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def norm(x, eps=1e-6):
    """Parameter-free RMSNorm: norm(x) = x / sqrt(mean(x^2) + eps). Every token
    vector comes out with L2 norm sqrt(n_embd)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


# -----------------------------------------------------------------------------
# The blocks

class Attention(nn.Module):
    """Causal multi-head attention with separate inputs for queries and keys/values:
        Q = W_Q xq,  K = W_K xkv,  V = W_V xkv,  out = W_O softmax(Q K^T / sqrt(d) + causal) V.
    Self-attention is xq = xkv; FLT's attention injection is xq = norm(h)."""

    def __init__(self, config):
        super().__init__()
        d = config.n_embd
        self.n_head, self.head_dim = config.n_head, d // config.n_head
        self.qk_norm, self.eps = config.qk_norm, config.norm_eps
        self.W_Q = nn.Linear(d, d, bias=False)
        self.W_K = nn.Linear(d, d, bias=False)
        self.W_V = nn.Linear(d, d, bias=False)
        self.W_O = nn.Linear(d, d, bias=False)

    def split_heads(self, x):                                   # (B, T, C) -> (B, H, T, hd)
        B, T, _ = x.shape
        return x.view(B, T, self.n_head, self.head_dim).transpose(1, 2)

    def forward(self, xq, xkv, rope):
        # AI: a^(t)_l = Attention(Q = W_Q h^(t-1)_L, K = W_K z^(t)_l, V = W_V z^(t)_l). Block passes
        # xkv = z^(t)_l = norm(x), and xq = norm(h) = h^(t-1)_L under AI (h is already normed), else xq = xkv
        q = apply_rope(self.split_heads(self.W_Q(xq)), *rope)   # Q = W_Q xq (AI: W_Q h^(t-1)_L), RoPE
        k = apply_rope(self.split_heads(self.W_K(xkv)), *rope)  # K = W_K z^(t)_l, RoPE
        if self.qk_norm:
            q, k = norm(q, self.eps), norm(k, self.eps)         # QK-norm, after RoPE as nanochat
        v = self.split_heads(self.W_V(xkv))                     # V = W_V z^(t)_l
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.W_O(y.transpose(1, 2).reshape(xkv.shape))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, config.ffn_mult * config.n_embd, bias=False)
        self.proj = nn.Linear(config.ffn_mult * config.n_embd, config.n_embd, bias=False)

    def forward(self, x):
        return self.proj(F.relu(self.fc(x)).square())           # ReLU^2, as nanochat


class Block(nn.Module):
    """Pre-norm block. Without a query input: x += attn(norm(x), norm(x)).
    With one (attention injection): x += attn(norm(q), norm(x)). Then x += mlp(norm(x))."""

    def __init__(self, config):
        super().__init__()
        self.eps = config.norm_eps
        self.attn = Attention(config)
        self.mlp = MLP(config)

    def forward(self, x, rope, q=None):
        xn = norm(x, self.eps)
        x = x + self.attn(xn if q is None else norm(q, self.eps), xn, rope)   # AI (q = h given): a^(t)_l
        return x + self.mlp(norm(x, self.eps))


# -----------------------------------------------------------------------------
# The model

class LoopedTransformer(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.n_embd)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        cos, sin = rope_tables(c.block_size, c.n_embd // c.n_head)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self):
        """nanochat's initialisation: embeddings N(0, 1); input projections uniform
        with std 1/sqrt(fan_in); W_O and the MLP's out projection zero; the lm head
        N(0, lm_head_std^2) (zero when lm_head_std = 0)."""
        nn.init.normal_(self.tok_emb.weight, std=1.0)
        for name, p in self.named_parameters():
            if name.endswith(("attn.W_O.weight", "mlp.proj.weight")):
                nn.init.zeros_(p)
            elif name == "lm_head.weight":
                nn.init.normal_(p, std=self.config.lm_head_std) if self.config.lm_head_std else nn.init.zeros_(p)
            elif p.dim() == 2 and name != "tok_emb.weight":
                bound = math.sqrt(3.0 / p.size(1))              # uniform(-b, b) has std 1/sqrt(fan_in)
                nn.init.uniform_(p, -bound, bound)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    # --- THE loop: one body, five variants

    def loops(self, idx, n_loops=None, h=None):
        """Run the looped stack; yield, after every loop t = 0..n_loops-1, the pair
        (h, x): h = norm(x_L^(t)) the loop's final state (what the lm head reads and
        what the next loop receives), x = the residual stream before that norm.
        The first loop is plain self-attention on norm(x0), unless a previous state
        h (B, T, n_embd) is given: then every loop is a "loop t>1" continuing from it
        (for probes of the wiring, or to loop on from a saved state)."""
        c = self.config
        n_loops = c.n_loops if n_loops is None else n_loops
        B, T = idx.shape
        if T > c.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size={c.block_size}")
        rope = (self.rope_cos[:T], self.rope_sin[:T])
        eps = c.norm_eps
        x0 = self.tok_emb(idx)                                  # x0 = token embedding
        for _ in range(n_loops):
            # where the loop starts (loop 1, which has no h yet, always from norm(x0))
            if h is None or c.start == "x0":
                x = norm(x0, eps)                               # norm(x0)
            elif c.start == "h":
                x = h                                           # LT: the previous final state
            else:
                x = norm(x0 + h, eps)                           # LT_i: norm(x0 + h)
            for i, block in enumerate(self.blocks):
                # FLA: h^(t)_l = f_theta^(l)(h^(t)_{l-1}, h^(t-1)_L) at every layer l = i + 1, with h^(t)_l = x
                # after block i and h^(t-1)_L = h: block i reads x and h, h as the query (FLT) or through
                # x = norm(x + h) (FLT_res). Without FLA, h reaches block 0 only (LT_ia) or no block (LT, LT_i).
                q = None                                        # plain self-attention unless h enters here
                if h is not None and (c.fla or i == 0):         # h reaches layer i: every layer with FLA
                    if c.ai:
                        q = h                                   # AI: Q = W_Q norm(h), K,V = W_K,W_V norm(x)
                    elif c.fla:
                        x = norm(x + h, eps)                    # FLT_res: x = norm(x + h) before each block
                x = block(x, rope, q)
            h = norm(x, eps)                                    # h = norm(x_L^(t)), also the final norm
            yield h, x

    def logits(self, h):
        """The shared lm head on a loop's final state, soft-capped (float32)."""
        logits = self.lm_head(h).float()
        cap = self.config.softcap
        return cap * torch.tanh(logits / cap) if cap else logits

    def forward(self, idx, targets=None, n_loops=None, return_stats=False):
        """logits (B, T, vocab) of the last loop and the loss (None without targets).
        The loss averages the cross-entropy of the loops chosen by config.loss_type
        (END / STEP / FEW, see loss_loops), each loop read by the shared lm head.
        Targets equal to -1 are ignored (positions that carry no loss).
        With return_stats=True also a dict with 'residual_norms': tensor (n_loops,),
        the mean over tokens of ||x_L^(t)||_2 before the final norm, per loop."""
        n_loops = self.config.n_loops if n_loops is None else n_loops
        c = self.config
        chosen = set(loss_loops(c.loss_type, n_loops, c.variant)) if targets is not None else set()
        losses, res_norms = [], []
        for t, (h, x) in enumerate(self.loops(idx, n_loops)):
            res_norms.append(x.detach().float().norm(dim=-1).mean())
            if t in chosen:
                logits_t = self.logits(h)
                losses.append(F.cross_entropy(logits_t.view(-1, logits_t.size(-1)), targets.reshape(-1),
                                              ignore_index=-1))
        logits = logits_t if targets is not None else self.logits(h)
        loss = torch.stack(losses).mean() if losses else None
        if return_stats:
            return logits, loss, {"residual_norms": torch.stack(res_norms)}
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, n_loops=None):
        """Sample max_new_tokens tokens after the prompt idx (B, T), nanoGPT style."""
        for _ in range(max_new_tokens):
            context = idx[:, -self.config.block_size:]
            logits, _ = self(context, n_loops=n_loops)
            logits = logits[:, -1, :] / max(temperature, 1e-8)
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            next_id = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, next_id), dim=1)
        return idx

    # --- optimisation

    def configure_optimizers(self, weight_decay, learning_rate, betas=(0.9, 0.95), eps=1e-8, device_type="cpu"):
        """A plain AdamW recipe ("adamw"): one AdamW; weight decay on the linear layers' matrices
        only, lm head included, not on the embedding (this model has no norm weights
        and no biases). Fused kernel on CUDA."""
        decay = [p for n, p in self.named_parameters() if p.requires_grad and p.dim() >= 2 and "emb" not in n]
        no_decay = [p for n, p in self.named_parameters() if p.requires_grad and not (p.dim() >= 2 and "emb" not in n)]
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, eps=eps, fused=(device_type == "cuda"))
