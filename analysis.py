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
  plot_attention, plot_proximity, plot_evolution   the figures
  report, seed_table, plot_curves, plot_val_accuracy   tables and figures gathered
                      from run folders (train_spt.py --report=DIR,...): one row per
                      run, and runs that differ only in --seed as mean +- std

Imports torch, numpy and (for figures) matplotlib, and from this project only model.py.
"""

import json
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
    return _mass(maps, real, [dist <= w for w in widths], "widths", widths)


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
    return _mass(maps, real, [dist <= r for r in radii], "radii", radii)


def _mass(maps, real, bands, name, values):
    keys = real[:, None, :].float()                                  # (B, 1, T) real keys
    out = {name: list(values), "layers": [], "uniform": []}
    for band in bands:
        band = band.float()
        out["uniform"].append(((band * keys).sum(-1) / keys.sum(-1))[real].mean().item())
    for m in maps:
        out["layers"].append([((m * band).sum(-1).mean(1))[real].mean().item() for band in bands])
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
    through the layer's real ln_1, W_Q and W_K (biases included), for additive encodings
    (sinusoidal or learned); None otherwise. For layer > 0 the input of the layer is
    not the positions alone, so read it as a probe of W_Q, W_K, not the layer's scores."""
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
    """The PNG is written to a temp file, then renamed (training.atomic_write): a full disk
    never leaves half a figure, and a link at `path` is refused."""
    import training  # here, not at the top: analysis.py imports alone with model.py
    try:
        training.atomic_write(path, lambda f: fig.savefig(f, dpi=dpi, format="png"))
    finally:
        plt.close(fig)


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
# Runs: figures and tables from run folders (config.json, log.jsonl, summary.json)

def plot_curves(out_dir):
    """curves.png in out_dir: train loss per step, val loss and val accuracy per epoch,
    from its log.jsonl (training.read_log: a last line cut short by a kill is dropped)."""
    import training  # here, not at the top: analysis.py imports alone with model.py
    plt, (fig, axes) = plt_figure(1, 3, figsize=(13, 3.5))
    records = training.read_log(out_dir)
    for phase, color in (("spt", "tab:purple"), ("finetune", "tab:blue")):
        steps = [r for r in records if r.get("phase") == phase and "loss" in r]
        vals = [r for r in records if r.get("phase") == phase and "val_loss" in r]
        if steps:
            axes[0].plot([r["step"] for r in steps], [r["loss"] for r in steps], color=color, label=phase)
        if vals:
            axes[1].plot([r["epoch"] for r in vals], [r["val_loss"] for r in vals], "o-", color=color, label=phase)
            if phase == "finetune":
                axes[2].plot([r["epoch"] for r in vals], [r["val_acc"] for r in vals], "o-", color=color)
    for ax, title in zip(axes, ("train loss (per step)", "val loss (per epoch)", "val accuracy (finetuning)")):
        ax.set_title(title)
        ax.legend() if ax.get_legend_handles_labels()[0] else None
    fig.tight_layout()
    save_figure(plt, fig, os.path.join(out_dir, "curves.png"), 90)


def plot_evolution_of_runs(run_dirs, path, n_cols=6):
    """The paper's figure from each run's snapshots.jsonl: one row per (run, phase),
    n_cols snapshots spread over training (plot_evolution draws it)."""
    import training  # here, not at the top: analysis.py imports alone with model.py
    rows = []
    for d in run_dirs:
        snap_path = os.path.join(d, "snapshots.jsonl")
        if not os.path.exists(snap_path):
            continue
        snaps = training.read_jsonl(snap_path)
        for phase in ("spt", "finetune"):
            s = [x for x in snaps if x["phase"] == phase]
            if s:
                picks = [dict(s[round(i)], mass=s[round(i)]["mass"][PROX_WIDTHS.index(2)])
                         for i in np.linspace(0, len(s) - 1, min(n_cols, len(s)))]
                rows.append((f"{os.path.basename(os.path.normpath(d))} {phase}", picks))
    return plot_evolution(rows, path, n_cols) if rows else None


