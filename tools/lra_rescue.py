"""Does self-pretraining rescue a Transformer on LRA's PathFinder, and which weights carry
the gain? The seed runs, their records, tables, verdicts and figures, at CPU scale
(train_spt.py --preset=cpu_rescue: two layers, 8,000 training images, SPT 2,750 steps,
finetuning 4,000).

    python tools/lra_rescue.py run            # the arms in --arms, 3 seeds, two runs at a time
    python tools/lra_rescue.py run --dry=True # the commands only
    python tools/lra_rescue.py commands       # one line a run for a cluster (below), wave by wave
    python tools/lra_rescue.py one --run=qk_s2   # one run, trained and recorded (what a line says)
    python tools/lra_rescue.py record         # copy finished runs' records into --results
    python tools/lra_rescue.py report         # tables + verdicts (rescue.md) and figures, from the records
    python tools/lra_rescue.py status         # each run: recorded, running, stopped or waiting

Cost, measured: a step of the preset is 1.9-2.1 s on one core of a 2-core Zen 5 EPYC
(two runs side by side; bf16 autocast is 4.8 times slower there), so an SPT run alone
(11 epochs) takes about 1.6 h, a finetuning run (16 epochs) about 2.3 h and a from-scratch
run (27 epochs) about 3.8 h. Every default arm on 3 seeds is about 45 core-hours.
Shorter: --seeds=0, --arms=spt,qk, or --max_core_hours=N.

An SPT run is split in two records: SPT alone (`spt_pretrain`, --epochs=0), then each arm
finetunes from its checkpoints (`--init_from`), which logs the same steps as phase 2 of a
single SPT run (tests/test_train_spt.py). The arms, in the default order (--arms):
    spt       SPT, then finetuning from all of its weights (A9's arm (a))
    qk        only W_Q, W_K from the seed's SPT checkpoint (A5)
    mlp       only the MLP weights from it (A5's contrast)
    short1    all weights after SPT's epoch 1 (A2: a short SPT)
    short5    all weights after SPT's epoch 5
    cross     SPT on photographs instead (data_lra.load_photos), then finetuning (A3)
    frozen    from scratch, 27 epochs, attention frozen at its init (A4)
    attn      all four attention matrices from SPT (A5)
and, by name only: scratch (27 epochs, compute-matched: A9's arm (b)), learned (as scratch,
learned positions), spt_torch and scratch_torch (PyTorch's init: W_Q, W_K not tied).
The data are generated once; a seed changes the init, the masks and the batch order. The
arms other than spt and scratch wait for the first seed's spt run: if it never takes off
(take_off_epoch), they do not start.

Records: when a run finishes, its summary.json, log.jsonl, command.txt, config.json,
finetune_best.pt and, for an SPT run, spt_best.pt and spt_epoch<N>.pt are copied into
--results/<run> (about 0.3 MB a checkpoint; 1.4 MB an SPT record): commit them in the
session the run finishes, since run folders do not survive a move to another machine. A
recorded run is never run again; other arms start from the recorded checkpoints; `report`
reads the records alone. A run cut by a machine change starts again from its beginning.
Restartable on one machine: a stopped run resumes from its ckpt.pt (--init_from=resume).
Runs go two at a time, one thread each (OMP_NUM_THREADS=1), and no run starts once the runs
have used --max_core_hours; the runs going then finish, so a sweep can pass it by up to
--slots runs. --extra (every run) and --extra_spt (the SPT-alone runs) add train_spt.py
flags: a tiny sweep for a test, or --device=cuda for a GPU replica.

What the driver guarantees (tests/test_tools.py; the hostile cases: tests/reliability_cases.py):
- A record is whole or absent. It is copied into <run>.partial (a leftover of a copy cut
  short is removed first) and renamed into place; no reader looks at a .partial folder. A
  record folder without its summary.json, or with a file that does not parse, a checkpoint
  that does not load, a number that is NaN or missing, or the flags of another run (another
  preset, arm or seed), is named in one line by run, one, commands and report before any
  work, and never tabled (status shows it on its line).
- No run is left going without its driver: a stop signal (SIGINT, SIGTERM, SIGHUP) passes
  SIGTERM to the runs, which save their resume points; on Linux each run also gets SIGTERM
  from the kernel when its driver dies, even by SIGKILL (PR_SET_PDEATHSIG), and elsewhere
  the runs are in the driver's process group. Started again, the driver records what
  finished, resumes what stopped, and never runs a recorded run again.
- No run is started twice: a driver holds --results/.driver.lock (a second `run` on the
  same records is refused in one line), and whoever trains a run, a driver or `one`, holds
  its claim, --results/.<run>.lock, until it is recorded (the run inherits it, so it lasts
  as long as the run does). A run held elsewhere, or a train_spt.py writing into its folder
  (one an older driver left going), takes a slot and is not started.
- A results or runs folder that cannot be written is one line before any work.

On a cluster (no `run --slots`): `commands` prints the `one` line of every unrecorded run,
wave by wave: wave 1 needs nothing (the SPT-alone runs, scratch), wave 2 needs only wave 1
(spt, from its SPT run), wave 3 the rest (the arms the first spt seed gates); --wave=N
prints one wave. Each line trains its run (resuming it if stopped) and keeps its record in
--results as `run` does; then `report` reads the records. Run the lines from this folder:

    python tools/lra_rescue.py commands --wave=1 > wave1.txt     # likewise wave2.txt, wave3.txt
    # SLURM: a job array a wave, each after the one before; job.sh runs line N of its file:
    #   #!/bin/bash
    #   #SBATCH --cpus-per-task=1 --time=8:00:00
    #   export OMP_NUM_THREADS=1; eval "$(sed -n ${SLURM_ARRAY_TASK_ID}p "$1")"
    one=$(sbatch --parsable --array=1-$(wc -l < wave1.txt) job.sh wave1.txt)
    two=$(sbatch --parsable --dependency=afterok:$one --array=1-$(wc -l < wave2.txt) job.sh wave2.txt)
    sbatch --dependency=afterok:$two --array=1-$(wc -l < wave3.txt) job.sh wave3.txt
    # or GNU parallel on one machine: a wave at a time
    for w in 1 2 3; do python tools/lra_rescue.py commands --wave=$w | OMP_NUM_THREADS=1 parallel -j 8; done
    python tools/lra_rescue.py report

Print each wave's lines when the one before it has finished, or all at once: a line whose
needs are not recorded yet is refused in one line, and one that is recorded already is
passed over, so a job array can be sent again. A wave-3 line is refused while the gate
holds (the first spt seed stuck). --max_core_hours binds `run` only.
"""

import ctypes
import fcntl
import functools
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

from configurator import configure, given_keys, run_cli  # noqa: E402

DEFAULTS = dict(action="report", out="out/rescue", results="results/rescue", slots=2, dry=False, extra="", extra_spt="",
                seeds="0,1,2", arms="spt,qk,mlp,short1,short5,cross,frozen,attn", figures="", max_core_hours=30.0,
                run="", wave=0)
BASE = ["--task=pathfinder", "--preset=cpu_rescue"]
CHANCE = 0.5

