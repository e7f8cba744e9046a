"""
pathfinder.py against the original snakes2 generator (drewlinsley/pathfinder at ab9c130), both
with LRA's published 32-px arguments (google-research/long-range-arena, Pathfinder32), n images
per contour length: REPORT's validation table. --original='' runs ours alone.

  python tools/pathfinder_vs_original.py --original=/path/to/pathfinder --n=1000

The original is imported from the checkout, unchanged. It needs OpenCV (opencv-python-headless,
in a throwaway environment) and SciPy <= 1.2's imresize / imsave: a stand-in does what they did
(byte-scale a float image by its own range, then Pillow's Lanczos resize / PNG).
Measured per generator and length: the share of positives; distractors placed; target contours
that touch; each target's own gaps (its far tip reached from its origin tip through its own lit
pixels, bridging up to b px); a flood fill from one marker through bright pixels bridging up to
b px, as a solver; the marker distance; ridge classifiers (3/4 of the images, scored on the rest)
on that distance, on the bright-pixel count and sum, and on all pixels. Writes results.json,
table.md and grid.png (8 images a length, original above, ours below) into out_dir.
"""

import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
import pathfinder  # noqa: E402
import configurator  # noqa: E402
from test_data_lra import flood_fill_connected, held_out_accuracy  # noqa: E402  the solver and probe the tests use

DEFAULTS = dict(original="",            # a checkout of drewlinsley/pathfinder (snakes.py, snakes2.py); '' = ours only
                n=1000,                 # images per contour length and generator
                lengths="6,9,14",       # contour lengths (LRA: 6 baseline, 9, 14)
                seed=0,
                out_dir="out/pathfinder_vs_original")
BRIDGES = (0, 1, 2, 3)  # gaps (px) the flood fill may jump
THRESHOLDS = (32, 96)   # bright = above this grey level; the solver keeps the better of the two
LIT = 0.3               # a target layer's pixel is lit above this (targets are drawn at 1.5)


def byte_scale(image):
    """scipy.misc's bytescale: uint8 as it is, anything else divided by its own range."""
    a = np.asarray(image)
    if a.dtype == np.uint8:
        return a
    lo, hi = a.min(), a.max()
    return (((a - lo) * (255.0 / (hi - lo if hi > lo else 1))).clip(0, 255) + 0.5).astype(np.uint8)


def load_original(folder):
    """Import snakes and snakes2 from the checkout, with the stand-ins they need on a current
    stack: NumPy 2's removed aliases, and SciPy <= 1.2's imresize / imsave for a 2-D image."""
    import types
    import scipy
    from PIL import Image
    if not os.path.isfile(os.path.join(folder, "snakes2.py")):
        raise FileNotFoundError(f"--original={folder}: no snakes2.py there (a checkout of github.com/drewlinsley/pathfinder)")
    np.float, np.round_ = getattr(np, "float", float), getattr(np, "round_", np.round)
    if not hasattr(getattr(scipy, "misc", None), "imresize"):
        filters = dict(nearest=Image.NEAREST, lanczos=Image.LANCZOS, bilinear=Image.BILINEAR, bicubic=Image.BICUBIC)
        scipy.misc = types.SimpleNamespace(
            imresize=lambda a, size, interp="bilinear", mode=None: np.array(
                Image.fromarray(byte_scale(a)).resize((size[1], size[0]), resample=filters[interp])),
            imsave=lambda name, a: Image.fromarray(byte_scale(a)).save(name))
    sys.path.insert(0, os.path.abspath(folder))
    import snakes
    import snakes2
    return snakes, snakes2


