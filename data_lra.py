"""
Long Range Arena (Tay et al., 2021) data: five tasks, read from the official
files, plus offline generators for the two procedural ones.

    task        input                          classes  length   split sizes
    listops     nested [MIN [MAX [MED [SM ]    10       <= 2000  96k / 2k / 2k
    text        IMDb review, bytes             2        4096     25k / 25k(test=val) / 25k
    retrieval   two AAN papers, bytes each     2        4000 x2  release sizes
    image       CIFAR-10 in grey, pixels       10       1024     45k / 5k / 10k
    pathfinder  32x32 "snakes" image, pixels   2        1024     80 / 10 / 10 %
    pathx       the same at 128x128            2        16384    80 / 10 / 10 %

Every example is a sequence of integer tokens and an int label; no [CLS] token
is added (the model pools). Vocabularies (pad and mask are reserved ids):

    pixels and bytes   0..255, pad=256, mask=257           vocab 258
    listops            digits 0..9 are ids 0..9, [MIN=10 [MAX=11 [MED=12
                       [SM=13 ]=14, pad=15, mask=16        vocab 17

Files, read exactly as released (data_dir defaults to ./data):

    listops-1000/basic_{train,val,test}.tsv      header Source<TAB>Target
    aclImdb/{train,test}/{pos,neg}/*.txt         (IMDb, test doubles as val)
    new_aan_pairs.{train,eval,test}.tsv          label id1 id2 text1 text2
    cifar-10-batches-py/data_batch_1..5, test_batch   (python pickles)
    pathfinder32/curv_contour_length_14/{imgs/<b>/sample_<i>.png, metadata/<b>.npy}

ListOps and PathFinder are procedurally generated datasets, so when their files
are missing they are generated (faithful re-implementations of the LRA ListOps
script, here, and of Linsley et al.'s "snakes" PathFinder generator, in
pathfinder.py), cached under data_dir keyed on the generator's version, and
loaded through the same readers as the release.

Bad files are refused with one line naming the file and what is wrong: rows that
do not parse, labels out of range, PathFinder image paths that leave the data
folder, images of the wrong size, unreadable PNGs, CIFAR pickles that are
truncated, too large, name any callable, or are not the expected arrays.

    ds = load_task("pathfinder", "train", data_dir="data")
    tokens, label = ds[0]
    tokens, pad_mask, labels = ds.collate([ds[0], ds[1]])

Command line:
    python data_lra.py --task=listops --generate
    python data_lra.py --task=pathfinder --generate --difficulty=baseline --n=2000 --grid
    python data_lra.py --task=pathfinder --generate --format=lra   (PNG + metadata)
"""

import contextlib
import errno
import fcntl
import hashlib
import io
import json
import os
import pickle
import sys
import time

import numpy as np
import torch

import pathfinder

# -----------------------------------------------------------------------------
# vocabularies

BYTE_PAD, BYTE_MASK, BYTE_VOCAB = 256, 257, 258  # pixels and bytes
LISTOPS_TOKENS = [str(d) for d in range(10)] + ["[MIN", "[MAX", "[MED", "[SM", "]"]
LISTOPS_ID = {t: i for i, t in enumerate(LISTOPS_TOKENS)}
LISTOPS_PAD, LISTOPS_MASK, LISTOPS_VOCAB = 15, 16, 17

TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")
SPLITS = ("train", "val", "test")
SOURCES = (
    "ListOps, AAN retrieval, PathFinder: the LRA release lra_release.gz "
    "(github.com/google-research/long-range-arena); CIFAR-10: the python version "
    "cifar-10-python.tar.gz (www.cs.toronto.edu/~kriz/cifar.html); IMDb: aclImdb_v1.tar.gz "
    "(ai.stanford.edu/~amaas/data/sentiment). ListOps and PathFinder need no download: "
    "--task=listops|pathfinder generate them offline (data_source='generated' or 'auto')."
)


# -----------------------------------------------------------------------------
# the dataset every loader returns


class LRADataset(torch.utils.data.Dataset):
    """Token sequences and int labels, plus the facts a model needs.

    sequences: a uint8 array (N, L) for fixed-length tasks, a list of 1-D integer
    arrays for variable-length ones, or a list of (doc1, doc2) for retrieval.
    """

    def __init__(self, task, split, sequences, labels, vocab_size, n_classes, max_len, pad_id, mask_id):
        assert len(sequences) == len(labels), (len(sequences), len(labels))
        self.task, self.split = task, split
        self.sequences, self.labels = sequences, np.asarray(labels, dtype=np.int64)
        self.vocab_size, self.n_classes, self.max_len = vocab_size, n_classes, max_len
        self.pad_id, self.mask_id = pad_id, mask_id

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        x = self.sequences[i]
        if isinstance(x, tuple):  # retrieval: the two documents, padded to a common length
            L = max(len(x[0]), len(x[1]))
            tokens = torch.full((2, L), self.pad_id, dtype=torch.long)
            for j, doc in enumerate(x):
                tokens[j, : len(doc)] = torch.from_numpy(doc.astype(np.int64))
        else:
            tokens = torch.from_numpy(np.asarray(x, dtype=np.int64))
        return tokens, int(self.labels[i])

    def collate(self, items):
        """-> tokens (B, T) or (B, 2, T) padded with pad_id, pad_mask (True at padding)
        or None when nothing is padded, labels (B,)."""
        seqs = [t for t, _ in items]
        T = max(s.shape[-1] for s in seqs)
        tokens = torch.full((len(seqs), *seqs[0].shape[:-1], T), self.pad_id, dtype=torch.long)
        for i, s in enumerate(seqs):
            tokens[i, ..., : s.shape[-1]] = s
        pad_mask = tokens == self.pad_id  # pad_id is reserved, so this marks exactly the padding
        labels = torch.tensor([y for _, y in items], dtype=torch.long)
        return tokens, (pad_mask if pad_mask.any() else None), labels


def _byte_dataset(task, split, sequences, labels, n_classes, max_len):
    return LRADataset(task, split, sequences, labels, BYTE_VOCAB, n_classes, max_len, BYTE_PAD, BYTE_MASK)


# -----------------------------------------------------------------------------
# finding files, clear errors


def _find(data_dir, relpath):
    """The released archive nests folders (lra_release/...); accept those too."""
    for root in ("", "lra_release", os.path.join("lra_release", "lra_release"), os.path.join("lra_release", "tsv_data")):
        p = os.path.join(data_dir, root, relpath)
        if os.path.exists(p):
            return p
    return None


def _missing(what, path):
    return FileNotFoundError(f"{what}: expected {path} (not found). Where the files come from: {SOURCES}")


def _malformed(path, lineno, why):
    return ValueError(f"{path}, line {lineno}: {why}")


# -----------------------------------------------------------------------------
# ListOps: reading the TSV


