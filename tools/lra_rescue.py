"""Does self-pretraining rescue a Transformer on LRA's PathFinder? The seed runs, their
table, the verdict and the figures, at CPU scale (train_spt.py --preset=cpu_rescue).

    python tools/lra_rescue.py run            # every arm, 3 seeds, two runs at a time
    python tools/lra_rescue.py run --dry=True # the commands only
    python tools/lra_rescue.py report         # table + verdict (rescue.md) and figures

The arms (each 3 seeds; the data are generated once, a seed changes the init, the masks
and the batch order):
    spt        SPT, then finetuning (the preset)
    scratch    from scratch, the same finetuning steps
    long       from scratch, SPT's steps + the finetuning steps (compute-matched)
    learned    as long, with learned positions (LRA's issue #60: learned ones reach ~70%)
    qk         only W_Q, W_K from the seed's SPT checkpoint (A5 on LRA)
    frozen     from scratch with attention frozen at its init (A4 on LRA)
The from-scratch arms take the learning rate of Amos et al.'s grid (1e-3, 5e-4, 1e-4) that
gives the best val accuracy on seed 0 at the scratch arm's length (the grid arm; a tie goes
to the first of the grid).

Restartable: a run whose folder has summary.json is skipped, a stopped one resumes from
its checkpoint (--init_from=resume). Each run writes its command into command.txt, its
output into FOLDER.log. Runs go two at a time, one thread each (OMP_NUM_THREADS=1).
"""

import glob
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from configurator import configure, run_cli  # noqa: E402

DEFAULTS = dict(action="report", out="out/rescue", slots=2, dry=False, extra="", seeds="0,1,2", figures="")
GRID = (1e-3, 5e-4, 1e-4)          # Amos et al.'s learning rates for the from-scratch arms
BASE = ["--task=pathfinder", "--preset=cpu_rescue"]
ARMS = ("spt", "scratch", "long", "learned", "qk", "frozen")
CHANCE = 0.5


# -----------------------------------------------------------------------------
# The pre-registered verdict (written down before the seed runs; REPORT.md, A9)

def verdict(spt, baselines, min_gap=0.10):
    """spt: the SPT arm's test accuracies, one per seed; baselines: {arm: accuracies} of the
    from-scratch arms it must beat. "rescued": every SPT seed above every seed of every
    baseline AND the SPT mean at least min_gap above the best baseline mean; "separated,
    small gap": every seed above, the gap under min_gap; "worse": every SPT seed below
    every baseline seed; else "not separated" (the seeds' ranges overlap)."""
    if len(spt) < 3 or any(len(v) < 3 for v in baselines.values()):
        return "too few seeds (3 per arm needed)"
    lo_spt, hi_spt = min(spt), max(spt)
    hi_base = max(max(v) for v in baselines.values())
    lo_base = min(min(v) for v in baselines.values())
    gap = np.mean(spt) - max(np.mean(v) for v in baselines.values())
    if lo_spt > hi_base:
        return "rescued" if gap >= min_gap else "separated, small gap"
    if hi_spt < lo_base:
        return "worse"
    return "not separated"


def at_chance(accs, n_test, majority=CHANCE):
    """Is an arm's mean test accuracy within what a coin or a constant answer scores: the
    band between the two classes' shares of the test split (majority, 1 - majority),
    widened by 2 standard errors of the mean?"""
    se = math.sqrt(CHANCE * (1 - CHANCE) / (n_test * len(accs)))
    return abs(np.mean(accs) - CHANCE) <= abs(majority - CHANCE) + 2 * se


def standard_error(acc, n):
    """The binomial standard error of one run's accuracy on n test images."""
    return math.sqrt(acc * (1 - acc) / n)


# -----------------------------------------------------------------------------
# The runs

def folder(out, arm, seed, lr=None):
    return os.path.join(out, f"{arm}_s{seed}" if lr is None else f"grid_lr{lr:g}_s{seed}")


def preset_epochs():
    """(SPT epochs, finetuning epochs) of the preset."""
    import spt_settings
    p = spt_settings.preset_values("cpu_rescue", "pathfinder")
    return p["pretrain_epochs"], p["epochs"]


