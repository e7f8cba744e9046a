"""Does self-pretraining rescue a Transformer on LRA's PathFinder? The seed runs, their
table, the verdict and the figures, at CPU scale (train_spt.py --preset=cpu_rescue: two
layers, 8,000 training images, SPT 2,750 steps, finetuning 4,000).

    python tools/lra_rescue.py run            # every arm, 3 seeds, two runs at a time
    python tools/lra_rescue.py run --dry=True # the commands only
    python tools/lra_rescue.py report         # table + verdict (rescue.md) and figures
    python tools/lra_rescue.py status         # each run: finished, running, stopped or waiting

A run of 27 epochs takes 1.6 h of one core on a recent Intel Xeon and 3.2 h on a Zen 5
EPYC (two runs side by side). The first two arms on 3 seeds are 10-19 core-hours (5-10 h
of two cores), the first three 14-29, and every arm 29-54, near or above the default cap
of 30. The arms, in the order
they run (the data are generated once; a seed changes the init, the masks and the batch
order):
    spt            (a) SPT, then finetuning (the preset)
    scratch        (b) from scratch for SPT's steps + the finetuning steps (compute-matched)
    learned        (c) as scratch, with learned positions (long-range-arena issue #60)
    qk             (d) only W_Q, W_K from the seed's SPT checkpoint, then finetuning (A5 on LRA)
    spt_torch      (e) as spt, and
    scratch_torch      as scratch, with PyTorch's init: W_Q and W_K not tied at the start
Seed 0's spt and scratch run first. If that SPT run never takes off (take_off_epoch), the
sweep stops there: the rest would spend hours to repeat a null.

Restartable: a run whose folder has summary.json is skipped, a stopped one resumes from
its checkpoint (--init_from=resume). Each run writes its command into command.txt, its
output into FOLDER.log. Runs go two at a time, one thread each (OMP_NUM_THREADS=1), and no
run starts once the runs have used --max_core_hours (a stopped one counts to its checkpoint).
The runs going when the cap is reached finish, so a sweep can pass it by up to --slots runs.
"""

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

DEFAULTS = dict(action="report", out="out/rescue", slots=2, dry=False, extra="", seeds="0,1,2", figures="",
                max_core_hours=30.0)
BASE = ["--task=pathfinder", "--preset=cpu_rescue"]
ARMS = ("spt", "scratch", "learned", "qk", "spt_torch", "scratch_torch")
CHANCE = 0.5


# -----------------------------------------------------------------------------
# The rule, written down before the seed runs (REPORT.md, A9)

def constant_loss(share):
    """The val loss of the best constant answer, the entropy of the class shares:
    H(q) = -q ln q - (1-q) ln(1-q), ln 2 at q = 1/2. No model that ignores the image
    scores below it, so a val loss under it is evidence the model reads the image."""
    return -share * math.log(share) - (1 - share) * math.log(1 - share)


def off_chance(val_loss, val_loss_se, val_acc, share, n):
    """Does one evaluation say the model has learned something? Either its val loss is
    below the best constant answer's by more than 2 standard errors, or its val accuracy
    is above the chance band: the larger class's share, plus 2 standard errors of a coin
    on n images."""
    majority = max(share, 1 - share)
    return val_loss < constant_loss(share) - 2 * val_loss_se or \
        val_acc > majority + 2 * math.sqrt(CHANCE * (1 - CHANCE) / n)


def take_off_epoch(evals, share, n):
    """The first finetuning epoch off chance that the next evaluation confirms (two in a
    row: over 16-27 epochs a single lucky one is too likely), or None: "stuck".
    evals: the finetuning validation records, in order (val_loss, val_loss_se, val_acc)."""
    off = [off_chance(r["val_loss"], r.get("val_loss_se", 0.0), r["val_acc"], share, n) for r in evals]
    for i in range(len(off) - 1):
        if off[i] and off[i + 1]:
            return evals[i]["epoch"]
    return None