# SPT alone (--epochs=0): the runs whose checkpoints the arms finetune from.
SOURCES = {"spt_pretrain": [], "cross_pretrain": ["--pretrain_task=photos"], "torch_pretrain": ["--init=torch"]}
# arm: (its start: (source, checkpoint, --init_params), or None for from scratch; more flags)
SCRATCH = "scratch"
ARMS = {
    "spt": (("spt_pretrain", "spt_best.pt", "all"), []),
    "scratch": (None, []),
    "qk": (("spt_pretrain", "spt_best.pt", "qk"), []),
    "mlp": (("spt_pretrain", "spt_best.pt", "mlp"), []),
    "short1": (("spt_pretrain", "spt_epoch1.pt", "all"), []),
    "short5": (("spt_pretrain", "spt_epoch5.pt", "all"), []),
    "cross": (("cross_pretrain", "spt_best.pt", "all"), []),
    "frozen": (None, ["--freeze=attn"]),
    "attn": (("spt_pretrain", "spt_best.pt", "attn"), []),
    "learned": (None, ["--pos_enc=learned"]),
    "spt_torch": (("torch_pretrain", "spt_best.pt", "all"), ["--init=torch"]),
    "scratch_torch": (None, ["--init=torch"]),
}
RATED = ("spt", "qk", "attn", "mlp", "frozen")   # the arms the rate rule is asked about, each against scratch
UNGATED = ("spt", "scratch")     # the arms that run before the first spt seed is judged
KEPT = ("summary.json", "log.jsonl", "command.txt", "config.json", "val.json", "finetune_best.pt", "spt_best.pt")


# -----------------------------------------------------------------------------
# The rules, written down before the seed runs (REPORT.md, A9 and "Paper A's ablations
# on PathFinder"), tested on made-up numbers in tests/test_tools.py

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


def gain_verdict(arm, arm_off, spt, spt_off, base, most=0.8):
    """How much of SPT's gain over from-scratch training an arm keeps (a hybrid start,
    a short SPT, SPT on other images). arm, spt, base: test accuracies, one per seed;
    arm_off, spt_off: did each seed take off? The gain is mean(spt) - mean(base), and it
    must first be there: every spt seed above every base seed.
        "no gain to recover": the spt and base ranges overlap;
        "worse": every arm seed below every base seed;
        "no gain": the arm's range overlaps the base's;
        "recovers the gain": every arm seed above every base seed, its mean at least
            `most` of the gain above base's, and as many of its seeds took off as spt's;
        "part of the gain": every arm seed above every base seed, short of that."""
    if min(len(arm), len(spt), len(base)) < 3:
        return "too few seeds (3 per arm needed)"
    if min(spt) <= max(base):
        return "no gain to recover"
    if max(arm) < min(base):
        return "worse"
    if min(arm) <= max(base):
        return "no gain"
    kept = (np.mean(arm) - np.mean(base)) / (np.mean(spt) - np.mean(base))
    return "recovers the gain" if kept >= most and sum(arm_off) >= sum(spt_off) else "part of the gain"


def frozen_verdict(frozen, base, little=0.05):
    """Does freezing the attention at its init change from-scratch training (A4: little,
    since supervision barely moves it)? frozen, base: test accuracies, one per seed.
        "frozen worse" / "frozen better": the ranges apart;
        "changes little": the ranges overlap and the means are under `little` apart;
        "not separated": the ranges overlap, the means further apart."""
    if len(frozen) < 3 or len(base) < 3:
        return "too few seeds (3 per arm needed)"
    if max(frozen) < min(base):
        return "frozen worse"
    if min(frozen) > max(base):
        return "frozen better"
    return "changes little" if abs(np.mean(frozen) - np.mean(base)) < little else "not separated"


def rate_table(runs, offs, base=SCRATCH):
    """Markdown: the take-off rate rule (tools/rates.py, committed before the runs it
    judges) for every arm against the *recorded* from-scratch seeds, never transcribed
    ones: k of n took off with its exact 95% interval, the Kaplan-Meier median take-off
    epoch (labelled epochs; a stuck seed censored at its arm's last epoch), the test
    accuracy of the seeds that took off and of all seeds, the one-sided Fisher p of "takes
    off more often than scratch" with the verdict, and the log-rank test of "earlier". An
    arm of RATED without a record gets a row that says so, not silence."""
    import rates
    lines = ["| arm | took off | 95% interval | median take-off epoch | test acc, seeds off | test acc, all | "
             "against recorded scratch: Fisher p (more often), verdict | log-rank z, p (earlier) |",
             "|---|---|---|---|---|---|---|---|"]
    acc = {arm: [m["test_acc"] for _, _, m in members] for arm, members in runs.items()}
    for arm in runs:
        last = run_epochs(arm)
        r = rates.rate_row(offs[arm], last, acc[arm])
        median = f"> {last} (not reached)" if r["median"] is None else str(r["median"])
        against, early = "-", "-"
        if base in runs and arm != base:
            k, n = r["k"], r["n"]
            bk, bn = sum(e is not None for e in offs[base]), len(offs[base])
            against = f"{rates.fisher_greater(k, n, bk, bn):.3f}, **{rates.rate_verdict(k, n, bk, bn)}**"
            z, p = rates.logrank(offs[arm], last, offs[base], run_epochs(base))
            early = f"{z:+.2f}, {p:.3f}"
        lines.append(f"| {arm} | {r['k']} of {r['n']} | {r['lo']:.2f}-{r['hi']:.2f} | {median} | "
                     f"{ms(r['acc_off'])} | {ms(acc[arm])} | {against} | {early} |")
    lines += [f"| {arm} | not recorded here | - | - | - | - | - | - |" for arm in RATED if arm not in runs]
    return "\n".join(lines)


def standard_error(acc, n):
    """The binomial standard error of one run's accuracy on n images."""
    return math.sqrt(acc * (1 - acc) / n)


# -----------------------------------------------------------------------------
# The runs and their records

def folder(where, name, seed):
    return os.path.join(where, f"{name}_s{seed}")


def results_dir(cfg):
    """--results, from the repository's root when relative (the records belong to it)."""
    return cfg["results"] if os.path.isabs(cfg["results"]) else os.path.join(ROOT, cfg["results"])


def preset_epochs():
    """(SPT epochs, finetuning epochs) of the preset."""
    from plumbing import spt_settings
    p = spt_settings.preset_values("cpu_rescue", "pathfinder")
    return p["pretrain_epochs"], p["epochs"]


def preset_total():
    """Epochs of an SPT run of the preset, SPT and finetuning (a scratch run's too)."""
    return sum(preset_epochs())


def run_flags(name, seed, records):
    """The train_spt.py flags of one run (an arm's, or a source's) at one seed."""
    spt_epochs, epochs = preset_epochs()
    if name in SOURCES:
        flags = SOURCES[name] + ["--epochs=0"]
    else:
        start, more = ARMS[name]
        flags = ([f"--init_from={folder(records, start[0], seed)}/{start[1]}", f"--init_params={start[2]}"]
                 if start else ["--pretrain_epochs=0", f"--epochs={spt_epochs + epochs}"]) + more
    return BASE + flags + [f"--seed={seed}"]