def plot_val_accuracy(runs, path, unfinished=()):
    """Two panels. Left: SPT val loss per epoch of every run with an SPT phase (and of
    `unfinished` run folders, stopped before their summary). Right: finetuning val accuracy per
    epoch, one line per (run_dir, summary): solid when the run starts from SPT weights
    (its own or a checkpoint's), dashed when from scratch."""
    import training  # here, not at the top: analysis.py imports alone with model.py
    plt, (fig, (ax_spt, ax)) = plt_figure(1, 2, figsize=(13, 4.2))
    for d in [d for d, _ in runs] + list(unfinished):
        spt = [r for r in training.read_log(d) if r.get("phase") == "spt" and "val_loss" in r]
        if spt:
            ax_spt.plot([r["epoch"] for r in spt], [r["val_loss"] for r in spt], "o-", markersize=2,
                        label=os.path.relpath(d) + (" (stopped)" if d in unfinished else ""))
    for d, s in runs:
        spt = s["pretrain_epochs"] > 0 or s["init_from"] not in ("", "resume")
        vals = [r for r in training.read_log(d) if r.get("phase") == "finetune" and "val_acc" in r]
        if vals:
            ax.plot([r["epoch"] for r in vals], [r["val_acc"] for r in vals], "o-" if spt else "o--",
                    label=os.path.relpath(d), markersize=3)
    ax_spt.set_xlabel("SPT epoch"), ax_spt.set_ylabel("SPT val loss (masked tokens)"), ax_spt.grid(alpha=0.3)
    ax.set_xlabel("finetuning epoch"), ax.set_ylabel("val accuracy"), ax.grid(alpha=0.3)
    for a in (ax_spt, ax):
        if a.lines:
            a.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    save_figure(plt, fig, path, 90)
    return path


# -----------------------------------------------------------------------------
# Gathering results: --report=DIR,... -> one markdown table and two figures

REPORT_COLUMNS = ("task", "depth", "init", "pos_enc", "pretrain_task", "pretrain_epochs", "init_from", "init_params", "freeze",
                  "best_val_acc", "test_acc", "mass_w2_finetune", "toeplitz_spt", "wall_time_s")


SEED_GROUP = ("task", "depth", "init", "pos_enc", "pretrain_task", "pretrain_epochs", "epochs", "init_params",
              "freeze", "pixel_encoder")
SEED_STATS = ("best_val_acc", "test_acc", "mass_w2_finetune", "score_std_init")