def verdict(spt, spt_off, base, base_off, min_gap=0.10):
    """spt, base: test accuracies, one per seed, of the SPT arm and of the from-scratch
    arm it must beat; spt_off, base_off: did each seed take off (take_off_epoch)?
        "rescued": every SPT seed takes off and ends above every baseline seed, the means
            at least min_gap apart, and every baseline seed is stuck;
        "SPT ahead, scratch learns too": the same, but a baseline seed took off;
        "separated, not every SPT seed took off": above and min_gap apart, but an SPT seed
            is stuck;
        "separated, small gap": every SPT seed above every baseline seed, means closer than min_gap;
        "neither learns": no seed of either arm takes off;
        "worse": every SPT seed below every baseline seed;
        "not separated": the seeds' ranges overlap."""
    if len(spt) < 3 or len(base) < 3:
        return "too few seeds (3 per arm needed)"
    if not any(spt_off) and not any(base_off):
        return "neither learns"
    if max(spt) < min(base):
        return "worse"
    if min(spt) <= max(base):
        return "not separated"
    if np.mean(spt) - np.mean(base) < min_gap:
        return "separated, small gap"
    if not all(spt_off):
        return "separated, not every SPT seed took off"
    return "SPT ahead, scratch learns too" if any(base_off) else "rescued"


def standard_error(acc, n):
    """The binomial standard error of one run's accuracy on n images."""
    return math.sqrt(acc * (1 - acc) / n)


# -----------------------------------------------------------------------------
# The runs

def folder(out, arm, seed):
    return os.path.join(out, f"{arm}_s{seed}")


def preset_epochs():
    """(SPT epochs, finetuning epochs) of the preset."""
    import spt_settings
    p = spt_settings.preset_values("cpu_rescue", "pathfinder")
    return p["pretrain_epochs"], p["epochs"]


def preset_total():
    """Epochs of an SPT run of the preset, SPT and finetuning (a scratch run's too)."""
    return sum(preset_epochs())


def arm_flags(arm, seed, out):
    """The train_spt.py flags of one arm at one seed."""
    spt_epochs, epochs = preset_epochs()
    scratch = ["--pretrain_epochs=0", f"--epochs={spt_epochs + epochs}"]
    flags = {"spt": [],
             "scratch": scratch,
             "learned": scratch + ["--pos_enc=learned"],
             "qk": [f"--init_from={folder(out, 'spt', seed)}/spt_best.pt", "--init_params=qk"],
             "spt_torch": ["--init=torch"],
             "scratch_torch": scratch + ["--init=torch"]}[arm]
    return BASE + flags + [f"--seed={seed}"]


def jobs(cfg):
    """(folder, flags, needs) in the order they start; needs: folders that must be finished
    first (seed 0's pair, for the gate; the seed's SPT run, for its checkpoint)."""
    seeds, out = [int(s) for s in cfg["seeds"].split(",")], cfg["out"]
    order = [(arm, s) for s in seeds for arm in ("spt", "scratch")]
    order += [(arm, s) for arm in ARMS[2:] for s in seeds]
    first = [folder(out, arm, s) for arm, s in order[:2]]
    return [(folder(out, arm, s), arm_flags(arm, s, out),
             (first if i >= 2 else []) + ([folder(out, "spt", s)] if arm == "qk" else []))
            for i, (arm, s) in enumerate(order)]


def finished(d):
    return os.path.exists(os.path.join(d, "summary.json"))


def read_summary(d):
    with open(os.path.join(d, "summary.json")) as f:
        return json.load(f)


def finetune_evals(d):
    """The finetuning phase's validation records of a run, in order."""
    import training
    return [r for r in training.read_log(d) if r.get("phase") == "finetune" and "val_acc" in r]


def val_split(d):
    """(size, share of class 1) of the val split a run was scored on."""
    import train_spt
    with open(os.path.join(d, "config.json")) as f:
        val = train_spt.load_data("pathfinder", "val", json.load(f))
    return len(val), float(np.mean([int(val[i][1]) for i in range(len(val))]))


def first_spt(cfg):
    """The folder of the first seed's SPT run, which the gate judges."""
    return folder(cfg["out"], "spt", int(cfg["seeds"].split(",")[0]))


def gate(cfg):
    """None while the sweep may go on; else why it stops: seed 0's SPT run finished
    without taking off."""
    d = first_spt(cfg)
    if not finished(d):
        return None
    n, share = val_split(d)
    if take_off_epoch(finetune_evals(d), share, n) is None:
        return f"{d} never took off within its finetuning steps: the sweep stops at seed 0"
    return None