def arm_flags(arm, seed, out, lr):
    """The train_spt.py flags of one arm at one seed; lr: the scratch arms' learning rate."""
    spt_epochs, epochs = preset_epochs()
    scratch = ["--pretrain_epochs=0", f"--lr={lr:g}" if isinstance(lr, float) else f"--lr={lr}"]
    flags = {"spt": [],
             "scratch": scratch,
             "long": scratch + [f"--epochs={spt_epochs + epochs}"],
             "learned": scratch + [f"--epochs={spt_epochs + epochs}", "--pos_enc=learned"],
             "qk": [f"--init_from={folder(out, 'spt', seed)}/spt_best.pt", "--init_params=qk"],
             "frozen": scratch + ["--freeze=attn"]}[arm]
    return BASE + flags + [f"--seed={seed}"]


def jobs(cfg, best_lr):
    """(folder, flags, needs) in the order they start; needs: folders that must be finished
    first (the grid, for its best lr; the seed's SPT run, for its checkpoint)."""
    seeds, out = [int(s) for s in cfg["seeds"].split(",")], cfg["out"]
    grid = [(folder(out, None, seeds[0], lr), BASE + ["--pretrain_epochs=0", f"--lr={lr:g}", f"--seed={seeds[0]}"],
             []) for lr in GRID]
    grid_dirs = [g[0] for g in grid]
    todo = [(folder(out, "spt", s), arm_flags("spt", s, out, None), []) for s in seeds[:2]] + grid
    todo += [(folder(out, "spt", s), arm_flags("spt", s, out, None), []) for s in seeds[2:]]
    for arm in ("scratch", "long", "learned", "frozen", "qk"):
        for s in seeds:
            if arm == "scratch" and s == seeds[0]:
                continue                                     # the grid's best run is this one
            needs = [folder(out, "spt", s)] if arm == "qk" else grid_dirs
            todo.append((folder(out, arm, s), arm_flags(arm, s, out, best_lr or GRID[0]), needs))
    return todo


def finished(d):
    return os.path.exists(os.path.join(d, "summary.json"))


def read_summary(d):
    with open(os.path.join(d, "summary.json")) as f:
        return json.load(f)


def best_grid_lr(cfg):
    """The grid's learning rate with the best val accuracy, the first on a tie (None until
    all have run)."""
    seed = int(cfg["seeds"].split(",")[0])
    dirs = {lr: folder(cfg["out"], None, seed, lr) for lr in GRID}
    if not all(finished(d) for d in dirs.values()):
        return None
    return max(GRID, key=lambda lr: read_summary(dirs[lr])["best_val_acc"])


def command(d, flags, extra):
    """The command that starts (or resumes) the run in folder d."""
    py = [sys.executable, os.path.join(ROOT, "train_spt.py")]
    if os.path.exists(os.path.join(d, "ckpt.pt")) and not any(f.startswith("--init_from=") for f in flags):
        return py + [f"--out_dir={d}", "--init_from=resume"]
    return py + flags + extra + [f"--out_dir={d}", "--overwrite=True"]


def run(cfg):
    """Start every unfinished run when its needs are met, cfg["slots"] at a time."""
    extra = cfg["extra"].split()
    if cfg["dry"]:
        for d, flags, _ in jobs(cfg, best_grid_lr(cfg) or "BEST_LR"):
            print(" ".join(["python", "train_spt.py"] + flags + extra + [f"--out_dir={d}"]))
        return
    going, failed = {}, set()
    while True:
        todo = [(d, f, n) for d, f, n in jobs(cfg, best_grid_lr(cfg)) if not finished(d) and d not in going
                and d not in failed]
        ready = [(d, f) for d, f, needs in todo if all(finished(n) for n in needs)]
        for d, flags in ready[:max(0, cfg["slots"] - len(going))]:
            os.makedirs(os.path.dirname(d) or ".", exist_ok=True)
            print(f"start: {d}", flush=True)
            with open(d + ".log", "a") as log:
                going[d] = subprocess.Popen(command(d, flags, extra), stdout=log, stderr=subprocess.STDOUT,
                                            env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=ROOT)
        for d, p in list(going.items()):
            if p.poll() is not None:
                del going[d]
                print(("done: " if finished(d) else "FAILED: ") + f"{d} (see {d}.log)", flush=True)
                failed |= set() if finished(d) else {d}
        if not going and not ready:
            break
        time.sleep(2)
    stuck = [d for d, _, _ in jobs(cfg, best_grid_lr(cfg)) if not finished(d)]
    print(f"{len(stuck)} runs not finished" if stuck else "every run finished")


# -----------------------------------------------------------------------------
# The table, the verdict and the figures