def run_original(snakes, snakes2, length, n, seed):
    """n images of the original at one length, with what it drew recorded by wrapping its
    functions: images (uint8 as saved), the two target layers, tips (y, x), distractors
    placed, labels, marker centres (y, x). Nothing is written: no folders, no metadata, no
    progress lines."""
    import builtins
    import random
    np.random.seed(seed)
    random.seed(seed)
    rec = dict(images=[], targets=[], markers=[], placed=[], labels=[], tips=[])
    state = dict(placed=0, circles=[])
    real = {}

    def two_snakes(*a, **k):
        out = real["two_snakes"](*a, **k)
        if out[4]:
            state.update(targets=np.stack(out[0]), tips=np.array([out[2], out[3]], float), placed=0, circles=[])
        return out

    def make_snake(*a, **k):
        out = real["make_snake"](*a, **k)
        state["placed"] += bool(out[2])
        return out

    def draw_circle(window, coord, radius, aa):
        state["circles"].append(list(coord))
        return real["draw_circle"](window, coord, radius, aa)

    def imsave(name, image):
        rec["images"].append(byte_scale(image))
        rec["targets"].append(state["targets"].astype(np.float32))
        rec["tips"].append(state["tips"])
        rec["markers"].append(np.array(state["circles"][-2:], float))
        rec["placed"].append(state["placed"])

    def accumulate_meta(array, label, *a, **k):
        rec["labels"].append(int(label))
        return array

    nothing = lambda *a, **k: None
    patches = [(snakes2, "two_snakes", two_snakes), (snakes, "make_snake", make_snake),
               (snakes2, "draw_circle", draw_circle), (snakes2, "accumulate_meta", accumulate_meta),
               (snakes2.scipy.misc, "imsave", imsave), (builtins, "print", nothing), (os, "makedirs", nothing),
               (snakes, "save_metadata", nothing)]
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    real.update((name, f) for _, name, f in saved)
    args = type("Args", (), dict(      # the wrapper's defaults, LRA's Pathfinder32 overrides, use_single_paddles off
        contour_path=os.path.join(os.path.abspath(os.sep), "nonexistent-pathfinder-output"), batch_id=0, n_images=n,
        window_size=[32, 32], padding=1, antialias_scale=2, LABEL=1, seed_distance=7, marker_radius=1.5,
        contour_length=length, distractor_length=length // 3, num_distractor_snakes=20 // (length // 3),
        snake_contrast_list=[2], use_single_paddles=False, max_target_contour_retrial=4,
        max_distractor_contour_retrial=4, max_paddle_retrial=2, continuity=1.0, paddle_length=2, paddle_thickness=0.5,
        paddle_margin_list=[1], paddle_contrast_list=[0.75], pause_display=False, save_images=True,
        save_metadata=True, segmentation_task=False, segmentation_task_double_circle=False))()
    try:
        for module, name, f in patches:
            setattr(module, name, f)
        t = time.time()
        snakes2.from_wrapper(args)
        seconds = time.time() - t
    finally:
        for module, name, f in saved:
            setattr(module, name, f)
    out = {k: np.stack(v) if k != "labels" else np.array(v) for k, v in rec.items()}
    out["placed"], out["seconds"] = np.array(rec["placed"]), seconds
    return out


def run_ours(length, n, seed):
    """The same record for pathfinder.py; target layers redrawn from the geometry it returns."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    t = time.time()
    images, info = pathfinder.pathfinder_batch(rng, labels, 32, length)
    seconds = time.time() - t
    p, sp = pathfinder.params(32), pathfinder.sprites(32, 1)
    h, R = sp.h, 32
    layers = np.zeros((2, n, R + 2 * h, R + 2 * h))
    tips = np.zeros((n, 2, 2, 2))
    for i, (segs, contour) in enumerate(zip(info["paddles"], info["contour"])):
        for c in (0, 1):
            s = segs[contour == c]
            y, x = s[:, 1].astype(int), s[:, 0].astype(int)
            d = np.rint((s[:, 3:1:-1] - s[:, 1::-1]) * p["antialias"]).astype(int) + sp.reach
            for yy, xx, k in zip(y, x, d[:, 0] * (2 * sp.reach + 1) + d[:, 1]):
                pathfinder.paste(layers[c], np.array([i]), np.array([yy]), np.array([xx]), sp.line[k][None] * 1.5, R, h)
            tips[i, 0, c], tips[i, 1, c] = (y[0], x[0]), (y[-1], x[-1])
    return dict(images=images, targets=layers[:, :, h:h + R, h:h + R].transpose(1, 0, 2, 3), tips=tips,
                markers=info["markers"][..., ::-1], placed=info["distractors_placed"], labels=labels, seconds=seconds)


def measure(run, asked):
    """The table's numbers for one generator at one length."""
    images, labels, n = run["images"], run["labels"], len(run["labels"])
    lit = run["targets"] >= LIT
    grown = lit.copy()
    grown[..., 1:, :] |= lit[..., :-1, :]
    grown[..., :-1, :] |= lit[..., 1:, :]
    grown[..., :, 1:] |= lit[..., :, :-1]
    grown[..., :, :-1] |= lit[..., :, 1:]
    out = dict(positive=float(labels.mean()), placed=float(run["placed"].mean()), asked=asked,
               overlap=float((lit[:, 0] & lit[:, 1]).any((1, 2)).mean()),
               touch=float((grown[:, 0] & lit[:, 1]).any((1, 2)).mean()))
    own = (lit[:, 0] * 255).astype(np.uint8)
    ends = np.stack([run["tips"][:, 0, 0], run["tips"][:, 1, 0]], 1)[..., ::-1].astype(float)
    for b in BRIDGES:  # a target's own far tip reached from its origin tip, through its own pixels
        out[f"own_joined_{b}"] = float(flood_fill_connected(own, ends, 127, b + 1.5).mean())
    for b in BRIDGES:
        out[f"solver_{b}"] = max(float((flood_fill_connected(images, run["markers"][..., ::-1], t, b + 1.5) == labels)
                                       .mean()) for t in THRESHOLDS)
    dist = np.linalg.norm(run["markers"][:, 0] - run["markers"][:, 1], axis=1)
    out["distance_pos"], out["distance_neg"] = float(dist[labels == 1].mean()), float(dist[labels == 0].mean())
    out["distance_probe"] = held_out_accuracy(np.stack([dist, dist ** 2, dist ** 3], 1) / [30, 900, 27000], labels, 1e-3)
    count = np.stack([(images > THRESHOLDS[0]).sum((1, 2)) / 100, images.sum((1, 2)) / 25500.0], 1)
    out["count_probe"] = held_out_accuracy(count, labels, 1e-3)
    out["pixel_probe"] = held_out_accuracy(images.reshape(n, -1) / 255.0, labels)
    out["images_per_s"] = n / max(run["seconds"], 1e-9)
    return out