def listops_tokenize(source, path="<string>", lineno=0):
    """'( ( [MAX 2 ) 9 ] )' -> ids: delete ( and ), split on whitespace."""
    words = source.replace("(", " ").replace(")", " ").split()
    try:
        return np.array([LISTOPS_ID[w] for w in words], dtype=np.uint8)
    except KeyError as e:
        raise _malformed(path, lineno, f"unknown ListOps token {e.args[0]!r}") from None


def read_listops_tsv(path, max_len=2000):
    """-> (list of uint8 id arrays, labels). Header Source<TAB>Target, label 0..9."""
    seqs, labels = [], []
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    for lineno, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError:
            raise _malformed(path, lineno, "not UTF-8 text") from None
        if lineno == 1:
            if line.split("\t") != ["Source", "Target"]:
                raise _malformed(path, 1, f"expected the header 'Source<TAB>Target', got {line[:60]!r}")
            continue
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) != 2 or not fields[1].strip().isdigit() or not 0 <= int(fields[1]) <= 9:
            raise _malformed(path, lineno, "expected '<expression><TAB><label 0-9>'")
        tokens = listops_tokenize(fields[0], path, lineno)[:max_len]
        if len(tokens) == 0:
            raise _malformed(path, lineno, "an expression with no tokens")
        seqs.append(tokens)
        labels.append(int(fields[1]))
    if not seqs:
        raise ValueError(f"{path}: has the header but no rows")
    return seqs, labels


def load_listops(split, data_dir, max_len=2000):
    fname = {"train": "basic_train.tsv", "val": "basic_val.tsv", "test": "basic_test.tsv"}[split]
    path = _find(data_dir, os.path.join("listops-1000", fname))
    if path is None:
        raise _missing("ListOps", os.path.join(data_dir, "listops-1000", fname))
    seqs, labels = read_listops_tsv(path, max_len)
    return LRADataset("listops", split, seqs, labels, LISTOPS_VOCAB, 10, max_len, LISTOPS_PAD, LISTOPS_MASK)


# -----------------------------------------------------------------------------
# Text: IMDb reviews, byte level


def load_text(split, data_dir, max_len=4096):
    sub = "train" if split == "train" else "test"  # LRA: the test set doubles as validation
    root = os.path.join(data_dir, "aclImdb", sub)
    seqs, labels = [], []
    for label, polarity in ((0, "neg"), (1, "pos")):
        folder = os.path.join(root, polarity)
        if not os.path.isdir(folder):
            raise _missing("IMDb (text task)", folder)
        for name in sorted(os.listdir(folder)):
            if name.endswith(".txt"):
                with open(os.path.join(folder, name), "rb") as f:
                    seqs.append(np.frombuffer(f.read()[:max_len], dtype=np.uint8))
                labels.append(label)
    return _byte_dataset("text", split, seqs, labels, 2, max_len)


# -----------------------------------------------------------------------------
# Retrieval: AAN paper pairs, byte level


def read_aan_tsv(path, max_len=4000):
    """No header; columns label id1 id2 text1 text2 (tab separated, no quoting)."""
    pairs, labels = [], []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.rstrip(b"\r\n")
            if not line:
                continue
            fields = line.split(b"\t")
            if len(fields) != 5:
                raise _malformed(path, lineno, f"expected 5 tab-separated columns (label id1 id2 text1 text2), got {len(fields)}")
            try:
                label = int(float(fields[0]))
            except ValueError:
                raise _malformed(path, lineno, f"label {fields[0][:20]!r} is not a number") from None
            if label not in (0, 1):
                raise _malformed(path, lineno, f"label {label} is not 0 or 1")
            doc = lambda b: np.frombuffer(b[:max_len], dtype=np.uint8)
            pairs.append((doc(fields[3]), doc(fields[4])))
            labels.append(label)
    return pairs, labels


def load_retrieval(split, data_dir, max_len=4000):
    fname = f"new_aan_pairs.{ {'train': 'train', 'val': 'eval', 'test': 'test'}[split] }.tsv"
    path = _find(data_dir, fname)
    if path is None:
        raise _missing("AAN (retrieval task)", os.path.join(data_dir, fname))
    pairs, labels = read_aan_tsv(path, max_len)
    return _byte_dataset("retrieval", split, pairs, labels, 2, max_len)


# -----------------------------------------------------------------------------
# Image: CIFAR-10 in grey, read with a restricted unpickler


class RestrictedUnpickler(pickle.Unpickler):
    """Admits numpy array reconstruction and builtin containers only, so a
    tampered pickle cannot name (and so cannot run) any other callable, e.g. os.system."""

    _array = np.zeros(1).__reduce__()[0]  # numpy's _reconstruct (numpy.core or numpy._core)
    _scalar = np.float32(0).__reduce__()[0]  # numpy's scalar rebuilder
    ALLOWED = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}
    _frombuffer = np.zeros(1).__reduce_ex__(5)[0]  # protocol 5 array rebuilder
    for _m in ("numpy.core.multiarray", "numpy._core.multiarray"):
        ALLOWED[(_m, "_reconstruct")], ALLOWED[(_m, "scalar")] = _array, _scalar
    for _m in ("numpy.core.numeric", "numpy._core.numeric"):
        ALLOWED[(_m, "_frombuffer")] = _frombuffer
    # python 3 writes bytes into protocol-2 pickles as _codecs.encode(text, "latin1")
    ALLOWED[("_codecs", "encode")] = lambda text, codec="latin1": text.encode(
        codec if codec in ("latin1", "latin-1") else "refused codec")
    for _m in ("builtins", "__builtin__"):  # python 3 and python 2 names
        for _c in (dict, list, tuple, set, frozenset, bytearray):
            ALLOWED[(_m, _c.__name__)] = _c

    def __init__(self, file, limit, **kwargs):
        super().__init__(file, **kwargs)
        self.limit = limit                  # bytes in the file: no array made here may claim more

    def find_class(self, module, name):
        obj = self.ALLOWED.get((module, name))
        if obj is None:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name} from a data file")
        if obj is np.ndarray:
            return self._ndarray
        if obj is self._array:
            return lambda cls, *args: self._array(np.ndarray if cls == self._ndarray else cls, *args)
        return obj

    def _ndarray(self, shape, dtype=float, *args, **kwargs):
        """np.ndarray(shape, dtype), refused when it claims more bytes than the file holds."""
        size = int(np.prod(np.asarray(shape, dtype=object))) * np.dtype(dtype).itemsize
        if size > self.limit:
            raise pickle.UnpicklingError(f"refusing an array of {size:,} bytes from a file of {self.limit:,}")
        return np.ndarray(shape, dtype, *args, **kwargs)


MAX_CIFAR_BYTES = 64 << 20  # a CIFAR-10 python batch is 31 MB


