"""
Long Range Arena (Tay et al., 2021) data: five tasks, read from the official files, plus offline
generators for the two procedural ones.

    task        input                          classes  length   split sizes
    listops     nested [MIN [MAX [MED [SM ]    10       <= 2000  96k / 2k / 2k
    text        IMDb review, bytes             2        4096     25k / 25k(test=val) / 25k
    retrieval   two AAN papers, bytes each     2        4000 x2  release sizes
    image       CIFAR-10 in grey, pixels       10       1024     45k / 5k / 10k
    pathfinder  32x32 "snakes" image, pixels   2        1024     80 / 10 / 10 %
    pathx       the same at 128x128            2        16384    80 / 10 / 10 %

Every example is a sequence of integer tokens and an int label; no [CLS] token is added (the model
pools). Vocabularies, pad and mask reserved: pixels and bytes 0..255, pad=256, mask=257 (vocab 258);
ListOps digits 0..9 are ids 0..9, [MIN=10 [MAX=11 [MED=12 [SM=13 ]=14, pad=15, mask=16 (vocab 17).

Files, read exactly as released (data_dir defaults to ./data):
    listops-1000/basic_{train,val,test}.tsv      header Source<TAB>Target
    aclImdb/{train,test}/{pos,neg}/*.txt         (IMDb, test doubles as val)
    new_aan_pairs.{train,eval,test}.tsv          label id1 id2 text1 text2
    cifar-10-batches-py/data_batch_1..5, test_batch   (pickles; a restricted unpickler admits numpy's alone)
    pathfinder32/curv_contour_length_14/{imgs/<b>/sample_<i>.png, metadata/<b>.npy}

ListOps and PathFinder are procedural: when their files are missing, or a size n is asked (train_spt.py's
--n_generate), they are generated (faithful re-implementations of the LRA ListOps script, here, and of
Linsley et al.'s "snakes" generator, in pathfinder.py), cached under data_dir/generated keyed on the
generator's version, seed and size, and read by the release readers. A missing file is one line naming
the path and where the files come from; a bad row is one line naming the file and the line.

    ds = load_task("pathfinder", "train", data_dir="data")
    tokens, label = ds[0]
    tokens, pad_mask, labels = ds.collate([ds[0], ds[1]])
    print(ds.source)      # which data were read: release files or a generated cache, path and count

    python data_lra.py --task=pathfinder --generate --difficulty=baseline --n=2000 --grid    (--help: the flags)
"""

import contextlib
import fcntl
import hashlib
import io
import json
import multiprocessing
import os
import pickle
import shutil
import sys
import zipfile

import numpy as np
import torch
from tqdm import tqdm

import pathfinder

# -----------------------------------------------------------------------------
# vocabularies

BYTE_PAD, BYTE_MASK, BYTE_VOCAB = 256, 257, 258  # pixels and bytes
LISTOPS_TOKENS = [str(d) for d in range(10)] + ["[MIN", "[MAX", "[MED", "[SM", "]"]
LISTOPS_ID = {t: i for i, t in enumerate(LISTOPS_TOKENS)}
LISTOPS_PAD, LISTOPS_MASK, LISTOPS_VOCAB = 15, 16, 17

SPLITS = ("train", "val", "test")
SOURCES = ("ListOps, AAN retrieval, PathFinder: the LRA release lra_release.gz (github.com/google-research/"
           "long-range-arena); CIFAR-10: the python version cifar-10-python.tar.gz (www.cs.toronto.edu/~kriz/"
           "cifar.html); IMDb: aclImdb_v1.tar.gz (ai.stanford.edu/~amaas/data/sentiment). ListOps and PathFinder "
           "need no download: --task=listops|pathfinder generate them offline (data_source='generated' or 'auto').")


# -----------------------------------------------------------------------------
# the dataset every loader returns


class LRADataset(torch.utils.data.Dataset):
    """Token sequences and int labels, plus the facts a model needs, and `source`: one
    line saying which data these are (release files or a generated cache, path, count).

    sequences: a uint8 array (N, L) for fixed-length tasks, a list of 1-D integer
    arrays for variable-length ones, or a list of (doc1, doc2) for retrieval.
    """

    def __init__(self, task, split, sequences, labels, n_classes, max_len, source,
                 vocab_size=BYTE_VOCAB, pad_id=BYTE_PAD, mask_id=BYTE_MASK):  # pixels and bytes, unless said
        assert len(sequences) == len(labels), (len(sequences), len(labels))
        self.task, self.split, self.source = task, split, source
        self.sequences, self.labels = sequences, np.asarray(labels, dtype=np.int64)
        self.vocab_size, self.n_classes, self.max_len = vocab_size, n_classes, max_len
        self.pad_id, self.mask_id = pad_id, mask_id

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        x = self.sequences[i]
        if isinstance(x, tuple):  # retrieval: the two documents, padded to a common length
            return self.collate([(torch.from_numpy(doc.astype(np.int64)), 0) for doc in x])[0], int(self.labels[i])
        return torch.from_numpy(np.asarray(x, dtype=np.int64)), int(self.labels[i])

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


