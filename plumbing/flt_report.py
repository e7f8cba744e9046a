"""
What the files of finished train_flt.py runs say (config.json, log.jsonl,
summary.json), read from those files, never from a model: the statistics and
verdicts of a run's curves, then the figures and the tables of a set of runs.

    python train_flt.py --compare=out/a,out/b --out_dir=assets     (compare() here)

The statistics and the collapse and separation rules are stability.py's.

The figures and the table:
  flt_loss.png             train loss (10-step mean; dots: val loss), a panel per trained loop count K
  flt_grad_norm.png        total gradient norm before clipping, per step
  flt_test_time_loops.png  val loss after 1, 2, ... inference loops (the test-time loop curve)
  flt_residual_norm.png    the residual norm of every loop over training, a panel per (variant, K)
  flt_map_<recipe>.png     the stability map: final val loss over K x lr multiplier, collapses marked
  flt_ladder_<recipe>.png  the loop ladder: final val loss against K, a colour per variant, a dot per seed
  compare.md               the tables: one row per finished run; then per (recipe, variant, K, lr),
                           over seeds: the mean and spread (with grad volatility, grad dlog ac1
                           and grad zigzag side by side), the gap to FLT paired by seed, the
                           separation rule against FLT (separation_verdict),
                           the residual norm over training, the gradient statistics over
                           the first 200 steps, the whole run and its second half (runs past 250),
                           the gradient reaching each loop, and the test-time loop curve

A colour per variant throughout. Every run also draws its own figures at its end.
Read top to bottom: the statistics, the summary's fields, compare and plot_runs, each figure in
the order above, the tables.
"""

import json
import math
import os
from types import SimpleNamespace

import numpy as np

from plumbing import runfiles
from stability import gradient_statistics, judge_curves, separation_verdict
from plumbing.training import read_log

CURVES = ("flt_loss.png", "flt_grad_norm.png", "flt_residual_norm.png", "flt_test_time_loops.png")
COMPARE_DIR = "out/flt_compare"      # --compare's folder when --out_dir is not given: never a run's


def val_curve(records):
    """{step: val loss} from a run's log records."""
    return {x["step"]: x["val_loss"] for x in records if "val_loss" in x}


# --- the fields of summary.json that train_flt.py computes from log.jsonl ----------------

def verdict_line(summary):
    """The run's last line: its final val loss against the unigram entropy (the loss of a
    model that ignores context), the outcome (stability.outcome, the one rule) and the
    residual peak."""
    s = summary
    why = f"a NaN at step {s['nan_step']}" if s.get("nan_step") else s["outcome_reason"]
    return (f"{s['variant']}, {s['n_loops']} loops: final val loss {s['final_val_loss']:.3f} nats/token against "
            f"{s['unigram_entropy']:.3f} for a model that ignores context (the unigram entropy): "
            f"{s['outcome']} ({why}; stability.outcome); residual norm peak {s['max_residual_norm']:.0f}")


def reference_fields(reference, val, final_loss, h_unigram):
    """The summary's fields of a run given --reference=DIR (a finished 1-loop run, same
    data, recipe, lr, budget and eval set): the reference's final val loss and its val
    curve at the steps both runs have (reference_val_steps, reference_val_curve: what
    stability.outcome reads beside the run's curve at those steps), and
    gain_kept = (H_unigram - final val loss) / (H_unigram - the reference's final val loss)."""
    ref_curve = val_curve(read_run_log(reference))
    ref_final = ref_curve[max(ref_curve)]
    kept = (h_unigram - final_loss) / (h_unigram - ref_final) if h_unigram - ref_final > 0 else float("nan")
    steps = sorted(set(val) & set(ref_curve))
    return {"reference": reference, "reference_val_loss": ref_final, "reference_val_steps": steps,
            "reference_val_curve": [ref_curve[k] for k in steps], "gain_kept": kept}


# --- the figures and tables of a set of runs ----------------------------------------

