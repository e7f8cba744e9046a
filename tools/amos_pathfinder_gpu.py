"""
Amos et al.'s PathFinder setting on one GPU, in one call: from scratch against SPT
then finetuning, under their tied attention init (--init=amos: W_Q = W_K = W_V = W_O
at the start) and under independent projections (--init=torch), with every seed of
every arm running at once on the same GPU. It prints one table and writes it to
out_dir/table.md.

    python tools/amos_pathfinder_gpu.py                  # one H200: under 9 minutes, data included
    python tools/amos_pathfinder_gpu.py --seeds=3 --minutes=14
    python tools/amos_pathfinder_gpu.py --smoke=True     # CPU, a few steps per arm (tests/test_tools.py)

Theirs (train_spt.py's --task=pathfinder defaults, from IdoAmos/not-from-scratch):
4 layers, d=128, 8 heads, FFN x1, mean pooling, sinusoidal positions, the linear
pixel encoder, contour length 14, 50% of the pixels masked, AdamW at lr 5e-4,
constant, batch 32, bf16 autocast. Ours: the length. Their 50 SPT + 200 finetuning
epochs over 160,000 images take days; here --n_generate=20,000 generated images
(16,000 / 2,000 / 2,000), at most --spt_epochs of SPT and --epochs of finetuning
(the same for both arms: step-matched finetuning), a 5% warmup instead of their
2,500 / 5,000 steps, and each phase also stopped at the first epoch end past a time
cap, so that the whole call fits --minutes. The table says how many steps each arm
really ran.

Every run is a train_spt.py process with its usual folder (config.json holds its
command line; commands.txt lists them all); a run whose summary.json exists is not
run again, so a call cut short can be repeated.
"""

import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import data_lra  # noqa: E402  (the repository root, added just above)
from configurator import configure, run_cli  # noqa: E402
from plumbing.training import read_log  # noqa: E402

DEFAULTS = dict(
    out_dir="out/amos_pathfinder_gpu",
    data_dir="data",
    seeds=2,                 # seeds per arm, all running at once
    inits="amos,torch",      # attention initialisations to compare
    n_generate=20_000,       # generated images, all splits (80 / 10 / 10)
    spt_epochs=10,           # SPT epochs of the spt arm (at most: time caps below)
    epochs=12,               # finetuning epochs of both arms (at most)
    minutes=9.0,             # wall-clock budget of the whole call, data generation included
    smoke=False,             # CPU smoke test: a tiny model, a few steps per arm
)
ARMS = ("scratch", "spt")
DIFFICULTY = "contour_length_14"
MARGIN_S = 75                # start-up, final evaluation and figures of each run
# The smoke test's overrides: a 1-layer d=32 model, 4 steps per phase, on the CPU.
SMOKE = dict(flags=["--device=cpu", "--depth=1", "--n_embd=32", "--n_head=2", "--batch_size=8", "--n_train=32",
                    "--n_eval=16", "--log_every=1"], n_generate=100, seeds=1, spt_epochs=1, epochs=1)


def run_dir(cfg, init, arm, seed):
    return os.path.join(cfg["out_dir"], f"{init}_{arm}_s{seed}")


def run_flags(cfg, init, arm, seed, cap_hours):
    """train_spt.py's command line for one (init, arm, seed)."""
    flags = ["--task=pathfinder", f"--difficulty={DIFFICULTY}", "--data_source=generated",
             f"--n_generate={cfg['n_generate']}", f"--data_dir={cfg['data_dir']}", f"--init={init}",
             f"--seed={seed}", f"--pretrain_epochs={cfg['spt_epochs'] if arm == 'spt' else 0}",
             f"--epochs={cfg['epochs']}", "--warmup_steps=0", "--warmup_frac=0.05",
             f"--max_hours={cap_hours:.5f}", "--log_every=50", f"--out_dir={run_dir(cfg, init, arm, seed)}"]
    if arm == "spt":                      # an SPT flag on a run without SPT is refused by train_spt.py
        flags.append("--pretrain_warmup_steps=0")
    return flags + (SMOKE["flags"] if cfg["smoke"] else [])


def phase_cap_hours(cfg, elapsed_s):
    """Each phase's time cap: the budget left after the data, less a margin for start-up
    and the final evaluation, shared by the spt arm's two phases, with room for each
    phase to finish the epoch it is in."""
    left = cfg["minutes"] * 60 - elapsed_s - MARGIN_S
    if left < 60:
        raise ValueError(f"--minutes={cfg['minutes']} leaves {left:.0f} s for training after the data "
                         f"({elapsed_s:.0f} s) and start-up; give more minutes")
    return 0.35 * left / 3600


