"""Tests for data_lra.py: every loader on tiny fixtures written in the official
formats, the two generators' faithfulness, collate, caching and error messages."""

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
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


def test_listops_file_that_is_not_utf8_names_file_and_line(tmp_path):
    folder = write_listops(tmp_path)
    (folder / "basic_train.tsv").write_bytes(b"Source\tTarget\n( [MAX 2 ] )\t2\n( [MAX \xff ] )\t3\n")
    with pytest.raises(ValueError, match=r"basic_train\.tsv, line 3: not UTF-8 text"):
        D.load_task("listops", "train", str(tmp_path), data_source="release")


def test_listops_header_only_file_names_the_file(tmp_path):
    folder = write_listops(tmp_path)
    (folder / "basic_val.tsv").write_text("Source\tTarget\n")
    with pytest.raises(ValueError, match=r"basic_val\.tsv: no rows under the header"):
        D.load_task("listops", "val", str(tmp_path), data_source="release")


@pytest.mark.parametrize("expr, value", [
    ("[MAX 2 9 ]", 9), ("[MIN 4 2 7 ]", 2), ("[MED 1 5 3 ]", 3), ("[MED 1 2 3 4 ]", 2),  # int(2.5)
    ("[MED 9 8 ]", 8), ("[SM 5 7 9 ]", 1), ("[MAX [MIN 3 5 ] [SM 9 9 ] 4 ]", 8),
    ("[MED [MAX 1 0 ] [MIN 7 9 ] [SM 2 2 ] 0 ]", 2), ("6", 6), ("[MED 3 6 ]", 4), ("[MED 0 1 8 9 ]", 4),
    ("[SM 8 8 8 ]", 4), ("[MED [SM 9 2 ] [MAX 1 ] 5 ]", 1)])
def test_listops_evaluator_on_hand_written_expressions(expr, value):
    assert D.listops_value(expr.split()) == value


def test_listops_evaluator_takes_any_depth():
    assert D.listops_value(("[SM " * 5000 + "7" + " ]" * 5000).split()) == 7  # deeper than Python's recursion limit


def test_listops_evaluator_rejects_broken_expressions():
    for broken in ("[MAX 2 9", "2 3", "]", "[MAX ]", "[FOO 1 ]", "", "[MAX 2 ] ]", "[SM 12 ]"):
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
    assert ds.source.startswith("generated cache ") and "100 expressions" in ds.source
    tsv = os.path.join(D.generated_listops_dir(str(tmp_path), 100, 0), "listops-1000", "basic_train.tsv")
    with open(tsv) as f:
        assert f.readline() == "Source\tTarget\n"
    with open(tsv, "r+") as f:  # cut the cache short: it is detected and regenerated
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
    with pytest.raises(ValueError, match="data_batch_3: refusing to load global .*system"):
        D.load_task("image", "train", str(tmp_path))
    assert not witness.exists()


def test_cifar_grey_rounds_as_tensorflow():
    """tf.image.rgb_to_grayscale on uint8 truncates grey * 255.5; rounding grey * 255 differs."""
    rgb = np.zeros((1, 3, 1024), np.uint8)
    rgb[0, 1] = 255  # pure green: 0.587 * 255.5 = 149.98 -> 149 (rint(0.587 * 255) would be 150)
    rgb[0, :, :1] = 255  # white: 0.9999 * 255.5 -> 255
    grey = D.tf_grey(rgb)
    assert grey[0, 0] == 255 and (grey[0, 1:] == 149).all()


def test_cifar_truncated_pickle_names_the_file(tmp_path):
    folder = write_cifar(tmp_path)
    data = (folder / "data_batch_2").read_bytes()
    (folder / "data_batch_2").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"data_batch_2: truncated or not a CIFAR-10 pickle"):
        D.load_task("image", "train", str(tmp_path))
    (folder / "data_batch_2").write_bytes(b"")
    with pytest.raises(ValueError, match=r"data_batch_2: truncated"):
        D.load_task("image", "train", str(tmp_path))


def test_cifar_nested_lists_are_refused_before_they_expand(tmp_path):
    folder = write_cifar(tmp_path)
    x = [1.0] * 16
    for _ in range(4):
        x = [x] * 16  # 16^5 = 1M floats from a pickle of a few hundred bytes (shared references)
    with open(folder / "data_batch_4", "wb") as f:
        pickle.dump({b"labels": [0], b"data": x}, f, protocol=2)
    assert os.path.getsize(folder / "data_batch_4") < 400
    with pytest.raises(ValueError, match=r"data_batch_4: 'data' must be a uint8 array of shape \(N, 3072\), got a list"):
        D.load_task("image", "train", str(tmp_path))


