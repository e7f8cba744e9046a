"""Does self-pretraining rescue a Transformer on LRA's PathFinder, and which weights carry
the gain? The seed runs at CPU scale (train_spt.py --preset=cpu_rescue: two layers, 8,000
training images, SPT 2,750 steps, finetuning 4,000), then the tables, verdicts and figures
from their records.

    python tools/lra_rescue.py commands            # one line per run not yet recorded (--wave=N: one wave)
    python tools/lra_rescue.py one --run=qk_s2     # what a line runs: one run, trained, then recorded
    python tools/lra_rescue.py report              # rescue.md and the figures, from the records alone

A line trains one run with train_spt.py (resuming it from its ckpt.pt when it was stopped)
and copies its record into --results/<run>: summary.json, log.jsonl, config.json,
command.txt, val.json, the best checkpoints. A recorded run is passed over, so a line can be
sent again. An arm that finetunes from SPT weights needs its SPT-alone run recorded first,
so the waves run in order: 1 needs nothing (the SPT-alone runs, scratch), 2 only wave 1
(spt), 3 the rest, which also waits for the first seed's spt run to take off (the gate:
if it stays at chance, `commands` leaves the ablation arms out).

    for w in 1 2 3; do python tools/lra_rescue.py commands --wave=$w | OMP_NUM_THREADS=1 xargs -d '\n' -P 2 -I{} sh -c '{}'; done
    # SLURM: an array per wave, each after the one before; job.sh runs line N of its file:
    #   export OMP_NUM_THREADS=1; eval "$(sed -n ${SLURM_ARRAY_TASK_ID}p "$1")"

Cost, measured: 1.9-2.1 s a step on one core of a 2-core Zen 5 EPYC (two runs side by side):
SPT alone (11 epochs) about 1.6 h, finetuning (16 epochs) 2.3 h, from scratch (27 epochs)
3.8 h; every default arm on 3 seeds about 45 core-hours.

An SPT run is two records: SPT alone (`spt_pretrain`, --epochs=0), then each arm finetunes
from its checkpoints (--init_from); ARMS names what each arm starts from. The data are
generated once; a seed changes the init, the masks and the batch order. --extra (every run)
and --extra_spt (the SPT-alone runs) add train_spt.py flags.
"""

import json
import math
import os
import shlex
import shutil
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from configurator import configure, run_cli  # noqa: E402
from training import read_log  # noqa: E402

DEFAULTS = dict(action="report",          # commands | one | report
                out="out/rescue",          # the run folders
                results="results/rescue",  # the records (relative: to the repository's root)
                seeds="0,1,2",             # comma list; the first is the gate's seed
                arms="spt,qk,mlp,short1,short5,cross,frozen,attn",
                extra="", extra_spt="",    # more train_spt.py flags: every run / the SPT-alone runs
                figures="",                # where report's figures go (default --out)
                run="",                    # one: the run, NAME_sSEED
                wave=0)                    # commands: one wave only (0: all)
BASE = ["--task=pathfinder", "--preset=cpu_rescue"]
SPT_EPOCHS, EPOCHS = 11, 16               # the preset's SPT and finetuning epochs (250 steps each)
CHANCE = 0.5

# SPT alone (--epochs=0): the runs whose checkpoints the arms finetune from.
SOURCES = {"spt_pretrain": [], "cross_pretrain": ["--pretrain_task=photos"], "torch_pretrain": ["--init=torch"]}
SP, BEST = "spt_pretrain", "spt_best.pt"
# arm: (its start: (source, checkpoint, --init_params), or None for from scratch; more flags). --arms, in this order:
ARMS = {"spt": ((SP, BEST, "all"), []),                  # SPT, then finetuning from all of its weights (A9's arm (a))
        "scratch": (None, []),                            # 27 epochs from scratch, compute-matched (A9's arm (b))
        "qk": ((SP, BEST, "qk"), []),                     # only W_Q, W_K from the seed's SPT checkpoint (A5)
        "mlp": ((SP, BEST, "mlp"), []),                   # only the MLP weights from it (A5's contrast)
        "short1": ((SP, "spt_epoch1.pt", "all"), []),     # all weights after SPT's epoch 1 (A2: a short SPT)
        "short5": ((SP, "spt_epoch5.pt", "all"), []),     # all weights after SPT's epoch 5
        "cross": (("cross_pretrain", BEST, "all"), []),   # SPT on photographs instead (A3)
        "frozen": (None, ["--freeze=attn"]),              # from scratch, attention frozen at its init (A4)
        "attn": ((SP, BEST, "attn"), []),                 # all four attention matrices from SPT (A5)
        "learned": (None, ["--pos_enc=learned"]),         # as scratch, learned positions
        "spt_torch": (("torch_pretrain", BEST, "all"), ["--init=torch"]),   # PyTorch's init: W_Q, W_K not tied
        "scratch_torch": (None, ["--init=torch"])}
