"""The figures and tables of a set of finished train_flt.py runs, read from their files
(config.json, log.jsonl or log.jsonl.gz, summary.json), never from a model:

    python tools/flt_compare.py --runs=$(ls -d results/flt_window/*/ | paste -sd,) --out=out/window

Every outcome is judged again by stability.outcome from the val curves in the logs (a
record of an older rule included), and the separation verdicts are stability's rule.
Older records wrote other key names: RENAMED reads them as today's.

  flt_loss.png             train loss (10-step mean; dots: val loss), a panel per trained loop count K
  flt_grad_norm.png        total gradient norm before clipping, per step
  flt_test_time_loops.png  val loss after 1, 2, ... inference loops (the test-time loop curve)
  flt_residual_norm.png    the residual norm of every loop over training, a panel per (variant, K)
  flt_map_<recipe>.png     the stability map: final val loss over K x lr multiplier, outcomes marked
  flt_ladder_<recipe>.png  the loop ladder: final val loss against K, a colour per variant, a dot per seed
  compare.md               one row per finished run; then per (data, recipe, variant, K, lr), over
                           seeds: mean and spread, the gap to FLT paired by seed, the separation
                           rule against FLT, the residual norm over training, the gradient
                           statistics in windows, the gradient reaching each loop, and the
                           test-time loop curves
A table with no row, and a map or ladder with a single cell, mean nothing and are left out,
each said in one line.
"""

import contextlib
import gzip
import json
import math
import os
import sys
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configurator import configure, run_cli  # noqa: E402
from stability import gradient_statistics, judge_curves, separation_verdict  # noqa: E402

DEFAULTS = dict(runs="",                 # comma list of train_flt.py run folders or records
                out="out/flt_compare")   # where the figures and compare.md go
# An outcome of stability.outcome -> its letter in the stability map.
MARKS = {"learned": "L", "lagging": "G", "collapsed": "C", "did not learn": "D", "diverged": "N", "undetermined": "U"}

# The names older runs wrote (records under results/ keep them): read as today's.
RENAMED = {"test_loops": "inference_loops", "test_val_loss": "val_loss_by_loops",
           "test_hidden_norm": "hidden_norm_by_loops", "test_logit_entropy": "logit_entropy_by_loops",
           "test_val_accuracy": "val_accuracy_by_loops", "block_grad_norms": "block_param_grad_norms",
           "out_grad_norms": "out_output_grad_norms", "attn_grad_norms": "attn_output_grad_norms",
           "mlp_grad_norms": "mlp_output_grad_norms", "collapse_kept": "gain_kept"}
NOT_NUMBERS = ("outcome", "outcome_reason", "nan_step", "reference")
NAN = float("nan")


def read_run_log(d):
    """A run's log records: log.jsonl, or log.jsonl.gz in a record; a line cut short is dropped."""
    path, records = os.path.join(d, "log.jsonl"), []
    with (open(path) if os.path.exists(path) else gzip.open(path + ".gz", "rt")) as f:
        for line in f:
            with contextlib.suppress(json.JSONDecodeError):
                records.append(json.loads(line))
    return records


def as_numbers(record):
    """A summary or log record with older names replaced (RENAMED) and its numbers read back:
    strict JSON writes a NaN as null."""
    nan = lambda v: NAN if v is None else [nan(x) for x in v] if isinstance(v, list) else v
    return {RENAMED.get(k, k): v if k in NOT_NUMBERS else nan(v) for k, v in record.items()}


def load_run(d):
    """A run folder's (or a record's) config, log records and summary ({} if unfinished)."""
    path, summary = os.path.join(d, "config.json"), os.path.join(d, "summary.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing (is {d} a train_flt.py run folder?)")
    if "variant" not in (cfg := json.load(open(path))):
        raise ValueError(f"{d} is not a run of train_flt.py (its config has no variant)")
    return SimpleNamespace(dir=d, cfg=cfg, log=[as_numbers(r) for r in read_run_log(d)],
                           summary=as_numbers(json.load(open(summary)) if os.path.exists(summary) else {}))


val_curve = lambda records: {x["step"]: x["val_loss"] for x in records if "val_loss" in x}   # {step: val loss}