def compare(dirs, out_dir=None):
    """--compare: the figures and compare.md of the finished runs in `dirs`, drawn into
    out_dir (COMPARE_DIR if None), a folder that holds no run (a run's own figures are
    never replaced), replacing only files an earlier --compare wrote there
    (runfiles.claim_outputs). Every run is read, and the folder checked, before
    anything is written. Returns the table's rows."""
    out = out_dir or COMPARE_DIR
    recipes = {load_run(d).cfg["optim"] for d in dirs}
    outputs = runfiles.claim_outputs(out, "train_flt.py --compare", ("compare.md", *CURVES,
                                                                     *(f"flt_map_{o}.png" for o in recipes),
                                                                     *(f"flt_ladder_{o}.png" for o in recipes)))
    try:
        return plot_runs(dirs, out)
    finally:
        outputs.release()


def plot_runs(dirs, out_dir, quiet=False):
    """Draw the figures of the runs in `dirs` into out_dir and write compare.md there;
    print the table unless quiet. Returns the table's rows (markdown lines)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [rejudge(load_run(d)) for d in dirs]
    unfinished = [r.dir for r in runs if not r.summary]
    if unfinished and not quiet:
        print(f"not finished (no summary.json: running, or stopped before its end), so drawn but given no row in "
              f"the tables: {', '.join(unfinished)}")
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
        one_each = {}                                   # one legend entry a variant, not one a seed
        for handle, label in zip(*axes[0][-1].get_legend_handles_labels()):
            one_each.setdefault(label, handle)
        if one_each:
            axes[0][-1].legend(one_each.values(), one_each.keys(), fontsize=7)
        fig.tight_layout()
        save_figure(plt, fig, os.path.join(out_dir, name), dpi=90)

    panels("flt_loss.png", "train loss (10-step mean; dots: val)", "nats / token", draw_loss)
    panels("flt_grad_norm.png", "total grad norm before clipping", "L2 norm", draw_grad_norm, logy=True)
    panels("flt_test_time_loops.png", "val loss vs inference loops (dotted: K)", "nats / token",
           draw_test_time_loops, xlabel="inference loops")
    draw_residual_norms(plt, runs, variants, Ks, out_dir)
    for optim in sorted(set(r.cfg["optim"] for r in runs)):
        finished = [r for r in runs if r.cfg["optim"] == optim and r.summary]
        draw_stability_map(plt, finished, optim, variants, Ks, out_dir)
        draw_ladder(plt, finished, optim, colour, out_dir)
    rows = compare_table(runs)
    tables = [rows, seed_table(runs), paired_table(runs), separation_table(runs), residual_table(runs),
              grad_window_table(runs), grad_flow_table(runs), grad_flow_table(runs, "attn")] + [
        test_time_table(runs, key, digits=d) for key, d in (("val_loss_by_loops", 3), ("val_accuracy_by_loops", 3),
                                                             ("hidden_norm_by_loops", 1), ("logit_entropy_by_loops", 3))]
    runfiles.write_file(os.path.join(out_dir, "compare.md"), "\n\n".join("\n".join(t) for t in tables) + "\n")
    if not quiet:
        print("\n".join(rows))
        print(f"figures: {', '.join(os.path.join(out_dir, n) for n in CURVES)}, flt_map_<recipe>.png, "
              f"flt_ladder_<recipe>.png")
    return rows


def read_run_log(d):
    """A run's log records: log.jsonl, or log.jsonl.gz in a run's record (results/)."""
    gz = os.path.join(d, "log.jsonl.gz")
    if not os.path.exists(os.path.join(d, "log.jsonl")) and os.path.exists(gz):
        import gzip
        with gzip.open(gz, "rt") as f:
            return [json.loads(line) for line in f if line.strip()]
    return read_log(d)


def load_run(d):
    """A run folder's (or a run record's) config, log records and summary ({} if the
    run has not finished)."""
    for name in ("config.json", "log.jsonl"):
        if not os.path.exists(os.path.join(d, name)) and not os.path.exists(os.path.join(d, name + ".gz")):
            raise FileNotFoundError(f"--compare: {os.path.join(d, name)} is missing (is {d} a run folder?)")
    summary_path = os.path.join(d, "summary.json")
    try:
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        summary = json.load(open(summary_path)) if os.path.exists(summary_path) else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"--compare: {d} holds a config.json or summary.json that is not JSON ({e.msg}, line "
                         f"{e.lineno}): restore it, or leave the run out") from None
    if "variant" not in cfg:
        raise ValueError(f"--compare: {d} is not a run of train_flt.py (its config has no variant); compare only "
                         f"train_flt.py runs")
    if "optim" not in cfg:
        raise ValueError(f"--compare: {d} was written by a train_flt.py that did not record its recipe (its "
                         f"config has no optim); train it again to compare it")
    return SimpleNamespace(dir=d, cfg=cfg, log=[as_numbers(renamed(r)) for r in read_run_log(d)],
                           summary=as_numbers(renamed(summary)))


# The names older runs wrote (records under results/ keep them): read as today's.
RENAMED = {"test_loops": "inference_loops", "test_val_loss": "val_loss_by_loops",
           "test_hidden_norm": "hidden_norm_by_loops", "test_logit_entropy": "logit_entropy_by_loops",
           "test_val_accuracy": "val_accuracy_by_loops", "block_grad_norms": "block_param_grad_norms",
           "out_grad_norms": "out_output_grad_norms", "attn_grad_norms": "attn_output_grad_norms",
           "mlp_grad_norms": "mlp_output_grad_norms", "collapse_kept": "gain_kept"}


def renamed(record):
    """A summary or log record with an older run's names replaced by today's (RENAMED)."""
    return {RENAMED.get(k, k): v for k, v in record.items()}


NOT_NUMBERS = ("outcome", "outcome_reason", "nan_step", "reference")


def as_numbers(record):
    """A summary or log record as written (strict JSON: a NaN is null) with its numbers
    read back: null is NaN again, in the fields and lists that hold numbers."""
    nan = lambda v: float("nan") if v is None else [nan(x) for x in v] if isinstance(v, list) else v
    return {k: v if k in NOT_NUMBERS else nan(v) for k, v in record.items()}


def rejudge(r):
    """The run with its outcome computed by stability.outcome from the val curves in its
    log.jsonl (and its reference's, when it has one), so that a table always shows this
    file's rule, whatever summary.json holds (a record of an older rule included)."""
    if not r.summary:                                      # not finished: nothing to judge
        return r
    ref_dir = r.summary.get("reference")
    if ref_dir and not os.path.exists(ref_dir):            # a record: its reference's record lies beside it
        ref_dir = os.path.join(os.path.dirname(os.path.abspath(r.dir)), os.path.basename(ref_dir.rstrip("/")))
    val, final, h = val_curve(r.log), r.summary["final_val_loss"], r.summary["unigram_entropy"]
    ref = None
    if ref_dir and os.path.exists(os.path.join(ref_dir, "config.json")):
        ref = val_curve(read_run_log(ref_dir))
        r.summary["gain_kept"] = reference_fields(ref_dir, val, final, h)["gain_kept"]
    r.summary["outcome"], r.summary["outcome_reason"] = judge_curves(val, ref, final, h)
    return r


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
    if s.get("val_loss_by_loops"):
        ax.plot(s["inference_loops"], s["val_loss_by_loops"], ".-", color=c, label=r.cfg["variant"])
        ax.axvline(r.cfg["n_loops"], color="grey", ls=":", lw=0.8)


def draw_residual_norms(plt, runs, variants, Ks, out_dir):
    """A grid, rows = variants, columns = K; one line per loop, light to dark. A (variant, K)
    with no run (the 1-loop reference is one variant's) gets a blank cell, not an empty plot."""
    fig, axes = plt.subplots(len(variants), len(Ks), figsize=(max(3.6 * len(Ks), 5), 2.2 * len(variants)),
                             squeeze=False, sharex=True)
    lowest = {}                                            # the last drawn cell of each column
    for i, v in enumerate(variants):
        for j, K in enumerate(Ks):
            ax = axes[i][j]
            cell = [r for r in runs if r.cfg["variant"] == v and r.cfg["n_loops"] == K]
            traces = [t for t in ([x for x in r.log if "residual_norms" in x] for r in cell) if t]  # a run in its first step has none
            if not traces:
                ax.axis("off")
                continue
            for tr in traces:
                arr = np.array([x["residual_norms"] for x in tr])
                for t in range(arr.shape[1]):
                    ax.plot([x["step"] for x in tr], arr[:, t], lw=0.8,
                            color=plt.get_cmap("viridis")(t / max(1, arr.shape[1] - 1)))
            ax.set_yscale("log")
            ax.set_title(f"{v}, K={K}", fontsize=8)
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=7)
            lowest[j] = ax
    for ax in lowest.values():                             # sharex labels only the bottom row, which may be blank
        ax.tick_params(labelbottom=True)
    fig.suptitle("residual norm per loop vs step\n"
                 "(mean token L2 before the final norm; purple = loop 1, yellow = last)", fontsize=9)
    fig.tight_layout()
    save_figure(plt, fig, os.path.join(out_dir, "flt_residual_norm.png"), dpi=80)