SCRATCH = "scratch"
RATED = ("spt", "qk", "attn", "mlp", "frozen")   # the arms the rate rule is asked about, each against scratch
UNGATED = ("spt", "scratch")     # the arms that run before the first spt seed is judged
KEPT = ("summary.json", "log.jsonl", "command.txt", "config.json", "finetune_best.pt", "spt_best.pt")
ALPHA = 0.05          # the rate rule: the one-sided level of the Fisher test, fixed before the runs
MIN_SEEDS = 3         # below this an arm gets no verdict
FEW = f"too few seeds ({MIN_SEEDS} per arm needed)"


# -----------------------------------------------------------------------------
# The rules, written down before the seed runs (REPORT.md, A9 and "Paper A's ablations
# on PathFinder"), tested on made-up numbers in tests/test_tools.py

def constant_loss(share):
    """The val loss of the best constant answer, the entropy of the class shares:
    H(q) = -q ln q - (1-q) ln(1-q), ln 2 at q = 1/2. No model that ignores the image
    scores below it, so a val loss under it is evidence the model reads the image."""
    return -share * math.log(share) - (1 - share) * math.log(1 - share)


def chance_band(share, n):
    """The larger class's share plus 2 standard errors of a coin on n images."""
    return max(share, 1 - share) + 2 * math.sqrt(CHANCE * (1 - CHANCE) / n)


def off_chance(val_loss, val_loss_se, val_acc, share, n):
    """Does one evaluation say the model has learned something? Either its val loss is
    below the best constant answer's by more than 2 standard errors, or its val accuracy
    is above the chance band."""
    return val_loss < constant_loss(share) - 2 * val_loss_se or val_acc > chance_band(share, n)


def take_off_epoch(evals, share, n):
    """The first finetuning epoch off chance that the next evaluation confirms (two in a
    row: over 16-27 epochs a single lucky one is too likely), or None: "stuck".
    evals: the finetuning validation records, in order (val_loss, val_loss_se, val_acc)."""
    off = [off_chance(r["val_loss"], r.get("val_loss_se", 0.0), r["val_acc"], share, n) for r in evals]
    return next((evals[i]["epoch"] for i in range(len(off) - 1) if off[i] and off[i + 1]), None)


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
    if min(len(spt), len(base)) < MIN_SEEDS:
        return FEW
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
    if min(len(arm), len(spt), len(base)) < MIN_SEEDS:
        return FEW
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
    if min(len(frozen), len(base)) < MIN_SEEDS:
        return FEW
    if max(frozen) < min(base):
        return "frozen worse"
    if min(frozen) > max(base):
        return "frozen better"
    return "changes little" if abs(np.mean(frozen) - np.mean(base)) < little else "not separated"

# -----------------------------------------------------------------------------
# Take-off rates: the rule for all-or-nothing seeds, committed (as tools/rates.py, 039e1d4)
# before the runs it judges. A seed either takes off (take_off_epoch) or stays stuck, so an
# arm is measured by a count, k of its n seeds, and two arms by their counts:
#   per arm      k of n took off, with an exact 95% interval (Clopper & Pearson 1934)
#   two arms     a one-sided Fisher exact test on the 2x2 table of counts (Fisher 1922)
#   how early    the Kaplan-Meier median take-off epoch, a stuck seed censored at the
#                arm's last epoch; a log-rank test beside it (Mantel 1966)
#   beside them  the test accuracy of the seeds that took off
# Only the standard library: a binomial tail, a hypergeometric tail and a normal tail.

def binomial_cdf(k, n, p):
    """P(X <= k) for X ~ Binomial(n, p)."""
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1))


def clopper_pearson(k, n, level=0.95):
    """The exact interval (lo, hi) of a rate from k successes in n trials: lo solves
    P(X >= k | lo) = (1 - level) / 2 and hi solves P(X <= k | hi) = (1 - level) / 2
    (0 and 1 at the ends, k = 0 and k = n). Found by bisection on the binomial tail."""
    tail = (1 - level) / 2

    def solve(f):                                   # f falls as p grows: the p where f(p) = tail
        a, b = 0.0, 1.0
        for _ in range(60):
            a, b = (m, b) if f(m := (a + b) / 2) > tail else (a, m)
        return (a + b) / 2
    lo = 0.0 if k == 0 else solve(lambda p: binomial_cdf(k - 1, n, p) - (1 - 2 * tail))   # P(X >= k | lo) = tail
    hi = 1.0 if k == n else solve(lambda p: binomial_cdf(k, n, p))                        # P(X <= k | hi) = tail
    return lo, hi


