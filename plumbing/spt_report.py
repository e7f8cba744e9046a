"""
Tables and figures of train_spt.py's run folders (config.json, log.jsonl, summary.json,
snapshots.jsonl), as flt_report.py is for train_flt.py:

  summarize       a finished run's summary.json, its figures and its last line
  plot_run        a run's curves.png (train loss per step, val loss and accuracy per epoch)
                  and attention_evolution.png (its attention snapshots)
  report          --report=DIR,...: one markdown row per run, a row per group of runs that
                  differ only in --seed (mean +- std), and two figures
  seed_table      that group table, from summaries
"""

import json
import os

import numpy as np

import analysis
from plumbing import runfiles
from plumbing.training import read_log


def summarize(run, seen, model, val_ds, results):
    """summary.json (the run's flags, its results, the attention statistics at each
    stage) and the figures: curves, proximity, attention evolution, the 2-D maps."""
    cfg, rt = run.cfg, run.rt
    summary = dict(task=cfg["task"], depth=cfg["depth"], pretrain_epochs=results.pop("pretrain_epochs"),
                   epochs=cfg["epochs"], pretrain_task=cfg["pretrain_task"] or cfg["task"],
                   init_from=cfg["init_from"], init_params=cfg["init_params"], freeze=cfg["freeze"],
                   pos_enc=cfg["pos_enc"], pool=cfg["pool"], init=cfg["init"], pixel_encoder=cfg["pixel_encoder"],
                   **results, n_params=model.num_params(), world_size=rt.world_size)
    if rt.ddp:
        summary["replica_max_diff"] = run.replica_max_diff(model)
    if not rt.master:
        return summary
    summary.update(analysis.stage_statistics(seen.reports), proximity=seen.reports)
    run.write_summary(summary)
    seen.plot(val_ds[0][0])
    plot_run(cfg["out_dir"])
    last = "finetune" if "test_acc" in summary else "spt"                 # "spt": SPT alone (--epochs=0)
    done = ("best val acc {best_val_acc:.4f} (epoch {best_epoch}), test acc {test_acc:.4f}" if last == "finetune"
            else "SPT best val loss {spt_best_val_loss:.4f} (epoch {spt_best_epoch})").format(**summary)
    print(f"{done}; attention mass within |i-j|<=2: init {summary['mass_w2_init']:.3f}, final "
          f"{summary['mass_w2_' + last]:.3f} (uniform {summary['mass_w2_uniform']:.3f}); files in {cfg['out_dir']}")
    return summary


def plot_run(out_dir):
    """The figures a finished run draws from its own files: curves.png and attention_evolution.png."""
    plot_curves(out_dir)
    plot_evolution_of_runs([out_dir], os.path.join(out_dir, "attention_evolution.png"))



def plot_curves(out_dir):
    """curves.png in out_dir: train loss per step, val loss and val accuracy per epoch,
    from its log.jsonl (a last line cut short by a kill is dropped)."""
    plt, (fig, axes) = analysis.plt_figure(1, 3, figsize=(13, 3.5))
    records = read_log(out_dir)
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
    analysis.save_figure(plt, fig, os.path.join(out_dir, "curves.png"), 90)


def plot_evolution_of_runs(run_dirs, path, n_cols=6):
    """The paper's figure from each run's snapshots.jsonl: one row per (run, phase),
    n_cols snapshots spread over training (plot_evolution draws it)."""
    rows = []
    for d in run_dirs:
        snap_path = os.path.join(d, "snapshots.jsonl")
        if not os.path.exists(snap_path):
            continue
        snaps = runfiles.read_records(snap_path)
        for phase in ("spt", "finetune"):
            s = [x for x in snaps if x["phase"] == phase]
            if s:
                picks = [dict(s[round(i)], mass=s[round(i)]["mass"][analysis.PROX_WIDTHS.index(2)])
                         for i in np.linspace(0, len(s) - 1, min(n_cols, len(s)))]
                rows.append((f"{os.path.basename(os.path.normpath(d))} {phase}", picks))
    return analysis.plot_evolution(rows, path, n_cols) if rows else None


