"""
When does SPT leave its plateau on PathFinder, and how local is attention by then?
For each train_spt.py run folder: the SPT val loss after every epoch (log.jsonl),
the first step at which it is below --threshold (PathFinder's plateau is the
pixels' unigram entropy), and the layer-0 attention mass in the 3 x 3 grid
neighbourhood (as a multiple of uniform attention) of the fresh model and of every
SPT checkpoint the run kept (spt_epochN.pt: --save_epochs), on the first --n
validation images.

    python tools/spt_plateau.py --runs=out/amos/plateau/amos_s0,out/amos/plateau/torch_s0
"""

import glob
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import analysis  # noqa: E402  (the repository root, added just above)
from configurator import configure, run_cli  # noqa: E402
from train_spt import build_model, load_data  # noqa: E402
from training import load_weights, read_log, setup_runtime  # noqa: E402

DEFAULTS = dict(runs="",           # comma list of train_spt.py run folders
                threshold=0.70,    # the SPT val loss that counts as off the plateau
                n=16)              # val images the attention mass is read on


def grid_mass(run, n):
    """{epoch: layer-0 3x3 mass / uniform} for the fresh model (epoch 0) and each spt_epochN.pt."""
    epoch_of = lambda path: int(re.search(r"spt_epoch(\d+)\.pt$", path).group(1))
    paths = sorted(glob.glob(os.path.join(run, "spt_epoch*.pt")), key=epoch_of)
    if not paths:
        return {}
    with open(os.path.join(run, "config.json")) as f:
        cfg = json.load(f)
    rt = setup_runtime("cpu", "float32", cfg["seed"])
    val = load_data(cfg["task"], "val", cfg)
    model = build_model(cfg, [val])                 # seeded as the run was: its init

    def mass():
        maps, _ = analysis.attention_maps(model, val, rt.device, n)
        grid = analysis.proximity_mass_2d(maps[:1], math.isqrt(maps[0].size(-1)), radii=(1,))
        return grid["layers"][0][0] / grid["uniform"][0]

    out = {0: mass()}
    for path in paths:
        load_weights(model, path)
        out[epoch_of(path)] = mass()
    return out


def report(run, threshold, n):
    epochs = [(r["epoch"], r["step"], r["val_loss"]) for r in read_log(run) if r.get("phase") == "spt" and "val_loss" in r]
    if not epochs:
        raise FileNotFoundError(f"{run}: no SPT epoch in its log.jsonl; is it an SPT run of train_spt.py?")
    masses = grid_mass(run, n)
    hit = next((e for e in epochs if e[2] < threshold), None)
    lines = [f"{run}: SPT val loss below {threshold} " + (f"after epoch {hit[0]} (step {hit[1]}, {hit[2]:.4f})"
                                                          if hit else f"never in {epochs[-1][1]} steps"),
             "| epoch | step | SPT val loss | 3x3 mass / uniform |", "|---|---|---|---|"]
    if 0 in masses:
        lines.append(f"| 0 | 0 | - | {masses[0]:.2f} |")
    for epoch, step, loss in epochs:
        lines.append(f"| {epoch} | {step} | {loss:.4f} | " + (f"{masses[epoch]:.2f}" if epoch in masses else "-") + " |")
    return "\n".join(lines)


def main(argv):
    cfg = configure(DEFAULTS, argv, __doc__, __file__)
    runs = [r for r in cfg["runs"].split(",") if r]
    if not runs:
        raise ValueError("give the run folders: --runs=DIR[,DIR...]")
    for run in runs:
        if not os.path.exists(os.path.join(run, "log.jsonl")):
            raise FileNotFoundError(f"{run}/log.jsonl does not exist; give train_spt.py run folders")
    out = "\n\n".join(report(run, cfg["threshold"], cfg["n"]) for run in runs)
    print(out)
    return out


if __name__ == "__main__":
    run_cli(main)