def seed_table(runs):
    """Runs that differ only in --seed (and in which seed's checkpoint they start from),
    gathered into one row: mean +- std (n runs) of each SEED_STATS column."""
    groups = {}
    for _, s in runs:
        key = tuple(s.get(c) for c in SEED_GROUP) + (s.get("init_from") not in ("", None),)
        groups.setdefault(key, []).append(s)
    lines = ["| " + " | ".join(SEED_GROUP) + " | from a checkpoint | n | " + " | ".join(SEED_STATS) + " |",
             "|---" * (len(SEED_GROUP) + len(SEED_STATS) + 2) + "|"]
    for key, members in groups.items():
        cells = []
        for c in SEED_STATS:
            v = np.array([m[c] for m in members if m.get(c) is not None], dtype=float)
            cells.append(f"{v.mean():.3f} +- {v.std(ddof=1) if len(v) > 1 else 0:.3f}" if len(v) else "")
        lines.append("| " + " | ".join(str(k) for k in key) + f" | {len(members)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_summary(out_dir):
    """A run's summary.json, with the flags it does not record (pixel_encoder, ...) taken
    from its config.json."""
    with open(os.path.join(out_dir, "summary.json")) as f:
        summary = json.load(f)
    config_path = os.path.join(out_dir, "config.json")
    if not os.path.exists(config_path):
        return summary
    with open(config_path) as f:
        config = json.load(f)
    return {**{k: config[k] for k in SEED_GROUP if k in config}, **summary}


RUN_SCRIPTS = ("train_spt.py", "train_flt.py")
REPORT_DIR = "out/spt_report"     # where --report writes when the first folder given is itself a run
REPORT_FILES = ("report.md", "val_accuracy.png", "attention_evolution.png")


def run_script(d):
    """The script that wrote the run folder d (its manifest says; a run written before
    manifests, by its config's keys), or None when d is not a run."""
    import training  # here, not at the top: analysis.py imports alone with model.py
    manifest = training.read_manifest(d)
    if manifest is not None:
        return manifest["script"] if manifest["script"] in RUN_SCRIPTS else None
    try:
        with open(os.path.join(d, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    return "train_flt.py" if "variant" in config else "train_spt.py" if "task" in config else None


def find_runs(dirs):
    """The train_spt.py run folders under the comma list `dirs`, walked without following
    links, each once by its real path: (finished runs, unfinished runs, other scripts' runs)."""
    seen, finished, unfinished, other = set(), [], [], []
    for top in dirs.split(","):
        if not os.path.isdir(top):
            raise FileNotFoundError(f"--report={dirs}: {top} is not a folder")
        for root, subdirs, files in os.walk(top):
            subdirs.sort()
            real = os.path.realpath(root)
            if not {"log.jsonl", "summary.json"} & set(files) or real in seen:
                continue
            seen.add(real)
            script = run_script(root)
            if script != "train_spt.py":
                other.append(root)
            elif "summary.json" in files and not os.path.islink(os.path.join(root, "summary.json")):
                finished.append(root)
            else:
                unfinished.append(root)
    return finished, unfinished, other


def report_folder(dirs, out_dir=""):
    """Where report.md and the figures go: --out_dir if given, else the first folder
    given unless it is itself a run (its own figures must not be replaced, nor its
    parent written into), else REPORT_DIR."""
    first = dirs.split(",")[0]
    if out_dir:
        return out_dir
    return first if run_script(first) is None else REPORT_DIR


def report(dirs, out_dir=""):
    """--report: one table of the train_spt.py runs under `dirs` (runs of other scripts
    are left out, and said so), report.md and two figures, written where report_folder
    says and never over a file --report did not write."""
    import training  # here, not at the top: analysis.py imports alone with model.py
    finished, unfinished, other = find_runs(dirs)
    if other:
        print(f"left out (not train_spt.py runs): {', '.join(other)}")
    if not finished:
        raise FileNotFoundError(f"no finished train_spt.py run (summary.json) under {dirs}")
    runs = [(d, run_summary(d)) for d in finished]
    lines = ["| run | " + " | ".join(REPORT_COLUMNS) + " |", "|---" * (len(REPORT_COLUMNS) + 1) + "|"]
    for d, s in runs:
        cells = [f"{s.get(c):.4g}" if isinstance(s.get(c), float) else str(s.get(c, "")) for c in REPORT_COLUMNS]
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n\n" + seed_table(runs)
    print(table)
    where = report_folder(dirs, out_dir)
    outputs = training.claim_outputs(where, "train_spt.py --report", REPORT_FILES)
    try:
        training.write_text(os.path.join(where, "report.md"), table + "\n")
        print(f"report: {os.path.join(where, 'report.md')}; SPT loss and val accuracy figure: "
              f"{plot_val_accuracy(runs, os.path.join(where, 'val_accuracy.png'), unfinished)}")
        fig = plot_evolution_of_runs([d for d, _ in runs], os.path.join(where, "attention_evolution.png"))
        if fig:
            print(f"attention evolution figure: {fig}")
    finally:
        outputs.release()
    return table


# -----------------------------------------------------------------------------
# A training run's attention (train_spt.py): the maps at each stage, their statistics,
# the snapshots during training and the run's figures

STAGE_TITLES = dict(init="init", spt="after SPT", finetune="finetuned")


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
    """The attention at the stages of a run (init, after SPT, finetuned): attention_report
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
        """curves.png, proximity.png, attention_evolution.png and, for an image task
        (`image`: one example's pixels), attention_2d.png."""
        plot_curves(self.out_dir)
        plot_proximity(self.reports, self.scores, os.path.join(self.out_dir, "proximity.png"))
        plot_evolution_of_runs([self.out_dir], os.path.join(self.out_dir, "attention_evolution.png"))
        if self.image_task:
            plot_image_attention(image, self.first_maps, os.path.join(self.out_dir, "attention_2d.png"))
