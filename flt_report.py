"""
The figures and the table of finished train_flt.py runs, made from the files in
their folders (config.json, log.jsonl, summary.json), never from a model:

    python train_flt.py --compare=out/a,out/b --out_dir=assets

  flt_loss.png             train loss (10-step mean; dots: val loss), a panel per trained loop count K
  flt_grad_norm.png        total gradient norm before clipping, per step
  flt_test_time_loops.png  val loss after 1, 2, ... inference loops (the test-time loop curve)
  flt_residual_norm.png    the residual norm of every loop over training, a panel per (variant, K)
  flt_map_<recipe>.png     the stability map: final val loss over K x lr multiplier, collapses marked
  compare.md               the table: one row per finished run

A colour per variant throughout. Every run also draws its own figures at its end.
Read top to bottom: plot_runs, then each figure in the order above, then the table.
"""

import json
import math
import os
from types import SimpleNamespace

import numpy as np

import training

CURVES = ("flt_loss.png", "flt_grad_norm.png", "flt_residual_norm.png", "flt_test_time_loops.png")


def plot_runs(dirs, out_dir, quiet=False):
    """Draw the figures of the runs in `dirs` into out_dir and write compare.md there;
    print the table unless quiet. Returns the table's rows (markdown lines)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [load_run(d) for d in dirs]
    variants = list(dict.fromkeys(r.cfg["variant"] for r in runs))
    colour = {v: plt.get_cmap("tab10")(i) for i, v in enumerate(variants)}
    Ks = sorted(set(r.cfg["n_loops"] for r in runs))
    os.makedirs(out_dir, exist_ok=True)

    def panels(name, title, ylabel, draw, logy=False, xlabel="step"):
        """One panel per K, one line per run trained with that K."""
        fig, axes = plt.subplots(1, len(Ks), figsize=(4.2 * len(Ks), 3.4), squeeze=False, sharey=True)
        for ax, K in zip(axes[0], Ks):
            for r in runs:
                if r.cfg["n_loops"] == K:
                    draw(ax, r, colour[r.cfg["variant"]])
            ax.set_title(f"{title}, trained with K={K} loops", fontsize=9)
            ax.set_xlabel(xlabel)
            if logy:
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel(ylabel)
        if axes[0][-1].get_legend_handles_labels()[0]:
            axes[0][-1].legend(fontsize=7)
        save(fig, plt, out_dir, name, dpi=90)

    panels("flt_loss.png", "train loss (10-step mean; dots: val)", "nats / token", draw_loss)
    panels("flt_grad_norm.png", "total grad norm before clipping", "L2 norm", draw_grad_norm, logy=True)
    panels("flt_test_time_loops.png", "val loss vs inference loops (dotted: K)", "nats / token",
           draw_test_time_loops, xlabel="inference loops")
    draw_residual_norms(plt, runs, variants, Ks, out_dir)
    for optim in sorted(set(r.cfg.get("optim", "adamw") for r in runs)):
        draw_stability_map(plt, [r for r in runs if r.cfg.get("optim", "adamw") == optim and r.summary],
                           optim, variants, Ks, out_dir)
    rows = compare_table(runs)
    with open(os.path.join(out_dir, "compare.md"), "w") as f:
        f.write("\n".join(rows) + "\n")
    if not quiet:
        print("\n".join(rows))
        print(f"figures: {', '.join(os.path.join(out_dir, n) for n in CURVES)}, flt_map_<recipe>.png")
    return rows


def load_run(d):
    """A run folder's config, log records and summary ({} if the run has not finished)."""
    for name in ("config.json", "log.jsonl"):
        if not os.path.exists(os.path.join(d, name)):
            raise FileNotFoundError(f"--compare: {os.path.join(d, name)} is missing (is {d} a run folder?)")
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    summary_path = os.path.join(d, "summary.json")
    summary = json.load(open(summary_path)) if os.path.exists(summary_path) else {}
    return SimpleNamespace(dir=d, cfg=cfg, log=training.read_log(d), summary=summary)


def save(fig, plt, out_dir, name, dpi):
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, name), dpi=dpi)
    plt.close(fig)


def smooth(y, w=10):
    """The w-step running mean (only the steps with a full window)."""
    y = np.asarray(y, dtype=float)
    return np.convolve(y, np.ones(w) / w, mode="valid") if len(y) >= w else y


# --- the figures, each drawn from the files of the runs ------------------------------

def draw_loss(ax, r, c):
    tr = [x for x in r.log if "loss" in x]
    ys = smooth([x["loss"] for x in tr])
    ax.plot([x["step"] for x in tr][len(tr) - len(ys):], ys, color=c, lw=1.2, label=r.cfg["variant"])
    va = [x for x in r.log if "val_loss" in x]
    ax.plot([x["step"] for x in va], [x["val_loss"] for x in va], "o", color=c, ms=3)
    if "unigram_entropy" in r.summary:                     # the context-free level
        ax.axhline(r.summary["unigram_entropy"], color="grey", ls=":", lw=0.8)


def draw_grad_norm(ax, r, c):
    tr = [x for x in r.log if "grad_norm" in x]
    ax.plot([x["step"] for x in tr], [x["grad_norm"] for x in tr], color=c, lw=0.6, label=r.cfg["variant"])