# -----------------------------------------------------------------------------
# files: finding them, clear errors, and the caches of generated data. Each cache is made under a
# lock, so two processes that ask for one cache at once end with one correct cache, and written
# atomically, so a kill never leaves half a file. corpora.py caches the stdlib corpus with these too.


def _find(data_dir, relpath, what=None):
    """A release file; the released archive nests folders (lra_release/...), so those are tried too.
    Not there: None, or, given `what`, the one-line error naming the path."""
    for root in ("", "lra_release", os.path.join("lra_release", "lra_release"), os.path.join("lra_release", "tsv_data")):
        if os.path.exists(p := os.path.join(data_dir, root, relpath)):
            return p
    if what:
        raise _missing(what, os.path.join(data_dir, relpath))


def _missing(what, path):
    return FileNotFoundError(f"{what}: expected {path} (not found). Where the files come from: {SOURCES}")


def _malformed(path, lineno, why):
    return ValueError(f"{path}, line {lineno}: {why}")


def _tsv_rows(path):
    """(line number, tab-separated fields as bytes) of every line, '\r\n' ends too."""
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            yield lineno, line.rstrip(b"\r\n").split(b"\t")


def write_atomically(path, write):
    """write(f) into <path>.tmp, then rename it over `path`. (This file carries these lines
    itself so that it can be copied with pathfinder.py alone.)"""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "wb") as f:
        write(f)
    os.replace(path + ".tmp", path)


@contextlib.contextmanager
def cache_lock(path):
    """Hold an exclusive flock on <path>.lock while a cache is checked and made: a second
    process asking for the same cache waits, then reads the first one's. The kernel drops
    the lock when its holder ends, however it ends (kill -9 too), so nothing is left to clean."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            tqdm.write(f"data_lra: waiting for another process making {path}")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def cache_complete(sidecar, key, files):
    """True if the sidecar (written last, by mark_complete) holds `key` and each file's current
    size: False for a cache never finished, cut short, or made with another key."""
    try:
        with open(sidecar) as f:
            meta = json.load(f)
        return meta["key"] == key and all(meta["bytes"][os.path.basename(p)] == os.path.getsize(p) for p in files)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def mark_complete(sidecar, key, files):
    """Write the sidecar of finished `files`: `key` (what they were made with) and their sizes."""
    meta = dict(key=key, bytes={os.path.basename(p): os.path.getsize(p) for p in files})
    write_atomically(sidecar, lambda f: f.write(json.dumps(meta, indent=1).encode()))


def _load_npz(path, names):
    """The arrays `names` of a cached .npz, or None when there is none. A cut or damaged one
    (its zip directory or a checksum fails) is said in one line, and None: it is made again."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return tuple(z[k] for k in names)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        tqdm.write(f"data_lra: {path} is cut or damaged ({type(e).__name__}: {e}); making it again")
        return None


def _npz_cache(path, names, make):
    """The arrays `names` of the .npz cache at path; when it has none, make() gives them (in that
    order) and they are written, all under the cache's lock."""
    with cache_lock(path):
        arrays = _load_npz(path, names)
        if arrays is None:
            arrays = make()
            write_atomically(path, lambda f: np.savez(f, **dict(zip(names, arrays))))
        return arrays


def _split_80_10_10(n, split, seed=0):
    """Indices of one split of a fixed seeded permutation (PathFinder: 80/10/10)."""
    order = np.random.default_rng(seed).permutation(n)
    a, b = int(0.8 * n), int(0.9 * n)
    return np.sort({"train": order[:a], "val": order[a:b], "test": order[b:]}[split])


def _use_release(data_source, n, found):
    """The rule of the procedural tasks: n given (not None) means generated data, so it is an
    error with data_source='release'; with n None, 'auto' reads the release if it is there."""
    if data_source not in ("auto", "generated", "release"):
        raise ValueError(f"data_source must be 'auto', 'generated' or 'release', got {data_source!r}")
    if n is not None and data_source == "release":
        raise ValueError(f"n={n} (--n_generate) asks for generated data, but data_source='release' reads the "
                         f"release files; give one or the other")
    return data_source == "release" or (data_source == "auto" and n is None and found is not None)


# -----------------------------------------------------------------------------
# ListOps: reading the TSV