def core_hours(d):
    """Hours of one core a run has used: a finished run's summary's wall time; an
    unfinished one's up to its last checkpoint (0 without one). Both count the time before
    a stop: a sweep that spans sessions spends its budget once."""
    if finished(d):
        return read_summary(d)["wall_time_s"] / 3600
    path = os.path.join(d, "ckpt.pt")
    if not os.path.exists(path):
        return 0.0
    import runfiles
    try:
        return runfiles.load_checkpoint(path)["wall_time"] / 3600
    except (OSError, ValueError, KeyError):          # damaged: the run's own resume says so, in its log
        return 0.0


def command(d, flags, extra):
    """The command that starts (or resumes) the run in folder d."""
    py = [sys.executable, os.path.join(ROOT, "train_spt.py")]
    if os.path.exists(os.path.join(d, "ckpt.pt")):
        return py + [f"--out_dir={d}", "--init_from=resume"]
    return py + flags + extra + [f"--out_dir={d}", "--overwrite=True"]


def run(cfg):
    """Start every unfinished run when its needs are met, cfg["slots"] at a time, until
    the gate closes or the core-hour budget is spent."""
    extra = cfg["extra"].split()
    if cfg["dry"]:
        for d, flags, _ in jobs(cfg):
            print(" ".join(["python", "train_spt.py"] + flags + extra + [f"--out_dir={d}"]))
        return
    spent = {d: core_hours(d) for d, _, _ in jobs(cfg)}     # each run's hours; renewed when a run ends
    announce(cfg, sum(spent.values()))
    going, failed, started = {}, set(), {}
    first, stop, judged = first_spt(cfg), None, False
    while True:
        # a running run: its hours when it started, plus the time since (its checkpoint lags)
        used = sum(h + (time.time() - started[d]) / 3600 if d in going else h for d, h in spent.items())
        todo = [(d, f, n) for d, f, n in jobs(cfg) if not finished(d) and d not in going and d not in failed]
        ready = [(d, f) for d, f, needs in todo if all(finished(n) for n in needs)]
        if not judged:          # after `ready`: a run that needs seed 0's pair waits for this judgement
            judged = finished(first)
            stop = gate(cfg)    # read once seed 0's SPT run has finished, then kept
        if stop or used >= cfg["max_core_hours"]:
            ready = []
        for d, flags in ready[:max(0, cfg["slots"] - len(going))]:
            os.makedirs(os.path.dirname(d) or ".", exist_ok=True)
            print(f"start: {d}", flush=True)
            with open(d + ".log", "a") as log:
                going[d] = subprocess.Popen(command(d, flags, extra), stdout=log, stderr=subprocess.STDOUT,
                                            env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=ROOT)
            started[d] = time.time()
        for d, p in list(going.items()):
            if p.poll() is not None:
                del going[d], started[d]
                spent[d] = core_hours(d)
                print(("done: " if finished(d) else "FAILED: ") + f"{d} (see {d}.log)", flush=True)
                failed |= set() if finished(d) else {d}
        if not going and not ready:
            break
        time.sleep(2)
    left = [d for d, _, _ in jobs(cfg) if not finished(d)]
    print(stop or (f"the budget of {cfg['max_core_hours']:g} core-hours is spent" if left and used >=
                        cfg["max_core_hours"] else ""))
    print(f"{len(left)} runs not finished" if left else "every run finished")


# -----------------------------------------------------------------------------
# Where a sweep stands (it spans sessions: check it at the start of each)

def live(d):
    """Whether the process named in d's run.lock is alive and is train_spt.py writing into
    d. Read only: taking the lock, even for a moment, could refuse a run that starts."""
    try:
        with open(os.path.join(d, "run.lock")) as f:
            pid = int(f.read().strip() or 0)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except (OSError, ValueError):
        return False
    out_dirs = [a[len("--out_dir="):].rstrip("/") for a in argv if a.startswith("--out_dir=")]
    return any(a.endswith("train_spt.py") for a in argv) and os.path.basename(d) in map(os.path.basename, out_dirs)