def fisher_greater(k1, n1, k2, n2):
    """One-sided Fisher exact test: P(at least k1 of arm 1's seeds take off), given
    k1 + k2 take-offs among the n1 + n2 seeds, if the two arms had one rate. Small: arm 1
    takes off more often. (3 of 3 against 1 of 3 gives 4/20 = 0.2.)"""
    total, off = n1 + n2, k1 + k2
    p = lambda x: math.comb(off, x) * math.comb(total - off, n1 - x) / math.comb(total, n1)
    return sum(p(x) for x in range(k1, min(off, n1) + 1))


def rate_verdict(k, n, base_k, base_n, alpha=ALPHA):
    """An arm's take-off count against the baseline's (recorded from-scratch seeds):
        "takes off more often": fisher_greater(arm, base) < alpha;
        "takes off less often": fisher_greater(base, arm) < alpha;
        "not separated": neither (with few seeds, even 3 of 3 against 0 of 3: p = 0.05);
        "too few seeds": an arm with under MIN_SEEDS seeds."""
    if n < MIN_SEEDS or base_n < MIN_SEEDS:
        return FEW
    if fisher_greater(k, n, base_k, base_n) < alpha:
        return "takes off more often"
    if fisher_greater(base_k, base_n, k, n) < alpha:
        return "takes off less often"
    return "not separated"


def km_median(epochs, last):
    """The Kaplan-Meier median of the take-off epoch: the first epoch at which the share
    of seeds still stuck falls to 1/2 or below. epochs: one a seed, None for a stuck one
    (censored at `last`, the arm's final epoch). None when the median is not reached
    (fewer than half the seeds take off): it lies past `last`."""
    times = sorted(e for e in epochs if e is not None)
    at_risk, stuck_share = len(epochs), 1.0
    for t in sorted(set(times)):
        events = times.count(t)
        stuck_share *= 1 - events / at_risk          # S(t) = prod (1 - d_t / n_t)
        at_risk -= events
        if stuck_share <= 0.5:
            return t
    return None


def logrank(epochs1, last1, epochs2, last2):
    """The log-rank test of "arm 1 takes off earlier than arm 2": (z, one-sided p).
    At each epoch where a seed takes off, arm 1 expects its share of the seeds at risk;
    z = (observed - expected) / sqrt(variance), summed over those epochs, and p = P(Z >= z)
    under a normal law (an approximation, rough at 3-10 seeds: read it beside the counts).
    A stuck seed is at risk until its arm's last epoch. (z, p) = (0, 0.5) with no take-off."""
    seeds = [(e if e is not None else last1, e is not None, 1) for e in epochs1] + \
            [(e if e is not None else last2, e is not None, 2) for e in epochs2]
    o_minus_e, var = 0.0, 0.0
    for t in sorted({s[0] for s in seeds if s[1]}):
        risk = [s for s in seeds if s[0] >= t]
        n, n1 = len(risk), sum(s[2] == 1 for s in risk)
        d = sum(1 for s in risk if s[0] == t and s[1])
        d1 = sum(1 for s in risk if s[0] == t and s[1] and s[2] == 1)
        o_minus_e += d1 - d * n1 / n
        var += d * (n1 / n) * (1 - n1 / n) * (n - d) / (n - 1) if n > 1 else 0.0
    if var == 0:
        return 0.0, 0.5
    z = o_minus_e / math.sqrt(var)
    return z, 0.5 * math.erfc(z / math.sqrt(2))


def rate_table(runs, offs, last, base=SCRATCH):
    """Markdown: the take-off rate rule for every arm against the *recorded* from-scratch
    seeds, never transcribed ones: k of n took off with its exact 95% interval, the
    Kaplan-Meier median take-off epoch (labelled epochs; a stuck seed censored at its arm's
    last epoch, last[arm]), the test accuracy of the seeds that took off and of all seeds,
    the one-sided Fisher p of "takes off more often than scratch" with the verdict, and the
    log-rank test of "earlier". An arm of RATED without a record gets a row that says so."""
    lines = ["| arm | took off | 95% interval | median take-off epoch | test acc, seeds off | test acc, all | "
             "against recorded scratch: Fisher p (more often), verdict | log-rank z, p (earlier) |",
             "|---|---|---|---|---|---|---|---|"]
    for arm, members in runs.items():
        acc, es = [m["test_acc"] for _, _, m in members], offs[arm]
        k, n = sum(e is not None for e in es), len(es)
        median = km_median(es, last[arm])
        against, early = "-", "-"
        if base in runs and arm != base:
            bk, bn = sum(e is not None for e in offs[base]), len(offs[base])
            against = f"{fisher_greater(k, n, bk, bn):.3f}, **{rate_verdict(k, n, bk, bn)}**"
            early = "{:+.2f}, {:.3f}".format(*logrank(es, last[arm], offs[base], last[base]))
        lines.append(f"| {arm} | {k} of {n} | " + "{:.2f}-{:.2f}".format(*clopper_pearson(k, n)) + " | "
                     f"{f'> {last[arm]} (not reached)' if median is None else median} | "
                     f"{ms([a for e, a in zip(es, acc) if e is not None])} | {ms(acc)} | {against} | {early} |")
    lines += [f"| {arm} | not recorded here | - | - | - | - | - | - |" for arm in RATED if arm not in runs]
    return "\n".join(lines)


