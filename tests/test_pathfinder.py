"""Tests for pathfinder.py: the original snakes2 generator's rules (drawing, seeds,
collisions, contrast, grey levels), checked on the generator's own geometry and pixels,
and the shortcuts a model must not find. The numbers the original gives (run offline
with OpenCV, 1,000 images per length) come from tools/pathfinder_vs_original.py.

`python tests/test_pathfinder.py` prints the validation table of pathfinder.py alone."""

import ast
import json
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import pathfinder as P  # noqa: E402
from test_data_lra import flood_fill_connected, held_out_accuracy  # noqa: E402

LENGTHS = (6, 9, 14)


def batch(seed, n, length, resolution=32, **options):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    images, info = P.pathfinder_batch(rng, labels, resolution, length, **options)
    return images, info, labels


def segment_distance(a, b):
    """Least distance between segments a (..., 4) and b (..., 4) as x0 y0 x1 y1 that do not
    cross (ends against segments)."""
    def to_segment(q, s):
        d = s[..., 2:] - s[..., :2]
        t = np.clip(((q - s[..., :2]) * d).sum(-1) / np.maximum((d * d).sum(-1), 1e-12), 0, 1)
        return np.linalg.norm(q - s[..., :2] - t[..., None] * d, axis=-1)
    return np.minimum(np.minimum(to_segment(a[..., :2], b), to_segment(a[..., 2:], b)),
                      np.minimum(to_segment(b[..., :2], a), to_segment(b[..., 2:], a)))


def target_distance(info, i):
    """Least distance between the centre lines of the two targets of image i."""
    segs, contour = info["paddles"][i], info["contour"][i]
    return segment_distance(segs[contour == 0][:, None], segs[contour == 1][None]).min()