def draw_stability_map(plt, runs, optim, variants, Ks, out_dir):
    """The finished runs of one recipe: a panel per variant, final val loss over K x lr
    multiplier (mean over seeds), marked D (did not learn), C (collapsed), L (lagging) by
    stability.outcome against the 1-loop run.
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
                    marks = "".join(sorted({c.get("outcome", "")[:1].upper() for c in cell} & {"C", "D", "L"}))
                    ax.text(j, i, f"{grid[i, j]:.2f}{marks}", ha="center", va="center", fontsize=7, color="w")
        ax.imshow(grid, cmap="viridis", origin="lower", aspect="auto", vmin=min(losses, default=0),
                  vmax=max(losses, default=1))
        ax.set_xticks(range(len(Ks)), Ks, fontsize=7)
        ax.set_yticks(range(len(lrms)), lrms, fontsize=7)
        ax.set_title(v, fontsize=9)
        ax.set_xlabel("loops K", fontsize=8)
    axes[0][0].set_ylabel("lr multiplier", fontsize=8)
    fig.suptitle(f"final val loss, recipe {optim} (D did not learn, C collapsed, L lagging, vs the 1-loop run)", fontsize=9)
    fig.tight_layout()
    save_figure(plt, fig, os.path.join(out_dir, f"flt_map_{optim}.png"), dpi=90)


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
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    for i, (v, by_K) in enumerate(series.items()):
        c = "grey" if v == "1-loop" else colour[v]
        x = {K: Ks.index(K) + 0.06 * (i - len(series) / 2) for K in by_K}
        for K, cell in by_K.items():
            for r in cell:
                bad = r.summary.get("outcome") in ("collapsed", "did not learn")
                ax.plot(x[K], r.summary["final_val_loss"], "x" if bad else "o", color=c, ms=5 if bad else 3.5, alpha=0.8)
        means = [(x[K], np.mean([r.summary["final_val_loss"] for r in cell])) for K, cell in sorted(by_K.items()) if cell]
        if means:
            ax.plot(*zip(*means), "-", color=c, lw=1, label=v)
    ax.set_xticks(range(len(Ks)), Ks)
    ax.set_xlabel("loops K (trained)")
    ax.set_ylabel("final val loss (nats / token)")
    ax.set_title(f"the loop ladder, recipe {optim}: a dot per seed, x collapsed or did not learn", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(plt, fig, os.path.join(out_dir, f"flt_ladder_{optim}.png"), dpi=90)


# --- the table ----------------------------------------------------------------------

def compare_table(runs):
    """A markdown row per finished run (summary.json; unfinished runs are left out)."""
    rows = ["| run | recipe | variant | K | seed | final val loss | bits/byte | res. norm first->last step "
            "(last loop) | max res. norm (loop, step) | grad volatility | grad dlog ac1 | grad zigzag "
            "| outcome (reason; gain kept) | best test-time loops (val) |", "|" + "---|" * 14]
    nan = float("nan")
    for r in runs:
        s = r.summary
        if not s:
            continue
        curve = s.get("val_loss_by_loops") or [nan]
        best = int(np.nanargmin(curve)) + 1 if not all(math.isnan(c) for c in curve) else 0
        kept = f"; {s['gain_kept']:.2f}" if "gain_kept" in s else ""
        outcome = f"{s['outcome']} ({s.get('outcome_reason', '')}{kept})" if "outcome" in s else "-"
        rows.append(f"| {os.path.basename(os.path.normpath(r.dir))} | {r.cfg['optim']} "
                    f"| {s['variant']} | {s['n_loops']} | {r.cfg.get('seed')} "
                    f"| {s['final_val_loss']:.3f} | {s.get('final_val_bpb', nan):.3f} "
                    f"| {s['residual_norm_first'][-1] if s['residual_norm_first'] else nan:.1f} -> "
                    f"{s['residual_norm_last'][-1] if s['residual_norm_last'] else nan:.1f} "
                    f"| {peak_residual(s)} | {s['grad_volatility']:.3f} "
                    f"| {s.get('grad_dlog_ac1', nan):.2f} | {s.get('grad_zigzag', nan):.2f} "
                    f"| {outcome} | {best} ({min(curve):.3f}) |")
    return rows


def peak_residual(s):
    """'peak (loop, step)': the largest residual norm over loops and steps, where it was."""
    peaks = s.get("residual_norm_peak") or []
    if not peaks:
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
    each = ", ".join(f"{x:.{digits}f}" for x in v)
    return f"{np.mean(v):.{digits}f} ± {np.std(v, ddof=1):.{digits}f} ({each})"


def by_cell(runs):
    """Finished runs grouped by (data, recipe, variant, K, lr multiplier), seeds sorted;
    a 1-loop run's variant reads '1-loop' (at one loop the five variants are one model)."""
    cells = {}
    for r in sorted((r for r in runs if r.summary), key=lambda r: r.cfg.get("seed", 0)):
        K = r.cfg["n_loops"]
        key = (r.cfg["data"], r.cfg["optim"], "1-loop" if K == 1 else r.cfg["variant"], K,
               r.cfg.get("lr_mult", 1.0))
        cells.setdefault(key, []).append(r)
    return cells