def standard_error(acc, n):
    """The binomial standard error of one run's accuracy on n images."""
    return math.sqrt(acc * (1 - acc) / n)


# -----------------------------------------------------------------------------
# The runs: their flags, their order, one run trained and recorded

def folder(where, name, seed):
    return os.path.join(where, f"{name}_s{seed}")


def recorded(cfg, name, seed):
    """A record is renamed into place whole, so its summary.json says it is there."""
    return os.path.isfile(os.path.join(folder(cfg["records"], name, seed), "summary.json"))


def run_flags(name, seed, records):
    """The train_spt.py flags of one run (an arm's, or a source's) at one seed."""
    if name in SOURCES:
        return BASE + SOURCES[name] + ["--epochs=0", f"--seed={seed}"]
    start, more = ARMS[name]
    flags = ([f"--init_from={folder(records, start[0], seed)}/{start[1]}", f"--init_params={start[2]}"]
             if start else ["--pretrain_epochs=0", f"--epochs={SPT_EPOCHS + EPOCHS}"])
    return BASE + flags + more + [f"--seed={seed}"]


def seeds_of(cfg):
    """--seeds as a list of ints, in the order given (the first is the gate's seed)."""
    parts = [s.strip() for s in str(cfg["seeds"]).split(",")]
    if not all(p.isdigit() for p in parts) or len(set(parts)) != len(parts):
        raise ValueError(f"--seeds={cfg['seeds']}: give distinct whole numbers separated by commas, e.g. 0,1,2")
    return [int(p) for p in parts]


def arm_list(cfg):
    arms = [a.strip() for a in cfg["arms"].split(",") if a.strip()]
    if unknown := [a for a in arms if a not in ARMS]:
        raise ValueError(f"--arms: unknown arm {unknown[0]!r}; choose from {', '.join(ARMS)}")
    return arms


def jobs(cfg):
    """[(name, seed, needs, wave)]: each arm on every seed, the SPT-alone runs an arm starts
    from just before it. needs: the (name, seed) runs that must be recorded first (the
    source run; the first seed's spt run, for the gate); wave: 1 for a run that needs none,
    else one more than the latest of its needs."""
    seeds, arms = seeds_of(cfg), arm_list(cfg)
    order, listed = [], set()
    for arm in arms:
        start = ARMS[arm][0]
        if start and start[0] not in listed:
            listed.add(start[0])
            order += [(start[0], s, []) for s in seeds]
        gate = [("spt", seeds[0])] if arm not in UNGATED and "spt" in arms else []
        order += [(arm, s, ([(start[0], s)] if start else []) + gate) for s in seeds]
    needs = {(n, s): k for n, s, k in order}
    wave = lambda key: 1 + max((wave(k) for k in needs.get(key, ())), default=0)
    return [(n, s, k, wave((n, s))) for n, s, k in order]


def gate(cfg):
    """None while the ablation arms may run; else why not: the first seed's spt run
    finished without taking off."""
    d = folder(cfg["records"], "spt", seeds_of(cfg)[0])
    if "spt" in arm_list(cfg) and recorded(cfg, "spt", seeds_of(cfg)[0]) and \
            take_off_epoch(finetune_evals(d), *val_split(d)[::-1]) is None:
        return f"{d} never took off within its finetuning steps: the ablation arms do not start"


gated = lambda name: name not in UNGATED and name not in SOURCES     # the arms the gate holds


def commands(cfg):
    """Print the line of every unrecorded run (--wave=N: that wave's only), wave by wave,
    and on stderr how many each wave holds. A gate that holds leaves out the arms it gates."""
    holds = gate(cfg)
    todo = sorted([(w, n, s) for n, s, _, w in jobs(cfg) if not recorded(cfg, n, s) and not (holds and gated(n))],
                  key=lambda t: t[0])
    flags = [f"--{k}={cfg[k]}" for k in ("arms", "seeds", "out", "results", "extra", "extra_spt")
             if cfg[k] != DEFAULTS[k]]
    lines = [f"cd {shlex.quote(ROOT)} && " + shlex.join(["python", "tools/lra_rescue.py", "one", f"--run={n}_s{s}",
                                                         *flags]) for w, n, s in todo if cfg["wave"] in (0, w)]
    print("\n".join(lines)) if lines else None
    per_wave = {w: sum(1 for t in todo if t[0] == w) for w in sorted({t[0] for t in todo})}
    print(f"{len(lines)} lines; unrecorded runs by wave: {per_wave or 'none'}" + (f"; {holds}" if holds else ""),
          file=sys.stderr)
    return lines


