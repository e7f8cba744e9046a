"""Tests for data_lra.py: every loader on tiny fixtures written in the official
formats, the two generators' faithfulness, collate, caching and error messages."""

import os
import pickle
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import data_lra as D  # noqa: E402


# -----------------------------------------------------------------------------
# helpers


def tokens_of(expr):
    return expr.replace("(", " ").replace(")", " ").split()


def flood_fill_connected(images, markers, threshold=20, reach=2.3):
    """A solver that sees only the image: binarise, then grow from the first marker
    through bright pixels (steps up to `reach` px, enough to jump the gaps between the
    dashes of one contour); is the second marker reached?"""
    B, R, _ = images.shape
    bright = images > threshold
    yy, xx = np.mgrid[0:R, 0:R]

    def disk(m, r):
        return (xx[None] - m[:, 0, None, None]) ** 2 + (yy[None] - m[:, 1, None, None]) ** 2 <= r * r

    reached, goal = disk(markers[:, 0], 2.0) & bright, disk(markers[:, 1], 2.0) & bright
    r = int(np.ceil(reach))
    steps = [(dy, dx) for dy in range(-r, r + 1) for dx in range(-r, r + 1) if 0 < dx * dx + dy * dy <= reach * reach]
    while True:
        pad = np.pad(reached, ((0, 0), (r, r), (r, r)))
        grown = reached.copy()
        for dy, dx in steps:
            grown |= pad[:, r + dy: r + dy + R, r + dx: r + dx + R]
        grown &= bright
        if (grown == reached).all():
            return (reached & goal).any((1, 2)).astype(int)
        reached = grown


def held_out_accuracy(features, labels, lam=10.0):
    """Ridge least squares on 3/4, accuracy on the last 1/4."""
    X = np.hstack([features, np.ones((len(features), 1))])
    cut = 3 * len(X) // 4
    w = np.linalg.solve(X[:cut].T @ X[:cut] + lam * np.eye(X.shape[1]), X[:cut].T @ (2.0 * labels[:cut] - 1))
    return float(((X[cut:] @ w > 0) == labels[cut:]).mean())


# -----------------------------------------------------------------------------
# ListOps


LISTOPS_ROWS = [("( ( ( [MAX 2 ) 9 ) ] )", 9), ("( ( ( [SM ( ( ( [MIN 3 ) 5 ) ] ) ) 8 ) ] )", 1), ("7", 7)]


def write_listops(root, rows=LISTOPS_ROWS, newline="\r\n"):
    folder = root / "listops-1000"
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val", "test"):
        text = "Source\tTarget" + newline + "".join(f"{s}\t{v}{newline}" for s, v in rows)
        (folder / f"basic_{split}.tsv").write_bytes(text.encode())
    return folder


def test_listops_reads_official_tsv(tmp_path):
    write_listops(tmp_path)
    ds = D.load_task("listops", "train", str(tmp_path), data_source="release")
    assert len(ds) == 3 and (ds.vocab_size, ds.n_classes, ds.pad_id, ds.mask_id) == (17, 10, 15, 16)
    tokens, label = ds[0]
    assert tokens.dtype == torch.long and tokens.tolist() == [11, 2, 9, 14] and label == 9
    assert ds[1][0].tolist() == [13, 10, 3, 5, 14, 8, 14] and ds[1][1] == 1


def test_listops_auto_prefers_release_files(tmp_path):
    write_listops(tmp_path)
    ds = D.load_task("listops", "val", str(tmp_path))  # auto: release present, nothing generated
    assert len(ds) == 3 and not (tmp_path / "generated").exists()


def test_listops_malformed_row_names_file_and_line(tmp_path):
    folder = write_listops(tmp_path)
    (folder / "basic_train.tsv").write_text("Source\tTarget\n( [MAX 2 ] )\t2\n( [MAX 2 [FOO ] )\t3\n")
    with pytest.raises(ValueError, match=r"basic_train\.tsv, line 3: unknown ListOps token '\[FOO'"):
        D.load_task("listops", "train", str(tmp_path), data_source="release")
    (folder / "basic_train.tsv").write_text("Source\tTarget\n( [MAX 2 ] )\n")
    with pytest.raises(ValueError, match=r"basic_train\.tsv, line 2"):
        D.load_task("listops", "train", str(tmp_path), data_source="release")


