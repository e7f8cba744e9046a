"""
Attention statistics of "Towards Understanding Self-Pretraining for Sequence Classification"
(claim 6: after SPT the attention is local, a learned proximity bias), measured rather than only
drawn. Plain tensors in, numbers out, so they work on any attention maps, ours or someone else's:

  proximity_mass, proximity_mass_2d   attention mass near the query: on the sequence, on an image grid
  score_spread                        how far attention is from uniform (score std, row entropy)
  position_scores, toeplitz_stats     what W_Q, W_K make of positions alone; how much is a function of i - j
  attention_report, attention_at_init all of them for one model; the locality of fresh models
  plot_attention, plot_proximity, plot_evolution, plot_image_attention, plot_curves   the figures
  Observations                        a training run's attention at init, after SPT and finetuned

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
    """maps: list (one per layer) of (B, H, T, T) attention rows summing to 1; pad_mask: (B, T) True
    at padding, or None. Returns {"widths", "layers": per layer the mean mass within |i-j| <= w (over
    examples, heads, real queries), "uniform": the same for uniform attention over the real keys}."""
    B, _, T, _ = maps[0].shape
    real = torch.ones(B, T, dtype=torch.bool) if pad_mask is None else ~pad_mask
    return _mass(maps, real, (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs(), "widths", widths)


def grid_distance(side):
    """(T, T) Chebyshev distance max(|r_i - r_j|, |c_i - c_j|) of a side x side image's pixels, row-major."""
    r, c = torch.arange(side * side) // side, torch.arange(side * side) % side
    return torch.maximum((r[:, None] - r[None, :]).abs(), (c[:, None] - c[None, :]).abs())


def proximity_mass_2d(maps, side=None, radii=PROX_RADII):
    """The 2-D version for images: mass within Chebyshev radius r on the grid (r = 1: the 3x3
    neighbourhood, itself included). side defaults to sqrt(T). Same output as proximity_mass, with
    "radii" for "widths". (On a row-major 32x32 image the 1-D statistic sees only horizontal
    neighbours, counts the row-wrap pair (r, 31)-(r+1, 0) as neighbours and misses the vertical ones.)"""
    T = maps[0].shape[-1]
    side = side or math.isqrt(T)
    if side * side != T:
        raise ValueError(f"attention over {T} positions is not a square image; give side=")
    return _mass(maps, torch.ones(maps[0].shape[0], T, dtype=torch.bool), grid_distance(side), "radii", radii)


def _mass(maps, real, dist, name, values):
    """The masses within dist <= v for each v in values (dist: (T, T) query-key distances), reading
    the maps once: each query's keys within the largest v gathered nearest first, then a running sum
    gives every v's mass. The uniform masses count the real keys in each band."""
    count = real.float()                                             # (B, T) real keys
    out = {name: list(values), "layers": [], "uniform": []}
    for v in values:
        in_band = count @ (dist <= v).float().T                       # (B, T): real keys within v of each query
        out["uniform"].append((in_band / count.sum(-1, keepdim=True))[real].mean().item())
    idx = torch.argsort(dist, dim=-1, stable=True)[:, :int((dist <= max(values)).sum(-1).max())]   # (T, K) nearest first
    n_within = [(dist.gather(-1, idx) <= v).sum(-1) - 1 for v in values]          # (T,) last index within v
    for m in maps:
        run = m.gather(-1, idx.expand(*m.shape[:2], *idx.shape)).cumsum(-1)      # (B, H, T, K)
        out["layers"].append([run.gather(-1, n.expand(*m.shape[:2], -1)[..., None])[..., 0].mean(1)[real].mean().item()
                              for n in n_within])
    return out


def score_spread(maps, pad_mask=None):
    """How far from uniform attention is, per layer: the std over real keys of the scores within a
    row (log A differs from the scores by a per-row constant, so this is exact), and the mean row
    entropy of A next to the uniform log(n_real_keys)."""
    B, H, T, _ = maps[0].shape
    real = torch.ones(B, T, dtype=torch.bool) if pad_mask is None else ~pad_mask
    keys, rows = real[:, None, None, :], real[:, None, :].expand(B, H, T)
    out = {"score_std": [], "entropy": [], "entropy_uniform": torch.log(real.sum(-1).float()).mean().item()}
    for m in maps:
        logm = m.clamp_min(1e-30).log()
        if pad_mask is None:                                     # every key real: fewer passes over the maps
            std, entropy = logm.std(-1, correction=0), -(m * logm).sum(-1)
        else:
            mean = (logm * keys).sum(-1, keepdim=True) / keys.sum(-1, keepdim=True)
            std = (((logm - mean) ** 2 * keys).sum(-1) / keys.sum(-1)).sqrt()
            entropy = -(m * logm * keys).sum(-1)
        out["score_std"].append(std[rows].mean().item())
        out["entropy"].append(entropy[rows].mean().item())
    return out