def one(cfg):
    """--run=NAME_sSEED: train it (resumed from its ckpt.pt when it was stopped), then copy
    its record into --results, whole: into <record>.partial, then renamed. A recorded run
    is passed over; one whose needs are not recorded, or that the gate holds, is refused."""
    found = [(n, s, k) for n, s, k, _ in jobs(cfg) if f"{n}_s{s}" == cfg["run"]]
    if not found:
        raise ValueError(f"--run={cfg['run']} is not a run of this sweep (--arms={cfg['arms']} --seeds="
                         f"{cfg['seeds']}); python tools/lra_rescue.py commands prints its lines")
    name, seed, needs = found[0]
    record, d = folder(cfg["records"], name, seed), folder(cfg["out"], name, seed)
    if recorded(cfg, name, seed):
        return print(f"recorded already: {record}")
    if missing := [folder(cfg["records"], *k) for k in needs if not recorded(cfg, *k)]:
        raise FileNotFoundError(f"{cfg['run']} needs {missing[0]}, which is not recorded yet: run the wave before")
    if gated(name) and (why := gate(cfg)):
        raise ValueError(why)
    more = cfg["extra"].split() + (cfg["extra_spt"].split() if name in SOURCES else [])
    argv = ([f"--out_dir={d}", "--init_from=resume"] if os.path.exists(os.path.join(d, "ckpt.pt")) else
            run_flags(name, seed, cfg["records"]) + more + [f"--out_dir={d}", "--overwrite=True"])
    rc = subprocess.run([sys.executable, os.path.join(ROOT, "train_spt.py"), *argv], cwd=ROOT).returncode
    if not os.path.isfile(os.path.join(d, "summary.json")):
        raise SystemExit(f"error: {d} ended without its summary.json (exit {rc}); this same line resumes it")
    shutil.rmtree(record + ".partial", ignore_errors=True)
    os.makedirs(record + ".partial")
    for f in [f for f in os.listdir(d) if f in KEPT or f.startswith("spt_epoch") and f.endswith(".pt")]:
        shutil.copy2(os.path.join(d, f), record + ".partial")
    with open(os.path.join(record + ".partial", "val.json"), "w") as f:
        json.dump(dict(zip(("n", "share"), val_split(d))), f, indent=2)
    os.rename(record + ".partial", record)
    print(f"recorded: {record} (commit it)")


# -----------------------------------------------------------------------------
# The tables, the verdicts and the figures, from the records alone

def read_json(d, name):
    with open(os.path.join(d, name)) as f:
        return json.load(f)


def val_split(d):
    """(size, share of class 1) of the val split a run was scored on: its record's val.json,
    else (a run folder just finished, whose data are on disk) from the data its config names."""
    if os.path.exists(os.path.join(d, "val.json")):
        v = read_json(d, "val.json")
        return v["n"], v["share"]
    import data_lra
    c = read_json(d, "config.json")
    val = data_lra.load_task("pathfinder", "val", c["data_dir"], data_source=c["data_source"], n=c["n_generate"],
                             difficulty=c["difficulty"])
    n = c["n_eval"] if 0 < c["n_eval"] < len(val) else len(val)
    return n, float(np.mean([int(val[i][1]) for i in range(n)]))


def logged(d, phase, key):
    """A run's log records of one phase ("spt", "finetune") that hold key, in order."""
    return [r for r in read_log(d) if r.get("phase") == phase and key in r]


finetune_evals = lambda d: logged(d, "finetune", "val_acc")      # the finetuning phase's validation records


def gather(cfg):
    """{arm: [(seed, record folder, summary)]} of the recorded arm runs, in ARMS order."""
    where = cfg["records"]
    return {arm: members for arm in ARMS
            if (members := [(s, folder(where, arm, s), read_json(folder(where, arm, s), "summary.json"))
                            for s in seeds_of(cfg) if recorded(cfg, arm, s)])}


def last_epoch(d):
    """The labelled epochs of a run: a finetuning arm's 16, a from-scratch run's 27."""
    c = read_json(d, "config.json")
    return c["epochs"] + (c["pretrain_epochs"] if not c["init_from"] else 0)