@pytest.mark.parametrize("expr, value", [
    ("[MAX 2 9 ]", 9), ("[MIN 4 2 7 ]", 2), ("[MED 1 5 3 ]", 3), ("[MED 1 2 3 4 ]", 2),  # int(2.5)
    ("[MED 9 8 ]", 8), ("[SM 5 7 9 ]", 1), ("[MAX [MIN 3 5 ] [SM 9 9 ] 4 ]", 8),
    ("[MED [MAX 1 0 ] [MIN 7 9 ] [SM 2 2 ] 0 ]", 2), ("6", 6)])
def test_listops_evaluator_on_hand_written_expressions(expr, value):
    assert D.listops_value(expr.split()) == value


def test_listops_evaluator_rejects_broken_expressions():
    for broken in ("[MAX 2 9", "2 3", "]", "[MAX ]", "[FOO 1 ]"):
        with pytest.raises(ValueError):
            D.listops_value(broken.split())


def test_listops_generator_is_faithful():
    rows = D.generate_listops(300, seed=1, progress=False)
    assert len(rows) == 300 and len({s for s, _ in rows}) == 300  # deduplicated
    ops = set()
    for source, label in rows[:100]:
        toks = tokens_of(source)
        assert 500 < len(toks) < 2000
        assert source.count("(") == source.count(")")
        assert D.listops_value(toks) == label  # labels agree with an independent evaluator
        ops.update(t for t in toks if t.startswith("["))
    assert ops == {"[MIN", "[MAX", "[MED", "[SM"}
    labels = np.bincount([v for _, v in rows], minlength=10)
    assert (labels > 0).sum() >= 8  # all kinds of answers occur


def lra_to_string(words):
    """The LRA script's to_string, rebuilt from a tree parsed out of the paren-free tokens:
    an operator with children c1..cn is written ( * (n+1), op, then ' ci )' each, then ' ] )'."""
    pos = 0

    def node():
        nonlocal pos
        word = words[pos]
        pos += 1
        if not word.startswith("["):
            return word
        kids = []
        while words[pos] != "]":
            kids.append(node())
        pos += 1
        return "( " * (len(kids) + 1) + word + "".join(f" {k} )" for k in kids) + " ] )"

    out = node()
    assert pos == len(words)
    return out


def test_listops_written_form_matches_lra_to_string():
    assert lra_to_string(tokens_of(LISTOPS_ROWS[0][0])) == LISTOPS_ROWS[0][0]
    for source, _ in D.generate_listops(30, seed=3, progress=False):
        assert lra_to_string(tokens_of(source)) == source


def test_generated_listops_is_read_by_the_official_loader_and_cached(tmp_path, capsys):
    ds = D.load_task("listops", "train", str(tmp_path), n=100, seed=0, progress=False)
    assert "generating ListOps" in capsys.readouterr().out
    assert len(ds) == 96 and len(D.load_task("listops", "test", str(tmp_path), n=100, progress=False)) == 2
    assert "generating" not in capsys.readouterr().out  # the cache is reused
    tsv = os.path.join(D.generated_listops_dir(str(tmp_path), 100, 0), "listops-1000", "basic_train.tsv")
    with open(tsv) as f:
        assert f.readline() == "Source\tTarget\n"
    with open(tsv, "r+") as f:  # damage the cache: it is detected and regenerated
        f.truncate(1000)
    ds2 = D.load_task("listops", "train", str(tmp_path), n=100, seed=0, progress=False)
    assert "generating ListOps" in capsys.readouterr().out
    assert [ds2[i][0].tolist() for i in range(5)] == [ds[i][0].tolist() for i in range(5)]


def test_listops_generation_is_deterministic_for_a_seed():
    a = D.generate_listops(50, seed=7, progress=False)
    assert a == D.generate_listops(50, seed=7, progress=False)
    assert a != D.generate_listops(50, seed=8, progress=False)


# -----------------------------------------------------------------------------
# Text (IMDb) and Retrieval (AAN)