def rejudge(r):
    """The run with its outcome computed by stability.outcome from the val curves in its
    log (and its 1-loop reference's, when it has one), and its gain kept,
    (H_unigram - final val loss) / (H_unigram - the reference's final val loss)."""
    if not r.summary:
        return r
    ref_dir = r.summary.get("reference")
    if ref_dir and not os.path.exists(ref_dir):            # a record: its reference's record lies beside it
        ref_dir = os.path.join(os.path.dirname(os.path.abspath(r.dir)), os.path.basename(ref_dir.rstrip("/")))
    final, h, ref = r.summary["final_val_loss"], r.summary["unigram_entropy"], None
    if ref_dir and os.path.exists(os.path.join(ref_dir, "config.json")):
        ref = val_curve(read_run_log(ref_dir))
        ref_final = ref[max(ref)]
        r.summary["gain_kept"] = (h - final) / (h - ref_final) if h - ref_final > 0 else NAN
    r.summary["outcome"], r.summary["outcome_reason"] = judge_curves(val_curve(r.log), ref, final, h)
    return r


def by_cell(runs):
    """Finished runs grouped by (data, recipe, variant, K, lr multiplier), seeds sorted;
    a 1-loop run's variant reads '1-loop' (at one loop the five variants are one model)."""
    cells = {}
    for r in sorted((r for r in runs if r.summary), key=lambda r: r.cfg.get("seed", 0)):
        K = r.cfg["n_loops"]
        key = (r.cfg["data"], r.cfg["optim"], "1-loop" if K == 1 else r.cfg["variant"], K, r.cfg.get("lr_mult", 1.0))
        cells.setdefault(key, []).append(r)
    return cells


def compare(dirs, out):
    """The figures and compare.md of the runs in `dirs`, into `out`; prints the first
    table and returns its rows."""
    runs = [rejudge(load_run(d)) for d in dirs]
    if unfinished := [r.dir for r in runs if not r.summary]:
        print(f"not finished (no summary.json), so drawn but given no row: {', '.join(unfinished)}")
    os.makedirs(out, exist_ok=True)
    plot_runs(runs, out)
    rows = compare_table(runs)
    tables = [rows, seed_table(runs), paired_table(runs), separation_table(runs), residual_table(runs),
              grad_window_table(runs), grad_flow_table(runs), grad_flow_table(runs, "attn")] + [
        test_time_table(runs, key, digits=d) for key, d in (("val_loss_by_loops", 3), ("val_accuracy_by_loops", 3),
                                                             ("hidden_norm_by_loops", 1), ("logit_entropy_by_loops", 3))]
    if empty := [t for t in tables if len(t) <= 2]:
        print(f"compare.md leaves out {len(empty)} tables with no row for these runs")
    with open(os.path.join(out, "compare.md"), "w") as f:
        f.write("\n\n".join("\n".join(t) for t in tables if len(t) > 2) + "\n")
    print("\n".join(rows))
    print(f"tables: {os.path.join(out, 'compare.md')}; figures in {out}")
    return rows


# -----------------------------------------------------------------------------
# The figures