def read_listops_tsv(path, max_len=2000):
    """-> (list of uint8 id arrays, labels). Header Source<TAB>Target, label 0..9; an expression
    '( ( [MAX 2 ) 9 ] )' is tokenised by deleting ( and ) and splitting on whitespace."""
    seqs, labels = [], []
    for lineno, row in _tsv_rows(path):
        try:
            row = [field.decode("utf-8") for field in row]
        except UnicodeDecodeError:
            raise _malformed(path, lineno, "not UTF-8 text") from None
        if lineno == 1 and row != ["Source", "Target"]:
            raise _malformed(path, 1, f"expected the header 'Source<TAB>Target', got {'<TAB>'.join(row)[:60]!r}")
        if lineno == 1 or row == [""]:
            continue
        if len(row) != 2 or not row[1].strip().isdigit() or not 0 <= int(row[1]) <= 9:
            raise _malformed(path, lineno, "expected '<expression><TAB><label 0-9>'")
        words = row[0].replace("(", " ").replace(")", " ").split()
        if not set(words) <= LISTOPS_ID.keys():
            raise _malformed(path, lineno, f"unknown ListOps token {min(set(words) - LISTOPS_ID.keys())!r}")
        if not words:
            raise _malformed(path, lineno, "an expression with no tokens")
        seqs.append(np.array([LISTOPS_ID[w] for w in words[:max_len]], dtype=np.uint8))
        labels.append(int(row[1]))
    if not seqs:
        raise ValueError(f"{path}: no rows under the header Source<TAB>Target")
    return seqs, labels


def load_listops(split, data_dir, max_len=2000, data_source="auto", n=None, seed=0, progress=True):
    """One split of ListOps: the release, or n (default 100,000) generated expressions; the rule
    is PathFinder's (load_pathfinder)."""
    release = _use_release(data_source, n, _find(data_dir, os.path.join("listops-1000", "basic_train.tsv")))
    root = data_dir if release else ensure_listops(data_dir, n or 100_000, seed, progress)
    path = _find(root, os.path.join("listops-1000", f"basic_{split}.tsv"), "ListOps")
    seqs, labels = read_listops_tsv(path, max_len)
    source = f"release file {path}, {len(labels):,}" if release else f"generated cache {root}, {n or 100_000:,}"
    return LRADataset("listops", split, seqs, labels, 10, max_len, source + " expressions",
                      LISTOPS_VOCAB, LISTOPS_PAD, LISTOPS_MASK)


# The generator (Nangia & Bowman 2018, as in the LRA script): a node is a leaf (a digit) with probability
# 0.75 below max_depth, else an operator with 2..max_args children; keep trees of 500 < length < 2000
# tokens, deduplicated. Here a whole forest is grown at once, one depth level at a time, with numpy.

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
        codes[np.repeat(p + n + 1 - np.cumsum(n + 1), n + 1) + np.arange((n + 1).sum())] = 15  # n + 1 '('
        codes[p + n + 1] = 10 + lv["op"][op]
        codes[p + size[d][op] - 2] = 14  # ']'
        if d + 1 < D and len(p):
            child_step = size[d + 1] + 1
            before = np.cumsum(child_step) - child_step  # exclusive cumsum over all children
            first = np.concatenate([[0], np.cumsum(lv["n"])[:-1]])[op]
            before -= np.repeat(before[first], n)
            pos = np.repeat(p + n + 2, n) + before
    return value[0], size[0], codes


_LISTOPS_WRITTEN = np.array([f"{d} " for d in range(10)] + ["[MIN ", "[MAX ", "[MED ", "[SM ", "] ", "( ", ") "], dtype="S5")


def generate_listops(n=100_000, seed=0, batch=20_000, progress=True):
    """-> list of (expression string, label) with n distinct expressions."""
    rng = np.random.default_rng(seed)
    data = {}
    bar = tqdm(total=n, desc="listops", disable=not progress, unit="ex")
    while len(data) < n:
        levels, tree = [], np.arange(batch)  # a forest; per level: op (-1 for a leaf), digit, n_children, tree id
        length = np.zeros(batch, np.int64)  # tokens without parens: digits + 2 per operator
        for depth in range(1, MAX_DEPTH + 1):
            m = len(tree)
            is_op = (rng.random(m) >= LEAF_P) if depth < MAX_DEPTH else np.zeros(m, bool)
            n_children = np.where(is_op, rng.integers(2, MAX_ARGS + 1, m), 0)
            op = np.where(is_op, rng.integers(0, 4, m), -1)
            levels.append(dict(op=op, digit=rng.integers(0, 10, m), n=n_children, tree=tree))
            length += np.bincount(tree, weights=np.where(is_op, 2, 1), minlength=batch).astype(np.int64)
            tree = np.repeat(tree, n_children)  # children are contiguous, in order
            if len(tree) == 0:
                break
        keep = (length > MIN_LENGTH) & (length < MAX_LENGTH)
        if not keep.any():
            continue
        remap = np.cumsum(keep) - 1  # every level restricted to the kept trees, renumbered 0..k-1
        levels = [{k: (remap[v] if k == "tree" else v)[keep[lv["tree"]]] for k, v in lv.items()} for lv in levels]
        values, sizes, codes = _evaluate_and_write(levels)
        chars = _LISTOPS_WRITTEN[codes].view(np.uint8)
        text = chars[chars != 0].tobytes()  # the tokens, each followed by one space
        nbytes = np.array([len(w) for w in _LISTOPS_WRITTEN])[codes]
        ends = np.cumsum(np.add.reduceat(nbytes, np.concatenate([[0], np.cumsum(sizes)[:-1]])))
        for start, end, value in zip(np.concatenate([[0], ends[:-1]]), ends, values):
            data.setdefault(text[start:end - 1].decode(), int(value))
            if len(data) == n:
                break
        bar.update(len(data) - bar.n)
    bar.close()
    items = list(data.items())
    return [items[i] for i in rng.permutation(len(items))]