# -----------------------------------------------------------------------------
# Position-only scores: what W_Q, W_K make of the positions alone

@torch.no_grad()
def position_scores(model: Transformer, layer=0, n=256):
    """(H, n, n) scores q_i . k_j / sqrt(d_head) of the first n position vectors alone, for
    additive encodings (sinusoidal or learned); None otherwise. Per head,
        S = (LN(PE) W_Q + b_Q)(LN(PE) W_K + b_K)^T / sqrt(d_head),
    PE the first n rows of the positional table and LN the layer's own ln_1 (its gain and bias
    included): what the layer's pre-norm attention makes of positions alone, not the bare
    (PE W_Q)(PE W_K)^T, which leaves out the norm and the biases. For layer > 0 the input of the
    layer is not the positions alone, so read it as a probe of W_Q, W_K, not the layer's scores."""
    c = model.config
    if c.pos_enc not in ("sinusoidal", "learned"):
        return None
    pe = model.pe if c.pos_enc == "sinusoidal" else model.pos_emb.weight
    block, start = model.blocks[layer], 1 if c.pool == "cls" else 0
    h = block.ln_1(pe[start:start + n].detach().float())
    q, k = (block.attn.split_heads(W(h)[None])[0] for W in (block.attn.W_Q, block.attn.W_K))   # (H, n, d_head)
    return (q @ k.transpose(-2, -1) / math.sqrt(c.n_embd // c.n_head)).cpu()


def toeplitz_stats(M):
    """How much of M (T, T) is a function of i - j alone: 1 - |M - Toe(M)|^2 / |M - mean|^2, where
    Toe(M) replaces each entry by the mean of its diagonal; and the near-far contrast of that
    diagonal profile (|i-j| <= 2 vs >= T/4) in units of std(M)."""
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
    """Every statistic above for one model and its attention maps, as plain numbers; and the
    position-only score matrices (or None). image_side: also the 2-D mass."""
    out = {"mass": proximity_mass(maps, pad_mask), **score_spread(maps, pad_mask)}
    if image_side:
        out["mass_2d"] = proximity_mass_2d(maps, image_side)
    scores = position_scores(model)
    if scores is not None:   # each averaged over the heads
        out["toeplitz"], out["near_far"] = (sum(col) / len(col) for col in zip(*map(toeplitz_stats, scores)))
    return out, scores


@torch.no_grad()
def attention_at_init(config, tokens, seeds=(0, 1, 2), pad_mask=None, image_side=None, width=2, layer=0):
    """The attention of a fresh Transformer(config) on `tokens`, one model per seed (torch.manual_seed(seed)
    before building it). -> {stat: [one value per seed]}: "self" the mass on the query itself, "near"
    within |i-j| <= width, "grid" (with image_side) within the 3x3 grid neighbourhood, each divided by
    what uniform attention over the real keys gives (1.0 = no locality); "score_std" the spread of the scores."""
    out, ratio = {}, lambda mass, i: mass["layers"][0][i] / mass["uniform"][i]
    for seed in seeds:
        torch.manual_seed(seed)
        maps = [Transformer(config).eval().forward_with_maps(tokens, pad_mask)[1][layer].float()]
        mass = proximity_mass(maps, pad_mask, widths=(0, width))
        ratios = {"self": ratio(mass, 0), "near": ratio(mass, 1)}
        if image_side:
            ratios["grid"] = ratio(proximity_mass_2d(maps, image_side, radii=(1,)), 0)
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
    """The PNG goes to a temp file beside `path`, then is renamed over it (os.replace):
    a crash never leaves half a figure under `path`."""
    fig.savefig(f"{path}.tmp", dpi=dpi, format="png")
    os.replace(f"{path}.tmp", path)
    plt.close(fig)


def heatmap(fig, ax, m, title, label=None, **kwargs):
    """m (T, T) with query position i down and key position j across; a colour bar named label."""
    im = ax.imshow(np.asarray(m), **kwargs)
    ax.set_title(title, fontsize=9), ax.tick_params(labelsize=7)
    ax.set_xlabel("key position j", fontsize=8), ax.set_ylabel("query position i", fontsize=8)
    if label:
        fig.colorbar(im, ax=ax, shrink=0.8).set_label(label, fontsize=8)
    return im


def plot_grid(rows, path, title=None, dpi=80):
    """Small maps without ticks, one row per (row name, [(map, its title), ...])."""
    n_cols = max(len(cells) for _, cells in rows)
    plt, (fig, axes) = plt_figure(len(rows), n_cols, figsize=(2.1 * n_cols, 2.1 * len(rows)), squeeze=False)
    for (name, cells), row in zip(rows, axes):
        for ax, (m, text) in zip(row, cells):
            ax.imshow(np.asarray(m), cmap="viridis"), ax.set_title(text, fontsize=7)
        row[0].set_ylabel(name, fontsize=8)
    plt.setp(axes, xticks=[], yticks=[]), fig.suptitle(title), fig.tight_layout()
    save_figure(plt, fig, path, dpi)
    return path


def plot_attention(maps, path, title, n_examples=2):
    """Rows: examples x layers; columns: heads."""
    plot_grid([("", [(maps[layer][e, h].numpy(), f"ex {e} layer {layer} head {h}") for h in range(maps[0].size(1))])
               for e in range(min(n_examples, maps[0].size(0))) for layer in range(len(maps))], path, title)


def plot_image_attention(image, maps, path, n_queries=3):
    """Where one image's pixels look (PathFinder: the 2-D proximity of claim 6). image: the
    T = side**2 pixel ids; maps: stage -> layer-0 maps of that image (H, T, T). Rows: query pixels
    spread over the drawn strokes (red +); columns: the image, then the head-averaged attention of
    that query at each stage, titled with the map's mass in the query's 3x3 neighbourhood
    (uniform: 9 / T). Returns those masses, {stage: [one per query]}."""
    side = math.isqrt(image.numel())
    img = image.float().reshape(side, side)
    lit = max(1, int((img > 0).sum()))                               # the drawn pixels, brightest first
    queries = torch.argsort(img.flatten(), descending=True, stable=True)[torch.linspace(0, lit - 1, n_queries).long()]
    near = (grid_distance(side) <= 1).float()
    masses = {stage: [] for stage in maps}
    plt, (fig, axes) = plt_figure(n_queries, 1 + len(maps), figsize=(2.3 * (1 + len(maps)), 2.3 * n_queries),
                                  squeeze=False)
    for row, q in zip(axes, queries.tolist()):
        y, x = divmod(q, side)
        row[0].imshow(img.numpy(), cmap="gray"), row[0].set_title(f"query ({y}, {x})", fontsize=8)
        for ax, (stage, m) in zip(row[1:], maps.items()):
            a = m.mean(0)[q]                                          # (T,) head-averaged row
            masses[stage].append((a * near[q]).sum().item())
            ax.imshow(a.reshape(side, side).numpy(), cmap="viridis")
            ax.set_title(f"{stage}: 3x3 mass {masses[stage][-1]:.3f}", fontsize=8)
        for ax in row:
            ax.plot(x, y, "r+", markersize=8)
    plt.setp(axes, xticks=[], yticks=[])
    fig.suptitle(f"layer-0 attention of one image's pixels (uniform 3x3 mass {9 / side ** 2:.4f})"), fig.tight_layout()
    save_figure(plt, fig, path, 90)
    return masses


def plot_proximity(reports, scores, path):
    """Left: layer-0 mass within |i-j| <= w (and, for images, within radius r on the grid) for each
    stage, against uniform. Right: position-only scores (head 0, the first 128 positions) per
    stage, each with its colour bar. Returns the figure."""
    stages = list(reports)
    curves = [("mass", "widths", "w", "|i-j| <= w"), ("mass_2d", "radii", "r", "grid radius <= r")]
    curves = [c for c in curves if c[0] in reports[stages[0]]]
    drawn = [s for s in stages if scores.get(s) is not None]
    plt, (fig, axes) = plt_figure(1, len(curves) + len(drawn), figsize=(4 * len(curves) + 3.6 * len(drawn), 3.6),
                                  squeeze=False, layout="constrained")
    for ax, (key, xname, x, label) in zip(axes[0], curves):
        for stage in stages:
            ax.plot(reports[stage][key][xname], reports[stage][key]["layers"][0], "o-", label=stage)
        ax.plot(reports[stage][key][xname], reports[stage][key]["uniform"], "k--", label="uniform")
        ax.set_xscale("symlog", linthresh=1), ax.set_title("layer-0 attention near the query", fontsize=9)
        ax.set_xlabel(x), ax.set_ylabel(f"attention mass within {label}"), ax.legend(fontsize=8)
    for ax, stage in zip(axes[0, len(curves):], drawn):
        heatmap(fig, ax, scores[stage][0][:128, :128].numpy(), f"{stage}: position-only scores\n"
                f"Toeplitz score {reports[stage]['toeplitz']:.2f}", "score (head 0)", cmap="RdBu_r")
    save_figure(plt, fig, path, 90)
    return fig


def plot_curves(records, path):
    """A run's curves from its log: train loss per step, val loss (spt, finetune) and val accuracy per epoch."""
    plt, (fig, axes) = plt_figure(1, 3, figsize=(13, 3.5), layout="constrained")
    panels = (("loss", "step", "train loss"), ("val_loss", "epoch", "val loss"), ("val_acc", "epoch", "val accuracy"))
    for ax, (key, x, name) in zip(axes, panels):
        for phase, color in (("spt", "tab:purple"), ("finetune", "tab:blue"))[key == "val_acc":]:
            rs = [r for r in records if r.get("phase") == phase and key in r]
            if rs:
                ax.plot([r[x] for r in rs], [r[key] for r in rs], "o-" if x == "epoch" else "-", color=color, label=phase)
        ax.set_xlabel(f"{x} (of its phase)"), ax.set_ylabel(name), ax.grid(alpha=0.3)
        ax.legend() if ax.lines else None
    save_figure(plt, fig, path, 90)


def plot_evolution(rows, path, n_cols=6):
    """The paper's figure: one row per (name, snapshots), each snapshot a dict with a head-averaged
    map ("map"), its "step" and its mass within |i-j|<=2 ("mass")."""
    return plot_grid([(name, [(p["map"], f"step {p['step']}, mass(w=2) {p['mass']:.2f}") for p in picks[:n_cols]])
                      for name, picks in rows], path)


# -----------------------------------------------------------------------------
# A training run's attention (train_spt.py): the maps at each stage, their statistics, the
# snapshots during training and the run's figures. The stages: at init; after SPT (a run of SPT
# alone); the model finetuning starts from (after SPT and the copy of --init_params: the SPT model
# itself only when every weight is copied); finetuned
STAGE_TITLES = dict(init="init", spt="after SPT", start="finetuning's start", finetune="finetuned")


@torch.no_grad()
def attention_maps(model, ds, device, n=8):
    """The attention maps of a dataset's first n examples, one (B, H, T, T) per layer ([CLS]
    dropped; retrieval pairs: the first documents), and their padding mask."""
    tokens, pad_mask, _ = ds.collate([ds[i] for i in range(min(n, len(ds)))])
    if tokens.dim() == 3:
        tokens, pad_mask = tokens[:, 0], None if pad_mask is None else pad_mask[:, 0]
    model.eval()
    _, maps = model.forward_with_maps(tokens.to(device), None if pad_mask is None else pad_mask.to(device))
    model.train()
    return [(m[:, :, 1:, 1:] if model.config.pool == "cls" else m).float().cpu() for m in maps], pad_mask


def attention_snapshot(model, ds, device, n=4):
    """One record of snapshots.jsonl: the layer-0 proximity mass on n examples, and the head-averaged
    map of the first (average-pooled down to at most 128 positions, rounded to 4 decimals)."""
    maps, pad_mask = attention_maps(model, ds, device, n)
    mass = proximity_mass(maps, pad_mask)
    m = maps[0][0].mean(0)[None, None]                                 # (1, 1, T, T) head-averaged
    m = torch.nn.functional.avg_pool2d(m, math.ceil(m.size(-1) / 128))[0, 0]
    return dict(mass=mass["layers"][0], widths=mass["widths"], uniform=mass["uniform"],
                map=np.round(m.double().numpy(), 4).tolist())


def stage_statistics(reports):
    """Flat summary keys from the stage reports: mass within |i-j|<=2, Toeplitz score, near/far
    score gap, score spread, entropy, and for images the 3x3 mass."""
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
    """The attention at the stages of a run (STAGE_TITLES): attention_report on the first validation
    examples, the maps drawn to attention_<stage>.png, and at the end the run's figures. Only the
    master rank observes (master=False: a no-op)."""

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
