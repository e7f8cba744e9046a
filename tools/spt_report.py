"""One table of many train_spt.py runs, from their files (summary.json, config.json,
log.jsonl), and a figure of their curves:

    python tools/spt_report.py --runs=out/quick --out=out/spt_report
    python tools/spt_report.py --runs=results/rescue,results/rescue_gpu --out=out/rescue_table

--runs: a comma list of folders, each walked for run folders. Written to --out:
  report.md          a row per finished run; then a row per group of runs that differ only
                     in --seed (and in which seed's checkpoint they start from): mean +- std
  val_accuracy.png   left: SPT val loss per epoch; right: finetuning val accuracy per epoch,
                     solid from SPT weights, dashed from scratch
Runs of train_flt.py are left out (tools/flt_compare.py draws them), and said so.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configurator import configure, run_cli  # noqa: E402
from training import read_log  # noqa: E402

DEFAULTS = dict(runs="",                 # comma list of folders holding train_spt.py run folders
                out="out/spt_report")    # where report.md and val_accuracy.png go
REPORT_COLUMNS = ("task", "depth", "init", "pos_enc", "pretrain_task", "pretrain_epochs", "init_from", "init_params",
                  "freeze", "best_val_acc", "test_acc", "mass_w2_finetune", "toeplitz_start", "wall_time_s")
SEED_GROUP = ("task", "depth", "init", "pos_enc", "pretrain_task", "pretrain_epochs", "epochs", "init_params",
              "freeze", "pixel_encoder")
SEED_STATS = ("best_val_acc", "test_acc", "mass_w2_finetune", "score_std_init")


def read_json(path):
    with open(path) as f:
        return json.load(f)


def find_runs(dirs):
    """The run folders under the comma list `dirs` (a folder with config.json and a
    log.jsonl or summary.json): (finished train_spt.py runs, unfinished ones, other scripts' runs)."""
    finished, unfinished, other = [], [], []
    for top in dirs.split(","):
        if not os.path.isdir(top):
            raise FileNotFoundError(f"--runs={dirs}: {top} is not a folder")
        for root, subdirs, files in os.walk(top):
            subdirs.sort()
            if "config.json" not in files or not {"log.jsonl", "summary.json"} & set(files):
                continue
            if "variant" in read_json(os.path.join(root, "config.json")):
                other.append(root)
            else:
                (finished if "summary.json" in files else unfinished).append(root)
    return finished, unfinished, other


def run_summary(d):
    """A run's summary.json, with the flags it does not record (pixel_encoder, ...) taken
    from its config.json."""
    config = read_json(os.path.join(d, "config.json"))
    return {**{k: config[k] for k in SEED_GROUP if k in config}, **read_json(os.path.join(d, "summary.json"))}


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
        vs = [np.array([m[c] for m in members if m.get(c) is not None], dtype=float) for c in SEED_STATS]
        cells = [f"{v.mean():.3f} +- {v.std(ddof=1) if len(v) > 1 else 0:.3f}" if len(v) else "" for v in vs]
        lines.append("| " + " | ".join(str(k) for k in key) + f" | {len(members)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_val_accuracy(runs, path, unfinished=()):
    """Left: SPT val loss per epoch of every run with an SPT phase (unfinished runs too).
    Right: finetuning val accuracy per epoch, solid when the run starts from SPT weights
    (its own or a checkpoint's), dashed when from scratch. One colour a run, one legend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dirs = [d for d, _ in runs] + list(unfinished)
    legend_h = 0.16 * ((len(dirs) + 2) // 3) + 0.1                 # inches under the panels for the legend
    fig, (ax_spt, ax) = plt.subplots(1, 2, figsize=(11, 4 + legend_h))
    colour = {d: plt.get_cmap("tab20" if len(dirs) > 10 else "tab10")(i % 20) for i, d in enumerate(dirs)}
    name = lambda d: os.path.relpath(d) + (" (stopped)" if d in unfinished else "")
    for d in dirs:
        spt = [r for r in read_log(d) if r.get("phase") == "spt" and "val_loss" in r]
        if spt:
            ax_spt.plot([r["epoch"] for r in spt], [r["val_loss"] for r in spt], "o-", ms=2, color=colour[d], label=name(d))
    for d, s in runs:
        from_spt = s.get("pretrain_epochs", 0) > 0 or s.get("init_from") not in ("", "resume", None)
        vals = [r for r in read_log(d) if r.get("phase") == "finetune" and "val_acc" in r]
        if vals:
            ax.plot([r["epoch"] for r in vals], [r["val_acc"] for r in vals], "o-" if from_spt else "o--", ms=2,
                    color=colour[d], label=name(d))
    ax_spt.set(title="SPT val loss\n(masked tokens)", xlabel="SPT epoch", ylabel="val loss")
    ax.set(title="finetuning val accuracy\n(solid: from SPT weights, dashed: from scratch)", xlabel="finetuning epoch",
           ylabel="val accuracy")
    legend = {}
    for a in (ax_spt, ax):
        a.grid(alpha=0.3), legend.update(zip(*a.get_legend_handles_labels()[::-1]))
    fig.legend(legend.values(), legend.keys(), loc="lower center", ncol=3, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, legend_h / (4 + legend_h), 1, 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def report(dirs, out):
    """report.md and val_accuracy.png of the train_spt.py runs under `dirs`, into `out`."""
    finished, unfinished, other = find_runs(dirs)
    if other:
        print(f"left out (train_flt.py runs: tools/flt_compare.py draws them): {', '.join(other)}")
    if unfinished:
        print(f"not finished (no summary.json), so drawn in the figure but given no row: {', '.join(unfinished)}")
    if not finished:
        raise FileNotFoundError(f"no finished train_spt.py run (summary.json) under {dirs}")
    runs = [(d, run_summary(d)) for d in finished]
    lines = ["| run | " + " | ".join(REPORT_COLUMNS) + " |", "|---" * (len(REPORT_COLUMNS) + 1) + "|"]
    for d, s in runs:
        cells = [f"{s.get(c):.4g}" if isinstance(s.get(c), float) else str(s.get(c, "")) for c in REPORT_COLUMNS]
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n\n" + seed_table(runs)
    print(table)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(table + "\n")
    print(f"report: {os.path.join(out, 'report.md')}; figure: "
          f"{plot_val_accuracy(runs, os.path.join(out, 'val_accuracy.png'), unfinished)}")
    return table


def main(argv):
    cfg = configure(DEFAULTS, argv, __doc__, __file__)
    if not cfg["runs"]:
        raise ValueError("give the runs: --runs=DIR,DIR,... (folders holding train_spt.py run folders)")
    return report(cfg["runs"], cfg["out"])


if __name__ == "__main__":
    run_cli(main)