def plot_runs(runs, out_dir):
    """Every figure of the runs (load_run's) into out_dir."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    variants = list(dict.fromkeys(r.cfg["variant"] for r in runs))
    colour = {v: plt.get_cmap("tab10")(i) for i, v in enumerate(variants)}
    Ks = sorted(set(r.cfg["n_loops"] for r in runs))
    for name, title, ylabel, draw, logy, xlabel in (
            ("loss", "train loss (10-step mean; dots: val; dotted: the unigram entropy)", "nats / token", draw_loss,
             False, "step"),
            ("grad_norm", "total gradient norm before clipping", "L2 norm", draw_grad_norm, True, "step"),
            ("test_time_loops", "val loss against the inference loops (dotted: the trained K)", "nats / token",
             draw_test_time_loops, False, "inference loops")):
        panels(plt, runs, Ks, colour, os.path.join(out_dir, f"flt_{name}.png"), title, ylabel, draw, logy, xlabel)
    draw_residual_norms(plt, runs, variants, Ks, out_dir)
    for optim in sorted(set(r.cfg["optim"] for r in runs)):
        finished = [r for r in runs if r.cfg["optim"] == optim and r.summary]
        if len({(r.cfg["n_loops"], r.cfg.get("lr_mult", 1.0), r.cfg["variant"]) for r in finished}) < 2:
            print(f"flt_map_{optim}.png and flt_ladder_{optim}.png: skipped, one finished cell (variant, K, lr) "
                  f"of recipe {optim} has nothing to set it against")
            continue
        draw_stability_map(plt, finished, optim, variants, Ks, out_dir)
        draw_ladder(plt, finished, optim, colour, out_dir)


def save(plt, fig, path, dpi=90):
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


label = lambda r: "1-loop" if r.cfg["n_loops"] == 1 else r.cfg["variant"]


def panels(plt, runs, Ks, colour, path, title, ylabel, draw, logy, xlabel):
    """One panel per trained K, one line per run trained with that K; one legend for the
    figure, an entry per variant (not per seed)."""
    fig, axes = plt.subplots(1, len(Ks), figsize=(3.6 * len(Ks) + 1.6, 3.4), squeeze=False, sharey=True)
    legend = {}
    for ax, K in zip(axes[0], Ks):
        for r in (r for r in runs if r.cfg["n_loops"] == K):
            draw(ax, r, "grey" if K == 1 else colour[r.cfg["variant"]])
        ax.set(title=f"trained with K={K} loop{'s' * (K > 1)}", xlabel=xlabel, yscale="log" if logy else "linear")
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3)
        for handle, name in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(name, handle)
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(title, fontsize=10)
    fig.legend(legend.values(), legend.keys(), loc="center right", fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1 - 1.0 / fig.get_figwidth(), 1))
    save(plt, fig, path)


def draw_loss(ax, r, c):
    tr, va = [x for x in r.log if "loss" in x], [x for x in r.log if "val_loss" in x]
    y = np.asarray([x["loss"] for x in tr], dtype=float)
    ys = np.convolve(y, np.ones(10) / 10, mode="valid") if len(y) >= 10 else y      # the 10-step running mean
    ax.plot([x["step"] for x in tr][len(tr) - len(ys):], ys, color=c, lw=1.0, label=label(r))
    ax.plot([x["step"] for x in va], [x["val_loss"] for x in va], "o", color=c, ms=2.5)
    if "unigram_entropy" in r.summary:                     # the context-free level
        ax.axhline(r.summary["unigram_entropy"], color="grey", ls=":", lw=0.8)


def draw_grad_norm(ax, r, c):
    tr = [x for x in r.log if "grad_norm" in x]
    ax.plot([x["step"] for x in tr], [x["grad_norm"] for x in tr], color=c, lw=0.6, label=label(r))


def draw_test_time_loops(ax, r, c):
    if r.summary.get("val_loss_by_loops"):
        ax.plot(r.summary["inference_loops"], r.summary["val_loss_by_loops"], ".-", color=c, label=label(r))
        ax.axvline(r.cfg["n_loops"], color="grey", ls=":", lw=0.8)


def draw_residual_norms(plt, runs, variants, Ks, out_dir):
    """A grid, rows = variants, columns = K; one line per loop, purple (loop 1) to yellow
    (the last). A (variant, K) with no run gets a blank cell, not an empty plot."""
    fig, axes = plt.subplots(len(variants), len(Ks), figsize=(max(3.2 * len(Ks), 5), 2.3 * len(variants) + 0.8),
                             squeeze=False, sharex=True)
    lowest = {}                                            # the last drawn cell of each column
    for i, v in enumerate(variants):
        for j, K in enumerate(Ks):
            ax = axes[i][j]
            traces = [t for r in runs if r.cfg["variant"] == v and r.cfg["n_loops"] == K
                      if (t := [x for x in r.log if "residual_norms" in x])]
            if not traces:
                ax.axis("off")
                continue
            for tr in traces:
                arr = np.array([x["residual_norms"] for x in tr])
                for t in range(arr.shape[1]):
                    ax.plot([x["step"] for x in tr], arr[:, t], lw=0.8,
                            color=plt.get_cmap("viridis")(t / max(1, arr.shape[1] - 1)))
            ax.set_yscale("log")
            ax.set_title("1-loop reference" if K == 1 else f"{v}, K={K}", fontsize=8)
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=7)
            if j == 0 or all(not a.axison for a in axes[i][:j]):
                ax.set_ylabel("residual norm", fontsize=8)
            lowest[j] = ax
    for ax in lowest.values():                             # sharex labels only the bottom row, which may be blank
        ax.tick_params(labelbottom=True)
        ax.set_xlabel("step", fontsize=8)
    fig.suptitle("residual norm per loop against step (mean token L2 before the final norm; "
                 "purple: loop 1, yellow: the last)", fontsize=9)
    fig.tight_layout()
    save(plt, fig, os.path.join(out_dir, "flt_residual_norm.png"), dpi=80)


def draw_stability_map(plt, runs, optim, variants, Ks, out_dir):
    """The finished runs of one recipe: a panel per variant, final val loss over K x lr
    multiplier (mean over seeds), each cell marked with its seeds' outcomes (MARKS, by
    stability.outcome against the 1-loop run). The K=1 column is the same in every panel:
    at one loop the five variants are one model (looped.py)."""
    lrms = sorted(set(r.cfg.get("lr_mult", 1.0) for r in runs))
    losses = [r.summary["final_val_loss"] for r in runs if math.isfinite(r.summary["final_val_loss"])]
    fig, axes = plt.subplots(1, len(variants), figsize=(2.7 * len(variants), 2.2 + 0.35 * len(lrms)), squeeze=False)
    for ax, v in zip(axes[0], variants):
        grid = np.full((len(lrms), len(Ks)), np.nan)
        for (i, lrm), (j, K) in [(a, b) for a in enumerate(lrms) for b in enumerate(Ks)]:
            if cell := [r.summary for r in runs if (r.cfg["variant"] == v or K == 1) and r.cfg["n_loops"] == K
                        and r.cfg.get("lr_mult", 1.0) == lrm]:
                grid[i, j] = np.mean([c["final_val_loss"] for c in cell])
                marks = "".join(sorted({MARKS.get(c.get("outcome"), "?") for c in cell}))
                ax.text(j, i, f"{grid[i, j]:.2f}\n{marks}", ha="center", va="center", fontsize=7, color="w")
        ax.imshow(grid, cmap="viridis", origin="lower", aspect="auto", vmin=min(losses, default=0),
                  vmax=max(losses, default=1))
        ax.set_xticks(range(len(Ks)), Ks, fontsize=7)
        ax.set_yticks(range(len(lrms)), lrms, fontsize=7)
        ax.set_title(v, fontsize=9)
        ax.set_xlabel("loops K", fontsize=8)
    axes[0][0].set_ylabel("lr multiplier", fontsize=8)
    fig.suptitle(f"final val loss, recipe {optim} (mean over seeds); each seed's outcome against its 1-loop run:\n"
                 + ", ".join(f"{m} {o}" for o, m in MARKS.items()), fontsize=8)
    fig.tight_layout()
    save(plt, fig, os.path.join(out_dir, f"flt_map_{optim}.png"))


def draw_ladder(plt, runs, optim, colour, out_dir):
    """The loop ladder of one recipe at its own learning rate (lr multiplier 1): final val
    loss against the trained loop count K, a colour per variant, a dot per seed (nudged
    sideways so that seeds and variants do not hide each other), a line through the seeds'
    mean; x marks a seed that stability.outcome calls collapsed or did not learn. The
    1-loop reference is grey at K=1 (one model for every variant there)."""
    series = {}                                    # variant ('1-loop' at K=1): {K: its seeds' runs}
    for (_, _, variant, K, lrm), cell in by_cell(runs).items():
        if lrm == 1.0:
            series.setdefault(variant, {})[K] = [r for r in cell if math.isfinite(r.summary["final_val_loss"])]
    Ks = sorted({K for by_K in series.values() for K in by_K})
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for i, (v, by_K) in enumerate(series.items()):
        c = "grey" if v == "1-loop" else colour[v]
        x = {K: Ks.index(K) + 0.06 * (i - len(series) / 2) for K in by_K}
        for K, r in [(K, r) for K, cell in by_K.items() for r in cell]:
            bad = r.summary.get("outcome") in ("collapsed", "did not learn")
            ax.plot(x[K], r.summary["final_val_loss"], "x" if bad else "o", color=c, ms=5 if bad else 3.5, alpha=0.8)
        if means := [(x[K], np.mean([r.summary["final_val_loss"] for r in cell])) for K, cell in sorted(by_K.items())
                     if cell]:
            ax.plot(*zip(*means), "-" if len(means) > 1 else "o", color=c, lw=1, ms=3.5, label=v)
    ax.set_xticks(range(len(Ks)), Ks)
    ax.set(xlabel="loops K (trained)", ylabel="final val loss (nats / token)")
    ax.set_title(f"the loop ladder, recipe {optim}\na dot per seed, a line through their mean; "
                 f"x: collapsed or did not learn", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.tight_layout()
    save(plt, fig, os.path.join(out_dir, f"flt_ladder_{optim}.png"))


# -----------------------------------------------------------------------------
# The tables (markdown rows)

base = lambda data: os.path.basename(str(data))
head = lambda *cols: ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]


def peak_residual(s):
    """'peak (loop, step)': the largest residual norm over loops and steps, where it was."""
    if not (peaks := s.get("residual_norm_peak") or []):
        return "-"
    t = int(np.argmax(peaks))
    return f"{peaks[t]:.0f} (loop {t + 1}, step {s['residual_norm_peak_step'][t]})"


def spread(values, digits=3):
    """'mean ± std (v1, v2, ...)' over seeds (sample std); 'v (one seed)' for one value."""
    v = [x for x in values if x is not None and math.isfinite(x)]
    if len(v) < len(values):
        return f"{len(values) - len(v)} of {len(values)} not finite"
    if len(v) == 1:
        return f"{v[0]:.{digits}f} (one seed)"
    return f"{np.mean(v):.{digits}f} ± {np.std(v, ddof=1):.{digits}f} ({', '.join(f'{x:.{digits}f}' for x in v)})"


def compare_table(runs):
    """A row per finished run (summary.json; unfinished runs are left out)."""
    rows = head("run", "recipe", "variant", "K", "seed", "final val loss", "bits/byte", "res. norm first->last step "
                "(last loop)", "max res. norm (loop, step)", "grad volatility", "grad dlog ac1", "grad zigzag",
                "outcome (reason; gain kept)", "best test-time loops (val)")
    for r, s in [(r, r.summary) for r in runs if r.summary]:
        curve = s.get("val_loss_by_loops") or [NAN]
        best = int(np.nanargmin(curve)) + 1 if not all(math.isnan(c) for c in curve) else 0
        kept = f"; {s['gain_kept']:.2f}" if "gain_kept" in s else ""
        outcome = f"{s['outcome']} ({s.get('outcome_reason', '')}{kept})" if "outcome" in s else "-"
        first, last = (s[f"residual_norm_{k}"][-1] if s[f"residual_norm_{k}"] else NAN for k in ("first", "last"))
        rows.append(f"| {os.path.basename(os.path.normpath(r.dir))} | {r.cfg['optim']} | {s['variant']} "
                    f"| {s['n_loops']} | {r.cfg.get('seed')} | {s['final_val_loss']:.3f} "
                    f"| {s.get('final_val_bpb', NAN):.3f} | {first:.1f} -> {last:.1f} | {peak_residual(s)} "
                    f"| {s['grad_volatility']:.3f} | {s.get('grad_dlog_ac1', NAN):.2f} | {s.get('grad_zigzag', NAN):.2f} "
                    f"| {outcome} | {best} ({min(curve):.3f}) |")
    return rows


def seed_table(runs):
    """A row per cell: the mean and spread over seeds of the final val loss, its paired gap
    to the 1-loop reference (run - reference, per seed), the outcomes (stability.outcome),
    the peak residual norm and the gradient statistics."""
    rows = head("data", "recipe", "variant", "K", "lr x", "seeds", "final val loss", "minus its reference (paired)",
                "outcome per seed", "peak residual norm", "grad volatility", "grad dlog ac1", "grad zigzag")
    for (data, optim, variant, K, lrm), cell in by_cell(runs).items():
        s = [r.summary for r in cell]
        gap = [x["final_val_loss"] - x["reference_val_loss"] for x in s if "reference_val_loss" in x]
        verdicts = "; ".join(f"{x['outcome']} ({x.get('outcome_reason', '')})" for x in s if "outcome" in x)
        rows.append(f"| {base(data)} | {optim} | {variant} | {K} | {lrm} | {', '.join(str(r.cfg.get('seed')) for r in cell)} "
                    f"| {spread([x['final_val_loss'] for x in s])} | {spread(gap) if gap else '-'} "
                    f"| {verdicts or '-'} | {spread([x['max_residual_norm'] for x in s], 0)} "
                    f"| {spread([x['grad_volatility'] for x in s])} "
                    f"| {spread([x.get('grad_dlog_ac1', NAN) for x in s], 2)} "
                    f"| {spread([x.get('grad_zigzag', NAN) for x in s], 2)} |")
    return rows


def test_time_table(runs, key="val_loss_by_loops", loops=(1, 3, 6, 9, 12), digits=3):
    """A row per cell: a test-time field (`key`: the val loss, accuracy, hidden norm or
    logit entropy) after each inference loop count in `loops` and at 2K, mean ± std over seeds."""
    cells = {c: cell for c, cell in by_cell(runs).items() if all(r.summary.get(key) for r in cell)}
    Ls = sorted(set(loops) | {2 * c[3] for c in cells})
    rows = head(key, "data", "variant", "K", "seeds", *(f"{t} loops" for t in Ls))
    for (data, optim, variant, K, lrm), cell in cells.items():
        vals = [spread([r.summary[key][t - 1] for r in cell], digits).split(" (")[0]
                if all(len(r.summary[key]) >= t for r in cell) else "-" for t in Ls]
        rows.append(f"| {optim}, lr x{lrm} | {base(data)} | {variant} | {K} | {len(cell)} | " + " | ".join(vals) + " |")
    return rows


def paired_table(runs, against="FLT"):
    """A row per cell that has a run of `against` at the same K and seed: the final val
    loss minus that run's, per seed (same eval set), mean ± std. A gap inside its spread
    is not a separation."""
    cells = by_cell(runs)
    rows = head("data", "recipe", "variant", "K", "lr x", "seeds", f"final val loss minus {against}'s (paired by seed)")
    for (data, optim, variant, K, lrm), cell in cells.items():
        other = {r.cfg.get("seed"): r.summary["final_val_loss"] for r in cells.get((data, optim, against, K, lrm), [])}
        pairs = [(r.cfg.get("seed"), r.summary["final_val_loss"] - other[r.cfg.get("seed")])
                 for r in cell if r.cfg.get("seed") in other]
        if variant != against and pairs:
            rows.append(f"| {base(data)} | {optim} | {variant} | {K} | {lrm} "
                        f"| {', '.join(str(p[0]) for p in pairs)} | {spread([p[1] for p in pairs])} |")
    return rows


def separation_table(runs, against="FLT", others=("FLT_res", "LT_ia", "LT_i", "LT")):
    """A row per (data, recipe, K, lr) and variant in `others` that has runs of `against`
    on the same seeds: separation_verdict on their final val losses and outcomes (B4:
    FLT_res, B5: LT_ia, B6: LT_i and LT_ia, against FLT)."""
    cells = by_cell(runs)
    seed_of = lambda cell: {r.cfg.get("seed"): (r.summary["final_val_loss"], r.summary.get("outcome", "diverged"))
                            for r in cell}
    rows = head("data", "recipe", "K", "lr x", "variant", "seeds", "final val loss", f"{against}'s", "the rule")
    for (data, optim, variant, K, lrm), cell in cells.items():
        if variant in others and (ref := cells.get((data, optim, against, K, lrm))):
            a, b = seed_of(ref), seed_of(cell)
            seeds = sorted(set(a) & set(b))
            rows.append(f"| {base(data)} | {optim} | {K} | {lrm} | {variant} | {', '.join(map(str, seeds))} "
                        f"| {spread([b[x][0] for x in seeds])} | {spread([a[x][0] for x in seeds])} "
                        f"| {separation_verdict(a, b, against, variant)} |")
    return rows


last_logged_step = lambda runs, key: max((x["step"] for r in runs for x in r.log if key in x), default=250)


def residual_table(runs):
    """A row per cell: the residual norm (the largest over loops) at a few steps, mean over
    seeds: the map's first 250 in six, or, for longer runs (the 2,000-step window), 25 and
    250 then each quarter of the longest run, so growth reads apart from an early
    explosion (B2); then, per seed, the loop and step of the peak."""
    last = last_logged_step(runs, "residual_norms")
    at_steps = (25, 50, 100, 150, 200, 250) if last <= 250 else (25, 250, last // 4, last // 2, 3 * last // 4, last)
    rows = head("data", "variant", "K", "seeds", *(f"step {t}" for t in at_steps), "peak (loop, step) per seed")
    for (data, optim, variant, K, lrm), cell in by_cell(runs).items():
        per_step = [{x["step"]: max(x["residual_norms"]) for x in r.log if "residual_norms" in x} for r in cell]
        cols = [f"{np.mean([p[t] for p in per_step]):.0f}" if all(t in p for p in per_step) else "-" for t in at_steps]
        rows.append(f"| {base(data)} | {variant} | {K} | {len(cell)} | " + " | ".join(cols)
                    + f" | {'; '.join(peak_residual(r.summary) for r in cell)} |")
    return rows


def grad_window_table(runs, first=200):
    """For runs longer than 250 steps, a row per cell: the gradient statistics
    (stability.gradient_statistics) over the first `first` steps, the whole run and its
    second half, mean ± std over seeds, so B3's "oscillating in the first steps" reads
    against the rest of training. No rows for shorter runs (their summary holds the first 200)."""
    if (last := last_logged_step(runs, "grad_norm")) <= 250:
        return []
    windows = ((1, first), (1, last), (last // 2 + 1, last))
    stats = ("grad_volatility", "grad_dlog_ac1", "grad_zigzag")
    rows = head("data", "variant", "K", "seeds", *(f"{stat} {a}-{b}" for stat in ("volatility", "dlog ac1", "zigzag")
                                                   for a, b in windows))
    for (data, optim, variant, K, lrm), cell in by_cell(runs).items():
        per = [[gradient_statistics([x["grad_norm"] for x in r.log if "grad_norm" in x and a <= x["step"] <= b])
                for r in cell] for a, b in windows]
        cols = [f"{np.mean(v):.2f}" + (f" ± {np.std(v, ddof=1):.2f}" if len(v) > 1 else "")
                for stat in stats for v in ([g[stat] for g in per_seed] for per_seed in per)]
        rows.append(f"| {base(data)} | {variant} | {K} | {len(cell)} | " + " | ".join(cols) + " |")
    return rows


def grad_flow_table(runs, kind="out"):
    """A row per cell: the gradient norm of the block outputs (kind "out"; "attn": the
    attention outputs) per loop, summed over the blocks, averaged over the steps and the
    seeds: how much gradient reaches each loop."""
    rows = head("data", "variant", "K", "seeds", f"{kind} grad norm per loop, loop 1 ... K (x1e-3)", "loop 1 / loop K")
    for (data, optim, variant, K, lrm), cell in by_cell(runs).items():
        arr = [np.array([x[f"{kind}_output_grad_norms"] for x in r.log if x.get(f"{kind}_output_grad_norms")])
               for r in cell]
        if all(len(a) for a in arr):
            per_loop = np.mean([a.sum(2).mean(0) for a in arr], axis=0)
            rows.append(f"| {base(data)} | {variant} | {K} | {len(cell)} | {' '.join(f'{1e3 * v:.1f}' for v in per_loop)} "
                        f"| {per_loop[0] / max(per_loop[-1], 1e-30):.2g} |")
    return rows


def main(argv):
    cfg = configure(DEFAULTS, argv, __doc__, source=__file__)
    if not (dirs := [d for d in cfg["runs"].split(",") if d]):
        raise ValueError("give the runs: --runs=DIR,DIR,... (train_flt.py run folders or records)")
    return compare(dirs, cfg["out"])


if __name__ == "__main__":
    run_cli(main)