def test_pathfinder_imports_nothing_from_this_project():
    tree = ast.parse(open(P.__file__).read())
    names = {a.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert names - {"numpy"} <= set(sys.stdlib_module_names)        # numpy and the standard library only


def test_lras_published_32px_arguments():
    """google-research/long-range-arena, lra_benchmarks/data/pathfinder.py (Pathfinder32)."""
    p = P.PARAMS[32]
    assert (p["padding"], p["antialias"], p["margins"], p["seed_distance"], p["marker_radius"]) == (1, 2, (1,), 7, 1.5)
    assert (p["paddle_length"], p["paddle_thickness"], p["continuity"]) == (2, 0.5, 1.0)
    assert (p["snake_contrast"], p["paddle_contrast"]) == (2.0, 0.75)
    assert [P.distractors_asked(L) for L in LENGTHS] == [(10, 2), (6, 3), (5, 4)]


def test_shrinking_and_lines_are_pillows():
    """The Lanczos resize (scipy.misc.imresize called Pillow) and the one-pixel line are
    Pillow's to the bit: the sprites are the original's paddles."""
    Image = pytest.importorskip("PIL.Image")
    ImageDraw = pytest.importorskip("PIL.ImageDraw")
    rng = np.random.default_rng(0)
    for n_in, n_out in [(17, 9), (64, 32), (41, 21), (256, 128)]:
        a = (rng.random((n_in, n_in)) < 0.2).astype(np.uint8) * 255
        ref = np.array(Image.fromarray(a).resize((n_out, n_out), Image.LANCZOS))
        assert np.array_equal(P.shrink(a, n_out), ref), (n_in, n_out)
    for dy in range(-4, 5):
        for dx in range(-4, 5):
            im = Image.new("F", (17, 17), "black")
            ImageDraw.Draw(im).line([(8, 8), (8 + dx, 8 + dy)], fill="white", width=1)
            assert np.array_equal(np.array(im) > 0, P.line_pixels(17, 8, dy, dx, 1)), (dy, dx)


def test_each_paddle_is_drawn_in_float32_as_the_originals_layer():
    line = P.sprites(32, 1).line                       # grey levels k / 255 of the shrunk paddles
    levels = np.unique(line)
    k = np.round(levels * 255)
    assert np.array_equal(levels, (k / 255).astype(np.float32))   # float32's k/255, not float64's:
    assert (levels != k / 255).sum() > len(levels) // 2           # .5 ties then round as the original's


def test_seeds_fit_only_where_opencvs_float_border_lets_them():
    """seed_snake dilates a float mask with OpenCV, whose border is -DBL_MAX: run with
    opencv-python-headless 4.10, only the orientations -150..-121 degrees leave no pixel
    negative at 32 px. Every seed footprint is sparse (the paddle mask's pixels at exactly 1)."""
    sp = P.sprites(32, 1)
    degrees = np.arange(-180, 180)
    passing = degrees[sp.seed_ok[sp.key(degrees * np.pi / 180)]]
    assert list(passing) == list(range(-150, -120))
    assert all(1 <= len(sp.seed_offsets[k]) <= 4 for k in sp.key(degrees * np.pi / 180))


@pytest.mark.parametrize("length, low, high", [(6, 2.7, 4.1), (9, 1.4, 2.3), (14, 0.8, 1.5)])
def test_distractors_placed_as_few_as_the_original(length, low, high):
    """The original placed 3.33 / 1.74 / 1.15 of 10 / 6 / 5 asked (1,000 images per length):
    a distractor's five tries mostly draw an orientation the border check refuses. Without
    that quirk nearly all are placed. Every placed distractor is whole."""
    _, info, _ = batch(1, 80, length)
    asked, d_len = P.distractors_asked(length)
    assert info["distractors_asked"] == asked
    assert low <= info["distractors_placed"].mean() <= high, info["distractors_placed"].mean()
    for contour, placed in zip(info["contour"], info["distractors_placed"]):
        assert (contour >= 2).sum() == placed * d_len
    _, fixed, _ = batch(1, 40, length, border_quirk=False)
    assert fixed["distractors_placed"].mean() >= {6: 0.95, 9: 0.8, 14: 0.6}[length] * asked


def test_first_target_starts_in_the_one_direction_the_border_check_allows():
    """The quirk also fixes the first target's first paddle to -150..-121 degrees (rows down)."""
    _, info, _ = batch(2, 60, 6)
    first = np.stack([segs[0] for segs in info["paddles"]])  # the first target's seed paddle
    angle = np.degrees(np.arctan2(first[:, 3] - first[:, 1], first[:, 2] - first[:, 0]))
    assert ((angle > -165) & (angle < -105)).all(), angle
    _, info, _ = batch(2, 60, 6, border_quirk=False)
    first = np.stack([segs[0] for segs in info["paddles"]])
    angle = np.degrees(np.arctan2(first[:, 3] - first[:, 1], first[:, 2] - first[:, 0]))
    assert ((angle > -165) & (angle < -105)).mean() < 0.5


@pytest.mark.parametrize("length, low", [(6, 0.03), (14, 0.2)])
def test_targets_may_touch_as_in_the_original(length, low):
    """Collisions are tested on soft dilated masks (refused at a sum of 1.8), without the
    other target's newest paddle: the targets touch or cross in some images (the original:
    a pixel lit in both targets in 0.14 of images at length 6, 0.25 at 14; lit
    pixels side by side in 0.24 and 0.48). all_pairs=True checks the newest paddles too: they keep apart."""
    _, info, _ = batch(3, 100, length)
    d = np.array([target_distance(info, i) for i in range(100)])
    assert (d <= 0.5).mean() >= low, np.sort(d)[:10]
    _, kept, _ = batch(3, 60, length, all_pairs=True)
    d = np.array([target_distance(kept, i) for i in range(60)])
    assert (d <= 0.5).mean() <= 0.02, np.sort(d)[:10]


@pytest.mark.parametrize("length", LENGTHS)
def test_labels_follow_from_the_geometry(length):
    """A positive has its two markers on the tips of one target, a negative on different
    ones; each target is a chain of contour_length paddles drawn from whole pixels, whose
    gaps are irregular (joints and candidates rounded to whole pixels)."""
    _, info, labels = batch(4, 60, length)
    gaps = []
    for i in range(60):
        segs, contour = info["paddles"][i], info["contour"][i]
        a, b = info["marked"][i]
        assert (a == b) == (labels[i] == 1)
        first, last = segs[contour == a][0], segs[contour == b][-1]
        assert np.allclose(info["markers"][i], [first[:2], last[:2]])  # origin tip, far tip (paddles drawn from there)
        for c in (0, 1):
            chain = segs[contour == c]
            assert len(chain) == length and np.allclose(chain[:, :2], np.rint(chain[:, :2]))
            far = np.concatenate([chain[:1, 2:], chain[1:-1, :2]])  # the seed is drawn forward, the others back
            gaps += list(np.linalg.norm(far - chain[1:, 2:], axis=1))
    gaps = np.array(gaps)
    assert 1.0 <= np.median(gaps) <= 2.5 and gaps.max() <= 4.5 and gaps.std() > 0.3, np.percentile(gaps, [5, 50, 95])


def test_grey_levels_contrast_and_normalisation():
    """Targets drawn at 0.75 x 2 = 1.5, distractors at 2 (brighter), markers at 1, and each
    image divided by its own maximum (scipy.misc.imsave): the brightest pixel is 255 and the
    markers a little darker. normalise=False: 1.0 = 255, clipped."""
    images, info, _ = batch(5, 40, 6)
    assert images.shape == (40, 32, 32) and images.dtype == np.uint8 and (images.max((1, 2)) == 255).all()
    centre = np.array([[img[int(y), int(x)] for x, y in m] for img, m in zip(images, info["markers"])])
    assert (centre >= 190).all() and (centre < 255).any(), centre.min()
    lit = (images > 20).mean((1, 2))
    assert (lit > 0.03).all() and (lit < 0.4).all()  # thin contours on black
    raw, info, _ = batch(5, 40, 6, normalise=False)
    centre = np.array([[img[int(y), int(x)] for x, y in m] for img, m in zip(raw, info["markers"])])
    assert (centre == 255).all()
    grey = {True: [], False: []}  # at the pixels the paddles are drawn from: distractor or target
    for img, segs, contour in zip(raw, info["paddles"], info["contour"]):
        for is_distractor, v in zip(contour >= 2, img[segs[:, 1].astype(int), segs[:, 0].astype(int)]):
            grey[is_distractor].append(v)
    ratio = np.median(grey[True]) / np.median(grey[False])
    assert 1.2 < ratio < 1.45, ratio  # 2 / 1.5


def test_local_flood_fill_does_not_solve_length_14():
    """A solver that follows bright pixels across gaps of up to 3 px stays near chance."""
    images, info, labels = batch(6, 200, 14)
    for reach in (1.5, 2.5, 3.5, 4.5):
        for threshold in (32, 96):
            assert (flood_fill_connected(images, info["markers"], threshold, reach) == labels).mean() <= 0.7


def test_labels_drawn_at_random_and_generation_seeded():
    a = P.generate(120, seed=1, contour_length=6, chunk=60)
    b = P.generate(120, seed=1, contour_length=6, chunk=60)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert 0.35 < a[1].mean() < 0.65 and set(a[2]) == {1}


def test_match_distance_option_pairs_the_marker_distances():
    _, info, labels = batch(7, 200, 6, match_distance=True)
    d = np.linalg.norm(info["markers"][:, 0] - info["markers"][:, 1], axis=1)
    pos, neg = np.sort(np.floor(d[labels == 1])), np.sort(np.floor(d[labels == 0]))
    n = min(len(pos), len(neg))
    assert abs(np.median(pos[:n]) - np.median(neg[:n])) <= 1


def test_pathx_is_128_by_128_with_its_two_margins():
    images, info, _ = batch(8, 6, 6, resolution=128)
    assert images.shape == (6, 128, 128) and (images.max((1, 2)) == 255).all()
    assert set(info["margin"]) <= {2, 3} and P.PARAMS[128]["paddle_length"] > P.PARAMS[32]["paddle_length"]
    with pytest.raises(ValueError, match="resolution must be one of"):
        P.params(64)


def load_validation_tool():
    import importlib.util
    path = os.path.join(os.path.dirname(HERE), "tools", "pathfinder_vs_original.py")
    spec = importlib.util.spec_from_file_location("pathfinder_vs_original", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_validation_tool_refuses_a_missing_original_before_writing(tmp_path):
    tool = load_validation_tool()
    out = tmp_path / "run"
    with pytest.raises(FileNotFoundError, match="no snakes2.py there"):
        tool.main([f"--original={tmp_path / 'nowhere'}", f"--out_dir={out}", "--n=16"])
    with pytest.raises(ValueError, match="--n must be at least 8"):
        tool.main(["--n=2", f"--out_dir={out}"])
    assert not out.exists()


def test_validation_tool_measures_ours_alone(tmp_path, capsys):
    """--original='' gives pathfinder.py's column of the side-by-side table."""
    tool = load_validation_tool()
    out = tmp_path / "run"
    tool.main(["--n=24", "--lengths=6", f"--out_dir={out}"])
    results = json.loads((out / "results.json").read_text())["ours"]["6"]
    assert results["asked"] == 10 and 0 <= results["overlap"] <= results["touch"] <= 1
    assert set(f"solver_{b}" for b in (0, 1, 2, 3)) <= set(results)
    assert "| flood-fill solver, bridge 3 px |" in capsys.readouterr().out and (out / "grid.png").exists()


def shortcut_probes(seed, n, length, **options):
    """-> label balance, linear classifier on pixels, marker distance alone, flood fill (held out)."""
    images, info, labels = batch(seed, n, length, **options)
    pixels = held_out_accuracy(images.reshape(n, -1) / 255.0, labels)
    dist = np.linalg.norm(info["markers"][:, 0] - info["markers"][:, 1], axis=1)
    distance = held_out_accuracy(np.stack([dist, dist ** 2, dist ** 3], 1) / np.array([30, 900, 27000]), labels, lam=1e-3)
    flood = float((flood_fill_connected(images[:400], info["markers"][:400]) == labels[:400]).mean())
    return dict(positive=float(labels.mean()), pixels=pixels, distance=distance, flood=flood,
                placed=float(info["distractors_placed"].mean()), asked=info["distractors_asked"])


@pytest.mark.slow
@pytest.mark.parametrize("length", LENGTHS)
def test_no_linear_pixel_shortcut(length):
    probes = shortcut_probes(9, 1600, length)
    assert probes["pixels"] <= 0.6 and probes["distance"] <= 0.65 and probes["flood"] <= 0.8, probes


if __name__ == "__main__":  # pathfinder.py's own validation table
    import time
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    print(f"n={n} images per difficulty; probes held out on the last quarter, flood fill on 400")
    for length in LENGTHS:
        t = time.time()
        probes = shortcut_probes(11, n, length)
        print(f"length {length}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                            for k, v in probes.items()) + f" ({time.time() - t:.0f} s)")