def unread_records(cfg):
    """The records under --results whose seed is not in --seeds: left out, and said so."""
    seeds, where = set(seeds_of(cfg)), cfg["records"]
    found = [d.rsplit("_s", 1) for d in (os.listdir(where) if os.path.isdir(where) else []) if "_s" in d]
    found = sorted((name, int(s)) for name, s in found if (name in ARMS or name in SOURCES) and s.isdigit())
    return [f"{name}_s{s}" for name, s in found if s not in seeds and recorded(cfg, name, s)]


def take_two(cfg):
    """A9's take-two seeds as transcribed into results/rescue/take_two.json (their run
    folders were lost): {arm: {"test_acc": [...], "take_off": [...]}}. A results folder
    without its own copy (the GPU replica's) reads the repository's."""
    path = os.path.join(cfg["records"], "take_two.json")
    return read_json(*os.path.split(path if os.path.exists(path) else
                                    os.path.join(ROOT, "results/rescue/take_two.json")))["arms"]


def source_of(d):
    """(the SPT record a finetuning run started from, the epoch of its checkpoint), or None.
    A record names its start by an absolute path on the machine it ran on: look for the same
    results/<folder>/<record> under d's results folder, then beside d, then at the path."""
    init_from = read_json(d, "config.json")["init_from"]
    if not init_from or init_from == "resume":
        return None
    src, ckpt = os.path.split(init_from)
    tail = src.rsplit(os.sep + "results" + os.sep, 1)
    near = ([os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(d))), tail[1])] if len(tail) == 2 else []) \
        + [os.path.join(os.path.dirname(os.path.abspath(d)), os.path.basename(src))]
    src = next((c for c in near + [src] if os.path.isdir(c)), src)
    if ckpt.startswith("spt_epoch"):
        return src, int(ckpt[len("spt_epoch"):-len(".pt")])
    return src, read_json(src, "summary.json").get("spt_best_epoch") if os.path.exists(f"{src}/summary.json") else None