def write_imdb(root):
    for sub, reviews in (("train", {"pos": ["great film", "loved it é"], "neg": ["dull"]}),
                         ("test", {"pos": ["fine"], "neg": ["awful", "bad", "meh"]})):
        for polarity, texts in reviews.items():
            folder = root / "aclImdb" / sub / polarity
            folder.mkdir(parents=True)
            for i, text in enumerate(texts):
                (folder / f"{i}_7.txt").write_text(text, encoding="utf-8")


def test_text_reads_imdb_layout_as_bytes(tmp_path):
    write_imdb(tmp_path)
    train = D.load_task("text", "train", str(tmp_path))
    assert len(train) == 3 and (train.vocab_size, train.pad_id, train.mask_id, train.n_classes) == (258, 256, 257, 2)
    assert sorted(train[i][1] for i in range(3)) == [0, 1, 1]
    texts = {bytes(train[i][0].tolist()).decode("utf-8") for i in range(3)}
    assert texts == {"great film", "loved it é", "dull"}
    val, test = D.load_task("text", "val", str(tmp_path)), D.load_task("text", "test", str(tmp_path))
    assert len(val) == len(test) == 4  # the test set doubles as validation
    short = D.load_task("text", "train", str(tmp_path), max_len=4)
    assert max(len(short[i][0]) for i in range(3)) == 4


def write_aan(root, rows):
    for split in ("train", "eval", "test"):
        (root / f"new_aan_pairs.{split}.tsv").write_text("".join("\t".join(r) + "\n" for r in rows))


def test_retrieval_reads_aan_pairs_and_collates_b_2_t(tmp_path):
    write_aan(tmp_path, [("1", "a1", "b1", "first doc", "second, longer doc"), ("0.0", "a2", "b2", "x", "yz")])
    ds = D.load_task("retrieval", "val", str(tmp_path))  # eval file
    tokens, label = ds[0]
    assert tokens.shape == (2, 18) and label == 1 and ds[1][1] == 0
    assert bytes(tokens[0, :9].tolist()) == b"first doc" and (tokens[0, 9:] == ds.pad_id).all()
    batch, pad_mask, labels = ds.collate([ds[0], ds[1]])
    assert batch.shape == (2, 2, 18) and pad_mask.shape == batch.shape and labels.tolist() == [1, 0]
    assert pad_mask[1, 0].tolist() == [False] + [True] * 17 and pad_mask[1, 1, 2:].all() and not pad_mask[1, 1, :2].any()


def test_retrieval_malformed_row_names_file_and_line(tmp_path):
    write_aan(tmp_path, [("1", "a", "b", "t1", "t2"), ("1", "a", "b", "only four")])
    with pytest.raises(ValueError, match=r"new_aan_pairs\.train\.tsv, line 2: expected 5"):
        D.load_task("retrieval", "train", str(tmp_path))


# -----------------------------------------------------------------------------
# Image (CIFAR-10)


def write_cifar(root, per_batch=2):
    folder = root / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (per_batch, 3072)).astype(np.uint8)
        data[0, :1024], data[0, 1024:] = 255, 0  # first image pure red
        with open(folder / name, "wb") as f:
            pickle.dump({b"batch_label": name.encode(), b"labels": list(range(per_batch)), b"data": data}, f, protocol=2)
    return folder


def test_image_reads_cifar_pickles_in_grey(tmp_path):
    write_cifar(tmp_path)
    train, val, test = (D.load_task("image", s, str(tmp_path)) for s in ("train", "val", "test"))
    assert (len(train), len(val), len(test)) == (9, 1, 2)  # first 90% / last 10% / test batch
    tokens, label = train[0]
    assert tokens.shape == (1024,) and label == 0 and (tokens == 76).all()  # round(0.2989 * 255)
    assert train.vocab_size == 258 and train.n_classes == 10
    _, pad_mask, _ = train.collate([train[0], train[1]])
    assert pad_mask is None  # fixed length: no mask, so attention can use the fused kernel


class Exploit:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_cifar_unpickler_refuses_code_execution(tmp_path):
    folder = write_cifar(tmp_path)
    witness = tmp_path / "pwned"
    with open(folder / "data_batch_3", "wb") as f:
        pickle.dump({b"labels": [0], b"data": Exploit(witness)}, f, protocol=2)
    with pytest.raises(pickle.UnpicklingError, match="refusing to load global .*system"):
        D.load_task("image", "train", str(tmp_path))
    assert not witness.exists()