def seed_table(runs):
    """A markdown row per (data, recipe, variant, K, lr): the mean and spread over seeds
    of the final val loss, its paired gap to the 1-loop reference (run - reference, per
    seed), the outcomes (stability.outcome), the peak residual norm and the gradient statistics."""
    rows = ["| data | recipe | variant | K | lr x | seeds | final val loss | minus its reference (paired) "
            "| outcome per seed | peak residual norm | grad volatility | grad dlog ac1 | grad zigzag |",
            "|" + "---|" * 13]
    for (data, optim, variant, K, lrm), cell in by_cell(runs).items():
        s = [r.summary for r in cell]
        gap = [x["final_val_loss"] - x["reference_val_loss"] for x in s if "reference_val_loss" in x]
        verdicts = "; ".join(f"{x['outcome']} ({x.get('outcome_reason', '')})" for x in s if "outcome" in x)
        rows.append(f"| {os.path.basename(str(data))} | {optim} | {variant} | {K} | {lrm} "
                    f"| {', '.join(str(r.cfg.get('seed')) for r in cell)} "
                    f"| {spread([x['final_val_loss'] for x in s])} | {spread(gap) if gap else '-'} "
                    f"| {verdicts or '-'} | {spread([x['max_residual_norm'] for x in s], 0)} "
                    f"| {spread([x['grad_volatility'] for x in s])} "
                    f"| {spread([x.get('grad_dlog_ac1', float('nan')) for x in s], 2)} "
                    f"| {spread([x.get('grad_zigzag', float('nan')) for x in s], 2)} |")
    return rows