def plot_val_accuracy(runs, path, unfinished=()):
    """Two panels. Left: SPT val loss per epoch of every run with an SPT phase (and of
    `unfinished` run folders, stopped before their summary). Right: finetuning val accuracy per
    epoch, one line per (run_dir, summary): solid when the run starts from SPT weights
    (its own or a checkpoint's), dashed when from scratch."""
    plt, (fig, (ax_spt, ax)) = analysis.plt_figure(1, 2, figsize=(13, 4.2))
    for d in [d for d, _ in runs] + list(unfinished):
        spt = [r for r in read_log(d) if r.get("phase") == "spt" and "val_loss" in r]
        if spt:
            ax_spt.plot([r["epoch"] for r in spt], [r["val_loss"] for r in spt], "o-", markersize=2,
                        label=os.path.relpath(d) + (" (stopped)" if d in unfinished else ""))
    for d, s in runs:
        spt = s["pretrain_epochs"] > 0 or s["init_from"] not in ("", "resume")
        vals = [r for r in read_log(d) if r.get("phase") == "finetune" and "val_acc" in r]
        if vals:
            ax.plot([r["epoch"] for r in vals], [r["val_acc"] for r in vals], "o-" if spt else "o--",
                    label=os.path.relpath(d), markersize=3)
    ax_spt.set_xlabel("SPT epoch"), ax_spt.set_ylabel("SPT val loss (masked tokens)"), ax_spt.grid(alpha=0.3)
    ax.set_xlabel("finetuning epoch"), ax.set_ylabel("val accuracy"), ax.grid(alpha=0.3)
    for a in (ax_spt, ax):
        if a.lines:
            a.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    analysis.save_figure(plt, fig, path, 90)
    return path


# -----------------------------------------------------------------------------
# Gathering results: --report=DIR,... -> one markdown table and two figures

REPORT_COLUMNS = ("task", "depth", "init", "pos_enc", "pretrain_task", "pretrain_epochs", "init_from", "init_params", "freeze",
                  "best_val_acc", "test_acc", "mass_w2_finetune", "toeplitz_start", "wall_time_s")


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
    config_path = os.path.join(out_dir, "config.json")
    try:
        with open(os.path.join(out_dir, "summary.json")) as f:
            summary = json.load(f)
        if not os.path.exists(config_path):
            return summary
        with open(config_path) as f:
            config = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{out_dir} holds a summary.json or config.json that is not JSON ({e.msg}, line "
                         f"{e.lineno}): restore it, or leave the run out of --report") from None
    return {**{k: config[k] for k in SEED_GROUP if k in config}, **summary}


RUN_SCRIPTS = ("train_spt.py", "train_flt.py")
REPORT_DIR = "out/spt_report"     # where --report writes when the first folder given is itself a run
REPORT_FILES = ("report.md", "val_accuracy.png", "attention_evolution.png")


def run_script(d):
    """The script that wrote the run folder d (its manifest says; a run written before
    manifests, by its config's keys), or None when d is not a run."""
    manifest = runfiles.read_manifest(d)
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
    finished, unfinished, other = find_runs(dirs)
    if other:
        print(f"left out (not train_spt.py runs): {', '.join(other)}")
    if unfinished:
        print(f"not finished (no summary.json: running, or stopped before its end), so drawn in the SPT figure "
              f"but given no row: {', '.join(unfinished)}")
    if not finished:
        raise FileNotFoundError(f"no finished train_spt.py run (summary.json) under {dirs}")
    runs = [(d, run_summary(d)) for d in finished]
    lines = ["| run | " + " | ".join(REPORT_COLUMNS) + " |", "|---" * (len(REPORT_COLUMNS) + 1) + "|"]
    for d, s in runs:
        cells = [f"{s.get(c):.4g}" if isinstance(s.get(c), float) else str(s.get(c, "")) for c in REPORT_COLUMNS]
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n\n" + seed_table(runs)
    where = report_folder(dirs, out_dir)
    outputs = runfiles.claim_outputs(where, "train_spt.py --report", REPORT_FILES)   # refused before any output
    print(table)
    try:
        runfiles.write_file(os.path.join(where, "report.md"), table + "\n")
        print(f"report: {os.path.join(where, 'report.md')}; SPT loss and val accuracy figure: "
              f"{plot_val_accuracy(runs, os.path.join(where, 'val_accuracy.png'), unfinished)}")
        fig = plot_evolution_of_runs([d for d, _ in runs], os.path.join(where, "attention_evolution.png"))
        if fig:
            print(f"attention evolution figure: {fig}")
    finally:
        outputs.release()
    return table
