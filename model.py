"""
A compact Transformer encoder for sequence classification and masked-token
reconstruction: the model of "Towards Understanding Self-Pretraining for
Sequence Classification" (Coser, Zollo, Soda, Orvieto, 2026).

Read top to bottom:
  TransformerConfig    every size and choice of the model, one dataclass
  positional encodings sinusoidal (additive, the paper's default), learned, RoPE, ALiBi, none
  pixel_features       Amos et al.'s pixel input for the linear pixel encoder: grey value
                       in [-1, 1] and a mask-indicator channel
  SelfAttention        W_Q, W_K, W_V, W_O as separately named projections, so an ablation can
                       pick "the query-key weights" by name; init="amos" starts them as copies
  MLP, Block           pre-LayerNorm residual block
  Transformer          embeddings -> blocks -> final norm, then two heads:
                       classify() (pooled -> class logits) and
                       reconstruct() (per-token -> vocabulary logits, for SPT)
  select_params        parameter groups (qk, qkv, attn, mlp, emb, norm, head)
                       used by freezing and hybrid initialisation

Conventions: `idx` is a LongTensor (B, T) of token ids; `pad_mask` is an optional
BoolTensor (B, T) that is True where the position is PADDING. Padded positions
are never attended to, never pooled, and change no output of a real token.

Training uses F.scaled_dot_product_attention (fused kernels); forward_with_maps runs an
explicit softmax that also returns the attention maps: both compute the same function.

This file imports only torch, so it can be copied into another project alone.
"""

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

POS_ENCODINGS = ("sinusoidal", "learned", "rope", "alibi", "none")
POOLINGS = ("mean", "max", "last", "cls")
INITS = ("torch", "gpt2", "amos")
PIXEL_ENCODERS = ("token", "linear")


