"""
Attention statistics of "Towards Understanding Self-Pretraining for Sequence
Classification" (claim 6: after SPT the attention is local, a learned proximity
bias), measured rather than only drawn. Plain tensors in, numbers out, so they
work on any attention maps, ours or someone else's:

  proximity_mass      mass within |i - j| <= w on the sequence (1-D), per layer,
                      with what uniform attention over the real keys would give
  proximity_mass_2d   mass within radius r on an image grid (Chebyshev distance:
                      r = 1 is the 3x3 neighbourhood), with its uniform baseline.
                      On a row-major 32x32 image the 1-D statistic sees only
                      horizontal neighbours, counts the row-wrap pair (r, 31)-(r+1, 0)
                      as neighbours and misses the vertical ones at |i - j| = 32
  score_spread        how far attention is from uniform: the std of the scores
                      within a row (from log A) and the mean row entropy of A
  position_scores     the position-only score matrix of a model.Transformer layer:
                      the real query and key (ln_1, W_Q, W_K and their biases) of the
                      position vectors alone, for additive encodings
  toeplitz_stats      how much of a score matrix is a function of i - j alone, and
                      the near-minus-far contrast of that profile
  attention_report    all of the above for one model and its maps, as plain numbers
  attention_at_init   how local a freshly initialised model's attention is, per seed,
                      as multiples of uniform attention (init torch, gpt2, amos)
  plot_attention, plot_proximity, plot_evolution, plot_image_attention   the figures
  Observations        a training run's attention at init, after SPT and finetuned
                      (the tables and figures of run folders: plumbing/spt_report.py)

Imports torch, numpy and (for figures) matplotlib, and from this project only model.py.
"""

import math
import os

import numpy as np
import torch

from model import Transformer

PROX_WIDTHS = (0, 1, 2, 4, 8, 16, 32)
PROX_RADII = (0, 1, 2, 4)


# -----------------------------------------------------------------------------
# Proximity: how much attention falls near the query

def proximity_mass(maps, pad_mask=None, widths=PROX_WIDTHS):
    """maps: list (one per layer) of (B, H, T, T) attention rows summing to 1;
    pad_mask: (B, T) True at padding, or None. Returns {"widths", "layers": per layer
    the mean mass within |i-j| <= w (over examples, heads, real queries), "uniform":
    the same for uniform attention over the real keys}."""
    B, H, T, _ = maps[0].shape
    real = torch.ones(B, T, dtype=torch.bool) if pad_mask is None else ~pad_mask
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs()
    return _mass(maps, real, dist, "widths", widths)


def grid_distance(side):
    """(T, T) Chebyshev distance max(|r_i - r_j|, |c_i - c_j|) between the pixels of a
    side x side image flattened row-major (T = side ** 2)."""
    r, c = torch.arange(side * side) // side, torch.arange(side * side) % side
    return torch.maximum((r[:, None] - r[None, :]).abs(), (c[:, None] - c[None, :]).abs())


def proximity_mass_2d(maps, side=None, radii=PROX_RADII):
    """The 2-D version for images: mass within Chebyshev radius r on the grid (r = 1:
    the 3x3 neighbourhood, itself included). side defaults to sqrt(T). Same output
    as proximity_mass, with "radii" for "widths"."""
    T = maps[0].shape[-1]
    side = side or math.isqrt(T)
    if side * side != T:
        raise ValueError(f"attention over {T} positions is not a square image; give side=")
    dist = grid_distance(side)
    real = torch.ones(maps[0].shape[0], T, dtype=torch.bool)
    return _mass(maps, real, dist, "radii", radii)


def _mass(maps, real, dist, name, values):
    """The masses within dist <= v for each v in values. dist: (T, T) query-key distances.
    Each query's keys are sorted by distance and only the nearest K (those within the
    largest v) gathered, so the (B, H, T, T) maps are read once; a running sum along
    them gives every v's mass. The uniform masses count the real keys in each band."""
    count = real.float()                                             # (B, T) real keys
    out = {name: list(values), "layers": [], "uniform": []}
    for v in values:
        in_band = count @ (dist <= v).float().T                       # (B, T): real keys within v of each query
        out["uniform"].append((in_band / count.sum(-1, keepdim=True))[real].mean().item())
    near = dist <= max(values)
    idx = torch.argsort(dist, dim=-1, stable=True)[:, :int(near.sum(-1).max())]     # (T, K) nearest first
    n_within = [(dist.gather(-1, idx) <= v).sum(-1) - 1 for v in values]          # (T,) last index within v
    for m in maps:
        run = m.gather(-1, idx.expand(*m.shape[:2], *idx.shape)).cumsum(-1)      # (B, H, T, K)
        out["layers"].append([run.gather(-1, n.expand(*m.shape[:2], -1)[..., None])[..., 0].mean(1)[real].mean().item()
                              for n in n_within])
    return out