def gather(cfg):
    """{arm: [(seed, folder, summary)]} of the finished runs; the scratch arm's seed-0 run
    is the grid's best."""
    seeds, out, lr = [int(s) for s in cfg["seeds"].split(",")], cfg["out"], best_grid_lr(cfg)
    runs = {}
    for arm in ARMS:
        for s in seeds:
            d = folder(out, None, s, lr) if arm == "scratch" and s == seeds[0] and lr else folder(out, arm, s)
            if finished(d):
                runs.setdefault(arm, []).append((s, d, read_summary(d)))
    return runs


def train_spt_config(flags=()):
    """train_spt.py's config of the preset, with flags."""
    import train_spt
    return train_spt.get_config(BASE + list(flags))


def test_split(runs):
    """(size, the larger class's share) of the test split the runs were scored on."""
    import train_spt
    d = next(d for members in runs.values() for _, d, _ in members)
    with open(os.path.join(d, "config.json")) as f:
        test = train_spt.load_data("pathfinder", "test", json.load(f))
    share = float(np.mean([int(test[i][1]) for i in range(len(test))]))
    return len(test), max(share, 1 - share)


def table(runs, n):
    """Markdown: one row per arm, mean +- std over seeds, each seed's test accuracy with
    its standard error, and the wall time."""
    lines = ["| arm | seeds | SPT val loss | 3x3 attention mass, x uniform: after SPT / trained | best val acc | "
             "test acc | each seed (+- s.e.) | steps | wall min |", "|---|---|---|---|---|---|---|---|---|"]
    ms = lambda v: f"{np.mean(v):.3f} ± {np.std(v, ddof=1) if len(v) > 1 else 0:.3f}" if v else "-"
    ratio = lambda s, stage: [m[f"mass2d_r1_{stage}"] / m["mass2d_r1_uniform"] for m in s
                              if m.get(f"mass2d_r1_{stage}") is not None and m.get("mass2d_r1_uniform")]
    for arm, members in runs.items():
        s = [m for _, _, m in members]
        spt = [m["spt_best_val_loss"] for m in s if m.get("spt_best_val_loss") is not None]
        seeds = ", ".join(f"{m['test_acc']:.3f} ± {standard_error(m['test_acc'], n):.3f}" for m in s)
        lines.append(f"| {arm} | {len(s)} | {ms(spt)} | {ms(ratio(s, 'spt'))} / {ms(ratio(s, 'finetune'))} | "
                     f"{ms([m['best_val_acc'] for m in s])} | {ms([m['test_acc'] for m in s])} | {seeds} | "
                     f"{ms([m['steps'] for m in s])} | {ms([m['wall_time_s'] / 60 for m in s])} |")
    return "\n".join(lines)


def verdicts(runs, n, majority=CHANCE):
    acc = {arm: [m["test_acc"] for _, _, m in members] for arm, members in runs.items()}
    lines = []
    if "spt" in acc:
        base = {a: acc.get(a, []) for a in ("scratch", "long")}
        lines.append(f"SPT against from scratch (same steps, compute-matched): **{verdict(acc['spt'], base)}**")
    if "learned" in acc and "long" in acc:
        lines.append(f"learned positions against sinusoidal, both from scratch: "
                     f"**{verdict(acc['learned'], {'long': acc['long']})}**")
    for arm, a in acc.items():
        band = abs(majority - CHANCE) + 2 * math.sqrt(0.25 / (n * len(a)))
        lines.append(f"{arm}: {'at chance' if at_chance(a, n, majority) else 'not at chance'} "
                     f"(mean {np.mean(a):.3f}; chance band {CHANCE} ± {band:.3f}: one class scores "
                     f"{majority:.3f} or {1 - majority:.3f})")
    return "\n".join("- " + line for line in lines)


def report(cfg):
    runs = gather(cfg)
    if not runs:
        raise FileNotFoundError(f"no finished run under {cfg['out']}; start them with: python tools/lra_rescue.py run")
    n, majority = test_split(runs)
    text = (f"scratch arms' learning rate (best of the grid on seed 0): {best_grid_lr(cfg)}\n\n"
            f"{table(runs, n)}\n\n{verdicts(runs, n, majority)}\n")
    print(text)
    with open(os.path.join(cfg["out"], "rescue.md"), "w") as f:
        f.write(text)
    where = cfg["figures"] or cfg["out"]
    plot_curves(runs, os.path.join(where, "rescue_curves.png"))
    if "spt" in runs and "scratch" in runs and os.path.exists(os.path.join(runs["spt"][0][1], "spt_best.pt")):
        plot_maps(runs, os.path.join(where, "rescue_attention_2d.png"))
    return text