def read_cifar_batch(path):
    """-> (uint8 grey images (N, 1024), labels). Rows are 1024 R, 1024 G, 1024 B.
    Bounded: the file's size, and its shape (a dict whose 'data' is a uint8 array (N, 3072) and
    'labels' a flat list of N ints), so nested lists cannot expand into gigabytes."""
    size = os.path.getsize(path)
    if size > MAX_CIFAR_BYTES:
        raise ValueError(f"{path}: {size} bytes, more than the {MAX_CIFAR_BYTES} a CIFAR-10 batch needs; not unpickled")
    with open(path, "rb") as f:
        try:
            d = RestrictedUnpickler(f, size, encoding="bytes").load()
        except pickle.UnpicklingError as e:
            why = str(e) if str(e).startswith("refusing") else f"truncated or not a CIFAR-10 pickle ({e})"
            raise ValueError(f"{path}: {why}") from None
        except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, OverflowError) as e:
            raise ValueError(f"{path}: truncated or not a CIFAR-10 pickle ({type(e).__name__}: {e})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path}: expected a dict, got {type(d).__name__}")
    d = {k.decode() if isinstance(k, bytes) else k: v for k, v in d.items()}
    if "data" not in d or "labels" not in d:
        raise ValueError(f"{path}: expected keys 'data' and 'labels', got {sorted(map(str, d))}")
    data, labels = d["data"], d["labels"]
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2 and data.shape[1] == 3072):
        what = f"{data.dtype} array {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise ValueError(f"{path}: 'data' must be a uint8 array of shape (N, 3072), got a {what}")
    if not (isinstance(labels, (list, np.ndarray)) and len(labels) == len(data)
            and all(isinstance(y, (int, np.integer)) and 0 <= y <= 9 for y in labels)):
        raise ValueError(f"{path}: 'labels' must be a flat list of {len(data)} ints 0-9")
    return tf_grey(data.reshape(-1, 3, 1024)), np.asarray(labels, dtype=np.int64)


def tf_grey(rgb):
    """uint8 (N, 3, P) -> uint8 (N, P) exactly as LRA's tf.image.rgb_to_grayscale on uint8: to float32
    (times 1/255), ITU-R 601 weights, back to uint8 by convert_image_dtype (times 255.5, truncated)."""
    f = rgb.astype(np.float32) * np.float32(1 / 255)
    w = np.array([0.2989, 0.5870, 0.1140], np.float32)
    grey = f[:, 0] * w[0] + f[:, 1] * w[1] + f[:, 2] * w[2]
    return np.clip(grey * np.float32(255.5), 0, 255).astype(np.uint8)


def load_image(split, data_dir):
    root = os.path.join(data_dir, "cifar-10-batches-py")
    names = ["test_batch"] if split == "test" else [f"data_batch_{i}" for i in range(1, 6)]
    xs, ys = [], []
    for name in names:
        path = os.path.join(root, name)
        if not os.path.exists(path):
            raise _missing("CIFAR-10 (image task)", path)
        x, y = read_cifar_batch(path)
        xs.append(x), ys.append(y)
    x, y = np.concatenate(xs), np.concatenate(ys)
    if split != "test":  # train = the first 90% of the 50k training images, val = the last 10%
        cut = int(round(0.9 * len(y)))
        x, y = (x[:cut], y[:cut]) if split == "train" else (x[cut:], y[cut:])
    return _byte_dataset("image", split, x, y, 10, 1024)


# -----------------------------------------------------------------------------
# ListOps generator (Nangia & Bowman 2018, as in the LRA script): a node is a
# leaf (a digit) with probability 0.75 below max_depth, else an operator with
# 2..max_args children; keep trees of 500 < length < 2000 tokens, deduplicated.
# Here a whole forest is grown at once, one depth level at a time, with numpy.

LISTOPS_VERSION = 1
LEAF_P, MAX_DEPTH, MAX_ARGS, MIN_LENGTH, MAX_LENGTH = 0.75, 10, 10, 500, 2000


# The four operators on the digits 0-9, in the order of their ids (10..13); the median
# of an even count is the mean of the middle two, truncated to an int.
LISTOPS_OPS = {"[MIN": min, "[MAX": max, "[MED": lambda a: int(np.median(a)), "[SM": lambda a: sum(a) % 10}


def listops_value(tokens):
    """The value of a ListOps expression given as tokens, parens left out:
    ['[MAX', '2', '[SM', '3', '9', ']', '0', ']'] -> 2. One pass with a stack, so any
    depth; ValueError if it is not one complete expression."""
    tokens, stack, result = list(tokens), [], []
    for t in tokens:
        if t in LISTOPS_OPS:
            stack.append((t, []))
        elif t == "]":
            if not stack:
                raise ValueError("']' without an operator")
            op, args = stack.pop()
            if not args:
                raise ValueError(f"{op} without arguments")
            (stack[-1][1] if stack else result).append(LISTOPS_OPS[op](args))
        elif t.isdigit() and len(t) == 1:
            (stack[-1][1] if stack else result).append(int(t))
        else:
            raise ValueError(f"unknown token {t!r}")
    if stack or len(result) != 1:
        raise ValueError(f"not one complete expression: {' '.join(tokens)!r}")
    return result[0]


def _grow_forest(rng, n_trees):
    """Levels of a random forest; per level: op (-1 for a leaf), digit, n_children, tree id."""
    levels, tree = [], np.arange(n_trees)
    for depth in range(1, MAX_DEPTH + 1):
        m = len(tree)
        is_op = (rng.random(m) >= LEAF_P) if depth < MAX_DEPTH else np.zeros(m, bool)
        n_children = np.where(is_op, rng.integers(2, MAX_ARGS + 1, m), 0)
        op = np.where(is_op, rng.integers(0, 4, m), -1)
        levels.append(dict(op=op, digit=rng.integers(0, 10, m), n=n_children, tree=tree))
        tree = np.repeat(tree, n_children)  # children are contiguous, in order
        if len(tree) == 0:
            break
    return levels


def _keep_trees(levels, keep):
    """Restrict every level to the trees with keep[tree] (order preserved)."""
    return [{k: v[keep[lv["tree"]]] for k, v in lv.items()} for lv in levels]