def test_time_table(runs, key="val_loss_by_loops", loops=(1, 3, 6, 9, 12), digits=3):
    """A markdown row per (data, recipe, variant, K, lr): a test-time field (`key`: the
    val loss, accuracy, hidden norm or logit entropy) read after each inference loop
    count in `loops` and at 2K, mean ± std over seeds."""
    cells = {c: cell for c, cell in by_cell(runs).items() if all(r.summary.get(key) for r in cell)}
    Ls = sorted(set(loops) | {2 * c[3] for c in cells})
    rows = [f"| {key} | data | variant | K | seeds | " + " | ".join(f"{t} loops" for t in Ls) + " |",
            "|" + "---|" * (5 + len(Ls))]
    for (data, optim, variant, K, lrm), cell in cells.items():
        vals = [" ".join(spread([r.summary[key][t - 1] for r in cell], digits).split(" (")[:1])
                if all(len(r.summary[key]) >= t for r in cell) else "-" for t in Ls]
        rows.append(f"| {optim}, lr x{lrm} | {os.path.basename(str(data))} | {variant} | {K} | {len(cell)} | "
                    + " | ".join(vals) + " |")
    return rows


def paired_table(runs, against="FLT"):
    """A markdown row per (data, recipe, variant, K, lr) that has a run of `against` at
    the same K and seed: the final val loss minus that run's, per seed (same eval set),
    mean ± std. A gap inside its spread is not a separation."""
    cells = by_cell(runs)
    rows = [f"| data | recipe | variant | K | lr x | seeds | final val loss minus {against}'s (paired by seed) |",
            "|---|---|---|---|---|---|---|"]
    for (data, optim, variant, K, lrm), cell in cells.items():
        other = {r.cfg.get("seed"): r.summary["final_val_loss"] for r in cells.get((data, optim, against, K, lrm), [])}
        pairs = [(r.cfg.get("seed"), r.summary["final_val_loss"] - other[r.cfg.get("seed")])
                 for r in cell if r.cfg.get("seed") in other]
        if variant != against and pairs:
            rows.append(f"| {os.path.basename(str(data))} | {optim} | {variant} | {K} | {lrm} "
                        f"| {', '.join(str(p[0]) for p in pairs)} | {spread([p[1] for p in pairs])} |")
    return rows