def arm_list(cfg):
    arms = [a.strip() for a in cfg["arms"].split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise ValueError(f"--arms: unknown arm {unknown[0]!r}; choose from {', '.join(ARMS)}")
    return arms


def seeds_of(cfg):
    """--seeds as a list of ints, in the order given (the first is the gate's seed)."""
    parts = [s.strip() for s in str(cfg["seeds"]).split(",")]
    if not all(p.isdigit() for p in parts) or len(set(parts)) != len(parts):
        raise ValueError(f"--seeds={cfg['seeds']}: give distinct whole numbers separated by commas, "
                         f"for example --seeds=0,1,2")
    return [int(p) for p in parts]


def jobs(cfg):
    """(name, seed, needs) in the order they start: each arm on every seed before the next
    arm, the SPT-alone runs an arm starts from just before it. needs: (name, seed) runs
    that must be recorded first (the source run; the first seed's spt run, for the gate)."""
    seeds = seeds_of(cfg)
    order, listed = [], set()
    for arm in arm_list(cfg):
        start = ARMS[arm][0]
        if start and start[0] not in listed:
            listed.add(start[0])
            order += [(start[0], s, []) for s in seeds]
        gate = [("spt", seeds[0])] if arm not in UNGATED and "spt" in arm_list(cfg) else []
        order += [(arm, s, ([(start[0], s)] if start else []) + gate) for s in seeds]
    return order


def recorded(cfg, name, seed):
    """Whether --results holds the run's record: its summary.json, a file. A record is renamed
    into place whole, so a folder without one is damage, which record_problem names."""
    return os.path.isfile(os.path.join(folder(results_dir(cfg), name, seed), "summary.json"))


def read_json(path):
    """A JSON object from a file; one that does not parse is a ValueError naming the file."""
    try:
        with open(path) as f:
            value = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{os.path.basename(path)} is not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{os.path.basename(path)} is not a JSON object")
    return value


def read_summary(d):
    return read_json(os.path.join(d, "summary.json"))


def val_split(d):
    """(size, share of class 1) of the val split a run was scored on: from its record's
    val.json, else from the data its config names."""
    if os.path.exists(os.path.join(d, "val.json")):
        with open(os.path.join(d, "val.json")) as f:
            v = json.load(f)
        return v["n"], v["share"]
    from plumbing import spt_data
    with open(os.path.join(d, "config.json")) as f:
        val = spt_data.load_data("pathfinder", "val", json.load(f))
    return len(val), float(np.mean([int(val[i][1]) for i in range(len(val))]))


def keep_record(run_dir, record_dir):
    """Copy a finished run's record (KEPT, and spt_epoch<N>.pt) into record_dir, whole or not
    at all: into record_dir.partial (a leftover of a copy cut short is removed first), then
    renamed; a record is never replaced. The caller holds the run's claim. Returns record_dir."""
    from plumbing import runfiles
    if os.path.lexists(record_dir):
        raise FileExistsError(f"{record_dir} exists: a record is never overwritten; remove it by hand to redo it")
    names = [f for f in KEPT if os.path.exists(os.path.join(run_dir, f))]
    names += sorted(f for f in os.listdir(run_dir) if f.startswith("spt_epoch") and f.endswith(".pt"))
    n, share = val_split(run_dir)
    temp = record_dir + ".partial"
    shutil.rmtree(temp, ignore_errors=True)
    os.makedirs(temp)
    for f in names:
        shutil.copy2(os.path.join(run_dir, f), temp)
    runfiles.write_json(os.path.join(temp, "val.json"), dict(n=n, share=share))
    os.rename(temp, record_dir)
    return record_dir


def record_run(cfg, name, seed):
    """The run's record, kept now if its folder under --out has finished and it has none yet;
    None while it has not finished. The caller holds the run's claim."""
    record, d = folder(results_dir(cfg), name, seed), folder(cfg["out"], name, seed)
    if recorded(cfg, name, seed):
        return record
    if not os.path.isfile(os.path.join(d, "summary.json")):
        return None
    keep_record(d, record)
    print(f"recorded: {record} (commit it: git add {os.path.relpath(record, ROOT)})", flush=True)
    return record


def record(cfg):
    """`record`: the records checked first (check_records), then record_finished."""
    check_records(cfg)
    return record_finished(cfg)


def record_finished(cfg):
    """Record every finished run under --out that has no record yet and that no other process
    holds; returns the new records."""
    new = []
    for name, seed, _ in jobs(cfg):
        finished = os.path.isfile(os.path.join(folder(cfg["out"], name, seed), "summary.json"))
        if recorded(cfg, name, seed) or not finished:
            continue
        held = claim(cfg, name, seed)
        if held is not None:
            with held:
                new.append(record_run(cfg, name, seed))
    return new


# -----------------------------------------------------------------------------
# A record is read only when it is whole and this sweep's own

# The numbers a summary must hold, finite: what the tables, the verdicts and the budget read.
NUMBERS = {"source": ("spt_best_val_loss", "spt_best_epoch", "wall_time_s"),
           "arm": ("test_acc", "best_val_acc", "steps", "wall_time_s")}


def record_problem(cfg, name, seed):
    """What is wrong with the run's record in --results, in words, or None (no record, or a
    sound one): a folder without summary.json (a copy cut short, or edited), a file that does
    not parse, a checkpoint missing or damaged (every zip member's CRC is checked), a number
    NaN or missing, the flags of another run (foreign), or a start that is not recorded."""
    from plumbing import runfiles, training
    d = folder(results_dir(cfg), name, seed)
    if not os.path.lexists(d):
        return None
    if not os.path.isfile(os.path.join(d, "summary.json")):
        return "has no summary.json (a copy cut short, or edited)"
    try:
        summary, config = read_summary(d), read_json(os.path.join(d, "config.json"))
        training.read_log(d)
        for path in checkpoints_of(name, d):
            runfiles.load_checkpoint(path)
    except (OSError, ValueError) as e:
        return f"cannot be read: {e}"
    bad = [k for k in NUMBERS["source" if name in SOURCES else "arm"] if not finite(summary.get(k))]
    if bad:
        return f"holds no finite {bad[0]} in its summary.json ({summary.get(bad[0])!r})"
    src = source_of(d)
    if src and not os.path.isfile(os.path.join(src[0], "summary.json")):
        return f"started from {src[0]}, which is not recorded here (nor where the record names it)"
    return foreign(cfg, name, seed, config)


def finite(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def checkpoints_of(name, d):
    """The checkpoints of record d that must load: every one it holds, and spt_best.pt, which
    every SPT-alone run writes and most arms start from."""
    return [os.path.join(d, f) for f in sorted({f for f in os.listdir(d) if f.endswith(".pt")} |
                                               ({"spt_best.pt"} if name in SOURCES else set()))]


def foreign(cfg, name, seed, config):
    """None when a record's config is the sweep's run's: the values of the flags the sweep
    gives it and of its preset, and its start (the source record and checkpoint); else the
    first that differs, in words. Where the data and the run lived may differ."""
    from plumbing import spt_settings
    flags = run_flags(name, seed, results_dir(cfg)) + more_flags(cfg, name)
    want = expected_config(flags)
    keys = set(given_keys(flags)) | set(spt_settings.preset_values(want["preset"], want["task"]))
    for k in sorted(keys - {"out_dir", "overwrite", "init_from", "data_dir"}):
        if k in config and config[k] != want[k]:
            return f"was made with --{k}={config[k]}, where this sweep's {name} run has --{k}={want[k]}"
    start = lambda path: path.replace(os.sep, "/").split("/")[-2:] if path else []
    if start(config.get("init_from", "")) != start(want["init_from"]):
        return (f"starts from {config.get('init_from') or 'scratch'}, where this sweep's {name} run starts from "
                f"{want['init_from'] or 'scratch'}")
    return None


def expected_config(flags):
    """train_spt.py's config of a run's flags under this code, before any check (a record's
    start may lie on another machine)."""
    from plumbing import spt_settings
    import train_spt
    return spt_settings.layered_config(train_spt.DEFAULTS, BASE + list(flags))


def check_records(cfg):
    """Refuse, before any work, records under --results that are not whole and this sweep's
    own (record_problem), naming the first and what to do."""
    for name in (*SOURCES, *ARMS):
        for seed in seeds_of(cfg):
            problem = record_problem(cfg, name, seed)
            if problem:
                raise ValueError(f"the record {folder(results_dir(cfg), name, seed)} {problem}. Nothing was done: "
                                 f"restore it (git checkout), move it out of --results, or give the flags it was "
                                 f"made with (--extra, --extra_spt), then run again")


def gate(cfg):
    """None while the sweep may go on; else why it stops: the first seed's spt run finished
    without taking off."""
    seed = seeds_of(cfg)[0]
    if "spt" not in arm_list(cfg) or not recorded(cfg, "spt", seed):
        return None
    d = folder(results_dir(cfg), "spt", seed)
    n, share = val_split(d)
    if take_off_epoch(finetune_evals(d), share, n) is None:
        return f"{d} never took off within its finetuning steps: the ablation arms do not start"
    return None


def gated(name):
    """Whether the gate (the first seed's spt run taking off) holds this run back."""
    return name not in UNGATED and name not in SOURCES


def core_hours(cfg, name, seed):
    """Hours of one core a run has used: a recorded run's wall time; an unrecorded one's up
    to its last checkpoint (0 without one). A sweep that spans sessions spends its budget once."""
    if recorded(cfg, name, seed):
        try:
            hours = read_summary(folder(results_dir(cfg), name, seed)).get("wall_time_s")
        except ValueError:                               # a bad record: check_records names it
            hours = None
        return hours / 3600 if finite(hours) else 0.0
    path = os.path.join(folder(cfg["out"], name, seed), "ckpt.pt")
    if not os.path.exists(path):
        return 0.0
    from plumbing import runfiles
    try:
        return runfiles.load_checkpoint(path)["wall_time"] / 3600
    except (OSError, ValueError, KeyError):          # damaged: the run's own resume says so, in its log
        return 0.0


def more_flags(cfg, name):
    """--extra (every run) and, for an SPT-alone run, --extra_spt (flags of the SPT phase,
    which a finetuning run refuses)."""
    return cfg["extra"].split() + (cfg["extra_spt"].split() if name in SOURCES else [])


def command(cfg, name, seed):
    """The command that starts (or resumes) one run."""
    extra = more_flags(cfg, name)
    d = folder(cfg["out"], name, seed)
    py = [sys.executable, os.path.join(ROOT, "train_spt.py")]
    if os.path.exists(os.path.join(d, "ckpt.pt")):
        return py + [f"--out_dir={d}", "--init_from=resume"]
    return py + run_flags(name, seed, results_dir(cfg)) + extra + [f"--out_dir={d}", "--overwrite=True"]


# -----------------------------------------------------------------------------
# Who runs a run: claims on the records, children that die with their driver

def lock_file(path):
    """An open file at path holding an exclusive flock, this pid written in it; None while
    another process holds it. Its folder is made; one that cannot be written is one line."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        f = open(path, "a+")
    except OSError as e:
        raise PermissionError(f"{os.path.dirname(path)} cannot be written ({e.strerror}): the records go there; "
                              f"give --results a folder that can be written") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    f.truncate(0)
    f.write(str(os.getpid()))
    f.flush()
    return f


def holder(path):
    """The pid written in a lock file, for a message."""
    try:
        with open(path) as f:
            return f.read().strip() or "unknown"
    except OSError:
        return "unknown"


def claim(cfg, name, seed, tries=1):
    """The run's claim, --results/.<run>.lock, held by whoever trains and records the run (its
    child inherits it, so it lasts as long as the run does): the open file, or None while
    another process holds it (tried `tries` times, 0.1 s apart)."""
    path = os.path.join(results_dir(cfg), f".{name}_s{seed}.lock")
    for i in range(tries):
        held = lock_file(path)
        if held is not None or i == tries - 1:
            return held
        time.sleep(0.1)


def held_elsewhere(cfg, name, seed):
    """Whether another process runs this run now: it holds the run's claim (a driver or `one`
    on these records), or a train_spt.py writes into its folder (one an older driver left)."""
    held = claim(cfg, name, seed)
    if held is None:
        return True
    held.close()
    return live(folder(cfg["out"], name, seed))


def hold_driver(cfg):
    """--results/.driver.lock, held while `run` drives the sweep: a second driver on the same
    records is refused in one line."""
    path = os.path.join(results_dir(cfg), ".driver.lock")
    held = lock_file(path)
    if held is None:
        pid = holder(path)
        raise FileExistsError(f"another lra_rescue.py run (pid {pid}) drives the records in {results_dir(cfg)}: "
                              f"wait for it, or stop it (kill {pid}: its runs save their resume points) and run "
                              f"this again, which resumes them")
    return held


def check_writable(where):
    """--out, where the runs write their folders, can be written: one line before any work if not."""
    try:
        os.makedirs(where, exist_ok=True)
        tempfile.TemporaryFile(dir=where).close()
    except OSError as e:
        raise PermissionError(f"--out={where} cannot be written ({e.strerror}): the runs write their folders "
                              f"there; give a folder that can be written") from None


def die_with_parent(driver):
    """In a run's child, before train_spt.py starts: Linux sends it SIGTERM when the driver
    dies, however it dies, SIGKILL included (PR_SET_PDEATHSIG), so it saves its resume point
    and stops. Elsewhere the run is in the driver's process group, which a kill of it reaches."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))     # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != driver:                      # the driver died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def start_run(cfg, name, seed, held):
    """One run as a child process, one thread, its output appended to <folder>.log; it
    inherits the run's claim `held` and dies with its driver (die_with_parent)."""
    d = folder(cfg["out"], name, seed)
    os.makedirs(os.path.dirname(d) or ".", exist_ok=True)
    print(f"start: {d}", flush=True)
    with open(d + ".log", "a") as log:
        return subprocess.Popen(command(cfg, name, seed), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=dict(os.environ, OMP_NUM_THREADS="1"), pass_fds=(held.fileno(),),
                                preexec_fn=functools.partial(die_with_parent, os.getpid()))