def test_cifar_labels_must_match_the_images(tmp_path):
    folder = write_cifar(tmp_path)
    with open(folder / "data_batch_5", "wb") as f:
        pickle.dump({b"labels": [0, 12], b"data": np.zeros((2, 3072), np.uint8)}, f, protocol=2)
    with pytest.raises(ValueError, match=r"data_batch_5: 'labels' must be a flat list of 2 ints 0-9"):
        D.load_task("image", "train", str(tmp_path))


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
    with pytest.raises(TypeError, match="unknown option.*max_len"):           # fixed length: no max_len
        D.load_task("pathfinder", "train", str(tmp_path), max_len=2000)
    with pytest.raises(ValueError, match="unknown difficulty"):
        D.load_task("pathfinder", "train", str(tmp_path), difficulty="hard")


@pytest.mark.parametrize("argv, words", [
    (["--bogus=1"], "unknown key --bogus"), (["--n=many"], "--n=many: expected an integer"),
    (["--n=-5"], r"--n=-5 must be in \[0, 2\*\*31\)"), (["--resolution=7"], "resolution must be one of"),
    (["--difficulty=bogus"], "unknown difficulty 'bogus'"), (["--seed=-1"], "--seed=-1 must be in"),
    (["--task=text", "--generate"], "--generate is for listops"), (["--task=listops", "--grid"], "--grid for path"),
])
def test_cli_rejects_unknown_keys_and_bad_values(argv, words):
    with pytest.raises(ValueError, match=words):
        D.parse_args(argv)


