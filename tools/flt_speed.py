"""How long is one step of Paper B's 2,000-step window run (6 layers, d=64, T=64, batch 16,
K=12: tools/flt_map.sh window), and where does it go? Side by side in one process, as
ratios to today's step:

    today       the per-(loop, block) gradient hooks on every step (BlockGradRecorder)
    hooks/10    the hooks on every 10th step (--block_grads_every=10): the window's runs
    no hooks    --block_grads_every=0: the hooks' own cost, by difference
    compile     --compile=True with the hooks on every 10th step: those steps run on the
                eager module (which shares the weights), the others on the compiled one

The variants take turns (ABCD ABCD ...), each a short train_flt.py run in this process; a
step's time is the mean gap between two run.tick() calls (the first 3 steps, which hold
compilation and warm-up, left out; a mean, so that the eager steps of hooks/10 and
compile count their share). torch.profiler then splits today's step into
matrix products, other torch ops and the rest (Python: modules, hooks, the optimizers'
loops). Last, the losses of each variant's first steps against today's, to 3 decimals:
a variant is adopted only where they agree (tests/test_train_flt.py keeps that).

    OMP_NUM_THREADS=1 python tools/flt_speed.py                 # about 10 minutes on one core
    OMP_NUM_THREADS=1 python tools/flt_speed.py --steps=8 --rounds=1 --compile=False   # a minute

Run it with nothing else on the machine: the ratios are what it reports.
"""

import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import train_flt  # noqa: E402
import training  # noqa: E402
from configurator import configure, run_cli  # noqa: E402

DEFAULTS = dict(steps=30, rounds=3, compile=True, loops=12, data="stdlib", out="",
                extra="")      # more train_flt.py flags after the window's (a test's tiny model)
WINDOW = ["--n_layer=6", "--n_embd=64", "--block_size=64", "--batch_size=16", "--eval_interval=100000",
          "--ckpt_interval=100000", "--variant=FLT", "--eval_batches=2"]     # no eval or checkpoint mid-run
VARIANTS = {"today": [], "hooks/10": ["--block_grads_every=10"], "no hooks": ["--block_grads_every=0"],
            "compile": ["--compile=True", "--block_grads_every=10"]}
MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_dot_product_flash_attention_for_cpu")


def timed_run(flags, out_dir, prof=None, skip=3):
    """One short train_flt.py run in this process: (seconds between consecutive steps,
    losses). With `prof`, a torch.profiler runs from step `skip` to the last step."""
    ticks, tick = [], training.Run.tick
    last = int([f for f in flags if f.startswith("--max_steps=")][-1].split("=")[1])

    def timing_tick(run):
        ticks.append(time.perf_counter())
        if prof is not None and len(ticks) == skip:
            prof.start()
        if prof is not None and len(ticks) == last:
            prof.stop()
        return tick(run)
    training.Run.tick = timing_tick
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            train_flt.main([*flags, f"--out_dir={out_dir}"])                 # its own lines, unshown
    finally:
        training.Run.tick = tick
    losses = [r["loss"] for r in training.read_log(out_dir) if "loss" in r]
    return [b - a for a, b in zip(ticks, ticks[1:])], losses


def profile_split(flags, out_dir, skip=3):
    """Today's step split by torch.profiler (steps after the first `skip`): s a step in
    matrix products, in other torch ops, and in the rest (Python: modules, hooks, loops)."""
    from torch.profiler import ProfilerActivity, profile
    prof = profile(activities=[ProfilerActivity.CPU])
    gaps, _ = timed_run(flags, out_dir, prof, skip)
    steps, wall = len(gaps[skip - 1:]), sum(gaps[skip - 1:])
    ops = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    mm = sum(e.self_cpu_time_total for e in ops if e.key in MATMUL) / 1e6
    other = sum(e.self_cpu_time_total for e in ops if e.key not in MATMUL) / 1e6
    return {"matrix products": mm / steps, "other torch ops": other / steps,
            "the rest (Python)": (wall - mm - other) / steps}


def main(argv=None):
    cfg = configure(DEFAULTS, argv, __doc__)
    base = [f"--data={cfg['data']}", f"--n_loops={cfg['loops']}", f"--max_steps={cfg['steps']}", *WINDOW,
            *cfg["extra"].split()]
    variants = {k: v for k, v in VARIANTS.items() if cfg["compile"] or k != "compile"}
    work = cfg["out"] or tempfile.mkdtemp(prefix="flt_speed_")
    times, losses = {k: [] for k in variants}, {}
    for r in range(cfg["rounds"]):
        for name, flags in variants.items():
            gaps, losses[name] = timed_run(base + flags, os.path.join(work, f"{name.replace('/', '_')}_{r}"))
            times[name] += gaps[3:]
    today = statistics.mean(times["today"])
    print(f"one core, {torch.get_num_threads()} thread(s); K={cfg['loops']}, {cfg['steps']} steps x {cfg['rounds']} "
          f"rounds a variant, taking turns\n\n| variant | s a step (mean) | ratio to today | losses vs today |")
    print("|---|---|---|---|")
    rows = {}
    for name in variants:
        t = statistics.mean(times[name])
        n = min(50, len(losses[name]), len(losses["today"]))
        diff = max(abs(a - b) for a, b in zip(losses[name][:n], losses["today"][:n]))
        agree = "agree to 3 decimals" if diff < 5e-4 else f"differ (max {diff:.2g})"
        rows[name] = dict(s_per_step=t, ratio=t / today, max_loss_diff=diff)
        print(f"| {name} | {t:.3f} | {t / today:.2f} | {agree} over {n} steps |")
    split = profile_split(base + [f"--max_steps={max(6, min(12, cfg['steps']))}"], os.path.join(work, "profile"))
    print("\ntoday's step, by torch.profiler:")
    for k, v in split.items():
        print(f"  {k:20s} {v:.3f} s  ({v / sum(split.values()):.0%})")
    hooks = rows["today"]["s_per_step"] - rows["no hooks"]["s_per_step"]
    print(f"  the hooks (today - no hooks): {hooks:.3f} s ({hooks / today:.0%})")
    with open(os.path.join(work, "flt_speed.json"), "w") as f:
        json.dump(dict(rows=rows, profile=split, flags=base), f, indent=1)
    print(f"\n{os.path.join(work, 'flt_speed.json')}")


if __name__ == "__main__":
    run_cli(main)