def generated_listops_dir(data_dir, n=100_000, seed=0):
    """Generated ListOps, in the official layout: <dir>/listops-1000/basic_*.tsv."""
    return os.path.join(data_dir, "generated", f"listops-v{LISTOPS_VERSION}-seed{seed}-n{n}")


def ensure_listops(data_dir, n=100_000, seed=0, progress=True):
    """Generate ListOps once (96%/2%/2%, i.e. 96k/2k/2k for n=100k) unless a finished cache exists.
    Not kept in parts: the generator draws one sequence and deduplicates across all of it, and
    its 100,000 expressions take about 20 s on one core."""
    root = generated_listops_dir(data_dir, n, seed)
    files = [os.path.join(root, "listops-1000", f"basic_{s}.tsv") for s in SPLITS]
    sidecar, key = os.path.join(root, "cache.json"), dict(version=LISTOPS_VERSION, seed=seed, n=n)
    with cache_lock(root):
        if not cache_complete(sidecar, key, files):
            tqdm.write(f"data_lra: generating ListOps (n={n}, seed={seed}) into {root} (once; cached for later runs)")
            rows = generate_listops(n, seed, progress=progress)
            a, b = n - 2 * int(round(0.02 * n)), n - int(round(0.02 * n))  # train | val | test
            for path, part in zip(files, (rows[:a], rows[a:b], rows[b:])):
                text = "Source\tTarget\n" + "".join(f"{s}\t{v}\n" for s, v in part)   # the official layout
                write_atomically(path, lambda f: f.write(text.encode()))
            mark_complete(sidecar, key, files)
    return root


# -----------------------------------------------------------------------------
# Text (IMDb reviews) and Retrieval (AAN paper pairs), byte level


def load_text(split, data_dir, max_len=4096):
    root = os.path.join(data_dir, "aclImdb", "train" if split == "train" else "test")  # LRA: test doubles as val
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
    return LRADataset("text", split, seqs, labels, 2, max_len, f"release files under {root}, {len(labels):,} reviews")


def load_retrieval(split, data_dir, max_len=4000):
    """new_aan_pairs.<split>.tsv: no header; columns label id1 id2 text1 text2 (tab separated, no quoting)."""
    path = _find(data_dir, f"new_aan_pairs.{ {'train': 'train', 'val': 'eval', 'test': 'test'}[split] }.tsv",
                 "AAN (retrieval task)")
    pairs, labels = [], []
    for lineno, row in _tsv_rows(path):
        if row == [b""]:
            continue
        if len(row) != 5:
            raise _malformed(path, lineno, f"expected 5 tab-separated columns (label id1 id2 text1 text2), got {len(row)}")
        try:
            label = int(float(row[0]))
        except ValueError:
            label = None
        if label not in (0, 1):
            raise _malformed(path, lineno, f"label {row[0][:20]!r} is not 0 or 1")
        pairs.append(tuple(np.frombuffer(doc[:max_len], dtype=np.uint8) for doc in row[3:]))
        labels.append(label)
    return LRADataset("retrieval", split, pairs, labels, 2, max_len, f"release file {path}, {len(labels):,} pairs")


# -----------------------------------------------------------------------------
# Image: CIFAR-10 in grey, read with a restricted unpickler


class RestrictedUnpickler(pickle.Unpickler):
    """Admits numpy array reconstruction and builtin containers only, so a
    tampered pickle cannot name (and so cannot run) any other callable, e.g. os.system."""

    ALLOWED = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}
    for _m in ("numpy.core.multiarray", "numpy._core.multiarray"):
        ALLOWED[(_m, "_reconstruct")] = np.zeros(1).__reduce__()[0]  # numpy's array rebuilder
        ALLOWED[(_m, "scalar")] = np.float32(0).__reduce__()[0]  # numpy's scalar rebuilder
    for _m in ("numpy.core.numeric", "numpy._core.numeric"):
        ALLOWED[(_m, "_frombuffer")] = np.zeros(1).__reduce_ex__(5)[0]  # protocol 5 array rebuilder
    # python 3 writes bytes into protocol-2 pickles as _codecs.encode(text, "latin1")
    ALLOWED[("_codecs", "encode")] = lambda text, codec="latin1": text.encode(
        codec if codec in ("latin1", "latin-1") else "refused codec")
    for _m in ("builtins", "__builtin__"):  # python 3 and python 2 names
        for _c in (dict, list, tuple, set, frozenset, bytearray):
            ALLOWED[(_m, _c.__name__)] = _c

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return self.ALLOWED[(module, name)]
        raise pickle.UnpicklingError(f"refusing to load global {module}.{name} from a data file")