def test_cli_errors_are_one_line(tmp_path):
    for argv, words in ((["--difficulty=bogus"], "unknown difficulty"),
                        (["--task=text", f"--data_dir={tmp_path}"], "aclImdb")):
        proc = subprocess.run([sys.executable, "data_lra.py", *argv], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().startswith("error: ") and words in proc.stderr


def test_cli_accepts_good_values():
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
    images, labels, margins = D.ensure_pathfinder(str(tmp_path), n=40, seed=0, difficulty="baseline",
                                                  progress=False, with_margins=True)
    folder = D.pathfinder_folder(str(tmp_path), 32, "baseline")
    D.export_pathfinder_lra(folder, images, labels, margins, batch_size=15, contour_length=6)
    assert sorted(os.listdir(os.path.join(folder, "metadata"))) == ["0.npy", "1.npy", "2.npy"]
    # as snakes2.py: each batch numbers its samples from 0, and the margin column is the image's own
    assert sorted(os.listdir(os.path.join(folder, "imgs", "2"))) == [f"sample_{i}.png" for i in range(10)]
    with open(os.path.join(folder, "metadata", "1.npy")) as f:
        first = f.readline().split()
    assert first[:4] == ["imgs/1", "sample_0.png", "0", str(labels[15])] and first[9] == str(margins[15])
    for split in ("train", "val", "test"):
        gen = D.load_task("pathfinder", split, str(tmp_path), difficulty="baseline", n=40, data_source="generated", progress=False)
        rel = D.load_task("pathfinder", split, str(tmp_path), difficulty="baseline", data_source="release", progress=False)
        assert len(gen) == len(rel) > 0
        for i in range(len(gen)):
            assert torch.equal(gen[i][0], rel[i][0]) and gen[i][1] == rel[i][1]


def test_pathfinder_export_writes_each_images_margin_at_128():
    margins = np.array([2, 3, 3])
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        D.export_pathfinder_lra(d, np.zeros((3, 128, 128), np.uint8), np.array([0, 1, 0]), margins, resolution=128)
        with open(os.path.join(d, "metadata", "0.npy")) as f:
            assert [line.split()[9] for line in f] == ["2", "3", "3"]


def test_pathfinder_release_decoded_once_then_cached(tmp_path, monkeypatch):
    images, labels = D.ensure_pathfinder(str(tmp_path), n=20, seed=0, difficulty="baseline", progress=False)
    D.export_pathfinder_lra(D.pathfinder_folder(str(tmp_path), 32, "baseline"), images, labels, contour_length=6)
    first = D.load_task("pathfinder", "train", str(tmp_path), difficulty="baseline", progress=False)  # auto: release

    def refuse(*a, **k):
        raise AssertionError("decoded the PNGs again")

    monkeypatch.setattr(D, "read_pathfinder_release", refuse)
    again = D.load_task("pathfinder", "train", str(tmp_path), difficulty="baseline", progress=False)
    assert len(first) == len(again) == 16 and torch.equal(first[0][0], again[0][0])
    monkeypatch.undo()


def test_pathfinder_release_cache_sees_a_replaced_png(tmp_path):
    """Same name, same size, even the same modification time: the new pixels are read."""
    from PIL import Image
    folder = write_release(tmp_path, [(i, i % 2, grey(10 * i + 5)) for i in range(10)])
    before = D.load_task("pathfinder", "train", str(tmp_path), difficulty="baseline", progress=False)
    png = folder / "imgs" / "0" / "sample_0.png"
    st = os.stat(png)
    Image.fromarray(grey(200), mode="L").save(png)
    os.utime(png, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = D.load_task("pathfinder", "train", str(tmp_path), difficulty="baseline", progress=False)
    assert not torch.equal(torch.stack([after[i][0] for i in range(len(after))]),
                           torch.stack([before[i][0] for i in range(len(before))]))


def write_release(root, rows, resolution=32, difficulty="curv_baseline"):
    """A release folder with one metadata file; rows: (index, label, image or bytes or None)."""
    from PIL import Image
    folder = root / f"pathfinder{resolution}" / difficulty
    (folder / "imgs" / "0").mkdir(parents=True, exist_ok=True)
    (folder / "metadata").mkdir(exist_ok=True)
    lines = []
    for i, label, content in rows:
        target = folder / "imgs" / "0" / f"sample_{i}.png"
        if isinstance(content, bytes):
            target.write_bytes(content)
        elif content is not None:
            Image.fromarray(content, mode="L").save(target)
        lines.append(f"imgs/0 sample_{i}.png {i} {label} 1.0 6 2 2 0.5 1 1")
    (folder / "metadata" / "0.npy").write_text("\n".join(lines) + "\n")
    return folder


def grey(value, size=32):
    return np.full((size, size), value, np.uint8)


def test_pathfinder_release_reader_greyscale_png_skip_empty_and_malformed(tmp_path, capsys):
    folder = write_release(tmp_path, [(3, 1, grey(200)), (172, 0, grey(0)), (5, 0, b"")])
    images, labels = D.read_pathfinder_release(str(folder), progress=False)
    assert images.shape == (1, 32, 32) and (images == 200).all() and labels.tolist() == [1]  # 172 and the empty one skipped
    assert "skipped 1 empty" in capsys.readouterr().out
    (folder / "metadata" / "0.npy").write_text("imgs/0 sample_3.png\n")
    with pytest.raises(ValueError, match=r"0\.npy, line 1"):
        D.read_pathfinder_release(str(folder), progress=False)


def test_pathfinder_known_empty_image_is_skipped_only_at_32(tmp_path):
    folder = write_release(tmp_path, [(3, 1, grey(200, 128)), (172, 0, grey(9, 128))], resolution=128)
    images, labels = D.read_pathfinder_release(str(folder), progress=False)
    assert labels.tolist() == [1, 0] and images[1].max() == 9


def test_pathfinder_label_other_than_0_or_1_is_refused(tmp_path):
    folder = write_release(tmp_path, [(3, 1, grey(200)), (4, 2, grey(200))])
    with pytest.raises(ValueError, match=r"0\.npy, line 2: label 2 is not 0 or 1"):
        D.read_pathfinder_release(str(folder), progress=False)


def test_pathfinder_wrong_size_and_mixed_sizes_are_refused(tmp_path):
    folder = write_release(tmp_path, [(3, 1, grey(200, 64))])
    with pytest.raises(ValueError, match=r"sample_3\.png: image is 64x64, expected 32x32"):
        D.read_pathfinder_release(str(folder), progress=False)
    write_release(tmp_path / "x", [(3, 1, grey(200, 32)), (4, 0, grey(200, 40))])
    os.rename(tmp_path / "x" / "pathfinder32", tmp_path / "x" / "unnamed")  # the folder no longer says 32
    with pytest.raises(ValueError, match=r"sample_4\.png: image is 40x40, expected 32x32"):   # the first image's
        D.read_pathfinder_release(str(tmp_path / "x" / "unnamed" / "curv_baseline"), progress=False)


def test_pathfinder_truncated_png_names_the_file(tmp_path):
    import io
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(grey(200), mode="L").save(buf, format="png")
    folder = write_release(tmp_path, [(3, 1, buf.getvalue()[:40])])
    with pytest.raises(ValueError, match=r"sample_3\.png: not a readable PNG"):
        D.read_pathfinder_release(str(folder), progress=False)


def test_pathfinder_cache_reused_and_a_cut_cache_named_and_made_again(tmp_path, monkeypatch, capsys):
    ds = D.load_task("pathfinder", "train", str(tmp_path), difficulty="baseline", n=30, progress=False)
    assert "generating PathFinder32" in capsys.readouterr().out and len(ds) == 24
    path = D.generated_pathfinder_path(str(tmp_path), 30, 0, "baseline", 32)
    assert ds.source == f"generated cache {path}, 30 images" and not os.path.exists(path + ".parts")
    made = open(path, "rb").read()

    def refuse(*a, **k):
        raise AssertionError("regenerated although the cache is valid")

    with monkeypatch.context() as m:
        m.setattr(D, "generate_pathfinder", refuse)
        again = D.load_task("pathfinder", "train", str(tmp_path), difficulty="baseline", n=30, progress=False)
        assert all(torch.equal(ds[i][0], again[i][0]) for i in range(3))
    for cut in (len(made) // 2, len(made) - 10):        # cut short: its zip directory is gone or broken
        open(path, "wb").write(made[:cut])
        D.load_task("pathfinder", "train", str(tmp_path), difficulty="baseline", n=30, progress=False)
        out = capsys.readouterr().out
        assert f"{path} is cut or damaged" in out and "generating" in out
        assert open(path, "rb").read() == made           # made again, the same bytes
    damaged = bytearray(made)
    damaged[len(made) // 2] ^= 1                         # one pixel flipped: the zip's checksum fails
    open(path, "wb").write(bytes(damaged))
    D.load_task("pathfinder", "train", str(tmp_path), difficulty="baseline", n=30, progress=False)
    assert "is cut or damaged" in capsys.readouterr().out and open(path, "rb").read() == made
    assert not [f for f in os.listdir(os.path.dirname(path)) if ".tmp" in f]  # atomic writes leave no temp files


def test_interrupted_generation_continues_from_the_finished_chunks(tmp_path, monkeypatch, capsys):
    """Ctrl-C after 2 of 4 chunks: those 2 stay in <cache>.parts/, the same call again makes only
    the other 2, and the cache is the same file, byte for byte, as one made without a stop."""
    whole = D.ensure_pathfinder(str(tmp_path / "whole"), n=1000, seed=2, difficulty="baseline", progress=False)
    path = D.generated_pathfinder_path(str(tmp_path / "cut"), 1000, 2, "baseline", 32)
    real, made = D._pathfinder_chunk, []

    def chunk(job):
        if len(made) == 2:
            raise KeyboardInterrupt
        made.append(job[1])
        return real(job)
    monkeypatch.setattr(D, "_pathfinder_chunk", chunk)
    monkeypatch.setattr(D.os, "cpu_count", lambda: 1)       # in this process, so the patch is seen
    with pytest.raises(KeyboardInterrupt):
        D.ensure_pathfinder(str(tmp_path / "cut"), n=1000, seed=2, difficulty="baseline", progress=False)
    assert sorted(os.listdir(path + ".parts")) == ["chunk_00000.npz", "chunk_00001.npz"] and not os.path.exists(path)
    assert "interrupted; 2 of 4 chunks are kept" in capsys.readouterr().out
    made.clear()
    monkeypatch.setattr(D, "_pathfinder_chunk", lambda job: made.append(job[1]) or real(job))
    again = D.ensure_pathfinder(str(tmp_path / "cut"), n=1000, seed=2, difficulty="baseline", progress=False)
    assert made == [2, 3] and "2 of 4 chunks found on disk" in capsys.readouterr().out
    assert all(np.array_equal(a, b) for a, b in zip(whole, again)) and not os.path.exists(path + ".parts")
    assert open(path, "rb").read() == open(D.generated_pathfinder_path(str(tmp_path / "whole"), 1000, 2, "baseline",
                                                                      32), "rb").read()


def test_two_processes_building_one_cache_at_once_end_with_one_correct_cache(tmp_path):
    code = ("import sys, hashlib; sys.path.insert(0, sys.argv[1]); import data_lra; "
            "x = data_lra.ensure_pathfinder(sys.argv[2], n=300, seed=4, difficulty='baseline', progress=False); "
            "print(hashlib.sha256(x[0].tobytes() + x[1].tobytes()).hexdigest())")
    procs = [subprocess.Popen([sys.executable, "-c", code, ROOT, str(tmp_path)], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].splitlines() for p in procs]
    assert all(p.returncode == 0 for p in procs) and outs[0][-1] == outs[1][-1]
    assert sum("generating" in line for out in outs for line in out) == 1          # made once, read by the other
    images, labels = D.generate_pathfinder(300, seed=4, difficulty="baseline", progress=False)[:2]
    cached = D.ensure_pathfinder(str(tmp_path), n=300, seed=4, difficulty="baseline", progress=False)
    assert np.array_equal(cached[0], images) and np.array_equal(cached[1], labels)


def test_n_means_generated_data_and_source_says_which(tmp_path):
    """Asking for n images means generated data, even when release files are there; with
    data_source='release' it is one line; without n, 'auto' reads the release."""
    images, labels = D.ensure_pathfinder(str(tmp_path), n=20, seed=0, difficulty="baseline", progress=False)
    D.export_pathfinder_lra(D.pathfinder_folder(str(tmp_path), 32, "baseline"), images, labels, contour_length=6)
    gen = D.load_task("pathfinder", "train", str(tmp_path), difficulty="baseline", n=30, progress=False)
    assert len(gen) == 24 and gen.source.startswith("generated cache ") and gen.source.endswith("30 images")
    rel = D.load_task("pathfinder", "train", str(tmp_path), difficulty="baseline", progress=False)
    assert len(rel) == 16 and rel.source.startswith("release files under ") and "20 images" in rel.source
    with pytest.raises(ValueError, match=r"n=30 \(--n_generate\) asks for generated data, but data_source='release'"):
        D.load_task("pathfinder", "train", str(tmp_path), difficulty="baseline", n=30, data_source="release")
    write_listops(tmp_path)
    assert len(D.load_task("listops", "val", str(tmp_path))) == 3                  # the release
    ds = D.load_task("listops", "train", str(tmp_path), n=100, progress=False)     # n: generated
    assert len(ds) == 96 and ds.source.startswith("generated cache ") and "100 expressions" in ds.source
    with pytest.raises(ValueError, match="asks for generated data"):
        D.load_task("listops", "train", str(tmp_path), n=100, data_source="release")


def make_cache(kind, data_dir):
    """Make (or read) one cache of each kind through its own function: PathFinder, ListOps,
    the stdlib corpus of train_flt.py."""
    import corpora
    if kind == "pathfinder":
        return D.ensure_pathfinder(data_dir, n=40, difficulty="baseline", progress=False)[0]
    if kind == "listops":
        return open(os.path.join(D.ensure_listops(data_dir, n=50, progress=False), "listops-1000",
                                 "basic_train.tsv")).read()
    return corpora.prepare_stdlib(data_dir)[0]


@pytest.mark.parametrize("kind", ["pathfinder", "listops", "stdlib"])
def test_two_makers_of_one_cache_at_once_make_it_once(tmp_path, monkeypatch, kind):
    """Two processes asking for one cache at once: the second waits for the first, then reads
    its files, so the cache is made once and both get the same data. (Two threads here: the
    lock is an flock, which two open files of one process contend for as two processes do.)"""
    import threading
    import corpora
    made, inside, go_on = [], threading.Event(), threading.Event()

    def maker(real):
        def slow(*a, **k):
            made.append(1)
            inside.set()
            go_on.wait(20)                                   # the first maker is still at work
            return real(*a, **k)
        return slow
    monkeypatch.setattr(D, "generate_pathfinder", maker(D.generate_pathfinder))
    monkeypatch.setattr(D, "generate_listops", maker(D.generate_listops))
    monkeypatch.setattr(corpora, "stdlib_docstrings", maker(lambda root=None: ["a docstring"] * 400))
    got = []
    first = threading.Thread(target=lambda: got.append(make_cache(kind, str(tmp_path))))
    second = threading.Thread(target=lambda: got.append(make_cache(kind, str(tmp_path))))
    first.start()
    assert inside.wait(20)
    second.start()
    second.join(0.5)                                         # it waits for the first maker's lock
    go_on.set()
    first.join(20), second.join(20)
    assert len(made) == 1 and len(got) == 2 and np.array_equal(np.asarray(got[0]), np.asarray(got[1]))


def test_pathfinder_cache_name_changes_with_the_generator_version(monkeypatch):
    old = D.generated_pathfinder_path("data", 10, 0, "baseline", 32)
    monkeypatch.setattr(D.pathfinder, "VERSION", D.pathfinder.VERSION + 1)
    new = D.generated_pathfinder_path("data", 10, 0, "baseline", 32)
    assert new != old and f"-v{D.pathfinder.VERSION}-" in new  # an older generator's cache is never read as new


def test_pathfinder_generation_is_deterministic_and_worker_independent():
    a, la, ma = D.generate_pathfinder(60, seed=5, difficulty="baseline", workers=1, progress=False)
    b, lb, mb = D.generate_pathfinder(60, seed=5, difficulty="baseline", workers=2, progress=False)
    c, _, _ = D.generate_pathfinder(60, seed=6, difficulty="baseline", workers=1, progress=False)
    assert np.array_equal(a, b) and np.array_equal(la, lb) and np.array_equal(ma, mb) and not np.array_equal(a, c)
    assert 10 < la.sum() < 50 and set(ma) == {1}  # labels drawn at random, as the original


def test_pathfinder_fixed_length_collate_and_facts(tmp_path):
    ds = D.load_task("pathfinder", "val", str(tmp_path), difficulty="baseline", n=40, progress=False)
    assert (ds.vocab_size, ds.n_classes, ds.max_len, ds.pad_id, ds.mask_id) == (258, 2, 1024, 256, 257)
    tokens, pad_mask, labels = ds.collate([ds[i] for i in range(len(ds))])
    assert tokens.shape == (4, 1024) and pad_mask is None and labels.shape == (4,)
    assert int(tokens.max()) <= 255


def test_sample_grid_is_written(tmp_path):
    path = D.save_sample_grid(str(tmp_path / "grid.png"), 32, per_difficulty=2)
    import matplotlib.image
    img = matplotlib.image.imread(path)
    assert img.shape[0] > 100 and img.shape[1] > 100


def test_an_empty_release_and_empty_listops_rows_are_named(tmp_path):
    folder = write_release(tmp_path, [(5, 0, b"")])
    with pytest.raises(ValueError, match="lists no readable images"):
        D.read_pathfinder_release(str(folder), progress=False)
    path = tmp_path / "basic_train.tsv"
    path.write_text("Source\tTarget\n( )\t3\n")
    with pytest.raises(ValueError, match=r"basic_train\.tsv, line 2: an expression with no tokens"):
        D.read_listops_tsv(str(path))


def test_photos_are_grey_crops_of_a_photograph_not_contours():
    """--pretrain_task=photos: 256-level crops of matplotlib's sample photograph, the
    same every time, in PathFinder's 80/10/10 split sizes, one class."""
    train, val = D.load_task("photos", "train", n=200), D.load_task("photos", "val", n=200)
    assert (len(train), len(val), train.n_classes, train.max_len) == (160, 20, 1, 1024)
    assert (train.vocab_size, train.pad_id, train.mask_id) == (D.BYTE_VOCAB, D.BYTE_PAD, D.BYTE_MASK)
    crops = D.photo_crops(50, seed=0)
    assert crops.shape == (50, 1024) and crops.dtype == np.uint8
    assert np.array_equal(crops, D.photo_crops(50, seed=0)) and not np.array_equal(crops, D.photo_crops(50, seed=1))
    levels = [len(np.unique(c)) for c in crops]
    assert np.median(levels) > 40                           # shades of grey, not PathFinder's dark field + strokes
    near = np.abs(np.diff(crops.reshape(50, 32, 32).astype(float), axis=2)).mean()
    far = np.abs(crops.reshape(50, 32, 32)[:, :, 16:].astype(float) - crops.reshape(50, 32, 32)[:, :, :16]).mean()
    assert near < far / 2                                   # a photograph: neighbouring pixels alike