def progress(d):
    """(state, epochs done, epochs in all) of one run folder; epochs count SPT's too."""
    import training
    if not os.path.exists(os.path.join(d, "config.json")):
        return "waiting", 0, None
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    total = c["pretrain_epochs"] + c["epochs"]
    if finished(d):
        return "finished", total, total
    records = training.read_log(d)
    if not records:
        return ("running" if live(d) else "stopped") + ": no step logged yet", 0, total
    last = records[-1]                       # "epoch": the epochs this phase has finished
    done = last["epoch"] + (c["pretrain_epochs"] if last["phase"] == "finetune" else 0)
    where = f"{last['phase']} step {last['step']}, {done} of {total} epochs done"
    return ("running: " if live(d) else "stopped (resumes from ckpt.pt): ") + where, done, total


MIN_PER_EPOCH = 7.0   # one core, float32, two runs side by side on a 2-core Zen 5 EPYC (seed 0: 3.2 h / 27 epochs)


def estimate(runs):
    """(epochs left, minutes an epoch, where that number comes from) of the whole sweep;
    runs: [(folder, progress(folder))] of every job."""
    left, per_epoch = 0, []
    for d, (state, done, total) in runs:
        if state == "finished":
            per_epoch.append(read_summary(d)["wall_time_s"] / 60 / total)
        left += (total or preset_total()) - done
    if per_epoch:
        return left, float(np.mean(per_epoch)), "the finished runs' mean"
    return left, MIN_PER_EPOCH, "one CPU core's pace, on a Zen 5 EPYC; a GPU is faster"


def status(cfg):
    """One line a run, then the core-hours used, an estimate of what is left, the gate."""
    rows, runs = [], [(d, progress(d)) for d, _, _ in jobs(cfg)]
    for d, (state, _, _) in runs:
        if state == "finished":
            summary = read_summary(d)
            state += f": test acc {summary['test_acc']:.3f}, {summary['wall_time_s'] / 3600:.2f} h"
        rows.append(f"{os.path.basename(d):<17} {state}")
    used = sum(core_hours(d) for d, _, _ in jobs(cfg))
    rows.append(f"core-hours used (finished runs, and the others to their last checkpoint): {used:.1f} of "
                f"--max_core_hours={cfg['max_core_hours']:g}")
    left, minutes, source = estimate(runs)
    rows.append(f"left: {left} epochs, about {left * minutes / 60:.0f} core-hours at {minutes:.1f} min an epoch "
                f"({source}); no run starts once {cfg['max_core_hours']:g} are used")
    first = first_spt(cfg)
    rows.append(gate(cfg) or (f"gate: open, {os.path.basename(first)} took off" if finished(first) else
                              f"gate: waits for {os.path.basename(first)} to finish"))
    text = "\n".join(rows)
    print(text)
    return text


def announce(cfg, used):
    """The sweep's cost, said before it starts anything, with the shorter ways; used: the
    core-hours its runs have spent so far."""
    left, minutes, source = estimate([(d, progress(d)) for d, _, _ in jobs(cfg)])
    budget = cfg["max_core_hours"] - used
    hours = max(0.0, min(left * minutes / 60, budget))
    print(f"This sweep has {left} epochs left: about {hours:.0f} core-hours, {hours / cfg['slots']:.0f} h at "
          f"{cfg['slots']} runs at a time ({minutes:.1f} min an epoch, {source}; --max_core_hours="
          f"{cfg['max_core_hours']:g} caps it). Shorter: --seeds=0 (seed 0's runs), --max_core_hours=N. It can "
          f"be stopped at any time and run again: it resumes. Where it stands: python tools/lra_rescue.py status",
          flush=True)


# -----------------------------------------------------------------------------
# The table, the verdict and the figures

def gather(cfg):
    """{arm: [(seed, folder, summary)]} of the finished runs."""
    seeds, out = [int(s) for s in cfg["seeds"].split(",")], cfg["out"]
    runs = {}
    for arm in ARMS:
        for s in seeds:
            if finished(folder(out, arm, s)):
                runs.setdefault(arm, []).append((s, folder(out, arm, s), read_summary(folder(out, arm, s))))
    return runs


def train_spt_config(flags=()):
    """train_spt.py's config of the preset, with flags."""
    import spt_settings
    import train_spt
    return spt_settings.get_config(train_spt.DEFAULTS, BASE + list(flags))


def take_offs(runs, n, share):
    """{arm: [take-off epoch or None, one per seed]}."""
    return {arm: [take_off_epoch(finetune_evals(d), share, n) for _, d, _ in members]
            for arm, members in runs.items()}