def score_spread(maps, pad_mask=None):
    """How far from uniform attention is, per layer: the std over real keys of the
    scores within a row (log A differs from the scores by a per-row constant, so this
    is exact), and the mean row entropy of A next to the uniform log(n_real_keys)."""
    B, H, T, _ = maps[0].shape
    real = torch.ones(B, T, dtype=torch.bool) if pad_mask is None else ~pad_mask
    keys = real[:, None, None, :]
    out = {"score_std": [], "entropy": [], "entropy_uniform": torch.log(real.sum(-1).float()).mean().item()}
    for m in maps:
        logm = m.clamp_min(1e-30).log()
        if pad_mask is None:                                     # every key real: fewer passes over the maps
            std, entropy = logm.std(-1, correction=0), -(m * logm).sum(-1)
        else:
            n = keys.sum(-1)
            mean = (logm * keys).sum(-1) / n
            std = (((logm - mean[..., None]) ** 2 * keys).sum(-1) / n).sqrt()
            entropy = -(m * logm * keys).sum(-1)
        rows = real[:, None, :].expand(B, H, T)
        out["score_std"].append(std[rows].mean().item())
        out["entropy"].append(entropy[rows].mean().item())
    return out


# -----------------------------------------------------------------------------
# Position-only scores: what W_Q, W_K make of the positions alone