def forward_stop(going, stopped):
    """The driver's handler of a stop signal: note it in `stopped` and pass SIGTERM to each run
    (it stops at the end of its step, resume point saved); the driver's loop then calls
    stop_runs. The handler never waits: the signal may come while the loop polls a run,
    holding the lock that waiting for it needs."""
    def handler(signum, frame):
        stopped.append(signum)
        for p in list(going.values()):
            p.send_signal(signal.SIGTERM)
    return handler


def stop_runs(going, signum):
    """After a stop signal to the driver: pass SIGTERM to each run (again, for one started as
    the signal came), wait for them, then stop with 128 + the signal's number. Run again, the
    driver resumes them."""
    for p in going.values():
        p.send_signal(signal.SIGTERM)
    for p in going.values():
        p.wait()
    print(f"stopped by signal {signum}: {len(going)} run(s) saved their resume point; run again to resume",
          flush=True)
    raise SystemExit(128 + signum)




# -----------------------------------------------------------------------------
# The three ways to run the sweep: the local driver, one run, the lines for a cluster

def run(cfg):
    """Start every unrecorded run when its needs are recorded, cfg["slots"] at a time, until
    the gate closes or the core-hour budget is spent; record each run as it finishes. Refused
    first: a record that is not whole or not this sweep's, a folder that cannot be written,
    another driver on the same records. A run going in another process (its claim held, or
    a driver stopped earlier left it running) takes a slot and is never started twice; it is
    recorded when it ends. A stop signal to the driver stops its runs too, each at the end of
    a step with its resume point saved; so does the driver's death (die_with_parent)."""
    if cfg["dry"]:
        for name, seed, _ in jobs(cfg):
            flags = run_flags(name, seed, results_dir(cfg)) + more_flags(cfg, name)
            print(" ".join(["python", "train_spt.py"] + flags + [f"--out_dir={folder(cfg['out'], name, seed)}"]))
        return
    check_records(cfg)
    check_writable(cfg["out"])
    driver = hold_driver(cfg)
    record_finished(cfg)
    spent = {(n, s): core_hours(cfg, n, s) for n, s, _ in jobs(cfg)}   # renewed when a run ends
    announce(cfg, sum(spent.values()))
    going, claims, failed, started, stop, elsewhere, stopped = {}, {}, set(), {}, gate(cfg), set(), []
    handlers = {sig: signal.signal(sig, forward_stop(going, stopped)) for sig in STOP_SIGNALS}
    try:
        while True:
            for key, p in list(going.items()):                      # first the runs that have ended
                if p.poll() is not None:
                    del going[key], started[key]
                    d = folder(cfg["out"], *key)
                    with claims.pop(key):                           # held until it is recorded
                        if record_run(cfg, *key):
                            print(f"done: {d}", flush=True)
                        else:
                            failed.add(key)
                            print(f"FAILED: {d} (see {d}.log)", flush=True)
                    spent[key], stop = core_hours(cfg, *key), gate(cfg)    # judged again when a run ends
            if stopped:
                stop_runs(going, stopped[0])
            used = sum(h + (time.time() - started[k]) / 3600 if k in going else h for k, h in spent.items())
            todo = [(n, s, needs) for n, s, needs in jobs(cfg)
                    if not recorded(cfg, n, s) and (n, s) not in going and (n, s) not in failed]
            now_elsewhere = {(n, s) for n, s, _ in todo if held_elsewhere(cfg, n, s)}
            for key in sorted(now_elsewhere - elsewhere):
                print(f"running elsewhere, not started again: {folder(cfg['out'], *key)}", flush=True)
            if elsewhere - now_elsewhere:                           # one of them has ended
                record_finished(cfg)
                spent.update({k: core_hours(cfg, *k) for k in elsewhere - now_elsewhere})
            elsewhere = now_elsewhere
            ready = [(n, s) for n, s, needs in todo
                     if (n, s) not in elsewhere and all(recorded(cfg, *k) for k in needs)]
            if used >= cfg["max_core_hours"]:
                ready = []
            if stop:
                ready = [(n, s) for n, s in ready if not gated(n)]
            for name, seed in ready[:max(0, cfg["slots"] - len(going) - len(elsewhere))]:
                held = claim(cfg, name, seed)
                if held is not None:                                # else taken a moment ago: next round
                    claims[name, seed] = held
                    going[name, seed], started[name, seed] = start_run(cfg, name, seed, held), time.time()
            if not going and not elsewhere:
                break
            time.sleep(2)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        driver.close()
    left = [(n, s) for n, s, _ in jobs(cfg) if not recorded(cfg, n, s)]
    print(stop or (f"the budget of {cfg['max_core_hours']:g} core-hours is spent" if left and used >=
                        cfg["max_core_hours"] else ""))
    print(f"{len(left)} runs not recorded" if left else "every run recorded")