def read_cifar_batch(path):
    """-> (uint8 grey images (N, 1024), labels). A pickled dict whose 'data' is a uint8 array
    (N, 3072), each row 1024 R, 1024 G, 1024 B, and whose 'labels' is a flat list of N ints."""
    with open(path, "rb") as f:
        try:
            d = RestrictedUnpickler(f, encoding="bytes").load()
        except pickle.UnpicklingError as e:
            why = str(e) if str(e).startswith("refusing") else f"truncated or not a CIFAR-10 pickle ({e})"
            raise ValueError(f"{path}: {why}") from None
        except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, OverflowError) as e:
            raise ValueError(f"{path}: truncated or not a CIFAR-10 pickle ({type(e).__name__}: {e})") from None
    d = {k.decode() if isinstance(k, bytes) else k: v for k, v in d.items()} if isinstance(d, dict) else {}
    data, labels = d.get("data"), d.get("labels")
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
    root, parts = os.path.join(data_dir, "cifar-10-batches-py"), []
    for name in ["test_batch"] if split == "test" else [f"data_batch_{i}" for i in range(1, 6)]:
        if not os.path.exists(path := os.path.join(root, name)):
            raise _missing("CIFAR-10 (image task)", path)
        parts.append(read_cifar_batch(path))
    x, y = (np.concatenate(a) for a in zip(*parts))
    source = f"release files under {root}, {len(y):,} images"
    if split != "test":  # train = the first 90% of the 50k training images, val = the last 10%
        cut = int(round(0.9 * len(y)))
        x, y = (x[:cut], y[:cut]) if split == "train" else (x[cut:], y[cut:])
    return LRADataset("image", split, x, y, 10, 1024, source)


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