@torch.no_grad()
def position_scores(model: Transformer, layer=0, n=256):
    """(H, n, n) scores q_i . k_j / sqrt(d_head) of the first n position vectors alone,
    for additive encodings (sinusoidal or learned); None otherwise. Per head,
        S = (LN(PE) W_Q + b_Q)(LN(PE) W_K + b_K)^T / sqrt(d_head),
    PE the first n rows of the positional table and LN the layer's own ln_1 (its gain
    and bias included): what the layer's pre-norm attention makes of positions alone,
    not the bare (PE W_Q)(PE W_K)^T, which leaves out the norm and the biases.
    For layer > 0 the input of the layer is not the positions alone, so read it as a
    probe of W_Q, W_K, not the layer's scores."""
    c = model.config
    if c.pos_enc == "sinusoidal":
        pe = model.pe
    elif c.pos_enc == "learned":
        pe = model.pos_emb.weight
    else:
        return None
    pe = pe[1:] if c.pool == "cls" else pe
    block = model.blocks[layer]
    h = block.ln_1(pe[: min(len(pe), n)].detach().float())
    q = block.attn.split_heads(block.attn.W_Q(h)[None])[0]          # (H, n, d_head)
    k = block.attn.split_heads(block.attn.W_K(h)[None])[0]
    return (q @ k.transpose(-2, -1) / math.sqrt(c.n_embd // c.n_head)).cpu()


def toeplitz_stats(M):
    """How much of M (T, T) is a function of i - j alone: 1 - |M - Toe(M)|^2 / |M - mean|^2,
    where Toe(M) replaces each entry by the mean of its diagonal; and the near-far
    contrast of that diagonal profile (|i-j| <= 2 vs >= T/4) in units of std(M)."""
    T = M.size(-1)
    offset = (torch.arange(T)[:, None] - torch.arange(T)[None, :]) + T - 1
    sums = torch.zeros(2 * T - 1).scatter_add(0, offset.flatten(), M.flatten())
    counts = torch.zeros(2 * T - 1).scatter_add(0, offset.flatten(), torch.ones(T * T))
    toe = (sums / counts)[offset]
    score = 1 - ((M - toe) ** 2).sum() / ((M - M.mean()) ** 2).sum().clamp(min=1e-12)
    dist = (offset - T + 1).abs()
    near_far = (toe[dist <= 2].mean() - toe[dist >= T // 4].mean()) / M.std().clamp(min=1e-12)
    return score.item(), near_far.item()


def attention_report(model, maps, pad_mask=None, image_side=None):
    """Every statistic above for one model and its attention maps, as plain numbers;
    and the position-only score matrices (or None). image_side: also the 2-D mass."""
    out = {"mass": proximity_mass(maps, pad_mask), **score_spread(maps, pad_mask)}
    if image_side:
        out["mass_2d"] = proximity_mass_2d(maps, image_side)
    scores = position_scores(model)
    if scores is not None:
        stats = [toeplitz_stats(s) for s in scores]
        out["toeplitz"] = sum(s for s, _ in stats) / len(stats)
        out["near_far"] = sum(n for _, n in stats) / len(stats)
    return out, scores


@torch.no_grad()
def attention_at_init(config, tokens, seeds=(0, 1, 2), pad_mask=None, image_side=None, width=2, layer=0):
    """The attention of a fresh Transformer(config) on `tokens`, one model per seed
    (torch.manual_seed(seed) before building it). -> {stat: [one value per seed]}:
    "self" the mass on the query itself, "near" within |i-j| <= width, "grid" (with
    image_side) within the 3x3 grid neighbourhood, each divided by what uniform attention
    over the real keys gives (1.0 = no locality); "score_std" the spread of the scores."""
    out = {}
    for seed in seeds:
        torch.manual_seed(seed)
        _, maps = Transformer(config).eval().forward_with_maps(tokens, pad_mask)
        maps = [maps[layer].float()]
        mass = proximity_mass(maps, pad_mask, widths=(0, width))
        ratios = {"self": mass["layers"][0][0] / mass["uniform"][0],
                  "near": mass["layers"][0][1] / mass["uniform"][1]}
        if image_side:
            grid = proximity_mass_2d(maps, image_side, radii=(1,))
            ratios["grid"] = grid["layers"][0][0] / grid["uniform"][0]
        ratios["score_std"] = score_spread(maps, pad_mask)["score_std"][0]
        for k, v in ratios.items():
            out.setdefault(k, []).append(v)
    return out


# -----------------------------------------------------------------------------
# Figures

def plt_figure(*args, **kwargs):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt, plt.subplots(*args, **kwargs)


def save_figure(plt, fig, path, dpi):
    """The PNG goes to a temp file beside `path`, then is renamed over it: a crash or a
    full disk never leaves half a figure. In this project through runfiles.write_file
    (a run folder's manifest lists the file); copied alone, with the few lines below."""
    try:
        from plumbing import runfiles
        write = runfiles.write_file
    except ImportError:
        write = _write_atomically
    try:
        write(path, lambda f: fig.savefig(f, dpi=dpi, format="png"))
    finally:
        plt.close(fig)


def _write_atomically(path, write):
    tmp = os.path.join(os.path.dirname(path), f".sptflt-tmp.{os.getpid()}.{os.path.basename(path)}")
    try:
        with open(tmp, "xb") as f:
            write(f)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def plot_attention(maps, path, title, n_examples=2):
    """Rows: examples x layers; columns: heads."""
    L, H = len(maps), maps[0].size(1)
    n_examples = min(n_examples, maps[0].size(0))
    plt, (fig, axes) = plt_figure(n_examples * L, H, figsize=(2.1 * H, 2.1 * n_examples * L), squeeze=False)
    for e in range(n_examples):
        for layer in range(L):
            for h in range(H):
                ax = axes[e * L + layer, h]
                ax.imshow(maps[layer][e, h].numpy(), cmap="viridis")
                ax.set_xticks([]), ax.set_yticks([])
                ax.set_title(f"ex {e} layer {layer} head {h}", fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(plt, fig, path, 80)


def plot_image_attention(image, maps, path, n_queries=3):
    """Where one image's pixels look (PathFinder: the 2-D proximity of claim 6). image:
    the T = side**2 pixel ids; maps: stage -> layer-0 maps of that image (H, T, T).
    Rows: query pixels spread over the drawn strokes (red +); columns: the image, then
    the head-averaged attention of that query at each stage, titled with the map's
    mass in the query's 3x3 neighbourhood (uniform: 9 / T). Returns those masses,
    {stage: [one per query]}."""
    side = math.isqrt(image.numel())
    img = image.float().reshape(side, side)
    order = torch.argsort(img.flatten(), descending=True, stable=True)
    lit = max(1, int((img.flatten() > 0).sum()))
    queries = order[torch.linspace(0, lit - 1, n_queries).long()].tolist()
    near = (grid_distance(side) <= 1).float()
    masses = {stage: [] for stage in maps}
    plt, (fig, axes) = plt_figure(n_queries, 1 + len(maps), figsize=(2.3 * (1 + len(maps)), 2.3 * n_queries),
                                  squeeze=False)
    for row, q in enumerate(queries):
        y, x = divmod(q, side)
        axes[row, 0].imshow(img, cmap="gray")
        axes[row, 0].set_title(f"query ({y}, {x})", fontsize=8)
        for col, (stage, m) in enumerate(maps.items(), 1):
            a = m.mean(0)[q]                                          # (T,) head-averaged row
            masses[stage].append((a * near[q]).sum().item())
            axes[row, col].imshow(a.reshape(side, side).numpy(), cmap="viridis")
            axes[row, col].set_title(f"{stage}: 3x3 mass {masses[stage][-1]:.3f}", fontsize=8)
        for ax in axes[row]:
            ax.plot(x, y, "r+", markersize=8)
            ax.set_xticks([]), ax.set_yticks([])
    fig.suptitle(f"layer-0 attention of one image's pixels (uniform 3x3 mass {9 / side ** 2:.4f})")
    fig.tight_layout()
    save_figure(plt, fig, path, 90)
    return masses


def plot_proximity(reports, scores, path):
    """Left: layer-0 mass within |i-j| <= w (and, for images, within radius r on the
    grid) for each stage, against uniform. Right: position-only scores (head 0) per stage."""
    stages = list(reports)
    two_d = "mass_2d" in reports[stages[0]]
    n_right = sum(scores.get(s) is not None for s in stages)
    n_left = 2 if two_d else 1
    plt, (fig, axes) = plt_figure(1, n_left + n_right, figsize=(4 * n_left + 3 * n_right, 3.5), squeeze=False)
    for ax, key, xname, label in ((axes[0, 0], "mass", "widths", "|i-j| <= w"),
                                  (axes[0, 1] if two_d else None, "mass_2d", "radii", "grid radius <= r")):
        if ax is None:
            continue
        for stage in stages:
            mass = reports[stage][key]
            ax.plot(mass[xname], mass["layers"][0], "o-", label=stage)
        ax.plot(mass[xname], mass["uniform"], "k--", label="uniform")
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel(xname[0]), ax.set_ylabel(f"attention mass within {label} (layer 0)"), ax.legend()
    col = n_left
    for stage in stages:
        if scores.get(stage) is not None:
            a = axes[0, col]
            a.imshow(scores[stage][0][:128, :128].numpy(), cmap="RdBu_r")
            a.set_title(f"position-only scores, {stage}\nToeplitz {reports[stage]['toeplitz']:.2f}", fontsize=8)
            a.set_xticks([]), a.set_yticks([])
            col += 1
    fig.tight_layout()
    save_figure(plt, fig, path, 90)


def plot_evolution(rows, path, n_cols=6):
    """The paper's figure: one row per (name, snapshots), each snapshot a dict with a
    head-averaged map ("map"), its "step" and its mass within |i-j|<=2 ("mass")."""
    plt, (fig, axes) = plt_figure(len(rows), n_cols, figsize=(2 * n_cols, 2.1 * len(rows)), squeeze=False)
    for r, (name, picks) in enumerate(rows):
        for c in range(n_cols):
            ax = axes[r, c]
            ax.set_xticks([]), ax.set_yticks([])
            if c < len(picks):
                ax.imshow(torch.tensor(picks[c]["map"]).numpy(), cmap="viridis")
                ax.set_title(f"step {picks[c]['step']}, mass(w=2) {picks[c]['mass']:.2f}", fontsize=7)
        axes[r, 0].set_ylabel(name, fontsize=8)
    fig.tight_layout()
    save_figure(plt, fig, path, 80)
    return path


# -----------------------------------------------------------------------------
# A training run's attention (train_spt.py): the maps at each stage, their statistics,
# the snapshots during training and the run's figures

# the stages: at init; after SPT (a run of SPT alone); the model finetuning starts from (after SPT
# and the copy of --init_params: the SPT model itself only when every weight is copied); finetuned
STAGE_TITLES = dict(init="init", spt="after SPT", start="finetuning's start", finetune="finetuned")


@torch.no_grad()
def attention_maps(model, ds, device, n=8):
    """The attention maps of a dataset's first n examples, one (B, H, T, T) per layer
    ([CLS] dropped; retrieval pairs: the first documents), and their padding mask."""
    tokens, pad_mask, _ = ds.collate([ds[i] for i in range(min(n, len(ds)))])
    if tokens.dim() == 3:
        tokens, pad_mask = tokens[:, 0], None if pad_mask is None else pad_mask[:, 0]
    model.eval()
    _, maps = model.forward_with_maps(tokens.to(device), None if pad_mask is None else pad_mask.to(device))
    model.train()
    if model.config.pool == "cls":
        maps = [m[:, :, 1:, 1:] for m in maps]
    return [m.float().cpu() for m in maps], pad_mask


def attention_snapshot(model, ds, device, n=4):
    """One record of snapshots.jsonl: the layer-0 proximity mass on n examples, and the
    head-averaged map of the first (average-pooled down to at most 128 positions)."""
    maps, pad_mask = attention_maps(model, ds, device, n)
    mass = proximity_mass(maps, pad_mask)
    m = maps[0][0].mean(0)
    factor = max(1, math.ceil(m.size(0) / 128))
    m = torch.nn.functional.avg_pool2d(m[None, None], factor)[0, 0] if factor > 1 else m
    return dict(mass=mass["layers"][0], widths=mass["widths"], uniform=mass["uniform"],
                map=np.round(m.numpy(), 4).tolist())


def stage_statistics(reports):
    """Flat summary keys from the stage reports: mass within |i-j|<=2, Toeplitz score,
    near/far score gap, score spread, entropy, and for images the 3x3 mass."""
    w2, r1 = PROX_WIDTHS.index(2), PROX_RADII.index(1)
    out = {}
    for stage, r in reports.items():
        out[f"mass_w2_{stage}"] = r["mass"]["layers"][0][w2]
        out[f"toeplitz_{stage}"], out[f"near_far_{stage}"] = r.get("toeplitz"), r.get("near_far")
        out[f"score_std_{stage}"], out[f"entropy_{stage}"] = r["score_std"][0], r["entropy"][0]
        if "mass_2d" in r:
            out[f"mass2d_r1_{stage}"] = r["mass_2d"]["layers"][0][r1]
    if "mass_2d" in reports["init"]:
        out["mass2d_r1_uniform"] = reports["init"]["mass_2d"]["uniform"][r1]
    out["mass_w2_uniform"] = reports["init"]["mass"]["uniform"][w2]
    return out


class Observations:
    """The attention at the stages of a run (STAGE_TITLES): attention_report
    on the first validation examples, the maps drawn to attention_<stage>.png, and at
    the end the run's figures. Only the master rank observes (master=False: a no-op)."""

    def __init__(self, out_dir, image_task, master=True):
        self.out_dir, self.image_task, self.master = out_dir, image_task, master
        self.reports, self.scores, self.first_maps = {}, {}, {}

    def observe(self, stage, model, ds, device):
        if not self.master:
            return
        maps, pad_mask = attention_maps(model, ds, device)
        side = math.isqrt(maps[0].size(-1)) if self.image_task else None
        self.reports[stage], self.scores[stage] = attention_report(model, maps, pad_mask, side)
        plot_attention(maps, os.path.join(self.out_dir, f"attention_{stage}.png"), f"attention maps: {stage}")
        self.first_maps[STAGE_TITLES[stage]] = maps[0][0]

    def plot(self, image=None):
        """proximity.png and, for an image task (`image`: one example's pixels), attention_2d.png."""
        plot_proximity(self.reports, self.scores, os.path.join(self.out_dir, "proximity.png"))
        if self.image_task:
            plot_image_attention(image, self.first_maps, os.path.join(self.out_dir, "attention_2d.png"))