# -----------------------------------------------------------------------------
# missing files


@pytest.mark.parametrize("task, expected, source", [
    ("text", "aclImdb/train/neg", "ai.stanford.edu/~amaas"),
    ("retrieval", "new_aan_pairs.train.tsv", "lra_release.gz"),
    ("image", "cifar-10-batches-py/data_batch_1", "cs.toronto.edu/~kriz"),
    ("listops", "listops-1000/basic_train.tsv", "lra_release.gz"),
    ("pathfinder", "pathfinder32/curv_contour_length_14/metadata", "lra_release.gz")])
def test_missing_files_error_names_path_source_and_generators(tmp_path, task, expected, source):
    options = {"data_source": "release"} if task in ("listops", "pathfinder") else {}
    with pytest.raises(FileNotFoundError) as e:
        D.load_task(task, "train", str(tmp_path), **options)
    msg = str(e.value)
    assert os.path.join(str(tmp_path), *expected.split("/")) in msg and source in msg
    assert "--task=listops|pathfinder" in msg


def test_load_task_rejects_unknown_names_and_options(tmp_path):
    with pytest.raises(ValueError, match="unknown task"):
        D.load_task("cifar", "train", str(tmp_path))
    with pytest.raises(ValueError, match="unknown split"):
        D.load_task("image", "dev", str(tmp_path))
    with pytest.raises(TypeError, match="unknown option.*resolution"):
        D.load_task("text", "train", str(tmp_path), resolution=32)
    with pytest.raises(ValueError, match="fixed length 1024"):
        D.load_task("pathfinder", "train", str(tmp_path), max_len=2000)
    with pytest.raises(ValueError, match="unknown difficulty"):
        D.load_task("pathfinder", "train", str(tmp_path), difficulty="hard")


def test_cli_rejects_unknown_keys_and_bad_values():
    with pytest.raises(SystemExit, match="unknown key --bogus"):
        D.parse_args(["--bogus=1"])
    with pytest.raises(SystemExit, match="bad value for --n"):
        D.parse_args(["--n=many"])
    cfg = D.parse_args(["--task=listops", "--generate", "--n=10", "--seed=3"])
    assert (cfg["task"], cfg["generate"], cfg["n"], cfg["seed"]) == ("listops", True, 10, 3)


# -----------------------------------------------------------------------------
# collate


def test_collate_pads_variable_lengths_and_marks_only_the_padding(tmp_path):
    write_listops(tmp_path)
    ds = D.load_task("listops", "train", str(tmp_path), data_source="release")
    items = [ds[0], ds[1], ds[2]]  # lengths 4, 7, 1
    tokens, pad_mask, labels = ds.collate(items)
    assert tokens.shape == (3, 7) and tokens.dtype == torch.long and labels.tolist() == [9, 1, 7]
    assert pad_mask.dtype == torch.bool and pad_mask.shape == (3, 7)
    for row, n in enumerate((4, 7, 1)):
        assert not pad_mask[row, :n].any() and pad_mask[row, n:].all()
        assert (tokens[row, n:] == ds.pad_id).all() and tokens[row, :n].tolist() == items[row][0].tolist()
    _, same_mask, _ = ds.collate([ds[0], ds[0]])
    assert same_mask is None


# -----------------------------------------------------------------------------
# PathFinder: release layout, generator, cache


def test_pathfinder_export_is_read_back_identically_by_the_release_loader(tmp_path):
    images, labels = D.ensure_pathfinder(str(tmp_path), n=40, seed=0, difficulty="baseline", progress=False)
    folder = D.pathfinder_folder(str(tmp_path), 32, "baseline")
    D.export_pathfinder_lra(folder, images, labels, batch_size=15, contour_length=6)
    assert sorted(os.listdir(os.path.join(folder, "metadata"))) == ["0.npy", "1.npy", "2.npy"]
    for split in ("train", "val", "test"):
        gen = D.load_task("pathfinder", split, str(tmp_path), difficulty="baseline", n=40, data_source="generated", progress=False)
        rel = D.load_task("pathfinder", split, str(tmp_path), difficulty="baseline", data_source="release", progress=False)
        assert len(gen) == len(rel) > 0
        for i in range(len(gen)):
            assert torch.equal(gen[i][0], rel[i][0]) and gen[i][1] == rel[i][1]