ROWS = [("positive share", "positive", "{:.3f}"), ("distractors placed", "placed", "{:.2f}"),
        ("targets share a lit pixel", "overlap", "{:.3f}"), ("targets touch (lit pixels side by side or shared)", "touch", "{:.3f}")] + \
       [(f"target joined through own gaps, bridge {b} px", f"own_joined_{b}", "{:.3f}") for b in BRIDGES] + \
       [(f"flood-fill solver, bridge {b} px", f"solver_{b}", "{:.3f}") for b in BRIDGES] + \
       [("marker distance, positives (px)", "distance_pos", "{:.2f}"), ("marker distance, negatives (px)", "distance_neg", "{:.2f}"),
        ("classifier on marker distance", "distance_probe", "{:.3f}"), ("classifier on bright-pixel count and sum", "count_probe", "{:.3f}"),
        ("linear classifier on pixels", "pixel_probe", "{:.3f}"), ("images / s (one process)", "images_per_s", "{:.1f}")]


def main(argv):
    cfg = configurator.configure(DEFAULTS, argv, __doc__)
    lengths = [int(x) for x in str(cfg["lengths"]).split(",") if x.strip()]
    if cfg["n"] < 8 or not lengths or any(L < 3 for L in lengths):
        raise ValueError("--n must be at least 8 and --lengths a comma list of contour lengths >= 3")
    original = load_original(cfg["original"]) if cfg["original"] else None
    os.makedirs(cfg["out_dir"], exist_ok=True)
    generators = ({"original": lambda *a: run_original(*original, *a)} if original else {}) | {"ours": run_ours}
    runs, results = {g: {} for g in generators}, {g: {} for g in generators}
    for L in lengths:
        for g, generate in generators.items():
            runs[g][L] = generate(L, cfg["n"], cfg["seed"] + L)
            results[g][str(L)] = measure(runs[g][L], pathfinder.distractors_asked(L)[0])
        print(f"length {L} done", flush=True)
    names = list(generators)
    text = "\n".join([f"| measure | {' | '.join(f'{g} L={L}' for L in lengths for g in names)} |",
                      "|" + "---|" * (1 + len(names) * len(lengths))] +
                     [f"| {label} | {' | '.join(fmt.format(results[g][str(L)][key]) for L in lengths for g in names)} |"
                      for label, key, fmt in ROWS])
    text += "\n\ndistractors asked: " + ", ".join(f"L={L}: {results[names[0]][str(L)]['asked']}" for L in lengths) + "\n"
    print(text)
    with open(os.path.join(cfg["out_dir"], "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(cfg["out_dir"], "table.md"), "w") as f:
        f.write(text)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(lengths) * len(names), 8, figsize=(12, 1.6 * len(lengths) * len(names)),
                             squeeze=False, facecolor="white")
    for row, (L, g) in zip(axes, [(L, g) for L in lengths for g in names]):
        for ax, image, label in zip(row, runs[g][L]["images"], runs[g][L]["labels"]):
            ax.imshow(image, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
            ax.set_title(str(int(label)), fontsize=7)
            ax.set_xticks([]), ax.set_yticks([])
        row[0].set_ylabel(f"{g}\nlength {L}", fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(cfg["out_dir"], "grid.png"), dpi=100)
    print(f"wrote {cfg['out_dir']}/results.json, table.md, grid.png")


if __name__ == "__main__":
    configurator.run_cli(main)