def _evaluate_and_write(levels):
    """Bottom-up: each node's value and written size; top-down: each token's position.
    Written form, as the LRA script's to_string: an operator with n children is
    '( ' * (n+1) + op, then each child followed by ' )', then '] )'."""
    D = len(levels)
    value, size = [None] * D, [None] * D
    for d in range(D - 1, -1, -1):
        lv = levels[d]
        v, s = lv["digit"].copy(), np.ones(len(lv["op"]), np.int64)
        ops = np.nonzero(lv["op"] >= 0)[0]
        if len(ops):
            cv, cs = value[d + 1], size[d + 1]
            start = np.concatenate([[0], np.cumsum(lv["n"])[:-1]])[ops]
            n = lv["n"][ops]
            parent = np.repeat(np.arange(len(ops)), n)  # operator index of each child
            hist = np.zeros((len(ops), 10), np.int64)
            np.add.at(hist, (parent, cv), 1)
            cum = hist.cumsum(1)
            kth = lambda k: (cum <= k[:, None]).sum(1)  # k-th smallest child (0-based)
            med = (kth((n - 1) // 2) + kth(n // 2)) // 2  # int(np.median): floor of the mean of the middle two
            results = np.stack([np.minimum.reduceat(cv, start), np.maximum.reduceat(cv, start),
                                med, np.add.reduceat(cv, start) % 10])
            v[ops] = results[lv["op"][ops], np.arange(len(ops))]
            s[ops] = 2 * n + 4 + np.add.reduceat(cs, start)
        value[d], size[d] = v, s
    # positions: roots one after another in one buffer; a child starts after its parent's
    # n+1 '(' and op token, plus its earlier siblings and their ')'
    codes = np.full(int(size[0].sum()), 16, np.uint8)  # 16 = ')', overwritten below where needed
    pos = np.concatenate([[0], np.cumsum(size[0])[:-1]])
    for d in range(D):
        lv = levels[d]
        leaf, op = lv["op"] < 0, lv["op"] >= 0
        codes[pos[leaf]] = lv["digit"][leaf]
        p, n = pos[op], lv["n"][op]
        opens = np.repeat(p, n + 1) + _ranges(n + 1)
        codes[opens] = 15  # '('
        codes[p + n + 1] = 10 + lv["op"][op]
        codes[p + size[d][op] - 2] = 14  # ']'
        if d + 1 < D and len(p):
            child_step = size[d + 1] + 1
            before = np.cumsum(child_step) - child_step  # exclusive cumsum over all children
            first = np.concatenate([[0], np.cumsum(lv["n"])[:-1]])[op]
            before -= np.repeat(before[first], n)
            pos = np.repeat(p + n + 2, n) + before
    return value[0], size[0], codes


def _ranges(counts):
    """[0..c0-1, 0..c1-1, ...]"""
    ends = np.cumsum(counts)
    return np.arange(ends[-1] if len(ends) else 0) - np.repeat(ends - counts, counts)


_LISTOPS_WRITTEN = np.array([f"{d} " for d in range(10)] + ["[MIN ", "[MAX ", "[MED ", "[SM ", "] ", "( ", ") "], dtype="S5")


def generate_listops(n=100_000, seed=0, batch=20_000, progress=True):
    """-> list of (expression string, label) with n distinct expressions."""
    from tqdm import tqdm
    rng = np.random.default_rng(seed)
    data = {}
    bar = tqdm(total=n, desc="listops", disable=not progress, unit="ex")
    while len(data) < n:
        levels = _grow_forest(rng, batch)
        length = np.zeros(batch, np.int64)  # tokens without parens: digits + 2 per operator
        for lv in levels:
            length += np.bincount(lv["tree"], weights=np.where(lv["op"] >= 0, 2, 1), minlength=batch).astype(np.int64)
        keep = (length > MIN_LENGTH) & (length < MAX_LENGTH)
        k = int(keep.sum())
        if k == 0:
            continue
        levels = _keep_trees(levels, keep)
        remap = np.cumsum(keep) - 1
        for lv in levels:
            lv["tree"] = remap[lv["tree"]]
        values, sizes, codes = _evaluate_and_write(levels)
        chars = _LISTOPS_WRITTEN[codes].view(np.uint8)
        text = chars[chars != 0].tobytes()  # the tokens, each followed by one space
        nbytes = np.array([len(w) for w in _LISTOPS_WRITTEN])[codes]
        ends = np.cumsum(np.add.reduceat(nbytes, np.concatenate([[0], np.cumsum(sizes)[:-1]])))
        before = len(data)
        for i, end in enumerate(ends):
            start = ends[i - 1] if i else 0
            data.setdefault(text[start:end - 1].decode(), int(values[i]))
            if len(data) == n:
                break
        bar.update(len(data) - before)
    bar.close()
    items = list(data.items())
    order = rng.permutation(len(items))
    return [items[i] for i in order]


def write_listops_tsv(path, rows):
    """The official layout: header Source<TAB>Target, one expression per line."""
    _atomic_write_text(path, "Source\tTarget\n" + "".join(f"{s}\t{v}\n" for s, v in rows))


def _atomic_write_text(path, text):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_atomically(path, lambda f: f.write(text.encode("utf-8")))


def write_atomically(path, write):
    """write(f) into a temp file beside `path`, then rename it over `path`: a kill or a full
    disk never leaves half a cache file, and the temp file never outlives a failure. (This
    file carries these lines itself so that it can be copied with pathfinder.py alone.)"""
    tmp = os.path.join(os.path.dirname(path) or ".", f".sptflt-tmp.{os.getpid()}.{os.path.basename(path)}")
    try:
        with open(tmp, "xb") as f:
            write(f)
        os.replace(tmp, path)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(e.errno, f"no space left to write {path}; free some space and run again") from None
        raise
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# -----------------------------------------------------------------------------
# the cache of generated data: files plus a JSON sidecar written last, holding the
# key (version, seed, n, ...) and each file's sha256, so that a stale, truncated or
# half-written cache is detected and generated again. Every write is atomic, and a
# cache is checked and made under its lock, so two processes never make it at once.
# corpora.py caches the stdlib corpus the same way, with these three functions.


@contextlib.contextmanager
def cache_lock(path, files_in=None):
    """Hold an exclusive flock on <path>.lock while a cache is checked and made: a second
    process asking for the same cache waits, then reads the first one's files (the kernel
    drops a lock when its holder ends, however it ends). Temp files that a killed writer
    left in files_in (the cache's folder) are removed under it. In a folder this process cannot
    write there is no lock: a valid cache is read, and making one fails there anyway."""
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        f = open(path + ".lock", "a")
    except OSError:
        yield
        return
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"data_lra: waiting for another process making {path}", flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        folder = files_in or os.path.dirname(path) or "."
        for name in os.listdir(folder) if os.path.isdir(folder) else []:
            pid = name.split(".")[2] if name.startswith(".sptflt-tmp.") else ""
            if pid.isdigit() and not _alive(int(pid)):
                os.remove(os.path.join(folder, name))
        yield


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        pass
    return True


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sidecar_matches(path, key, files):
    """True if the sidecar at `path` holds exactly `key` and each file's current sha256;
    False if it or a file is missing, unreadable, of another key or another content."""
    try:
        with open(path) as f:
            meta = json.load(f)
        return meta["key"] == key and all(meta["sha256"][os.path.basename(p)] == _sha256(p) for p in files)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def write_sidecar(path, key, files):
    """Write the sidecar of `files` (after them, atomically): `key` (a JSON dict saying
    what the files were made with) and each file's sha256 under its name."""
    meta = dict(key=key, sha256={os.path.basename(p): _sha256(p) for p in files})
    _atomic_write_text(path, json.dumps(meta, indent=1))


def _split_80_10_10(n, split, seed=0):
    """Indices of one split of a fixed seeded permutation (PathFinder: 80/10/10)."""
    order = np.random.default_rng(seed).permutation(n)
    a, b = int(0.8 * n), int(0.9 * n)
    return np.sort({"train": order[:a], "val": order[a:b], "test": order[b:]}[split])


def generated_listops_dir(data_dir, n=100_000, seed=0):
    """Generated ListOps, in the official layout: <dir>/listops-1000/basic_*.tsv."""
    return os.path.join(data_dir, "generated", f"listops-v{LISTOPS_VERSION}-seed{seed}-n{n}")


def ensure_listops(data_dir, n=100_000, seed=0, progress=True):
    """Generate ListOps once (96%/2%/2%, i.e. 96k/2k/2k for n=100k) unless a valid cache exists."""
    root = generated_listops_dir(data_dir, n, seed)
    files = [os.path.join(root, "listops-1000", f"basic_{s}.tsv") for s in SPLITS]
    sidecar, key = os.path.join(root, "cache.json"), dict(version=LISTOPS_VERSION, seed=seed, n=n)
    with cache_lock(root, os.path.dirname(files[0])):
        if sidecar_matches(sidecar, key, files):
            return root
        print(f"data_lra: generating ListOps (n={n}, seed={seed}) into {root} (once; cached for later runs)")
        rows = generate_listops(n, seed, progress=progress)
        n_val = int(round(0.02 * n))
        n_train = n - 2 * n_val
        for path, part in zip(files, (rows[:n_train], rows[n_train:n_train + n_val], rows[n_train + n_val:])):
            write_listops_tsv(path, part)
        write_sidecar(sidecar, key, files)
    return root


# -----------------------------------------------------------------------------
# PathFinder: reading the release layout (PNG images + metadata text lines)

DIFFICULTIES = {"baseline": ("curv_baseline", 6), "contour_length_9": ("curv_contour_length_9", 9),
                "contour_length_14": ("curv_contour_length_14", 14)}
EMPTY_IMAGE = "curv_baseline/imgs/0/sample_172.png"  # known empty in the release


def _difficulty(d):
    """'baseline' | 'contour_length_9' | 'contour_length_14' (also 6, 9, 14 or the folder name)."""
    for name, (folder, length) in DIFFICULTIES.items():
        if d in (name, folder, length, str(length)):
            return name
    raise ValueError(f"unknown difficulty {d!r}; use one of {list(DIFFICULTIES)} (contour length 6, 9, 14)")


def pathfinder_folder(root, resolution=32, difficulty="contour_length_14"):
    return os.path.join(root, f"pathfinder{resolution}", DIFFICULTIES[_difficulty(difficulty)][0])


def _read_png_grey(path):
    """-> uint8 (H, W); a file that is not a readable PNG is an error naming it."""
    import matplotlib.image
    try:
        x = matplotlib.image.imread(path, format="png")
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        raise ValueError(f"{path}: not a readable PNG, truncated or damaged ({type(e).__name__}: {e})") from None
    if x.ndim == 3:
        x = x[..., 0]
    if x.dtype != np.uint8:
        x = np.rint(x * 255)
    return x.astype(np.uint8)


def _metadata_lines(path):
    """The release's metadata/<batch>.npy files are text; np.save'd string arrays are read too."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        if raw.startswith(b"\x93NUMPY"):
            return [" ".join(map(str, row)) for row in np.load(io.BytesIO(raw), allow_pickle=False)]
        return raw.decode("utf-8").split("\n")
    except (ValueError, TypeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not PathFinder metadata (text lines or a string array): {e}") from None


def _inside(folder, rel):
    """The path rel (from a metadata line) resolved under folder, or None if it leaves it."""
    if os.path.isabs(rel):
        return None
    root = os.path.realpath(folder)
    path = os.path.realpath(os.path.join(root, rel))
    return path if os.path.commonpath([root, path]) == root else None


def _release_resolution(folder):
    """32 for .../pathfinder32/<difficulty>, None if the folder does not say."""
    parent = os.path.basename(os.path.dirname(os.path.normpath(folder)))
    return int(parent[len("pathfinder"):]) if parent.startswith("pathfinder") and parent[10:].isdigit() else None


def read_pathfinder_release(folder, progress=True, resolution=None):
    """-> (uint8 images (N, R, R), labels (N,)) in metadata order. R is the folder's
    (pathfinder<R>), else the first image's. Refused with a line naming the file: image paths
    outside the folder, labels other than 0/1, unreadable PNGs, images of another size.
    Skipped: zero-byte PNGs (as TFDS; counted and said) and, at 32 px, the release's known
    empty curv_baseline/imgs/0/sample_172.png."""
    from tqdm import tqdm
    meta_dir = os.path.join(folder, "metadata")
    if not os.path.isdir(meta_dir):
        raise _missing("PathFinder", meta_dir)
    resolution = resolution or _release_resolution(folder)
    names = sorted((f for f in os.listdir(meta_dir) if f.endswith(".npy")),
                   key=lambda f: (len(f), f))  # 0.npy, 1.npy, ..., 10.npy
    entries = []
    for name in names:
        path = os.path.join(meta_dir, name)
        for lineno, line in enumerate(_metadata_lines(path), start=1):
            if not line.strip():
                continue
            fields = line.split(" ")
            if len(fields) < 4 or not fields[3].lstrip("-").isdigit():
                raise _malformed(path, lineno, "expected '<subdir> <file> <index> <label> ...' separated by spaces")
            if int(fields[3]) not in (0, 1):
                raise _malformed(path, lineno, f"label {fields[3]} is not 0 or 1")
            rel = os.path.join(fields[0], fields[1])
            image = _inside(folder, rel)
            if image is None:
                raise _malformed(path, lineno, f"image path {rel!r} leaves the data folder {folder}")
            if resolution == 32 and os.path.join(os.path.basename(os.path.normpath(folder)), rel).replace(os.sep, "/") == EMPTY_IMAGE:
                continue
            entries.append((image, int(fields[3])))
    images, labels, empty = [], [], 0
    size = f"pathfinder{resolution}" if resolution else None  # what the images must match
    for path, label in tqdm(entries, desc=f"reading {folder}", disable=not progress, unit="img"):
        if not os.path.exists(path):
            raise _missing("PathFinder image listed in the metadata", path)
        if os.path.getsize(path) == 0:
            empty += 1
            continue
        x = _read_png_grey(path)
        if resolution is None:
            resolution, size = x.shape[0], f"the first image ({x.shape[1]}x{x.shape[0]}); sizes are mixed"
        if x.shape != (resolution, resolution):
            raise ValueError(f"{path}: image is {x.shape[1]}x{x.shape[0]}, expected {resolution}x{resolution} for {size}")
        images.append(x)
        labels.append(label)
    if empty:
        print(f"data_lra: skipped {empty} empty (zero-byte) image(s) listed in {meta_dir}")
    if not images:
        raise ValueError(f"{meta_dir}: lists no readable images, so the PathFinder release at {folder} is empty; "
                         f"download it again, or generate the data (--data_source=generated)")
    return np.stack(images), np.array(labels, dtype=np.int64)


# -----------------------------------------------------------------------------
# PathFinder generator: pathfinder.py (numpy only, the original's rules and settings);
# here it is run in parallel chunks, cached, and exported in the release layout.

CHUNK = 250  # images per independently seeded chunk: the data do not depend on the number of workers


def pool_room(per_worker=6, spare=12):
    """How many pool workers the open-file limit leaves room for: each takes a few pipes
    and descriptors, and a pool whose worker cannot start waits for it for ever. 0 or 1:
    generate in this process instead."""
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        used = len(os.listdir("/proc/self/fd"))
    except (ImportError, OSError, ValueError):
        return os.cpu_count() or 1
    return max(0, (soft - used - spare) // per_worker) if soft != resource.RLIM_INFINITY else os.cpu_count() or 1


def _quiet_worker():
    """A pool worker leaves the stop signals to its parent: Ctrl-C, SIGHUP and SIGUSR1
    reach the parent (which ends the pool), and SIGTERM, the pool's own way of ending a
    worker, ends it at once, not through a handler inherited from the parent (a
    training run's, which would raise inside the worker and could leave it blocked)."""
    import signal
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(s, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _pathfinder_chunk(args):
    seed, chunk, size, resolution, contour_length = args
    return pathfinder.generate_chunk(seed, chunk, size, contour_length, resolution)


def generate_pathfinder(n, seed=0, difficulty="contour_length_14", resolution=32, workers=None, progress=True):
    """-> uint8 images (n, R, R), int64 labels (n,) (each drawn at random, as the original),
    int64 paddle margin of each image (n,)."""
    from tqdm import tqdm
    length = DIFFICULTIES[_difficulty(difficulty)][1]
    pathfinder.params(resolution)
    jobs = [(seed, c, min(CHUNK, n - c * CHUNK), resolution, length) for c in range((n + CHUNK - 1) // CHUNK)]
    workers = min(workers or os.cpu_count() or 1, len(jobs), pool_room())
    bar = tqdm(total=n, desc=f"pathfinder{resolution} {difficulty}", disable=not progress, unit="img")
    parts = []
    if workers <= 1:
        for job in jobs:
            parts.append(_pathfinder_chunk(job))
            bar.update(job[2])
    else:
        import multiprocessing as mp
        with mp.get_context("fork" if sys.platform != "win32" else "spawn").Pool(workers, _quiet_worker) as pool:
            for part in pool.imap(_pathfinder_chunk, jobs):
                parts.append(part)
                bar.update(len(part[1]))
    bar.close()
    if not parts:
        return np.zeros((0, resolution, resolution), np.uint8), np.zeros(0, np.int64), np.zeros(0, np.int64)
    return tuple(np.concatenate([part[i] for part in parts]) for i in range(3))


def _pathfinder_key(n, seed, difficulty, resolution):
    """What a cached file must have been made with; the generator's VERSION is part of it,
    so a cache from an older generator is never read as new."""
    return dict(version=pathfinder.VERSION, seed=seed, n=n, difficulty=difficulty, resolution=resolution)


def generated_pathfinder_path(data_dir, n=200_000, seed=0, difficulty="contour_length_14", resolution=32):
    folder = DIFFICULTIES[_difficulty(difficulty)][0]
    return os.path.join(data_dir, "generated", f"pathfinder{resolution}-{folder}-v{pathfinder.VERSION}-seed{seed}-n{n}.npz")


def _load_npz(path, key):
    """Cached arrays (images, labels, margins if saved), or None if missing, stale or damaged."""
    sidecar = path + ".json"
    if not sidecar_matches(sidecar, key, [path]):
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, KeyError):
        return None
    R, n = key["resolution"], key["n"]
    if arrays.get("images", np.zeros(0)).shape != (n, R, R) or any(
            arrays.get(k, np.zeros(n)).shape != (n,) for k in ("labels", "margins")):
        return None
    return arrays


def _save_npz(path, key, **arrays):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomically(path, lambda f: np.savez(f, **arrays))
    write_sidecar(path + ".json", key, [path])


def ensure_pathfinder(data_dir, n=200_000, seed=0, difficulty="contour_length_14", resolution=32, progress=True,
                      with_margins=False):
    """Generated PathFinder from the cache, generating it once if needed.
    -> images, labels (and each image's paddle margin if with_margins)."""
    difficulty = _difficulty(difficulty)
    path = generated_pathfinder_path(data_dir, n, seed, difficulty, resolution)
    key = _pathfinder_key(n, seed, difficulty, resolution)
    with cache_lock(path):
        cached = _load_npz(path, key)
        if cached is None or "margins" not in cached:
            print(f"data_lra: generating PathFinder{resolution} {difficulty} (n={n}, seed={seed}, generator "
                  f"v{pathfinder.VERSION}) into {path} (once; cached for later runs)")
            images, labels, margins = generate_pathfinder(n, seed, difficulty, resolution, progress=progress)
            cached = dict(images=images.astype(np.uint8), labels=labels.astype(np.int64),
                          margins=margins.astype(np.int64))
            _save_npz(path, key, **cached)
    out = (cached["images"], cached["labels"])
    return out + (cached["margins"],) if with_margins else out


def export_pathfinder_lra(folder, images, labels, margins=None, batch_size=1000, contour_length=14, resolution=32):
    """Write the official layout: <folder>/imgs/<b>/sample_<i>.png and <folder>/metadata/<b>.npy, whose
    text lines read 'imgs/<b> sample_<i>.png <i> <label> <continuity> <contour length> <distractor length>
    <paddle length> <paddle thickness> <margin> 1'. As snakes2.py, each batch numbers its samples from 0;
    margin is each image's own (margins (n,); None: the resolution's first margin). The PNGs are 8-bit
    greyscale, as scipy.misc.imsave wrote them (a colormapped PNG would shift some grey levels)."""
    from PIL import Image
    from tqdm import tqdm
    p = pathfinder.params(resolution)
    margins = np.full(len(labels), p["margins"][0]) if margins is None else np.asarray(margins)
    for b in tqdm(range((len(labels) + batch_size - 1) // batch_size), desc=f"export {folder}", unit="batch"):
        os.makedirs(os.path.join(folder, "imgs", str(b)), exist_ok=True)
        lines = []
        for i, j in enumerate(range(b * batch_size, min((b + 1) * batch_size, len(labels)))):
            name = f"sample_{i}.png"
            Image.fromarray(np.asarray(images[j], np.uint8)).save(os.path.join(folder, "imgs", str(b), name))
            lines.append(f"imgs/{b} {name} {i} {int(labels[j])} {p['continuity']} {contour_length} "
                         f"{contour_length // 3} {p['paddle_length']} {p['paddle_thickness']} {int(margins[j])} 1\n")
        _atomic_write_text(os.path.join(folder, "metadata", f"{b}.npy"), "".join(lines))


def save_sample_grid(path, resolution=32, per_difficulty=8, seed=0, difficulties=tuple(DIFFICULTIES)):
    """A PNG with one row of generated samples per difficulty, labels in the titles."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(difficulties), per_difficulty, figsize=(1.6 * per_difficulty, 1.8 * len(difficulties)),
                             squeeze=False, facecolor="white")
    for r, d in enumerate(difficulties):
        length = DIFFICULTIES[_difficulty(d)][1]
        labels = np.arange(per_difficulty) % 2
        images, _ = pathfinder.pathfinder_batch(np.random.default_rng([seed, r]), labels, resolution, length)
        for ax, image, label in zip(axes[r], images, labels):
            ax.imshow(image, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
            ax.set_title(f"{'connected' if label else 'apart'} ({label})", fontsize=8)
            ax.set_xticks([]), ax.set_yticks([])
        axes[r][0].set_ylabel(f"{d}\n(length {length})", fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
        write_atomically(path, lambda f: fig.savefig(f, dpi=100, format="png"))
    finally:
        plt.close(fig)
    return path


def _cached_release(folder, data_dir, resolution, progress=True):
    """Decoding 200k PNGs takes minutes: keep the decoded release next to the generated data,
    keyed by the size and modification and change times of every metadata and image file
    (a PNG replaced in place changes its times, so its new pixels are read)."""
    stamp = hashlib.sha256()
    for sub in ("metadata", "imgs"):
        for root, dirs, files in sorted(os.walk(os.path.join(folder, sub))):
            dirs.sort()
            for name in sorted(files):
                st = os.stat(os.path.join(root, name))
                stamp.update(f"{root}/{name} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}\n".encode())
    key = dict(release=os.path.abspath(folder), files=stamp.hexdigest(), resolution=resolution)
    name = "release-" + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16] + ".npz"
    path = os.path.join(data_dir, "generated", name)
    if os.path.exists(path + ".json"):
        with open(path + ".json") as f:
            key["n"] = json.load(f).get("key", {}).get("n")
        cached = _load_npz(path, key) if key["n"] is not None else None
        if cached is not None:
            return cached["images"], cached["labels"]
    images, labels = read_pathfinder_release(folder, progress, resolution)
    key["n"] = len(labels)
    if images.shape[1:] == (resolution, resolution):
        _save_npz(path, key, images=images, labels=labels)
    return images, labels


def load_pathfinder(split, data_dir, resolution=32, difficulty="contour_length_14", data_source="auto",
                    n=200_000, seed=0, progress=True):
    difficulty = _difficulty(difficulty)
    task = "pathfinder" if resolution == 32 else "pathx"
    folder = pathfinder_folder(data_dir, resolution, difficulty)
    found = _find(data_dir, os.path.relpath(os.path.join(folder, "metadata"), data_dir))
    if data_source == "release" or (data_source == "auto" and found):
        if not found:
            raise _missing(f"PathFinder{resolution} release (data_source='release')", os.path.join(folder, "metadata"))
        images, labels = _cached_release(os.path.dirname(found), data_dir, resolution, progress)
    elif data_source in ("auto", "generated"):
        images, labels = ensure_pathfinder(data_dir, n, seed, difficulty, resolution, progress)
    else:
        raise ValueError(f"data_source must be 'auto', 'generated' or 'release', got {data_source!r}")
    idx = _split_80_10_10(len(labels), split)
    return _byte_dataset(task, split, images[idx].reshape(len(idx), -1), labels[idx], 2, resolution * resolution)


def load_listops_task(split, data_dir, max_len=2000, data_source="auto", n=100_000, seed=0, progress=True):
    found = _find(data_dir, os.path.join("listops-1000", "basic_train.tsv"))
    if data_source == "release" or (data_source == "auto" and found):
        return load_listops(split, data_dir, max_len)  # its error names the expected path
    if data_source not in ("auto", "generated"):
        raise ValueError(f"data_source must be 'auto', 'generated' or 'release', got {data_source!r}")
    return load_listops(split, ensure_listops(data_dir, n, seed, progress), max_len)


# -----------------------------------------------------------------------------
# the one entry point

# -----------------------------------------------------------------------------
# Photos: images that are not contours, for SPT on another image set (Paper A: pretraining
# on other data still helps). 32x32 grey crops of the one photograph that matplotlib ships
# in its package data (mpl-data/sample_data/grace_hopper.jpg: Grace Hopper's portrait,
# 512x600 RGB), so nothing is downloaded. Each crop: a random square window of 32-128
# pixels, resized to 32x32 (bilinear), flipped left-right with probability 1/2, 256 grey
# levels (PIL's "L": 0.299 R + 0.587 G + 0.114 B). No labels (all 0): pretraining data only.

PHOTO = "grace_hopper.jpg"


def photo_crops(n, seed=0, side=32):
    """n crops of side x side grey pixels from matplotlib's sample photograph, (n, side*side) uint8."""
    import matplotlib.cbook
    from PIL import Image
    with matplotlib.cbook.get_sample_data(PHOTO) as f:
        grey = Image.open(f).convert("L")
    rng = np.random.default_rng(seed)
    crops = np.empty((n, side * side), np.uint8)
    for i in range(n):
        size = int(rng.integers(side, 4 * side + 1))
        x, y = int(rng.integers(0, grey.width - size + 1)), int(rng.integers(0, grey.height - size + 1))
        crop = np.asarray(grey.crop((x, y, x + size, y + size)).resize((side, side), Image.BILINEAR))
        crops[i] = (crop[:, ::-1] if rng.random() < 0.5 else crop).reshape(-1)
    return crops


def load_photos(split, data_dir, n=10_000, seed=0):
    """One split (80/10/10) of n photo crops: a one-class LRADataset, for --pretrain_task=photos."""
    idx = _split_80_10_10(n, split)
    return _byte_dataset("photos", split, photo_crops(n, seed)[idx], np.zeros(len(idx), np.int64), 1, 1024)


TASK_OPTIONS = {  # task -> (loader, its options and defaults)
    "listops": (load_listops_task, dict(max_len=2000, data_source="auto", n=100_000, seed=0, progress=True)),
    "text": (load_text, dict(max_len=4096)),
    "retrieval": (load_retrieval, dict(max_len=4000)),
    "image": (load_image, dict()),
    "pathfinder": (load_pathfinder, dict(resolution=32, difficulty="contour_length_14", data_source="auto",
                                         n=200_000, seed=0, progress=True)),
    "photos": (load_photos, dict(n=10_000, seed=0)),
    "pathx": (load_pathfinder, dict(resolution=128, difficulty="contour_length_14", data_source="auto",
                                    n=200_000, seed=0, progress=True)),
}


def load_task(name, split, data_dir="data", **options):
    """-> LRADataset for one split of one task. Options (with defaults) per task are in TASK_OPTIONS;
    max_len=None means the task's default everywhere."""
    if name not in TASK_OPTIONS:
        raise ValueError(f"unknown task {name!r}; choose from {list(TASK_OPTIONS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {list(SPLITS)}")
    loader, defaults = TASK_OPTIONS[name]
    if options.get("max_len", 0) is None:
        options.pop("max_len")
    if name in ("image", "pathfinder", "pathx") and "max_len" in options:
        fixed = 1024 if name == "image" else options.get("resolution", defaults["resolution"]) ** 2
        if options.pop("max_len") != fixed:
            raise ValueError(f"{name} has fixed length {fixed}; max_len cannot change it")
    unknown = set(options) - set(defaults)
    if unknown:
        raise TypeError(f"unknown option(s) {sorted(unknown)} for task {name!r}; it takes {defaults}")
    return loader(split, data_dir, **{**defaults, **options})


# -----------------------------------------------------------------------------
# command line: python data_lra.py --task=pathfinder --generate [--key=value ...]

CLI_DEFAULTS = dict(task="pathfinder", generate=False, grid=False, n=None, seed=0, difficulty="contour_length_14",
                    resolution=None, data_dir="data", format="npz", debug=False)


def parse_args(argv):
    """--key=value overrides of CLI_DEFAULTS (typed like the default); a bare --flag means True.
    Bad values raise ValueError naming the flag, before any work."""
    cfg = dict(CLI_DEFAULTS)
    for arg in argv:
        if arg in ("-h", "--help"):
            print("python data_lra.py [--key=value ...], keys and defaults:")
            for k, v in CLI_DEFAULTS.items():
                print(f"  --{k}={v}")
            sys.exit(0)
        if not arg.startswith("--"):
            raise ValueError(f"expected --key=value, got {arg!r}")
        key, eq, value = arg[2:].partition("=")
        if key not in cfg:
            raise ValueError(f"unknown key --{key}; known keys: {', '.join('--' + k for k in cfg)}")
        if not eq and not isinstance(CLI_DEFAULTS[key], bool):
            raise ValueError(f"--{key} needs a value (--{key}=...)")
        cfg[key] = _cli_value(key, value if eq else "True")
    if cfg["task"] not in TASK_OPTIONS:
        raise ValueError(f"unknown --task={cfg['task']}; choose from {', '.join(TASK_OPTIONS)}")
    if cfg["format"] not in ("npz", "lra"):
        raise ValueError(f"--format must be npz or lra, got {cfg['format']!r}")
    if cfg["n"] is not None and cfg["n"] <= 0:
        raise ValueError(f"--n={cfg['n']} must be a positive number of examples")
    if cfg["n"] is not None and cfg["task"] in ("listops", "pathfinder", "pathx"):
        check_generate(cfg["task"], cfg["n"], cfg["resolution"], "--n")
    if not 0 <= cfg["seed"] < 2**31:
        raise ValueError(f"--seed={cfg['seed']} must be in [0, 2**31)")
    if cfg["resolution"] is not None:
        pathfinder.params(cfg["resolution"])                       # names the resolutions there are
    _difficulty(cfg["difficulty"])
    return cfg


MAX_EXAMPLES = 10**7     # examples to make or read at most: 50x LRA's largest split (configurator.MAX_COUNT)


def memory_available():
    """Bytes of RAM the kernel says can be had (MemAvailable; else the free pages). The
    file's own, so it copies alone; configurator.memory_available also counts ulimit -v."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))
    except (OSError, StopIteration):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_generate(task, n, resolution=None, flag="--n_generate"):
    """Refuse, before any work, a number of examples to generate that is over
    MAX_EXAMPLES or whose arrays would not fit in the memory free here."""
    R = resolution or (128 if task == "pathx" else 32)
    per_example = 4 * 2000 if task == "listops" else R * R         # ListOps: up to 2,000 int32 tokens
    free = memory_available()
    if n > MAX_EXAMPLES or n * per_example > free:
        raise ValueError(f"{flag}={n} is too many {task} examples to generate here (at most "
                         f"{MAX_EXAMPLES:,}, and about {per_example:,} bytes each must fit in the "
                         f"{free / 2**30:.1f} GiB free); ask for fewer")


def _cli_value(key, value):
    default = CLI_DEFAULTS[key]
    if isinstance(default, bool):
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"--{key}={value}: expected True or False")
        return value.lower() in ("true", "1")
    if key in ("n", "resolution", "seed"):
        try:
            if len(value) > 40:
                raise ValueError
            return int(value)
        except ValueError:
            raise ValueError(f"--{key}={value}: expected an integer") from None
    return value


def main(argv):
    cfg = parse_args(argv)
    task, data_dir, seed = cfg["task"], cfg["data_dir"], cfg["seed"]
    if task in ("pathfinder", "pathx"):
        R = cfg["resolution"] or (32 if task == "pathfinder" else 128)
        difficulty = _difficulty(cfg["difficulty"])
        if cfg["grid"]:
            path = save_sample_grid(os.path.join(data_dir, "generated", f"pathfinder{R}_grid.png"), R, seed=seed)
            print(f"data_lra: wrote {path}")
        if cfg["generate"]:
            n = cfg["n"] or 200_000
            t0 = time.time()
            images, labels, margins = ensure_pathfinder(data_dir, n, seed, difficulty, R, with_margins=True)
            print(f"data_lra: {len(labels)} images {images.shape[1:]} ({labels.mean():.3f} positive) "
                  f"at {generated_pathfinder_path(data_dir, n, seed, difficulty, R)} in {time.time() - t0:.1f}s")
            if cfg["format"] == "lra":
                folder = pathfinder_folder(data_dir, R, difficulty)
                if os.path.exists(folder):
                    raise FileExistsError(f"{folder} exists; not overwriting it")
                export_pathfinder_lra(folder, images, labels, margins, contour_length=DIFFICULTIES[difficulty][1], resolution=R)
                print(f"data_lra: exported the official layout to {folder}")
    elif task == "listops":
        if cfg["generate"]:
            n = cfg["n"] or 100_000
            t0 = time.time()
            root = ensure_listops(data_dir, n, seed)
            print(f"data_lra: ListOps n={n} in {os.path.join(root, 'listops-1000')} ({time.time() - t0:.1f}s)")
    elif cfg["generate"] or cfg["grid"]:
        raise ValueError(f"--task={task} reads released files; only listops, pathfinder and pathx are generated")
    if not (cfg["generate"] or cfg["grid"]):  # describe what load_task sees
        options = {}
        if task in ("listops", "pathfinder", "pathx"):
            options = dict(seed=seed, **({"n": cfg["n"]} if cfg["n"] else {}))
        if task in ("pathfinder", "pathx"):
            options.update(difficulty=cfg["difficulty"], **({"resolution": cfg["resolution"]} if cfg["resolution"] else {}))
        for split in SPLITS:
            ds = load_task(task, split, data_dir, **options)
            print(f"{task} {split}: {len(ds)} examples, vocab {ds.vocab_size}, classes {ds.n_classes}, max_len {ds.max_len}")


if __name__ == "__main__":
    try:                                   # a bad flag or file: one line, as in the training scripts
        main(sys.argv[1:])
    except (ValueError, OSError, RecursionError) as e:     # RecursionError: a --data_dir that links to itself
        if any(a.lower() == "--debug=true" for a in sys.argv):
            raise
        sys.exit("error: " + " ".join(str(e).split()))
    except KeyboardInterrupt:
        print("interrupted; what was generated is not cached, so the same command starts again", file=sys.stderr)
        sys.exit(130)