def one(cfg):
    """One run of the sweep, --run=NAME_sSEED, trained and recorded as `run` does it (resumed
    from its ckpt.pt when it was stopped): what each line of `commands` says. Refused in one
    line, before any work, when it is not a run of the sweep (--arms, --seeds), a run it
    needs is not recorded, the gate holds it, or another process runs it; a run recorded
    already is passed over, so a job array can be sent again."""
    name, seed, needs = find_job(cfg)
    check_records(cfg)
    record, d = folder(results_dir(cfg), name, seed), folder(cfg["out"], name, seed)
    if recorded(cfg, name, seed):
        return print(f"recorded already: {record}")
    missing = [k for k in needs if not recorded(cfg, *k)]
    if missing:
        raise FileNotFoundError(f"{cfg['run']} needs {folder(results_dir(cfg), *missing[0])}, which is not recorded "
                                f"yet: run the lines of wave {waves(cfg)[missing[0]]} first (python "
                                f"tools/lra_rescue.py commands --wave={waves(cfg)[missing[0]]})")
    if gated(name) and gate(cfg):
        raise ValueError(gate(cfg))
    check_writable(cfg["out"])
    held = claim(cfg, name, seed, tries=20)
    if held is None or live(d):
        raise FileExistsError(f"{cfg['run']} is being run by another process (pid "
                              f"{holder(os.path.join(results_dir(cfg), f'.{name}_s{seed}.lock'))}): wait for it; "
                              f"its record goes to {record}")
    going, stopped = {(name, seed): start_run(cfg, name, seed, held)}, []
    handlers = {sig: signal.signal(sig, forward_stop(going, stopped)) for sig in STOP_SIGNALS}
    try:
        p = going[name, seed]
        p.wait()
        kept = record_run(cfg, name, seed)
        if stopped:
            stop_runs(going, stopped[0])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if kept is None:
        raise SystemExit(f"error: {d} ended without its summary.json (exit {p.returncode}): see {d}.log; this "
                         f"line resumes it")


def find_job(cfg):
    """(name, seed, needs) of --run=NAME_sSEED among the sweep's runs."""
    found = [job for job in jobs(cfg) if f"{job[0]}_s{job[1]}" == cfg["run"]]
    if not found:
        raise ValueError(f"--run={cfg['run']} is not a run of this sweep (--arms={cfg['arms']} --seeds="
                         f"{cfg['seeds']}); python tools/lra_rescue.py commands prints its runs")
    return found[0]


def waves(cfg):
    """{(name, seed): wave}: 1 for a run that needs none, else one more than the latest of its
    needs, recorded or not, so that no run needs a run of its own wave."""
    needs = {(n, s): k for n, s, k in jobs(cfg)}

    def wave(key):
        return 1 + max((wave(k) for k in needs.get(key, ())), default=0)
    return {key: wave(key) for key in needs}


def commands(cfg):
    """Print the `one` line of every unrecorded run, wave by wave (--wave=N: that wave's
    only), and on stderr how many each wave holds: the runs `run` would start, with its
    train_spt.py flags (a gate that holds leaves out the arms it gates). Returns the lines."""
    check_records(cfg)
    wave, holds = waves(cfg), gate(cfg)
    todo = sorted([(wave[n, s], n, s) for n, s, _ in jobs(cfg)
                   if not recorded(cfg, n, s) and not (holds and gated(n))], key=lambda t: t[0])
    flags = [f"--{k}={cfg[k]}" for k in ("arms", "seeds", "out", "results", "extra", "extra_spt")
             if cfg[k] != DEFAULTS[k]]
    lines = [f"cd {shlex.quote(ROOT)} && " + shlex.join(["python", "tools/lra_rescue.py", "one", f"--run={n}_s{s}", *flags])
             for w, n, s in todo if cfg["wave"] in (0, w)]             # cd: a job starts in any folder
    if lines:
        print("\n".join(lines))
    per_wave = {w: sum(1 for t in todo if t[0] == w) for w in sorted({t[0] for t in todo})}
    print(f"{len(lines)} lines; unrecorded runs by wave: {per_wave or 'none'}" + (f"; {holds}" if holds else ""),
          file=sys.stderr)
    return lines


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