def read_pathfinder_release(folder, progress=True, resolution=None):
    """-> (uint8 images (N, R, R), labels (N,)) in metadata order. The metadata/<batch>.npy files
    are text lines '<subdir> <file> <index> <label> ...' (np.save'd string arrays are read too).
    R is the folder's (pathfinder<R>), else the first image's. Refused with a line naming the
    file: labels other than 0/1, unreadable PNGs, images of another size. Skipped: zero-byte PNGs
    (as TFDS; counted and said) and, at 32 px, the release's known empty
    curv_baseline/imgs/0/sample_172.png."""
    import matplotlib.image
    meta_dir = os.path.join(folder, "metadata")
    if not os.path.isdir(meta_dir):
        raise _missing("PathFinder", meta_dir)
    parent = os.path.basename(os.path.dirname(os.path.normpath(folder)))
    if resolution is None and parent.startswith("pathfinder") and parent[10:].isdigit():
        resolution = int(parent[10:])
    entries = []
    for name in sorted((f for f in os.listdir(meta_dir) if f.endswith(".npy")), key=lambda f: (len(f), f)):
        with open(path := os.path.join(meta_dir, name), "rb") as f:  # 0.npy, 1.npy, ..., 10.npy
            raw = f.read()
        try:
            lines = ([" ".join(map(str, row)) for row in np.load(io.BytesIO(raw), allow_pickle=False)]
                     if raw.startswith(b"\x93NUMPY") else raw.decode("utf-8").split("\n"))
        except (ValueError, TypeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: not PathFinder metadata (text lines or a string array): {e}") from None
        for lineno, fields in enumerate((line.split(" ") for line in lines), start=1):
            if not " ".join(fields).strip():
                continue
            if len(fields) < 4 or not fields[3].lstrip("-").isdigit():
                raise _malformed(path, lineno, "expected '<subdir> <file> <index> <label> ...' separated by spaces")
            if int(fields[3]) not in (0, 1):
                raise _malformed(path, lineno, f"label {fields[3]} is not 0 or 1")
            if resolution == 32 and f"{os.path.basename(os.path.normpath(folder))}/{fields[0]}/{fields[1]}" == EMPTY_IMAGE:
                continue
            entries.append((os.path.join(folder, fields[0], fields[1]), int(fields[3])))
    images, labels, empty = [], [], 0
    for path, label in tqdm(entries, desc=f"reading {folder}", disable=not progress, unit="img"):
        if not os.path.exists(path):
            raise _missing("PathFinder image listed in the metadata", path)
        if os.path.getsize(path) == 0:
            empty += 1
            continue
        try:
            x = matplotlib.image.imread(path, format="png")
        except (OSError, ValueError, SyntaxError, EOFError) as e:
            raise ValueError(f"{path}: not a readable PNG, truncated or damaged ({type(e).__name__}: {e})") from None
        x = x[..., 0] if x.ndim == 3 else x  # grey, as uint8
        images.append((x if x.dtype == np.uint8 else np.rint(x * 255)).astype(np.uint8))
        labels.append(label)
        resolution = resolution or images[0].shape[0]  # the folder's (pathfinder<R>), else the first image's
        if images[-1].shape != (resolution, resolution):
            raise ValueError(f"{path}: image is {images[-1].shape[1]}x{images[-1].shape[0]}, expected {resolution}x{resolution}")
    if empty:
        tqdm.write(f"data_lra: skipped {empty} empty (zero-byte) image(s) listed in {meta_dir}")
    if not images:
        raise ValueError(f"{meta_dir}: lists no readable images, so the PathFinder release at {folder} is empty; "
                         f"download it again, or generate the data (--data_source=generated)")
    return np.stack(images), np.array(labels, dtype=np.int64)


# -----------------------------------------------------------------------------
# PathFinder generator: pathfinder.py (numpy only, the original's rules and settings);
# here it is run in parallel chunks kept on disk as they finish, cached, and exported in
# the release layout.

CHUNK = 250  # images per independently seeded chunk: the data do not depend on the number of workers
NAMES = ("images", "labels", "margins")  # the arrays of a chunk and of a generated cache


def _quiet_worker():
    """A pool worker leaves Ctrl-C, SIGHUP and SIGUSR1 to its parent (which ends the pool), and
    SIGTERM, the pool's way of ending a worker, ends it at once, not through a training run's handler."""
    import signal
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(s, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _pathfinder_chunk(job):
    seed, chunk, size, resolution, contour_length = job
    return chunk, pathfinder.generate_chunk(seed, chunk, size, contour_length, resolution)


def generate_pathfinder(n, seed=0, difficulty="contour_length_14", resolution=32, workers=None, progress=True,
                        parts=None):
    """-> uint8 images (n, R, R), int64 labels (n,) (each drawn at random, as the original),
    int64 paddle margin of each image (n,). Drawn in chunks of CHUNK images, each seeded on its
    own, on every core. parts: a folder that keeps each finished chunk (chunk_00012.npz, written
    atomically) and is read first, so an interrupted call loses only the chunks in flight and the
    same call continues from the rest, to the same arrays."""
    length = DIFFICULTIES[_difficulty(difficulty)][1]
    pathfinder.params(resolution)
    jobs = [(seed, c, min(CHUNK, n - c * CHUNK), resolution, length) for c in range((n + CHUNK - 1) // CHUNK)]
    part = lambda c: os.path.join(parts, f"chunk_{c:05d}.npz")
    done = {}
    for c in range(len(jobs)) if parts else []:
        if (arrays := _load_npz(part(c), NAMES)) is not None:
            done[c] = arrays
    bar = tqdm(total=n, initial=sum(len(d[1]) for d in done.values()), desc=f"pathfinder{resolution} {difficulty}",
               disable=not progress, unit="img")
    if done:
        bar.write(f"data_lra: {len(done)} of {len(jobs)} chunks found on disk in {parts}; making the other "
                  f"{len(jobs) - len(done)}")
    todo = [job for job in jobs if job[1] not in done]
    workers = min(workers or os.cpu_count() or 1, len(todo))
    pool = multiprocessing.get_context("fork").Pool(workers, _quiet_worker) if workers > 1 else None
    try:
        for c, arrays in (pool.imap_unordered if pool else map)(_pathfinder_chunk, todo):
            done[c] = arrays
            if parts:
                write_atomically(part(c), lambda f: np.savez(f, **dict(zip(NAMES, arrays))))
            bar.update(len(arrays[1]))
    except KeyboardInterrupt:
        if parts:
            bar.write(f"data_lra: interrupted; {len(done)} of {len(jobs)} chunks are kept in {parts}, and the "
                      f"same command continues from them")
        raise
    finally:
        bar.close()
        if pool:
            pool.terminate()
    return tuple(np.concatenate([done[c][i] for c in range(len(jobs))]) for i in range(3))


def generated_pathfinder_path(data_dir, n=200_000, seed=0, difficulty="contour_length_14", resolution=32):
    """The cache's name holds what it was made with, the generator's VERSION included, so a
    cache from an older generator is never read as new."""
    folder = DIFFICULTIES[_difficulty(difficulty)][0]
    return os.path.join(data_dir, "generated", f"pathfinder{resolution}-{folder}-v{pathfinder.VERSION}-seed{seed}-n{n}.npz")


def ensure_pathfinder(data_dir, n=200_000, seed=0, difficulty="contour_length_14", resolution=32, progress=True,
                      with_margins=False):
    """Generated PathFinder from the cache, generating it once if needed; while it is made, its
    finished chunks are kept in <cache>.parts/ (removed once the cache is written).
    -> images, labels (and each image's paddle margin if with_margins)."""
    difficulty = _difficulty(difficulty)
    path = generated_pathfinder_path(data_dir, n, seed, difficulty, resolution)

    def make():
        tqdm.write(f"data_lra: generating PathFinder{resolution} {difficulty} (n={n}, seed={seed}, generator "
                   f"v{pathfinder.VERSION}) into {path} (once; cached for later runs)")
        return generate_pathfinder(n, seed, difficulty, resolution, progress=progress, parts=path + ".parts")
    images, labels, margins = _npz_cache(path, NAMES, make)
    shutil.rmtree(path + ".parts", ignore_errors=True)
    return (images, labels, margins) if with_margins else (images, labels)


def export_pathfinder_lra(folder, images, labels, margins=None, batch_size=1000, contour_length=14, resolution=32):
    """Write the official layout: <folder>/imgs/<b>/sample_<i>.png and <folder>/metadata/<b>.npy, whose
    text lines read 'imgs/<b> sample_<i>.png <i> <label> <continuity> <contour length> <distractor length>
    <paddle length> <paddle thickness> <margin> 1'. As snakes2.py, each batch numbers its samples from 0;
    margin is each image's own (margins (n,); None: the resolution's first margin). The PNGs are 8-bit
    greyscale, as scipy.misc.imsave wrote them (a colormapped PNG would shift some grey levels)."""
    from PIL import Image
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
        write_atomically(os.path.join(folder, "metadata", f"{b}.npy"), lambda f: f.write("".join(lines).encode()))


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
    write_atomically(path, lambda f: fig.savefig(f, dpi=100, format="png"))
    plt.close(fig)
    return path


def load_pathfinder(split, data_dir, resolution=32, difficulty="contour_length_14", data_source="auto", n=None,
                    seed=0, progress=True):
    """One split (80/10/10) of PathFinder (Path-X at 128 px): the release when data_source is
    'release', or 'auto' with no n and the release there; else n (default 200,000) generated images.
    Decoding 200k PNGs takes minutes, so the decoded release is kept as an .npz beside the generated
    data, named by the size and modification and change times of every metadata and image file (a PNG
    replaced in place changes its times, so its new pixels are read)."""
    difficulty = _difficulty(difficulty)
    relpath = os.path.relpath(os.path.join(pathfinder_folder(data_dir, resolution, difficulty), "metadata"), data_dir)
    if _use_release(data_source, n, _find(data_dir, relpath)):
        folder = os.path.dirname(_find(data_dir, relpath, f"PathFinder{resolution} release (data_source='release')"))
        stamp = hashlib.sha256(f"{os.path.abspath(folder)} {resolution}\n".encode())
        for sub in ("metadata", "imgs"):
            for root, dirs, files in sorted(os.walk(os.path.join(folder, sub))):
                for name in sorted(files):
                    st = os.stat(os.path.join(root, name))
                    stamp.update(f"{root}/{name} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}\n".encode())
        cache = os.path.join(data_dir, "generated", f"release-{stamp.hexdigest()[:16]}.npz")
        images, labels = _npz_cache(cache, ("images", "labels"), lambda: read_pathfinder_release(folder, progress, resolution))
        source = f"release files under {folder}, {len(labels):,} images (decoded once into {cache})"
    else:
        n = n or 200_000
        images, labels = ensure_pathfinder(data_dir, n, seed, difficulty, resolution, progress)
        source = f"generated cache {generated_pathfinder_path(data_dir, n, seed, difficulty, resolution)}, {n:,} images"
    idx = _split_80_10_10(len(labels), split)
    return LRADataset("pathfinder" if resolution == 32 else "pathx", split, images[idx].reshape(len(idx), -1), labels[idx],
                      2, resolution * resolution, source)


# -----------------------------------------------------------------------------
# Photos: images that are not contours, for SPT on another image set (Paper A: pretraining on other data
# still helps). 32x32 grey crops of the one photograph that matplotlib ships in its package data
# (mpl-data/sample_data/grace_hopper.jpg: Grace Hopper's portrait, 512x600 RGB), so nothing is downloaded.
# Each crop: a random square window of 32-128 pixels, resized to 32x32 (bilinear), flipped left-right with
# probability 1/2, 256 grey levels (PIL's "L": 0.299 R + 0.587 G + 0.114 B). No labels (all 0): pretraining
# data only.

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
    return LRADataset("photos", split, photo_crops(n, seed)[idx], np.zeros(len(idx), np.int64), 1, 1024,
                      f"{n:,} crops (seed {seed}) of matplotlib's sample photograph {PHOTO}")


# -----------------------------------------------------------------------------
# the one entry point

PROCEDURAL = dict(difficulty="contour_length_14", data_source="auto", n=None, seed=0, progress=True)
TASK_OPTIONS = {  # task -> (loader, its options and defaults); n=None: the release if there, else generated
    "listops": (load_listops, dict(max_len=2000, data_source="auto", n=None, seed=0, progress=True)),
    "text": (load_text, dict(max_len=4096)),
    "retrieval": (load_retrieval, dict(max_len=4000)),
    "image": (load_image, dict()),
    "pathfinder": (load_pathfinder, dict(resolution=32, **PROCEDURAL)),
    "photos": (load_photos, dict(n=10_000, seed=0)),
    "pathx": (load_pathfinder, dict(resolution=128, **PROCEDURAL)),
}


def load_task(name, split, data_dir="data", **options):
    """-> LRADataset for one split of one task. Options (with defaults) per task are in TASK_OPTIONS;
    max_len=None means the task's default everywhere. ds.source says which data were read."""
    if name not in TASK_OPTIONS:
        raise ValueError(f"unknown task {name!r}; choose from {list(TASK_OPTIONS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {list(SPLITS)}")
    loader, defaults = TASK_OPTIONS[name]
    options = {k: v for k, v in options.items() if not (k == "max_len" and v is None)}
    unknown = set(options) - set(defaults)
    if unknown:
        raise TypeError(f"unknown option(s) {sorted(unknown)} for task {name!r}; it takes {defaults}")
    return loader(split, data_dir, **{**defaults, **options})


# -----------------------------------------------------------------------------
# command line: python data_lra.py --task=pathfinder --generate [--key=value ...]

CLI = dict(task="pathfinder", generate=False, grid=False, n=0, seed=0, difficulty="contour_length_14",
           resolution=0, data_dir="data")  # n, resolution 0: the task's own


def parse_args(argv):
    """--key=value overrides of CLI, typed like the default; a bare --flag means True.
    A bad flag raises ValueError naming it, before any work."""
    cfg = dict(CLI)
    for arg in argv:
        if arg in ("-h", "--help"):
            sys.exit(print("python data_lra.py " + " ".join(f"--{k}={v}" for k, v in CLI.items())))
        key, _, value = arg[2:].partition("=")
        if not arg.startswith("--") or key not in cfg:
            raise ValueError(f"unknown key {arg.partition('=')[0]}; known keys: {', '.join('--' + k for k in cfg)}")
        kind = type(CLI[key])
        try:
            cfg[key] = {"": True, "true": True, "false": False}[value.lower()] if kind is bool else kind(value)
        except (KeyError, ValueError):
            raise ValueError(f"--{key}={value}: expected {'True or False' if kind is bool else 'an integer'}") from None
        if kind is int and not 0 <= cfg[key] < 2**31:  # n, seed, resolution
            raise ValueError(f"--{key}={value} must be in [0, 2**31)")
    takes = TASK_OPTIONS.get(cfg["task"], (None, None))[1]
    if takes is None or cfg["generate"] and "data_source" not in takes or cfg["grid"] and "resolution" not in takes:
        raise ValueError(f"--task={cfg['task']}: the tasks are {', '.join(TASK_OPTIONS)}; --generate is for "
                         f"listops, pathfinder and pathx, --grid for pathfinder and pathx")
    pathfinder.params(cfg["resolution"] or 32), _difficulty(cfg["difficulty"])  # name the choices there are
    return cfg


def main(argv):
    """--grid: a PNG of generated samples; --generate: generated data (made once); then, unless
    --grid alone, each split as load_task reads it, with its source."""
    cfg = parse_args(argv)
    task, R = cfg["task"], cfg["resolution"] or (128 if cfg["task"] == "pathx" else 32)
    if cfg["grid"]:
        path = os.path.join(cfg["data_dir"], "generated", f"pathfinder{R}_grid.png")
        print(f"data_lra: wrote {save_sample_grid(path, R, seed=cfg['seed'])}")
    options = dict(data_source="generated" if cfg["generate"] else "auto", n=cfg["n"] or None, seed=cfg["seed"],
                   difficulty=cfg["difficulty"], resolution=R)
    options = {k: v for k, v in options.items() if k in TASK_OPTIONS[task][1] and v is not None}
    for split in SPLITS if cfg["generate"] or not cfg["grid"] else ():
        ds = load_task(task, split, cfg["data_dir"], **options)
        print(f"{task} {split}: {len(ds):,} examples, vocab {ds.vocab_size}, classes {ds.n_classes}, "
              f"max_len {ds.max_len}; {ds.source}")


if __name__ == "__main__":
    try:                                   # a bad flag or file: one line, as in the training scripts
        main(sys.argv[1:])
    except (ValueError, OSError) as e:
        sys.exit("error: " + " ".join(str(e).split()))
    except KeyboardInterrupt:                # generate_pathfinder has said which chunks are kept
        sys.exit(130)