def curve(d, phase, key):
    """(steps, values) of one run's records of a phase that hold key."""
    import training
    rec = [r for r in training.read_log(d) if r.get("phase") == phase and key in r]
    return np.array([r["step"] for r in rec]), np.array([r[key] for r in rec])


def smooth(x, y, k=10):
    """A running mean over k logged points (the loss is logged every 10 steps)."""
    if len(y) < k:
        return x, y
    return x[k - 1:], np.convolve(y, np.ones(k) / k, mode="valid")


def plot_curves(runs, path):
    """Left: SPT loss of every SPT seed (train, smoothed; val, dots). Middle: finetuning
    train loss, smoothed, every arm and seed. Right: val accuracy against finetuning step
    (one point an epoch). An arm is one colour."""
    import analysis
    plt, (fig, (ax_spt, ax_loss, ax_acc)) = analysis.plt_figure(1, 3, figsize=(16, 4.2))
    colours = dict(zip(ARMS, ("tab:red", "tab:blue", "tab:cyan", "tab:green", "tab:orange", "tab:gray")))
    for arm, members in runs.items():
        c = colours[arm]
        for i, (s, d, _) in enumerate(members):
            label = arm if i == 0 else None
            if arm == "spt":
                ax_spt.plot(*smooth(*curve(d, "spt", "loss")), color=c, lw=0.8, alpha=0.6)
                ax_spt.plot(*curve(d, "spt", "val_loss"), "o", color=c, markersize=4,
                            label="val" if i == 0 else None)
            ax_loss.plot(*smooth(*curve(d, "finetune", "loss")), color=c, lw=0.8, label=label)
            ax_acc.plot(*curve(d, "finetune", "val_acc"), "o-", color=c, markersize=4, label=label)
    ax_acc.axhline(CHANCE, color="k", lw=0.6, ls=":")
    ax_loss.axhline(math.log(2), color="k", lw=0.6, ls=":")
    ax_spt.set_title("SPT loss (masked pixels)"), ax_spt.set_xlabel("SPT step")
    ax_loss.set_title("finetuning train loss (chance: ln 2)"), ax_loss.set_xlabel("finetuning step")
    ax_acc.set_title("val accuracy (1,000 images)"), ax_acc.set_xlabel("finetuning step")
    for a in (ax_spt, ax_loss, ax_acc):
        a.grid(alpha=0.3)
        a.legend(fontsize=7) if a.get_legend_handles_labels()[0] else None
    fig.tight_layout()
    analysis.save_figure(plt, fig, path, 90)


def plot_maps(runs, path):
    """One val image's layer-0 attention, head-averaged, at init, after SPT and after
    finetuning (the first SPT seed), beside the scratch run of that seed after training."""
    import torch
    import analysis
    import train_spt
    from training import load_checkpoint, load_state
    (s, spt_dir, _), scratch_dir = runs["spt"][0], runs["scratch"][0][1]
    with open(os.path.join(spt_dir, "config.json")) as f:
        cfg = json.load(f)                                    # the run's own flags: its shape and data
    val = train_spt.load_data("pathfinder", "val", cfg)
    image, maps = val[0][0], {}
    for stage, ckpt in (("init", None), ("after SPT", os.path.join(spt_dir, "spt_best.pt")),
                        ("SPT, finetuned", os.path.join(spt_dir, "finetune_best.pt")),
                        ("scratch, trained", os.path.join(scratch_dir, "finetune_best.pt"))):
        model = train_spt.build_model(cfg, [val])
        if ckpt:
            load_state(model, load_checkpoint(ckpt)["model"])
        with torch.no_grad():
            _, att = model.eval().forward_with_maps(image[None])
        maps[stage] = att[0][0]
    return analysis.plot_image_attention(image, maps, path)


def main(argv=None):
    cfg = configure(DEFAULTS, sys.argv[1:] if argv is None else argv, __doc__)
    if cfg["action"] not in ("run", "report"):
        raise ValueError(f"--action={cfg['action']}: choose run or report")
    if cfg["slots"] < 1:
        raise ValueError(f"--slots={cfg['slots']} must be at least 1")
    return run(cfg) if cfg["action"] == "run" else report(cfg)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and not args[0].startswith("--"):                 # `run` / `report` as a word
        args = [f"--action={args[0]}"] + args[1:]
    run_cli(main, args)