def run_epochs(name):
    """Epochs of one run of the preset: SPT alone, finetuning, or from scratch."""
    spt_epochs, epochs = preset_epochs()
    return spt_epochs if name in SOURCES else epochs if ARMS[name][0] else spt_epochs + epochs


def progress(cfg, name, seed):
    """(state, epochs done) of one run; epochs count SPT's too."""
    from plumbing import training
    problem = record_problem(cfg, name, seed)
    if problem:
        return f"bad record: it {problem}", 0
    if recorded(cfg, name, seed):
        return "recorded", run_epochs(name)
    d = folder(cfg["out"], name, seed)
    if not os.path.exists(os.path.join(d, "config.json")):
        return "waiting", 0
    records = training.read_log(d)
    if not records:
        return ("running" if live(d) else "stopped") + ": no step logged yet", 0
    last = records[-1]                       # "epoch": the epochs its one phase has finished
    done = last["epoch"]
    where = f"{last['phase']} step {last['step']}, {done} of {run_epochs(name)} epochs done"
    return ("running: " if live(d) else "stopped (resumes from ckpt.pt): ") + where, done


MIN_PER_EPOCH = 8.5   # one core, float32, two runs side by side on a 2-core Zen 5 EPYC (2.05 s a step)


def estimate(cfg, runs):
    """(epochs left, minutes an epoch, where that number comes from) of the whole sweep;
    runs: [((name, seed), progress)] of every job."""
    left, per_epoch = 0, []
    for (name, seed), (state, done) in runs:
        if state == "recorded":
            per_epoch.append(read_summary(folder(results_dir(cfg), name, seed))["wall_time_s"] / 60 / run_epochs(name))
        left += run_epochs(name) - done
    if per_epoch:
        return left, float(np.mean(per_epoch)), "the recorded runs' mean"
    return left, MIN_PER_EPOCH, "one CPU core's pace, on a Zen 5 EPYC; a GPU is faster"


def status(cfg):
    """One line a run, then the core-hours used, an estimate of what is left, the gate."""
    rows, runs = [], [((n, s), progress(cfg, n, s)) for n, s, _ in jobs(cfg)]
    for (name, seed), (state, _) in runs:
        if state == "recorded":
            summary = read_summary(folder(results_dir(cfg), name, seed))
            acc = f"test acc {summary['test_acc']:.3f}" if "test_acc" in summary else \
                f"SPT val loss {summary['spt_best_val_loss']:.3f}"
            state += f": {acc}, {summary['wall_time_s'] / 3600:.2f} h"
        rows.append(f"{name}_s{seed:<14} {state}")
    used = sum(core_hours(cfg, n, s) for n, s, _ in jobs(cfg))
    rows.append(f"core-hours used (recorded runs, and the others to their last checkpoint): {used:.1f} of "
                f"--max_core_hours={cfg['max_core_hours']:g}")
    left, minutes, source = estimate(cfg, runs)
    rows.append(f"left: {left} epochs, about {left * minutes / 60:.0f} core-hours at {minutes:.1f} min an epoch "
                f"({source}); no run starts once {cfg['max_core_hours']:g} are used")
    first = seeds_of(cfg)[0]                                # the gate's seed
    rows.append(f"gate: not judged, spt_s{first}'s record is bad" if record_problem(cfg, "spt", first) else
                gate(cfg) or (f"gate: open, spt_s{first} took off" if recorded(cfg, "spt", first) else
                              f"gate: waits for spt_s{first} to be recorded"))
    text = "\n".join(rows)
    print(text)
    return text


def announce(cfg, used):
    """The sweep's cost, said before it starts anything, with the shorter ways; used: the
    core-hours its runs have spent so far."""
    left, minutes, source = estimate(cfg, [((n, s), progress(cfg, n, s)) for n, s, _ in jobs(cfg)])
    budget = cfg["max_core_hours"] - used
    hours = max(0.0, min(left * minutes / 60, budget))
    print(f"This sweep has {left} epochs left: about {hours:.0f} core-hours, {hours / cfg['slots']:.0f} h at "
          f"{cfg['slots']} runs at a time ({minutes:.1f} min an epoch, {source}; --max_core_hours="
          f"{cfg['max_core_hours']:g} caps it). Shorter: --seeds=0, --arms=spt,qk, --max_core_hours=N. It can "
          f"be stopped at any time and run again: it resumes. Where it stands: python tools/lra_rescue.py status",
          flush=True)


# -----------------------------------------------------------------------------
# The tables, the verdicts and the figures, from the records alone

def finetune_evals(d):
    """The finetuning phase's validation records of a run, in order."""
    from plumbing import training
    return [r for r in training.read_log(d) if r.get("phase") == "finetune" and "val_acc" in r]


def gather(cfg):
    """{arm: [(seed, record folder, summary)]} of the recorded arm runs, in ARMS order."""
    seeds, where = seeds_of(cfg), results_dir(cfg)
    return {arm: members for arm in ARMS
            if (members := [(s, folder(where, arm, s), read_summary(folder(where, arm, s)))
                            for s in seeds if recorded(cfg, arm, s)])}


def unread_records(cfg):
    """The records under --results of this sweep's arms whose seed is not in --seeds: the
    tables leave them out, and say so, so that a seed run later is never silently unread."""
    seeds, where = set(seeds_of(cfg)), results_dir(cfg)
    found = [d.rsplit("_s", 1) for d in (os.listdir(where) if os.path.isdir(where) else []) if "_s" in d]
    found = sorted((name, int(s)) for name, s in found if (name in ARMS or name in SOURCES) and s.isdigit())
    return [f"{name}_s{s}" for name, s in found if s not in seeds and recorded(cfg, name, s)]


