"""The paper's central picture, moving: the layer-0 attention of one synthetic validation
sequence over training, SPT (left) against supervised from scratch (right), side by side.
Under reconstruction the diagonal forms (each position attends to its neighbours); under
the labels alone it does not. Both runs take 1,248 steps: SPT's 3 pretraining and 5
finetuning epochs against 8 epochs from scratch (the README's one-minute demo).

    python tools/attention_gif.py               # trains the pair (1-2 min on 2 cores) -> out/attention_gif/
    python tools/attention_gif.py --out=assets  # -> assets/attention_evolution.gif (the README's)
    python tools/attention_gif.py --spt=RUN --scratch=RUN   # two finished runs with snapshots.jsonl

A frame is the head-averaged map of snapshots.jsonl (analysis.attention_snapshot) at one
step; both panels share one colour scale. A run folder that already holds a finished run
is read, not trained again.
"""

import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import analysis  # noqa: E402
from configurator import configure, run_cli  # noqa: E402

DEFAULTS = dict(
    spt="",                     # a finished SPT run with snapshots ("" = train one under runs/spt)
    scratch="",                 # a finished from-scratch run with snapshots ("" = train one under runs/scratch)
    runs="out/attention_gif",   # where the pair is trained when --spt / --scratch are not given
    out="out/attention_gif",    # the GIF goes to out/attention_evolution.gif
    every=78,                   # steps between snapshots of the pair it trains (78 = half an epoch)
    fps=3,                      # frames a second
)
QUICK = ["--task=synthetic", "--n_eval=1000", "--lr=2e-3"]           # the README's one-minute demo
ARMS = {"spt": ["--pretrain_epochs=3", "--epochs=5", "--pretrain_lr=3e-3"],
        "scratch": ["--pretrain_epochs=0", "--epochs=8"]}


def train_pair(runs, every):
    """Both runs at once, one core each, each printing into its own folder's train.log."""
    jobs = {}
    for arm, flags in ARMS.items():
        d = os.path.abspath(os.path.join(runs, arm))
        if not os.path.exists(os.path.join(d, "summary.json")):
            os.makedirs(d, exist_ok=True)
            cmd = [sys.executable, "train_spt.py", *QUICK, *flags, f"--snapshot_attn_every={every}",
                   f"--out_dir={d}", "--overwrite=True"]
            log = open(os.path.join(d, "train.log"), "w")
            jobs[arm] = (subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                          env=dict(os.environ, OMP_NUM_THREADS="1")), log)
    print(f"training {' and '.join(jobs)} in {runs} (a minute or two on 2 cores; output in train.log)" if jobs
          else f"reading the finished pair in {runs}")
    for arm, (p, log) in jobs.items():
        if p.wait():
            raise ValueError(f"the {arm} run failed; see {log.name}")
        log.close()
    return [os.path.join(runs, arm) for arm in ARMS]


def read_snapshots(d):
    """A run's snapshots in order, each with "total": its step counted from the run's start."""
    path = os.path.join(d, "snapshots.jsonl")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} does not exist: train the run with --snapshot_attn_every=N")
    with open(path) as f:
        snaps = [json.loads(line) for line in f if line.strip()]
    spt_steps = max((s["step"] for s in snaps if s["phase"] == "spt"), default=0)
    for s in snaps:
        s["total"] = s["step"] + (spt_steps if s["phase"] == "finetune" else 0)
    return snaps


def frames(spt, scratch):
    """One frame per step either run snapshotted: (step, left, right), each side the latest
    snapshot at or before that step (the first one before its first)."""
    at = lambda snaps, t: ([s for s in snaps if s["total"] <= t] or snaps[:1])[-1]
    return [(t, at(spt, t), at(scratch, t)) for t in sorted({s["total"] for s in spt + scratch})]


def title(snap, scratch):
    name = "from scratch" if scratch else ("SPT" if snap["phase"] == "spt" else "finetune after SPT,")
    return f"{name} step {snap['step']}\nmass within |i-j| <= 2: {snap['mass'][2]:.2f}"


def draw(frames, path, fps=3, hold=2.0):
    """The GIF (matplotlib's PillowWriter), the last frame held for `hold` seconds. Returns the frame count."""
    from matplotlib.animation import PillowWriter
    from matplotlib.colors import PowerNorm
    values = np.concatenate([np.ravel(s["map"]) for _, a, b in frames for s in (a, b)])
    norm = PowerNorm(0.5, vmin=0, vmax=np.percentile(values, 99.5))   # one scale; sqrt shows the faint maps
    plt, (fig, axes) = analysis.plt_figure(1, 2, figsize=(8, 4.2), layout="constrained")
    ims = [analysis.heatmap(fig, ax, frames[0][i + 1]["map"], "", cmap="viridis", norm=norm,
                           interpolation="nearest")
           for i, ax in enumerate(axes)]
    fig.colorbar(ims[0], ax=axes, shrink=0.8, extend="max").set_label("attention weight (mean over heads)", fontsize=8)
    writer = PillowWriter(fps=fps)
    with writer.saving(fig, path, dpi=72):
        for t, left, right in frames + [frames[-1]] * round(hold * fps):
            for ax, im, snap, scratch in zip(axes, ims, (left, right), (False, True)):
                im.set_data(np.asarray(snap["map"])), ax.set_title(title(snap, scratch), fontsize=9)
            fig.suptitle(f"layer-0 attention of one synthetic sequence, step {t} of {frames[-1][0]}", fontsize=10)
            writer.grab_frame()
    plt.close(fig)
    return len(frames)


def main(argv):
    cfg = configure(DEFAULTS, argv, __doc__)
    if bool(cfg["spt"]) != bool(cfg["scratch"]):
        raise ValueError("give both --spt and --scratch, or neither (then the pair is trained)")
    runs = [cfg["spt"], cfg["scratch"]] if cfg["spt"] else train_pair(cfg["runs"], cfg["every"])
    os.makedirs(cfg["out"], exist_ok=True)
    path = os.path.join(cfg["out"], "attention_evolution.gif")
    n = draw(frames(*map(read_snapshots, runs)), path, cfg["fps"])
    print(f"{n} frames -> {path} ({os.path.getsize(path) / 1e6:.2f} MB)")


if __name__ == "__main__":
    run_cli(main)