def test_pathfinder_release_decoded_once_then_cached(tmp_path, monkeypatch):
    images, labels = D.ensure_pathfinder(str(tmp_path), n=20, seed=0, difficulty="baseline", progress=False)
    D.export_pathfinder_lra(D.pathfinder_folder(str(tmp_path), 32, "baseline"), images, labels, contour_length=6)
    first = D.load_task("pathfinder", "train", str(tmp_path), difficulty="baseline", progress=False)  # auto: release

    def refuse(*a, **k):
        raise AssertionError("decoded the PNGs again")

    monkeypatch.setattr(D, "read_pathfinder_release", refuse)
    again = D.load_task("pathfinder", "train", str(tmp_path), difficulty="baseline", progress=False)
    assert len(first) == len(again) == 16 and torch.equal(first[0][0], again[0][0])


def test_pathfinder_release_reader_greyscale_png_skip_empty_and_malformed(tmp_path):
    from PIL import Image
    folder = tmp_path / "pathfinder32" / "curv_baseline"
    (folder / "imgs" / "0").mkdir(parents=True)
    (folder / "metadata").mkdir()
    lines = []
    for i in range(173):
        if i in (3, 172):
            img = np.full((32, 32), 0 if i == 172 else 200, np.uint8)
            Image.fromarray(img, mode="L").save(folder / "imgs" / "0" / f"sample_{i}.png")
            lines.append(f"imgs/0 sample_{i}.png {i} {int(i == 3)} 1.0 6 2 2 0.5 1 1")
    (folder / "metadata" / "0.npy").write_text("\n".join(lines) + "\n")
    images, labels = D.read_pathfinder_release(str(folder), progress=False)
    assert images.shape == (1, 32, 32) and (images == 200).all() and labels.tolist() == [1]  # 172 skipped
    (folder / "metadata" / "0.npy").write_text("imgs/0 sample_3.png\n")
    with pytest.raises(ValueError, match=r"0\.npy, line 1"):
        D.read_pathfinder_release(str(folder), progress=False)


def test_pathfinder_generator_images_labels_and_markers():
    rng = np.random.default_rng(0)
    labels = np.arange(40) % 2
    images, markers = D.pathfinder_batch(rng, labels, 32, 14)
    assert images.shape == (40, 32, 32) and images.dtype == np.uint8 and markers.shape == (40, 2, 2)
    assert (images.max((1, 2)) == 255).all()  # the markers are full white
    lit = (images > 20).mean((1, 2))
    assert (lit > 0.08).all() and (lit < 0.5).all()  # thin contours on black
    for img, m in zip(images, markers):  # each marker sits on a bright blob
        for x, y in np.rint(m).astype(int):
            assert img[y, x] > 150


def test_pathfinder_flood_fill_solver_agrees_with_labels():
    rng = np.random.default_rng(1)
    labels = rng.permutation(np.arange(200) % 2)
    images, markers = D.pathfinder_batch(rng, labels, 32, 14)
    agree = (flood_fill_connected(images, markers) == labels).mean()
    assert agree >= 0.9, agree