def launch(cfg, cap_hours):
    """Start every unfinished run at once; wait for all. -> the run folders that failed."""
    procs, failed = [], []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(os.path.join(cfg["out_dir"], "commands.txt"), "a") as listing:
        for init in cfg["inits"].split(","):
            for arm in ARMS:
                for seed in range(cfg["seeds"]):
                    folder = run_dir(cfg, init, arm, seed)
                    if os.path.exists(os.path.join(folder, "summary.json")):
                        continue                                       # finished by an earlier call
                    cmd = [sys.executable, "train_spt.py", *run_flags(cfg, init, arm, seed, cap_hours)]
                    if os.path.exists(folder):
                        cmd.append("--overwrite=True")                 # cut short by an earlier call
                    listing.write(" ".join(cmd[1:]) + "\n")
                    log = open(folder + ".log", "w")
                    procs.append((folder, log, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log,
                                                                stderr=subprocess.STDOUT)))
    print(f"{len(procs)} runs started at once (each phase capped at {cap_hours * 60:.1f} min)", flush=True)
    for folder, log, proc in procs:
        if proc.wait() != 0:
            failed.append(folder)
        log.close()
    return failed


def run_row(folder):
    """The numbers of one finished run, from its summary.json and log.jsonl."""
    with open(os.path.join(folder, "summary.json")) as f:
        s = json.load(f)
    spt_steps = [r["step"] for r in read_log(folder) if r.get("phase") == "spt" and "step" in r]
    return dict(spt_steps=max(spt_steps, default=0), steps=s["steps"], spt_loss=s["spt_best_val_loss"],
                mass_init=s.get("mass2d_r1_init"), mass_spt=s.get("mass2d_r1_start", s.get("mass2d_r1_spt")),
                mass_final=s.get("mass2d_r1_finetune"), uniform=s.get("mass2d_r1_uniform"),
                val=s["best_val_acc"], test=s["test_acc"])


def mean_std(values, digits=3):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    std = np.std(values, ddof=1) if len(values) > 1 else 0.0
    return f"{np.mean(values):.{digits}f} ± {std:.{digits}f}"


def table(rows):
    """rows: {(init, arm): [run_row of each seed]} -> markdown, mean ± std over seeds."""
    lines = ["| init | arm | seeds | SPT steps | finetuning steps | SPT val loss | 3x3 mass: init / after SPT / "
             "final | best val acc | test acc |", "|---" * 9 + "|"]
    for (init, arm), runs in rows.items():
        col = lambda key, digits=3: mean_std([r[key] for r in runs], digits)
        mass = " / ".join(col(k, 4) for k in ("mass_init", "mass_spt", "mass_final"))
        lines.append(f"| {init} | {arm} | {len(runs)} | {col('spt_steps', 0)} | {col('steps', 0)} | "
                     f"{col('spt_loss')} | {mass} | {col('val')} | {col('test')} |")
    uniform = [r["uniform"] for runs in rows.values() for r in runs if r["uniform"] is not None]
    if uniform:
        lines.append(f"\n3x3 mass of uniform attention: {uniform[0]:.4f}")
    return "\n".join(lines)


def main(argv=None):
    cfg = configure(DEFAULTS, argv, __doc__)
    if cfg["smoke"]:
        cfg.update({k: v for k, v in SMOKE.items() if k != "flags"})
    bad = [i for i in cfg["inits"].split(",") if i not in ("torch", "gpt2", "amos")]
    if bad or cfg["seeds"] < 1 or cfg["epochs"] < 1 or cfg["spt_epochs"] < 1 or cfg["minutes"] <= 0:
        raise ValueError("need --inits from torch, gpt2, amos (comma list), --seeds, --epochs, --spt_epochs >= 1 "
                         "and --minutes > 0")
    import torch
    if not cfg["smoke"] and not torch.cuda.is_available():
        raise ValueError("no CUDA GPU here: this script is sized for one; --smoke=True runs its CPU smoke test")
    t0 = time.time()
    cfg["out_dir"], cfg["data_dir"] = os.path.abspath(cfg["out_dir"]), os.path.abspath(cfg["data_dir"])
    os.makedirs(cfg["out_dir"], exist_ok=True)                  # (the runs start in the repository root)
    with open(os.path.join(cfg["out_dir"], "command.txt"), "a") as f:
        f.write("python tools/amos_pathfinder_gpu.py " + " ".join(sys.argv[1:] if argv is None else argv) + "\n")
    data_lra.ensure_pathfinder(cfg["data_dir"], n=cfg["n_generate"], difficulty=DIFFICULTY)   # once, before
    print(f"data ready after {time.time() - t0:.0f} s", flush=True)                           # the runs start
    cap = 24.0 if cfg["smoke"] else phase_cap_hours(cfg, time.time() - t0)
    failed = launch(cfg, cap)
    rows = {}
    for init in cfg["inits"].split(","):
        for arm in ARMS:
            done = [run_dir(cfg, init, arm, s) for s in range(cfg["seeds"])]
            rows[(init, arm)] = [run_row(d) for d in done if os.path.exists(os.path.join(d, "summary.json"))]
    out = table(rows) + f"\n\nwall time {(time.time() - t0) / 60:.1f} min"
    out += "".join(f"\nFAILED: {d} (see {d}.log)" for d in failed)
    print(out)
    with open(os.path.join(cfg["out_dir"], "table.md"), "w") as f:
        f.write(out + "\n")
    return out


if __name__ == "__main__":
    run_cli(main)