def table(runs, offs, n):
    """Markdown: one row per arm, mean +- std over seeds, each seed's test accuracy with
    its standard error and its take-off epoch, the steps and the wall time."""
    lines = ["| arm | seeds | SPT val loss | 3x3 attention mass, x uniform: after SPT / trained | final val loss | "
             "best val acc | test acc | each seed: test acc ± s.e. (take-off epoch) | steps SPT + labelled | "
             "wall h |", "|---|---|---|---|---|---|---|---|---|---|"]
    ms = lambda v: f"{np.mean(v):.3f} ± {np.std(v, ddof=1) if len(v) > 1 else 0:.3f}" if v else "-"
    ratio = lambda s, stage: [m[f"mass2d_r1_{stage}"] / m["mass2d_r1_uniform"] for m in s
                              if m.get(f"mass2d_r1_{stage}") is not None and m.get("mass2d_r1_uniform")]
    for arm, members in runs.items():
        s = [m for _, _, m in members]
        spt = [m["spt_best_val_loss"] for m in s if m.get("spt_best_val_loss") is not None]
        final = [finetune_evals(d)[-1]["val_loss"] for _, d, _ in members]
        seeds = ", ".join(f"{m['test_acc']:.3f} ± {standard_error(m['test_acc'], n):.3f} "
                          f"({'stuck' if e is None else e})" for m, e in zip(s, offs[arm]))
        spt_steps = spt_step_count(members[0][1]) if spt else 0
        lines.append(f"| {arm} | {len(s)} | {ms(spt)} | {ms(ratio(s, 'spt'))} / {ms(ratio(s, 'finetune'))} | "
                     f"{ms(final)} | {ms([m['best_val_acc'] for m in s])} | {ms([m['test_acc'] for m in s])} | "
                     f"{seeds} | {spt_steps:,} + {int(np.mean([m['steps'] for m in s])):,} | "
                     f"{ms([m['wall_time_s'] / 3600 for m in s])} |")
    return "\n".join(lines)


def spt_step_count(d):
    """The SPT steps of a run, from its log."""
    steps, _ = curve(d, "spt", "loss")
    return int(steps.max()) if len(steps) else 0


def verdicts(runs, offs, n, share):
    acc = {arm: [m["test_acc"] for _, _, m in members] for arm, members in runs.items()}
    off = {arm: [e is not None for e in es] for arm, es in offs.items()}
    pairs = [("spt", "scratch", "SPT against from scratch, compute-matched"),
             ("learned", "scratch", "from scratch: learned positions against sinusoidal"),
             ("qk", "scratch", "W_Q, W_K from SPT against from scratch"),
             ("spt_torch", "scratch_torch", "SPT against from scratch, both with PyTorch's init (W_Q, W_K untied)")]
    lines = [f"{label}: **{verdict(acc[a], off[a], acc[b], off[b])}**" for a, b, label in pairs
             if a in acc and b in acc]
    band = max(share, 1 - share) + 2 * math.sqrt(CHANCE * (1 - CHANCE) / n)
    lines.append(f"take-off: two val evaluations in a row with val loss below {constant_loss(share):.4f} (the "
                 f"best constant answer) by 2 s.e., or val acc above {band:.3f}")
    for arm, es in offs.items():
        lines.append(f"{arm}: {sum(e is not None for e in es)} of {len(es)} seeds took off")
    return "\n".join("- " + line for line in lines)


def report(cfg):
    runs = gather(cfg)
    if not runs:
        raise FileNotFoundError(f"no finished run under {cfg['out']}; start them with: python tools/lra_rescue.py run")
    n, share = val_split(next(d for members in runs.values() for _, d, _ in members))
    offs = take_offs(runs, n, share)
    text = f"{table(runs, offs, n)}\n\n{verdicts(runs, offs, n, share)}\n"
    print(text)
    with open(os.path.join(cfg["out"], "rescue.md"), "w") as f:
        f.write(text)
    where = cfg["figures"] or cfg["out"]
    os.makedirs(where, exist_ok=True)
    plot_curves(runs, constant_loss(share), os.path.join(where, "rescue_curves.png"))
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