def separation_table(runs, against="FLT", others=("FLT_res", "LT_ia", "LT_i", "LT")):
    """A markdown row per (data, recipe, K, lr) and variant in `others` that has runs of
    `against` on the same seeds: separation_verdict on their final val losses and
    outcomes (B4: FLT_res, B5: LT_ia, B6: LT_i and LT_ia, against FLT)."""
    cells = by_cell(runs)
    seed_of = lambda cell: {r.cfg.get("seed"): (r.summary["final_val_loss"], r.summary.get("outcome", "diverged"))
                            for r in cell}
    rows = [f"| data | recipe | K | lr x | variant | seeds | final val loss | {against}'s | the rule |",
            "|---|---|---|---|---|---|---|---|---|"]
    for (data, optim, variant, K, lrm), cell in cells.items():
        base = cells.get((data, optim, against, K, lrm))
        if variant not in others or not base:
            continue
        a, b = seed_of(base), seed_of(cell)
        seeds = sorted(set(a) & set(b))
        rows.append(f"| {os.path.basename(str(data))} | {optim} | {K} | {lrm} | {variant} "
                    f"| {', '.join(map(str, seeds))} | {spread([b[x][0] for x in seeds])} "
                    f"| {spread([a[x][0] for x in seeds])} | {separation_verdict(a, b, against, variant)} |")
    return rows


def last_logged_step(runs, key, default=250):
    """The last step at which any run's log holds key (default if none does)."""
    return max((x["step"] for r in runs for x in r.log if key in x), default=default)