def assert_no_shortcut(seed, n, contour_length):
    """Neither the raw pixels nor the marker distance predict the label held out."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % 2)
    images, markers = D.pathfinder_batch(rng, labels, 32, contour_length)
    assert held_out_accuracy(images.reshape(n, -1) / 255.0, labels) <= 0.6
    dist = np.linalg.norm(markers[:, 0] - markers[:, 1], axis=1)
    assert held_out_accuracy(np.stack([dist, dist ** 2], 1) / 30, labels, lam=1e-3) <= 0.6
    return images, markers, labels


def test_pathfinder_no_linear_or_marker_distance_shortcut_baseline():
    images, markers, labels = assert_no_shortcut(seed=2, n=1200, contour_length=6)
    # and the same solver that checks the labels does see the task
    assert (flood_fill_connected(images[:300], markers[:300]) == labels[:300]).mean() >= 0.9


@pytest.mark.slow
def test_pathfinder_no_shortcut_contour_length_14():
    assert_no_shortcut(seed=3, n=2000, contour_length=14)


def test_pathfinder_generation_is_deterministic_and_worker_independent():
    a, la = D.generate_pathfinder(60, seed=5, difficulty="baseline", workers=1, progress=False)
    b, lb = D.generate_pathfinder(60, seed=5, difficulty="baseline", workers=2, progress=False)
    c, _ = D.generate_pathfinder(60, seed=6, difficulty="baseline", workers=1, progress=False)
    assert np.array_equal(a, b) and np.array_equal(la, lb) and not np.array_equal(a, c)
    assert la.sum() == 30  # balanced


def test_pathfinder_cache_reused_and_stale_or_truncated_cache_regenerated(tmp_path, monkeypatch, capsys):
    ds = D.load_task("pathfinder", "train", str(tmp_path), difficulty="baseline", n=30, progress=False)
    assert "generating PathFinder32" in capsys.readouterr().out and len(ds) == 24
    path = D.generated_pathfinder_path(str(tmp_path), 30, 0, "baseline", 32)
    assert os.path.exists(path) and os.path.exists(path + ".json")
    first = [ds[i][0] for i in range(3)]

    def refuse(*a, **k):
        raise AssertionError("regenerated although the cache is valid")

    with monkeypatch.context() as m:
        m.setattr(D, "generate_pathfinder", refuse)
        again = D.load_task("pathfinder", "train", str(tmp_path), difficulty="baseline", n=30, progress=False)
        assert all(torch.equal(x, again[i][0]) for i, x in enumerate(first))
    with open(path, "r+b") as f:  # truncated
        f.truncate(os.path.getsize(path) // 2)
    D.load_task("pathfinder", "train", str(tmp_path), difficulty="baseline", n=30, progress=False)
    assert "generating" in capsys.readouterr().out
    with open(path + ".json") as f:  # stale: written by another version
        meta = f.read()
    with open(path + ".json", "w") as f:
        f.write(meta.replace('"version": 1', '"version": 0'))
    again = D.load_task("pathfinder", "train", str(tmp_path), difficulty="baseline", n=30, progress=False)
    assert "generating" in capsys.readouterr().out
    assert all(torch.equal(x, again[i][0]) for i, x in enumerate(first))
    assert not [f for f in os.listdir(os.path.dirname(path)) if ".tmp" in f]  # atomic writes leave no temp files


def test_pathfinder_fixed_length_collate_and_facts(tmp_path):
    ds = D.load_task("pathfinder", "val", str(tmp_path), difficulty="baseline", n=40, progress=False)
    assert (ds.vocab_size, ds.n_classes, ds.max_len, ds.pad_id, ds.mask_id) == (258, 2, 1024, 256, 257)
    tokens, pad_mask, labels = ds.collate([ds[i] for i in range(len(ds))])
    assert tokens.shape == (4, 1024) and pad_mask is None and labels.shape == (4,)
    assert int(tokens.max()) <= 255


def test_pathx_is_128_by_128(tmp_path):
    images, markers = D.pathfinder_batch(np.random.default_rng(0), [0, 1], 128, 6)
    assert images.shape == (2, 128, 128) and (images.max((1, 2)) == 255).all()
    assert D.PATHFINDER_PARAMS[128]["paddle_length"] > D.PATHFINDER_PARAMS[32]["paddle_length"]


def test_sample_grid_is_written(tmp_path):
    path = D.save_sample_grid(str(tmp_path / "grid.png"), 32, per_difficulty=2)
    import matplotlib.image
    img = matplotlib.image.imread(path)
    assert img.shape[0] > 100 and img.shape[1] > 100


@pytest.mark.slow
def test_pathx_flood_fill_solver_agrees_with_labels():
    rng = np.random.default_rng(4)
    labels = rng.permutation(np.arange(100) % 2)
    images, markers = D.pathfinder_batch(rng, labels, 128, 14)
    assert (flood_fill_connected(images, markers, threshold=60, reach=6.5) == labels).mean() >= 0.9