@dataclass
class TransformerConfig:
    vocab_size: int = 258      # token ids 0..vocab_size-1 (incl. pad and mask ids)
    n_classes: int = 2
    max_len: int = 1024        # longest sequence (the cls pool adds one position)
    n_layer: int = 1           # depth
    n_head: int = 4
    n_embd: int = 64
    ffn_mult: int = 2          # MLP hidden width = ffn_mult * n_embd
    dropout: float = 0.0
    pos_enc: str = "sinusoidal"
    pool: str = "mean"
    pair: bool = False         # two-document input (LRA Retrieval): head sees [u, v, u*v, u-v]
    init: str = "torch"        # torch: PyTorch's default layer init; gpt2: N(0, 0.02), output
                               # projections scaled by depth; amos: PyTorch's defaults with
                               # W_Q = W_K = W_V = W_O at the start (Amos et al.'s code)
    pixel_encoder: str = "token"   # token: one nn.Embedding row per id; linear: Amos et al.'s
                                   # nn.Linear(2, n_embd) on [grey value in [-1, 1], is-masked]
    pixel_levels: int = 256    # linear: ids 0..pixel_levels-1 are grey levels, the SPT targets
    mask_id: int = 257         # linear: the [MASK] id, read as the mask-indicator channel

    def __post_init__(self):
        for name, allowed in (("init", INITS), ("pos_enc", POS_ENCODINGS), ("pixel_encoder", PIXEL_ENCODERS),
                              ("pool", POOLINGS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} is unknown; choose one of {allowed}")
        if self.pixel_encoder == "linear" and not 2 <= self.pixel_levels <= self.mask_id < self.vocab_size:
            raise ValueError(f"pixel_encoder='linear' reads ids 0..pixel_levels-1 as grey levels and mask_id "
                             f"as [MASK]: it needs 2 <= pixel_levels <= mask_id < vocab_size, got pixel_levels="
                             f"{self.pixel_levels}, mask_id={self.mask_id}, vocab_size={self.vocab_size}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                             f"pick n_embd as a multiple of n_head")
        if self.pos_enc == "rope" and (self.n_embd // self.n_head) % 2 != 0:
            raise ValueError(f"pos_enc='rope' needs an even head size, got n_embd/n_head={self.n_embd // self.n_head}")
        for name in ("vocab_size", "n_classes", "max_len", "n_layer", "n_head", "n_embd", "ffn_mult",
                     "pixel_levels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")


# -----------------------------------------------------------------------------
# Positional encodings

def sinusoidal_table(n_pos, dim):
    """Vaswani et al. (2017): PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...)."""
    pos = torch.arange(n_pos, dtype=torch.float32)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    table = torch.zeros(n_pos, dim)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return table


def rope_tables(n_pos, head_dim):
    """RoPE (Su et al. 2021): rotate each (even, odd) pair of q and k by angle p * theta_i."""
    theta = 10000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.arange(n_pos, dtype=torch.float32)[:, None] * theta   # (T, head_dim/2)
    return torch.cos(angles), torch.sin(angles)


def apply_rope(x, cos, sin):
    """x: (B, H, T, head_dim). Rotates the pairs (x[..., 2i], x[..., 2i+1])."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.flatten(-2)


def alibi_bias(n_pos, n_head):
    """ALiBi (Press et al. 2022), symmetric for an encoder: score_ij -= m_h * |i - j|,
    with head slopes m_h = 2^(-8 h / H), h = 1..H."""
    slopes = 2.0 ** (-8.0 * torch.arange(1, n_head + 1, dtype=torch.float32) / n_head)
    pos = torch.arange(n_pos, dtype=torch.float32)
    dist = (pos[None, :] - pos[:, None]).abs()
    return -slopes[:, None, None] * dist                                  # (H, T, T)


# -----------------------------------------------------------------------------
# Pixel inputs, as Amos et al. feed them (src/dataloaders/lra.py, PathFinderLMDataset)

def pixel_features(idx, levels=256, mask_id=257):
    """(B, T) ids -> (B, T, 2): [v * (1 - m), m], v = 2 g / (levels - 1) - 1 the grey level g
    in [-1, 1] (torchvision's ToTensor then Normalize(0.5, 0.5)), m = 1 at a masked pixel.
    A masked pixel reads [0, 1] whatever was under it; any other id (padding) [0, 0]."""
    grey = idx.float() * (2.0 / (levels - 1)) - 1.0
    value = torch.where(idx < levels, grey, torch.zeros_like(grey))
    return torch.stack([value, (idx == mask_id).float()], dim=-1)


# -----------------------------------------------------------------------------
# The blocks

class SelfAttention(nn.Module):
    """Multi-head self-attention, Vaswani et al. eq. (1):
        A = softmax(Q K^T / sqrt(d_head) + bias),  out = (A V) W_O,
        Q = x W_Q, K = x W_K, V = x W_V."""

    def __init__(self, config):
        super().__init__()
        d = config.n_embd
        self.n_head, self.head_dim = config.n_head, d // config.n_head
        if config.init == "amos":   # Amos et al.'s mhfa: clones(nn.Linear(d, d), 4), four deep
            one = nn.Linear(d, d)   # copies of one layer (weights and biases), never re-drawn
            self.W_Q, self.W_K, self.W_V, self.W_O = (copy.deepcopy(one) for _ in range(4))
        else:
            self.W_Q, self.W_K, self.W_V, self.W_O = (nn.Linear(d, d) for _ in range(4))
        self.dropout = config.dropout
        self.resid_drop = nn.Dropout(config.dropout)

    def split_heads(self, x):                                   # (B, T, C) -> (B, H, T, hd)
        B, T, _ = x.shape
        return x.view(B, T, self.n_head, self.head_dim).transpose(1, 2)

    def forward(self, x, bias=None, rope=None, return_attn=False):
        """bias: additive score bias broadcastable to (B, H, T, T), -inf at padded keys.
        rope: (cos, sin) tables or None. Returns (output, attention maps or None)."""
        q, k, v = self.split_heads(self.W_Q(x)), self.split_heads(self.W_K(x)), self.split_heads(self.W_V(x))
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        att = None
        if return_attn:                                         # explicit path, for analysis
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
            att = F.softmax(scores if bias is None else scores + bias, dim=-1)
            y = F.dropout(att, self.dropout, self.training) @ v
        else:                                                   # fused path, for training
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias,
                                               dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(x.shape)                  # concatenate heads
        return self.resid_drop(self.W_O(y)), att


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden = config.ffn_mult * config.n_embd
        self.fc = nn.Linear(config.n_embd, hidden)
        self.proj = nn.Linear(hidden, config.n_embd)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm residual block: x += attn(LN(x)); x += mlp(LN(x))."""

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = SelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x, bias=None, rope=None, return_attn=False):
        a, att = self.attn(self.ln_1(x), bias, rope, return_attn)
        x = x + a
        return x + self.mlp(self.ln_2(x)), att


# -----------------------------------------------------------------------------
# The model

class Transformer(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = c = config
        n_pos = c.max_len + (1 if c.pool == "cls" else 0)
        if c.pixel_encoder == "linear":   # Amos et al.'s `encoder: linear`
            self.pix_emb = nn.Linear(2, c.n_embd)
        else:
            self.tok_emb = nn.Embedding(c.vocab_size, c.n_embd)
        if c.pos_enc == "learned":
            self.pos_emb = nn.Embedding(n_pos, c.n_embd)
        if c.pos_enc == "sinusoidal":
            self.register_buffer("pe", sinusoidal_table(n_pos, c.n_embd), persistent=False)
        if c.pos_enc == "rope":
            cos, sin = rope_tables(n_pos, c.n_embd // c.n_head)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        if c.pos_enc == "alibi":
            self.register_buffer("alibi", alibi_bias(n_pos, c.n_head), persistent=False)
        if c.pool == "cls":
            self.cls_token = nn.Parameter(torch.zeros(c.n_embd))
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.n_embd)
        if c.pair:   # LRA Retrieval: an MLP over [u, v, u*v, u-v]
            self.head = nn.Sequential(nn.Linear(4 * c.n_embd, c.n_embd), nn.GELU(), nn.Linear(c.n_embd, c.n_classes))
        else:
            self.head = nn.Linear(c.n_embd, c.n_classes)
        # masked-token reconstruction: every id, or (linear pixels) the grey levels, 256-way as theirs
        self.lm_head = nn.Linear(c.n_embd, c.pixel_levels if c.pixel_encoder == "linear" else c.vocab_size)
        if c.init == "gpt2":          # "torch" and "amos" keep the layers' own defaults
            self.apply(self._init_gpt2)
            for name, p in self.named_parameters():   # nanoGPT: scale residual projections by depth
                if name.endswith(("attn.W_O.weight", "mlp.proj.weight")):
                    nn.init.normal_(p, std=0.02 / math.sqrt(2 * c.n_layer))
            if c.pixel_encoder == "linear":           # the pixel encoder is the embedding here
                nn.init.normal_(self.pix_emb.weight, std=1 / math.sqrt(2))

    # PyTorch's defaults (init="torch"): nn.Linear weight and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
    # nn.Embedding N(0, 1). Scores q.k/sqrt(d_head) then have std ~0.3: attention starts random,
    # not uniform. With init="gpt2" (std 0.02) they have std ~0.03 and attention starts uniform,
    # the premise of the paper's zero-gradient argument. With init="amos" W_Q = W_K, so per head
    # the score of query i and key j is q_i . q_j / sqrt(d_head), a positive semi-definite form:
    # a query scores itself |q_i|^2 >= 0 and inputs like its own (its neighbours, through the
    # sinusoidal encoding) above the rest. Attention starts local: 1.3-3x the uniform mass on
    # itself and its neighbours (tools/attention_at_init.py).

    def _init_gpt2(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            # Token and learned position vectors start at the scale of the sinusoidal
            # table (rms 1/sqrt(2) per coordinate), so neither drowns the other.
            nn.init.normal_(module.weight, std=1 / math.sqrt(2))

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    # --- the encoder

    def _check_input(self, idx):
        """A too-long sequence or an id outside the vocabulary, in one line that says what to do.
        The id check reads the values on the host, so it runs on the CPU only (CUDA asserts)."""
        c = self.config
        if idx.size(-1) > c.max_len:
            raise ValueError(f"sequence length {idx.size(-1)} exceeds max_len={c.max_len}; "
                             f"build the model with a larger max_len or truncate the input")
        if idx.device.type == "cpu" and idx.numel() and (idx.min() < 0 or idx.max() >= c.vocab_size):
            bad = idx[(idx < 0) | (idx >= c.vocab_size)][0].item()
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {c.vocab_size}); "
                             f"set vocab_size to cover every id (pad and mask included)")

    def embed(self, idx):
        """Token embeddings (or the linear pixel encoding) plus the additive positional
        encoding (sinusoidal or learned)."""
        c = self.config
        if c.pixel_encoder == "linear":
            x = self.pix_emb(pixel_features(idx, c.pixel_levels, c.mask_id).to(self.pix_emb.weight.dtype))
        else:
            x = self.tok_emb(idx)
        if c.pool == "cls":   # prepend a learned [CLS] vector at position 0
            x = torch.cat([self.cls_token.expand(x.size(0), 1, -1), x], dim=1)
        if c.pos_enc == "sinusoidal":
            x = x + self.pe[:x.size(1)]
        elif c.pos_enc == "learned":
            x = x + self.pos_emb.weight[:x.size(1)]
        return self.drop(x)

    def _attention_bias(self, pad_mask, T, dtype, causal=False):
        """Additive score bias (B or 1, H or 1, T, T): ALiBi distances, -inf at padded
        keys, and -inf above the diagonal for a causal (next-token) objective."""
        bias = self.alibi[:, :T, :T].to(dtype)[None] if self.config.pos_enc == "alibi" else None
        if causal:
            future = torch.full((T, T), float("-inf"), dtype=dtype, device=self.lm_head.weight.device).triu(1)
            bias = future if bias is None else bias + future
        if pad_mask is not None:
            if self.config.pool == "cls":   # the [CLS] position is always real
                pad_mask = F.pad(pad_mask, (1, 0), value=False)
            key_pad = torch.zeros_like(pad_mask, dtype=dtype).masked_fill(pad_mask, float("-inf"))[:, None, None, :]
            bias = key_pad if bias is None else bias + key_pad
        return bias

    def encode(self, idx, pad_mask=None, return_attn=False, causal=False):
        """All hidden states after the final norm, [CLS] included when pool='cls'.
        causal=True lets position i attend only to j <= i (next-token SPT)."""
        self._check_input(idx)
        x = self.embed(idx)
        T = x.size(1)
        bias = self._attention_bias(pad_mask, T, x.dtype, causal)
        rope = (self.rope_cos[:T], self.rope_sin[:T]) if self.config.pos_enc == "rope" else None
        maps = []
        for block in self.blocks:
            x, att = block(x, bias, rope, return_attn)
            maps.append(att)
        return self.ln_f(x), maps

    def forward(self, idx, pad_mask=None, causal=False):
        """Final hidden states (B, T, n_embd) of the tokens."""
        h, _ = self.encode(idx, pad_mask, causal=causal)
        return h[:, 1:] if self.config.pool == "cls" else h

    def forward_with_maps(self, idx, pad_mask=None, causal=False):
        """forward's hidden states and the list of per-layer attention maps (B, H, T', T'),
        T' = T (+1 with a [CLS]), computed with an explicit softmax."""
        h, maps = self.encode(idx, pad_mask, return_attn=True, causal=causal)
        return (h[:, 1:] if self.config.pool == "cls" else h), maps

    # --- the two heads

    def pool(self, h, pad_mask=None):
        """Sequence vector (B, n_embd) from hidden states (B, T, n_embd), pads excluded."""
        how = self.config.pool
        if how == "cls":
            return h[:, 0]
        if pad_mask is None:
            pad_mask = torch.zeros(h.shape[:2], dtype=torch.bool, device=h.device)
        real = (~pad_mask).unsqueeze(-1).to(h.dtype)                     # (B, T, 1)
        if how == "mean":
            return (h * real).sum(1) / real.sum(1).clamp(min=1)
        if how == "max":
            return h.masked_fill(pad_mask.unsqueeze(-1), float("-inf")).amax(1)
        last = (real.squeeze(-1).sum(1).long() - 1).clamp(min=0)         # index of last real token
        return h[torch.arange(h.size(0), device=h.device), last]

    def sequence_vector(self, idx, pad_mask=None):
        h, _ = self.encode(idx, pad_mask)
        return self.pool(h, pad_mask)

    def classify(self, idx, pad_mask=None):
        """Class logits (B, n_classes). With config.pair, idx and pad_mask have shape
        (B, 2, T): both documents go through the same encoder (LRA Retrieval)."""
        if not self.config.pair:
            return self.head(self.sequence_vector(idx, pad_mask))
        if idx.dim() != 3 or idx.size(1) != 2:
            raise ValueError(f"pair=True expects idx of shape (B, 2, T), got {tuple(idx.shape)}")
        B = idx.size(0)
        flat_mask = None if pad_mask is None else pad_mask.flatten(0, 1)
        u, v = self.sequence_vector(idx.flatten(0, 1), flat_mask).view(B, 2, -1).unbind(1)
        return self.head(torch.cat([u, v, u * v, u - v], dim=-1))

    def reconstruct(self, idx, pad_mask=None, causal=False):
        """Token logits (B, T, vocab_size; pixel_levels with the linear pixel encoder) at
        every position: the masked-token reconstruction head of self-pretraining (the
        loss reads the masked ones).
        causal=True: position t sees only tokens <= t (next-token SPT)."""
        return self.lm_head(self.forward(idx, pad_mask, causal=causal))

    # --- optimisation

    def configure_optimizers(self, weight_decay, learning_rate, betas=(0.9, 0.999), device_type="cpu"):
        """AdamW; weight decay only on matrices of linear layers (not on norms, biases,
        embeddings or the [CLS] vector), as nanoGPT does. Fused kernel on CUDA."""
        params = [(name, p) for name, p in self.named_parameters() if p.requires_grad]
        matrix = lambda name, p: p.dim() >= 2 and "emb" not in name
        groups = [{"params": [p for n, p in params if matrix(n, p)], "weight_decay": weight_decay},
                  {"params": [p for n, p in params if not matrix(n, p)], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=(device_type == "cuda"))


# -----------------------------------------------------------------------------
# Parameter groups, by name, for freezing and hybrid initialisation

PARAM_GROUPS = {
    "qk": ("attn.W_Q.", "attn.W_K."),
    "qkv": ("attn.W_Q.", "attn.W_K.", "attn.W_V."),
    "attn": ("attn.W_Q.", "attn.W_K.", "attn.W_V.", "attn.W_O."),
    "mlp": (".mlp.",),
    "emb": ("tok_emb.", "pix_emb.", "pos_emb.", "cls_token"),
    "norm": (".ln_1.", ".ln_2.", "ln_f."),
    "head": ("head.", "lm_head."),
}


def select_params(model, which):
    """Names of the parameters in a group: one of PARAM_GROUPS, 'all', or a comma list
    such as 'qk,mlp'. attn, mlp, emb, norm and head are disjoint and cover 'all'."""
    names, chosen = [n for n, _ in model.named_parameters()], set()
    for group in (g.strip() for g in which.split(",")):
        if group != "all" and group not in PARAM_GROUPS:
            raise ValueError(f"unknown parameter group {group!r}; choose from "
                             f"{sorted(PARAM_GROUPS) + ['all']} or a comma list of them")
        chosen.update(n for n in names if group == "all" or any(k in "." + n for k in PARAM_GROUPS[group]))
    return [n for n in names if n in chosen]   # in model order