def residual_steps(runs):
    """The steps residual_table reads: the map's first 250 in six, or, for longer runs (the
    2,000-step window), 25 and 250 then each quarter of the longest run, so a reader sees
    whether the norm grows, plateaus or explodes, and when (B2)."""
    last = last_logged_step(runs, "residual_norms")
    if last <= 250:
        return (25, 50, 100, 150, 200, 250)
    return (25, 250, last // 4, last // 2, 3 * last // 4, last)


def residual_table(runs, at_steps=None):
    """A markdown row per (data, recipe, variant, K, lr): the residual norm (the largest
    over loops) at a few steps (residual_steps), mean over seeds, so growth over training
    reads apart from an early explosion; then, per seed, the loop and step of the peak."""
    at_steps = at_steps or residual_steps(runs)
    rows = ["| data | variant | K | seeds | " + " | ".join(f"step {t}" for t in at_steps) + " | peak (loop, step) per seed |",
            "|" + "---|" * (5 + len(at_steps))]
    for (data, optim, variant, K, lrm), cell in by_cell(runs).items():
        per_step = [{x["step"]: max(x["residual_norms"]) for x in r.log if "residual_norms" in x} for r in cell]
        cols = [f"{np.mean([p[t] for p in per_step]):.0f}" if all(t in p for p in per_step) else "-"
                for t in at_steps]
        rows.append(f"| {os.path.basename(str(data))} | {variant} | {K} | {len(cell)} | " + " | ".join(cols)
                    + f" | {'; '.join(peak_residual(r.summary) for r in cell)} |")
    return rows


def grad_window_table(runs, first=200):
    """For runs longer than 250 steps (the 2,000-step window), a markdown row per (data,
    recipe, variant, K, lr): the gradient statistics (stability.gradient_statistics, on
    the logged total norms) over the first `first` steps, the whole run and its second
    half, mean ± std over seeds, so B3's "oscillating in the first steps" reads against
    the rest of training. No rows for shorter runs (their summary holds the first 200)."""
    last = last_logged_step(runs, "grad_norm")
    if last <= 250:
        return []
    windows = ((1, first), (1, last), (last // 2 + 1, last))
    names = [f"{a}-{b}" for a, b in windows]
    rows = ["| data | variant | K | seeds | " + " | ".join(f"{stat} {n}" for stat in ("volatility", "dlog ac1", "zigzag")
                                                    for n in names) + " |", "|" + "---|" * (4 + 3 * len(windows))]
    for (data, optim, variant, K, lrm), cell in by_cell(runs).items():
        stats = [[gradient_statistics([x["grad_norm"] for x in r.log if "grad_norm" in x and a <= x["step"] <= b])
                  for r in cell] for a, b in windows]           # per window, per seed: computed once
        cols = []
        for stat in ("grad_volatility", "grad_dlog_ac1", "grad_zigzag"):
            for per_seed in stats:
                v = [g[stat] for g in per_seed]
                cols.append(f"{np.mean(v):.2f}" + (f" ± {np.std(v, ddof=1):.2f}" if len(v) > 1 else ""))
        rows.append(f"| {os.path.basename(str(data))} | {variant} | {K} | {len(cell)} | " + " | ".join(cols) + " |")
    return rows


def grad_flow_table(runs, kind="out"):
    """A markdown row per (data, recipe, variant, K, lr): the gradient norm of the
    block outputs (kind "out"; "attn": the attention outputs) per loop, summed over the
    blocks, averaged over the steps and the seeds: how much gradient reaches each loop.
    (The MLP's output gradient equals the block's: the MLP is the block's last residual add.)"""
    rows = [f"| data | variant | K | seeds | {kind} grad norm per loop, loop 1 ... K (x1e-3) | loop 1 / loop K |",
            "|---|---|---|---|---|---|"]
    for (data, optim, variant, K, lrm), cell in by_cell(runs).items():
        arr = [np.array([x[f"{kind}_output_grad_norms"] for x in r.log if x.get(f"{kind}_output_grad_norms")])
               for r in cell]
        if not all(len(a) for a in arr):
            continue
        per_loop = np.mean([a.sum(2).mean(0) for a in arr], axis=0)
        rows.append(f"| {os.path.basename(str(data))} | {variant} | {K} | {len(cell)} | "
                    f"{' '.join(f'{1e3 * v:.1f}' for v in per_loop)} | {per_loop[0] / max(per_loop[-1], 1e-30):.2g} |")
    return rows


def save_figure(plt, fig, path, dpi):
    """The PNG written atomically (runfiles.write_file: a temp file, then a rename; the
    folder's manifest lists it), then the figure closed."""
    try:
        runfiles.write_file(path, lambda f: fig.savefig(f, dpi=dpi, format="png"))
    finally:
        plt.close(fig)