def take_two(cfg):
    """A9's take-two seeds as transcribed into results/rescue/take_two.json (their run
    folders were lost): {arm: {"test_acc": [...], "take_off": [...]}}, or {}. A results
    folder without its own copy (the GPU replica's) reads the repository's."""
    path = os.path.join(results_dir(cfg), "take_two.json")
    if not os.path.exists(path):
        path = os.path.join(ROOT, "results", "rescue", "take_two.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)["arms"]


def train_spt_config(flags=()):
    """train_spt.py's config of the preset, with flags."""
    from plumbing import spt_settings
    import train_spt
    return spt_settings.get_config(train_spt.DEFAULTS, BASE + list(flags))


def take_offs(runs, n, share):
    """{arm: [take-off epoch or None, one per seed]}."""
    return {arm: [take_off_epoch(finetune_evals(d), share, n) for _, d, _ in members]
            for arm, members in runs.items()}


def source_of(d):
    """(the SPT record a finetuning run started from, the epoch of its checkpoint), or None."""
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    if not c["init_from"] or c["init_from"] == "resume":
        return None
    src, ckpt = os.path.split(c["init_from"])
    src = located(src, d)
    if ckpt.startswith("spt_epoch"):
        return src, int(ckpt[len("spt_epoch"):-len(".pt")])
    return src, read_summary(src)["spt_best_epoch"] if os.path.exists(os.path.join(src, "summary.json")) else None


def located(src, d):
    """Where the source record src of record d is in this checkout. A record names its start
    by an absolute path on the machine it ran on, which may be another checkout's or gone:
    look first for the same results/<folder>/<record> under d's results folder, then for the
    record beside d, and only then at src itself, so a report reads its own records."""
    results = os.path.dirname(os.path.dirname(os.path.abspath(d)))       # d is results/<folder>/<run>
    tail = src.rsplit(os.sep + "results" + os.sep, 1)
    near = [os.path.join(results, tail[1])] if len(tail) == 2 else []
    near.append(os.path.join(os.path.dirname(os.path.abspath(d)), os.path.basename(src)))
    return next((c for c in near + [src] if os.path.isdir(c)), src)


def spt_at(d):
    """(SPT steps, SPT val loss) behind a run: its own SPT phase, or its source's at the
    epoch of the checkpoint it started from; (0, None) for a run from scratch."""
    from plumbing import training
    src = source_of(d)
    where, epoch = src if src else (d, None)
    if not os.path.exists(os.path.join(where, "log.jsonl")):
        return 0, None
    vals = [r for r in training.read_log(where) if r.get("phase") == "spt" and "val_loss" in r]
    if not vals:
        return 0, None
    r = next((v for v in vals if v["epoch"] == epoch), None) or min(vals, key=lambda v: v["val_loss"])
    return r["step"], r["val_loss"]


def ms(v):
    """mean ± sd over seeds (n - 1); 'v (one seed)', which has no spread; or '-'."""
    if len(v) == 1:
        return f"{v[0]:.3f} (one seed)"
    return f"{np.mean(v):.3f} ± {np.std(v, ddof=1):.3f}" if len(v) else "-"


def table(runs, offs, n):
    """Markdown: one row per arm, mean ± sd over seeds, each seed's test accuracy with
    its standard error and its take-off epoch, the steps and the wall time."""
    lines = ["| arm | seeds | SPT val loss | 3x3 attention mass, x uniform: after SPT / trained | final val loss | "
             "best val acc | test acc | each seed: test acc ± s.e. (take-off epoch) | steps SPT + labelled | "
             "wall h |", "|---|---|---|---|---|---|---|---|---|---|"]
    at = lambda m, stage: m.get(f"mass2d_r1_{stage}", m.get("mass2d_r1_spt") if stage == "start" else None)
    ratio = lambda s, stage: [at(m, stage) / m["mass2d_r1_uniform"] for m in s     # "start": "spt" in older records
                              if at(m, stage) is not None and m.get("mass2d_r1_uniform")]
    for arm, members in runs.items():
        s = [m for _, _, m in members]
        spt = [spt_at(d) for _, d, _ in members]
        final = [finetune_evals(d)[-1]["val_loss"] for _, d, _ in members]
        seeds = ", ".join(f"{m['test_acc']:.3f} ± {standard_error(m['test_acc'], n):.3f} "
                          f"({'stuck' if e is None else e})" for m, e in zip(s, offs[arm]))
        lines.append(f"| {arm} | {len(s)} | {ms([v for _, v in spt if v is not None])} | "
                     f"{ms(ratio(s, 'start'))} / {ms(ratio(s, 'finetune'))} | {ms(final)} | "
                     f"{ms([m['best_val_acc'] for m in s])} | {ms([m['test_acc'] for m in s])} | {seeds} | "
                     f"{int(np.mean([k for k, _ in spt])):,} + {int(np.mean([m['steps'] for m in s])):,} | "
                     f"{ms([m['wall_time_s'] / 3600 for m in s])} |")
    return "\n".join(lines)


def source_table(cfg):
    """Markdown: the SPT-alone records, one row a run: SPT val loss by epoch, 3x3 mass."""
    from plumbing import training
    lines = ["| SPT run | SPT val loss by epoch | best | 3x3 mass after SPT, x uniform | wall h |", "|---|---|---|---|---|"]
    for name in SOURCES:
        for s in seeds_of(cfg):
            if not recorded(cfg, name, s):
                continue
            d, m = folder(results_dir(cfg), name, s), read_summary(folder(results_dir(cfg), name, s))
            vals = [r["val_loss"] for r in training.read_log(d) if r.get("phase") == "spt" and "val_loss" in r]
            mass = f"{m['mass2d_r1_spt'] / m['mass2d_r1_uniform']:.1f}" if m.get("mass2d_r1_uniform") else "-"
            lines.append(f"| {name}_s{s} | {', '.join(f'{v:.3f}' for v in vals)} | {m['spt_best_val_loss']:.3f} "
                         f"(epoch {m['spt_best_epoch']}) | {mass} | {m['wall_time_s'] / 3600:.2f} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def verdicts(cfg, runs, offs, n, share):
    """The rules' verdicts, each from 3 seeds: spt against scratch, every other arm against
    spt and scratch, frozen against scratch. scratch: its records, else take two's seeds."""
    acc = {arm: [m["test_acc"] for _, _, m in members] for arm, members in runs.items()}
    off = {arm: [e is not None for e in es] for arm, es in offs.items()}
    lines, old = [], take_two(cfg)
    if SCRATCH not in acc and SCRATCH in old:
        acc[SCRATCH], off[SCRATCH] = old[SCRATCH]["test_acc"], [e is not None for e in old[SCRATCH]["take_off"]]
        lines.append("scratch: take two's three seeds, transcribed (results/rescue/take_two.json)")
    pairs = [("spt", "scratch", "SPT against from scratch, compute-matched"),
             ("learned", "scratch", "from scratch: learned positions against sinusoidal"),
             ("spt_torch", "scratch_torch", "SPT against from scratch, both with PyTorch's init (W_Q, W_K untied)")]
    lines += [f"{label}: **{verdict(acc[a], off[a], acc[b], off[b])}**" for a, b, label in pairs
              if a in acc and b in acc]
    for arm in ("qk", "mlp", "attn", "short1", "short5", "cross"):
        if arm in acc and "spt" in acc and SCRATCH in acc:
            lines.append(f"{arm} against spt and scratch: **{gain_verdict(acc[arm], off[arm], acc['spt'], off['spt'], acc[SCRATCH])}**")
    if "frozen" in acc and SCRATCH in acc:
        lines.append(f"frozen attention against scratch: **{frozen_verdict(acc['frozen'], acc[SCRATCH])}**")
    band = max(share, 1 - share) + 2 * math.sqrt(CHANCE * (1 - CHANCE) / n)
    lines.append(f"take-off: two val evaluations in a row with val loss below {constant_loss(share):.4f} (the "
                 f"best constant answer) by 2 s.e., or val acc above {band:.3f}")
    for arm, es in offs.items():
        lines.append(f"{arm}: {sum(e is not None for e in es)} of {len(es)} seeds took off")
    return "\n".join("- " + line for line in lines)


def report(cfg):
    """rescue.md (the tables and verdicts) and the figures, from the records alone; refused
    before any output when a record is not whole or not this sweep's (check_records)."""
    check_records(cfg)
    runs = gather(cfg)
    if not runs:
        raise FileNotFoundError(f"no recorded arm run under {results_dir(cfg)}; start them with: "
                                f"python tools/lra_rescue.py run")
    n, share = val_split(next(d for members in runs.values() for _, d, _ in members))
    offs = take_offs(runs, n, share)
    rate = rate_table(runs, offs) if SCRATCH in runs else "take-off rates: no recorded scratch seed, no rate verdict"
    text = f"{table(runs, offs, n)}\n\n{source_table(cfg)}\n\n{verdicts(cfg, runs, offs, n, share)}\n\n{rate}\n"
    if unread := unread_records(cfg):
        text += f"\nrecorded, not read here (outside --seeds={cfg['seeds']}): {', '.join(unread)}\n"
    print(text)
    os.makedirs(cfg["out"], exist_ok=True)
    with open(os.path.join(cfg["out"], "rescue.md"), "w") as f:
        f.write(text)
    where = cfg["figures"] or cfg["out"]
    os.makedirs(where, exist_ok=True)
    plot_curves(runs, constant_loss(share), os.path.join(where, "rescue_curves.png"))
    plot_take_offs(runs, offs, os.path.join(where, "rescue_take_offs.png"))
    first = [(arm, members[0][1]) for arm, members in runs.items()
             if os.path.exists(os.path.join(members[0][1], "finetune_best.pt"))]
    if first:
        plot_maps(first, os.path.join(where, "rescue_attention_2d.png"))
    return text


def curve(d, phase, key):
    """(steps, values) of one run's records of a phase that hold key."""
    from plumbing import training
    rec = [r for r in training.read_log(d) if r.get("phase") == phase and key in r]
    return np.array([r["step"] for r in rec]), np.array([r[key] for r in rec])


def smooth(x, y, k=10):
    """A running mean over k logged points (the loss is logged every 10 steps)."""
    if len(y) < k:
        return x, y
    return x[k - 1:], np.convolve(y, np.ones(k) / k, mode="valid")


COLOURS = dict(zip(ARMS, ("tab:red", "tab:blue", "tab:orange", "tab:brown", "tab:pink", "tab:olive", "tab:cyan",
                          "tab:gray", "tab:purple", "tab:green", "darkred", "navy")))


def plot_curves(runs, floor, path):
    """Left: SPT loss behind every arm's first seed (train, smoothed; val, dots). Middle:
    val loss against labelled step, every arm and seed, with the best constant answer's
    loss. Third: val accuracy against labelled step. Right: val accuracy against all steps,
    SPT's included, so that the arms line up at equal compute. One colour an arm, one line a seed."""
    import analysis
    plt, (fig, (ax_spt, ax_loss, ax_acc, ax_all)) = analysis.plt_figure(1, 4, figsize=(21, 4.2))
    for arm, members in runs.items():
        c = COLOURS[arm]
        for i, (s, d, _) in enumerate(members):
            label = arm if i == 0 else None
            src = source_of(d)
            if src and i == 0:
                ax_spt.plot(*smooth(*curve(src[0], "spt", "loss")), color=c, lw=0.8, alpha=0.6)
                ax_spt.plot(*curve(src[0], "spt", "val_loss"), "o", color=c, markersize=3, label=label)
            ax_loss.plot(*curve(d, "finetune", "val_loss"), "o-", color=c, markersize=3, lw=0.8, label=label)
            steps, acc = curve(d, "finetune", "val_acc")
            ax_acc.plot(steps, acc, "o-", color=c, markersize=3, lw=0.8, label=label)
            ax_all.plot(steps + spt_at(d)[0], acc, "o-", color=c, markersize=3, lw=0.8, label=label)
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


def plot_take_offs(runs, offs, path):
    """The take-off rates as a figure. Left: one mark a seed at its take-off epoch (labelled
    epochs), an arm a row, the stuck seeds apart at the right, with k of n. Right: the
    Kaplan-Meier curve of each arm, the share of seeds still stuck after each epoch (a stuck
    seed censored at its arm's last epoch, rates.km_median's reading)."""
    import analysis
    plt, (fig, (ax, ax_km)) = analysis.plt_figure(1, 2, figsize=(12, 0.5 * len(runs) + 2.2))
    arms = list(runs)
    stuck_x = max(run_epochs(a) for a in arms) + 3
    for row, arm in enumerate(arms):
        es, c = offs[arm], COLOURS[arm]
        jitter = np.linspace(-0.2, 0.2, len(es)) if len(es) > 1 else [0.0]
        for e, j in zip(es, jitter):
            ax.plot(stuck_x if e is None else e, row + j, "x" if e is None else "o", color=c, markersize=6)
        ax.text(stuck_x + 1.5, row, f"{sum(e is not None for e in es)} of {len(es)}", va="center", fontsize=8)
        last = run_epochs(arm)
        times, share = [0], [1.0]
        for t in range(1, last + 1):                                 # S(t) = prod (1 - d_t / n_t)
            at_risk = sum(1 for e in es if e is None or e >= t)
            d = sum(1 for e in es if e == t)
            times.append(t), share.append(share[-1] * (1 - d / at_risk) if at_risk else share[-1])
        ax_km.step(times, share, where="post", color=c, label=f"{arm} ({len(es)} seeds)")
    ax.axvline(stuck_x - 1.5, color="gray", lw=0.5)
    ax.set_yticks(range(len(arms)), arms), ax.set_ylim(-0.6, len(arms) - 0.4), ax.invert_yaxis()
    ax.set_xticks(list(range(0, stuck_x - 1, 4)) + [stuck_x], [str(t) for t in range(0, stuck_x - 1, 4)] + ["stuck"])
    ax.set_xlim(0, stuck_x + 3), ax.set_xlabel("take-off epoch (labelled epochs; x: never took off)")
    ax.set_title("take-off epoch of each seed", fontsize=10)
    ax_km.set_xlabel("labelled epoch"), ax_km.set_ylabel("share of seeds still at chance"), ax_km.set_ylim(-0.03, 1.03)
    ax_km.set_title("Kaplan-Meier: still stuck after each epoch", fontsize=10), ax_km.legend(fontsize=7)
    analysis.save_figure(plt, fig, path, 90)


def plot_maps(first, path):
    """One val image's layer-0 attention, head-averaged: at init, after SPT (where the
    first arm started from an SPT checkpoint), and each arm's first seed after training.
    first: [(arm, record folder)]."""
    import torch
    import analysis
    import train_spt
    from plumbing import spt_data
    from plumbing.training import load_weights
    with open(os.path.join(first[0][1], "config.json")) as f:
        cfg = json.load(f)                                    # the run's own flags: its shape and data
    val = spt_data.load_data("pathfinder", "val", cfg)
    image, maps = val[0][0], {}
    stages = [("init", None)] + [(f"{arm}, trained", os.path.join(d, "finetune_best.pt")) for arm, d in first]
    src = next((found for _, d in first if (found := source_of(d))), None)
    if src:
        stages.insert(1, ("after SPT", os.path.join(src[0], "spt_best.pt")))
    for stage, ckpt in stages:
        model = train_spt.build_model(cfg, [val])
        if ckpt:
            load_weights(model, ckpt)
        with torch.no_grad():
            _, att = model.eval().forward_with_maps(image[None])
        maps[stage] = att[0][0]
    return analysis.plot_image_attention(image, maps, path)


def main(argv=None):
    cfg = configure(DEFAULTS, sys.argv[1:] if argv is None else argv, __doc__)
    actions = {"run": run, "one": one, "commands": commands, "record": record, "report": report, "status": status}
    if cfg["action"] not in actions:
        raise ValueError(f"--action={cfg['action']}: choose {', '.join(actions)}")
    if cfg["action"] == "one" and not cfg["run"]:
        raise ValueError("one: give the run, e.g. --run=qk_s2 (python tools/lra_rescue.py commands prints each line)")
    if cfg["wave"] < 0:
        raise ValueError(f"--wave={cfg['wave']}: give a wave (1, 2, 3) or 0 for all")
    if cfg["slots"] < 1:
        raise ValueError(f"--slots={cfg['slots']} must be at least 1")
    if cfg["max_core_hours"] <= 0:
        raise ValueError(f"--max_core_hours={cfg['max_core_hours']} must be positive")
    arm_list(cfg)                                           # a bad --arms or --seeds: one line, before any work
    seeds_of(cfg)
    return actions[cfg["action"]](cfg)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and not args[0].startswith("--"):                 # `run` / `report` as a word
        args = [f"--action={args[0]}"] + args[1:]
    run_cli(main, args)