def plot_curves(runs, floor, path):
    """Left: SPT loss of every SPT seed (train, smoothed; val, dots). Middle: val loss
    against labelled step, every arm and seed, with the best constant answer's loss.
    Third: val accuracy against labelled step. Right: val accuracy against all steps, SPT's
    included, so that the arms line up at equal compute. One colour an arm, one line a seed."""
    import analysis
    plt, (fig, (ax_spt, ax_loss, ax_acc, ax_all)) = analysis.plt_figure(1, 4, figsize=(21, 4.2))
    colours = dict(zip(ARMS, ("tab:red", "tab:blue", "tab:green", "tab:orange", "tab:purple", "tab:gray")))
    for arm, members in runs.items():
        c = colours[arm]
        for i, (s, d, _) in enumerate(members):
            label = arm if i == 0 else None
            if arm.startswith("spt"):
                ax_spt.plot(*smooth(*curve(d, "spt", "loss")), color=c, lw=0.8, alpha=0.6)
                ax_spt.plot(*curve(d, "spt", "val_loss"), "o", color=c, markersize=3, label=label)
            ax_loss.plot(*curve(d, "finetune", "val_loss"), "o-", color=c, markersize=3, lw=0.8, label=label)
            steps, acc = curve(d, "finetune", "val_acc")
            ax_acc.plot(steps, acc, "o-", color=c, markersize=3, lw=0.8, label=label)
            ax_all.plot(steps + spt_step_count(d), acc, "o-", color=c, markersize=3, lw=0.8, label=label)
    for a in (ax_acc, ax_all):
        a.axhline(CHANCE, color="k", lw=0.6, ls=":")
    ax_loss.axhline(floor, color="k", lw=0.6, ls=":")
    ax_spt.set_title("SPT loss (masked pixels; dots: val)"), ax_spt.set_xlabel("SPT step")
    ax_loss.set_title("val loss (dotted: the best constant answer)"), ax_loss.set_xlabel("labelled step")
    ax_acc.set_title("val accuracy (1,000 images)"), ax_acc.set_xlabel("labelled step")
    ax_all.set_title("val accuracy at equal compute"), ax_all.set_xlabel("step, SPT + labelled")
    for a in (ax_spt, ax_loss, ax_acc, ax_all):
        a.grid(alpha=0.3)
        a.legend(fontsize=7) if a.get_legend_handles_labels()[0] else None
    fig.tight_layout()
    analysis.save_figure(plt, fig, path, 90)


def plot_maps(runs, path):
    """One val image's layer-0 attention, head-averaged, at init, after SPT and after
    finetuning (the first SPT seed), beside the scratch run of that seed after training
    (both start from the same init: build_model seeds with --seed)."""
    import torch
    import analysis
    import train_spt
    from training import load_weights
    spt_dir, scratch_dir = runs["spt"][0][1], runs["scratch"][0][1]
    with open(os.path.join(spt_dir, "config.json")) as f:
        cfg = json.load(f)                                    # the run's own flags: its shape and data
    val = train_spt.load_data("pathfinder", "val", cfg)
    image, maps = val[0][0], {}
    for stage, ckpt in (("init", None), ("after SPT", os.path.join(spt_dir, "spt_best.pt")),
                        ("SPT, finetuned", os.path.join(spt_dir, "finetune_best.pt")),
                        ("scratch, trained", os.path.join(scratch_dir, "finetune_best.pt"))):
        model = train_spt.build_model(cfg, [val])
        if ckpt:
            load_weights(model, ckpt)
        with torch.no_grad():
            _, att = model.eval().forward_with_maps(image[None])
        maps[stage] = att[0][0]
    return analysis.plot_image_attention(image, maps, path)


def main(argv=None):
    cfg = configure(DEFAULTS, sys.argv[1:] if argv is None else argv, __doc__)
    if cfg["action"] not in ("run", "report", "status"):
        raise ValueError(f"--action={cfg['action']}: choose run, report or status")
    if cfg["slots"] < 1:
        raise ValueError(f"--slots={cfg['slots']} must be at least 1")
    if cfg["max_core_hours"] <= 0:
        raise ValueError(f"--max_core_hours={cfg['max_core_hours']} must be positive")
    return {"run": run, "report": report, "status": status}[cfg["action"]](cfg)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and not args[0].startswith("--"):                 # `run` / `report` as a word
        args = [f"--action={args[0]}"] + args[1:]
    run_cli(main, args)