def draw_test_time_loops(ax, r, c):
    s = r.summary
    if s.get("test_val_loss"):
        ax.plot(s["test_loops"], s["test_val_loss"], ".-", color=c, label=r.cfg["variant"])
        ax.axvline(r.cfg["n_loops"], color="grey", ls=":", lw=0.8)


def draw_residual_norms(plt, runs, variants, Ks, out_dir):
    """A grid, rows = variants, columns = K; one line per loop, light to dark."""
    fig, axes = plt.subplots(len(variants), len(Ks), figsize=(max(3.6 * len(Ks), 5), 2.2 * len(variants)),
                             squeeze=False, sharex=True)
    for i, v in enumerate(variants):
        for j, K in enumerate(Ks):
            ax = axes[i][j]
            for r in runs:
                if r.cfg["variant"] == v and r.cfg["n_loops"] == K:
                    tr = [x for x in r.log if "residual_norms" in x]
                    arr = np.array([x["residual_norms"] for x in tr])
                    for t in range(arr.shape[1]):
                        ax.plot([x["step"] for x in tr], arr[:, t], lw=0.8,
                                color=plt.get_cmap("viridis")(t / max(1, arr.shape[1] - 1)))
                    ax.set_yscale("log")
            ax.set_title(f"{v}, K={K}", fontsize=8)
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=7)
    fig.suptitle("residual norm per loop vs step\n"
                 "(mean token L2 before the final norm; purple = loop 1, yellow = last)", fontsize=9)
    save(fig, plt, out_dir, "flt_residual_norm.png", dpi=80)


def draw_stability_map(plt, runs, optim, variants, Ks, out_dir):
    """The finished runs of one recipe: a panel per variant, final val loss over K x lr
    multiplier (mean over seeds), marked C (collapse) / P (partial) by the collapse rule.
    The K=1 column is the same in every panel: at one loop the five variants are one model (looped.py)."""
    lrms = sorted(set(r.cfg.get("lr_mult", 1.0) for r in runs))
    losses = [r.summary["final_val_loss"] for r in runs if math.isfinite(r.summary["final_val_loss"])]
    fig, axes = plt.subplots(1, len(variants), figsize=(2.6 * len(variants), 2.6), squeeze=False)
    for ax, v in zip(axes[0], variants):
        grid = np.full((len(lrms), len(Ks)), np.nan)
        for i, lrm in enumerate(lrms):
            for j, K in enumerate(Ks):
                cell = [r.summary for r in runs if (r.cfg["variant"] == v or K == 1) and r.cfg["n_loops"] == K
                        and r.cfg.get("lr_mult", 1.0) == lrm]
                if cell:
                    grid[i, j] = np.mean([c["final_val_loss"] for c in cell])
                    marks = "".join(sorted({c.get("collapse", "")[:1].upper() for c in cell} & {"C", "P"}))
                    ax.text(j, i, f"{grid[i, j]:.2f}{marks}", ha="center", va="center", fontsize=7, color="w")
        ax.imshow(grid, cmap="viridis", origin="lower", aspect="auto", vmin=min(losses, default=0),
                  vmax=max(losses, default=1))
        ax.set_xticks(range(len(Ks)), Ks, fontsize=7)
        ax.set_yticks(range(len(lrms)), lrms, fontsize=7)
        ax.set_title(v, fontsize=9)
        ax.set_xlabel("loops K", fontsize=8)
    axes[0][0].set_ylabel("lr multiplier", fontsize=8)
    fig.suptitle(f"final val loss, recipe {optim} (C collapse, P partial, vs the 1-loop run)", fontsize=9)
    save(fig, plt, out_dir, f"flt_map_{optim}.png", dpi=90)


# --- the table ----------------------------------------------------------------------

def compare_table(runs):
    """compare.md: a markdown row per finished run (summary.json; unfinished runs are left out)."""
    rows = ["| run | recipe | variant | K | final val loss | bits/byte | res. norm first->last step (last loop) "
            "| max res. norm | peak step (last loop) | grad osc | grad zigzag | diverged | collapse (kept) "
            "| best test-time loops (val) |", "|" + "---|" * 14]
    nan = float("nan")
    for r in runs:
        s = r.summary
        if not s:
            continue
        curve = s.get("test_val_loss") or [nan]
        best = int(np.nanargmin(curve)) + 1 if not all(math.isnan(c) for c in curve) else 0
        peak = s.get("residual_norm_peak_step") or [0]
        collapse = f"{s['collapse']} ({s['collapse_kept']:.2f})" if "collapse" in s else "-"
        rows.append(f"| {os.path.basename(os.path.normpath(r.dir))} | {r.cfg.get('optim', 'adamw')} "
                    f"| {s['variant']} | {s['n_loops']} "
                    f"| {s['final_val_loss']:.3f} | {s.get('final_val_bpb', nan):.3f} "
                    f"| {s['residual_norm_first'][-1] if s['residual_norm_first'] else nan:.1f} -> "
                    f"{s['residual_norm_last'][-1] if s['residual_norm_last'] else nan:.1f} "
                    f"| {s['max_residual_norm']:.1f} | {peak[-1]} | {s['grad_osc']:.3f} "
                    f"| {s.get('grad_zigzag', nan):.2f} | {s['diverged_reason'] or 'no'} | {collapse} "
                    f"| {best} ({min(curve):.3f}) |")
    return rows