def spt_at(d):
    """(SPT steps, SPT val loss) behind a run: its own SPT phase, or its source's at the
    epoch of the checkpoint it started from; (0, None) for a run from scratch."""
    where, epoch = source_of(d) or (d, None)
    vals = logged(where, "spt", "val_loss") if os.path.exists(os.path.join(where, "log.jsonl")) else []
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
    lines = ["| SPT run | SPT val loss by epoch | best | 3x3 mass after SPT, x uniform | wall h |", "|---|---|---|---|---|"]
    for name, s in [(name, s) for name in SOURCES for s in seeds_of(cfg) if recorded(cfg, name, s)]:
        d = folder(cfg["records"], name, s)
        m = read_json(d, "summary.json")
        after = m.get("mass2d_r1_spt", m.get("mass2d_r1_start"))       # "spt" in older records
        mass = f"{after / m['mass2d_r1_uniform']:.1f}" if after and m.get("mass2d_r1_uniform") else "-"
        vals = ", ".join(f"{r['val_loss']:.3f}" for r in logged(d, "spt", "val_loss"))
        lines.append(f"| {name}_s{s} | {vals} | "
                     f"{m['spt_best_val_loss']:.3f} (epoch {m.get('spt_best_epoch', '-')}) | {mass} | "
                     f"{m['wall_time_s'] / 3600:.2f} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def verdicts(cfg, runs, offs, n, share):
    """The rules' verdicts, each from 3 seeds: spt against scratch, every other arm against
    spt and scratch, frozen against scratch. scratch: its records, else take two's seeds."""
    acc = {arm: [m["test_acc"] for _, _, m in members] for arm, members in runs.items()}
    off = {arm: [e is not None for e in es] for arm, es in offs.items()}
    lines = []
    if SCRATCH not in acc and SCRATCH in (old := take_two(cfg)):
        acc[SCRATCH], off[SCRATCH] = old[SCRATCH]["test_acc"], [e is not None for e in old[SCRATCH]["take_off"]]
        lines.append("scratch: take two's three seeds, transcribed (results/rescue/take_two.json)")
    pairs = [("spt", "scratch", "SPT against from scratch, compute-matched"),
             ("learned", "scratch", "from scratch: learned positions against sinusoidal"),
             ("spt_torch", "scratch_torch", "SPT against from scratch, both with PyTorch's init (W_Q, W_K untied)")]
    lines += [f"{label}: **{verdict(acc[a], off[a], acc[b], off[b])}**" for a, b, label in pairs
              if a in acc and b in acc]
    if "spt" in acc and SCRATCH in acc:
        lines += [f"{arm} against spt and scratch: **{gain_verdict(acc[arm], off[arm], acc['spt'], off['spt'], acc[SCRATCH])}**"
                  for arm in ("qk", "mlp", "attn", "short1", "short5", "cross") if arm in acc]
    if "frozen" in acc and SCRATCH in acc:
        lines.append(f"frozen attention against scratch: **{frozen_verdict(acc['frozen'], acc[SCRATCH])}**")
    lines.append(f"take-off: two val evaluations in a row with val loss below {constant_loss(share):.4f} (the "
                 f"best constant answer) by 2 s.e., or val acc above {chance_band(share, n):.3f}")
    lines += [f"{arm}: {sum(e is not None for e in es)} of {len(es)} seeds took off" for arm, es in offs.items()]
    return "\n".join("- " + line for line in lines)


def report(cfg):
    """rescue.md (the tables and verdicts) and three figures, from the records alone."""
    runs = gather(cfg)
    if not runs:
        raise FileNotFoundError(f"no recorded arm run under {cfg['records']}; print the runs' lines with: "
                                f"python tools/lra_rescue.py commands")
    n, share = val_split(next(d for members in runs.values() for _, d, _ in members))
    offs = {arm: [take_off_epoch(finetune_evals(d), share, n) for _, d, _ in members] for arm, members in runs.items()}
    last = {arm: last_epoch(members[0][1]) for arm, members in runs.items()}
    rate = rate_table(runs, offs, last) if SCRATCH in runs else "take-off rates: no recorded scratch seed, no rate verdict"
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
    plot_take_offs(runs, offs, last, os.path.join(where, "rescue_take_offs.png"))
    plot_maps([(arm, members[0][1]) for arm, members in runs.items()], os.path.join(where, "rescue_attention_2d.png"))
    return text


# -----------------------------------------------------------------------------
# The figures

def figure(*args, **kw):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt.subplots(*args, **kw)


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    import matplotlib.pyplot as plt
    plt.close(fig)


def curve(d, phase, key):
    """(steps, values) of one run's records of a phase that hold key."""
    rec = logged(d, phase, key)
    return np.array([r["step"] for r in rec]), np.array([r[key] for r in rec])


def smooth(x, y, k=10):
    """A running mean over k logged points (the loss is logged every 10 steps)."""
    return (x, y) if len(y) < k else (x[k - 1:], np.convolve(y, np.ones(k) / k, mode="valid"))


COLOURS = dict(zip(ARMS, ("tab:red", "tab:blue", "tab:orange", "tab:brown", "tab:pink", "tab:olive", "tab:cyan",
                          "tab:gray", "tab:purple", "tab:green", "darkred", "navy")))


def plot_curves(runs, floor, path):
    """Top left: SPT loss behind every arm's first seed (train, smoothed; val, dots). Top
    right: val loss against labelled step, every arm and seed, with the best constant
    answer's loss. Bottom: val accuracy against labelled step, and against all steps, SPT's
    included, so that the arms line up at equal compute. One colour an arm, one line a seed."""
    fig, ((ax_spt, ax_loss), (ax_acc, ax_all)) = figure(2, 2, figsize=(11, 7.5))
    for arm, members in runs.items():
        c, dots = COLOURS[arm], dict(color=COLOURS[arm], markersize=3, lw=0.8)
        for i, (s, d, _) in enumerate(members):
            label = arm if i == 0 else None
            if (src := source_of(d)) and i == 0:
                ax_spt.plot(*smooth(*curve(src[0], "spt", "loss")), color=c, lw=0.8, alpha=0.6)
                ax_spt.plot(*curve(src[0], "spt", "val_loss"), "o", color=c, markersize=3, label=label)
            ax_loss.plot(*curve(d, "finetune", "val_loss"), "o-", **dots, label=label)
            steps, acc = curve(d, "finetune", "val_acc")
            ax_acc.plot(steps, acc, "o-", **dots, label=label)
            ax_all.plot(steps + spt_at(d)[0], acc, "o-", **dots, label=label)
    for a in (ax_acc, ax_all):
        a.axhline(CHANCE, color="k", lw=0.6, ls=":")
        a.set_ylabel("val accuracy")
    ax_loss.axhline(floor, color="k", lw=0.6, ls=":")
    ax_spt.set(title="SPT loss (masked pixels; dots: val)", xlabel="SPT step", ylabel="loss")
    ax_loss.set(title="val loss (dotted: the best constant answer)", xlabel="labelled step", ylabel="val loss")
    ax_acc.set(title="val accuracy (dotted: chance)", xlabel="labelled step")
    ax_all.set(title="val accuracy at equal compute", xlabel="step, SPT + labelled")
    for a in (ax_spt, ax_loss, ax_acc, ax_all):
        a.grid(alpha=0.3)
        a.legend(fontsize=7) if a.get_legend_handles_labels()[0] else None
    save(fig, path)


def plot_take_offs(runs, offs, last, path):
    """The take-off rates as a figure. Left: one mark a seed at its take-off epoch (labelled
    epochs), an arm a row, the stuck seeds apart at the right, with k of n. Right: the
    Kaplan-Meier curve of each arm, the share of seeds still stuck after each epoch (a stuck
    seed censored at its arm's last epoch, km_median's reading)."""
    fig, (ax, ax_km) = figure(1, 2, figsize=(12, 0.5 * len(runs) + 2.2))
    arms = list(runs)
    stuck_x = max(last.values()) + 3
    for row, arm in enumerate(arms):
        es, c = offs[arm], COLOURS[arm]
        for e, j in zip(es, np.linspace(-0.2, 0.2, len(es)) if len(es) > 1 else [0.0]):
            ax.plot(stuck_x if e is None else e, row + j, "x" if e is None else "o", color=c, markersize=6)
        ax.text(stuck_x + 1.5, row, f"{sum(e is not None for e in es)} of {len(es)}", va="center", fontsize=8)
        times, share = [0], [1.0]
        for t in range(1, last[arm] + 1):                            # S(t) = prod (1 - d_t / n_t)
            at_risk = sum(1 for e in es if e is None or e >= t)
            times.append(t), share.append(share[-1] * (1 - es.count(t) / at_risk) if at_risk else share[-1])
        ax_km.step(times, share, where="post", color=c, label=f"{arm} ({len(es)} seeds)")
    ax.axvline(stuck_x - 1.5, color="gray", lw=0.5)
    ax.set_yticks(range(len(arms)), arms), ax.set_ylim(-0.6, len(arms) - 0.4), ax.invert_yaxis()
    ax.set_xticks(list(range(0, stuck_x - 1, 4)) + [stuck_x], [str(t) for t in range(0, stuck_x - 1, 4)] + ["stuck"])
    ax.set_xlim(0, stuck_x + 3), ax.set_xlabel("take-off epoch (labelled epochs; x: never took off)")
    ax.set_title("take-off epoch of each seed", fontsize=10)
    ax_km.set_xlabel("labelled epoch"), ax_km.set_ylabel("share of seeds still at chance"), ax_km.set_ylim(-0.03, 1.03)
    ax_km.set_title("Kaplan-Meier: still stuck after each epoch", fontsize=10), ax_km.legend(fontsize=7)
    save(fig, path)


def plot_maps(first, path):
    """One val image's layer-0 attention, head-averaged (analysis.plot_image_attention): at
    init, after SPT, and each arm's first seed after training. first: [(arm, record)].
    It needs the images: read from the data cache the runs made, or skipped in one line."""
    import torch
    import analysis
    import data_lra
    from train_spt import build_model, load_data
    from training import load_weights
    c = read_json(first[0][1], "config.json")
    c["data_dir"] = os.path.join(ROOT, c["data_dir"])
    cache = data_lra.generated_pathfinder_path(c["data_dir"], n=c["n_generate"], difficulty=data_lra._difficulty(c["difficulty"]))
    if not os.path.exists(cache):
        return print(f"{os.path.basename(path)}: skipped, it needs the images of {cache}, which is not here "
                     f"(any run of the sweep makes it)")
    val = load_data("pathfinder", "val", c)
    stages = [("init", None)] + [(f"{arm}, trained", os.path.join(d, "finetune_best.pt")) for arm, d in first
                                 if os.path.exists(os.path.join(d, "finetune_best.pt"))]
    if src := next((found for _, d in first if (found := source_of(d))), None):
        stages.insert(1, ("after SPT", os.path.join(src[0], "spt_best.pt")))
    maps = {}
    for stage, ckpt in stages:
        model = build_model(c, [val])                        # seeded as the runs were: their init
        if ckpt:
            load_weights(model, ckpt)
        with torch.no_grad():
            maps[stage] = model.eval().forward_with_maps(val[0][0][None])[1][0][0]
    analysis.plot_image_attention(val[0][0], maps, path)


def main(argv):
    if argv and not argv[0].startswith("--"):                 # `commands` / `report` as a word
        argv = [f"--action={argv[0]}"] + argv[1:]
    cfg = configure(DEFAULTS, argv, __doc__, source=__file__)
    actions = {"commands": commands, "one": one, "report": report}
    if cfg["action"] not in actions:
        raise ValueError(f"--action={cfg['action']}: choose {', '.join(actions)}")
    arm_list(cfg), seeds_of(cfg)                              # a bad --arms or --seeds: one line, before any work
    cfg["records"] = os.path.join(ROOT, cfg["results"])      # relative: from the repository's root
    return actions[cfg["action"]](cfg)


if __name__ == "__main__":
    run_cli(main)
