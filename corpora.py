"""
The corpora train_flt.py trains its looped language models on, each a pair of
arrays (train, val) that get_batch draws from:

  stdlib      the docstrings of Python's standard library, as bytes (every
              machine with Python has them; nothing is downloaded), cached once
  listops     short ListOps expressions followed by '=' and their value, with a
              target only on the value (a corpus where more loops should help)
  a text file its bytes, 90% train / 10% val
  a folder    nanoGPT-style train.bin / val.bin of uint16 token ids

Read top to bottom: stdlib_docstrings, prepare_stdlib (the cache), listops_expression, listops_corpus
(valued by data_lra.listops_value), load_data, get_batch, eval_set, unigram_entropy (context-free loss).
"""

import ast
import os
import platform
import sysconfig

import numpy as np
import torch
from tqdm import tqdm

import data_lra

# The corpora are one fixed draw, whatever a run's --seed: the stdlib docstrings are shuffled, and the
# ListOps expressions drawn, with this seed, so every run trains and is scored on the same text.
CORPUS_SEED = 0


def stdlib_docstrings(root=None):
    """The docstrings of every module, class and function in the Python standard
    library's source (site-packages and test folders skipped), deduplicated, in a
    fixed order. Every machine with Python has them; nothing is downloaded."""
    root = root or sysconfig.get_paths()["stdlib"]
    skip = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}
    files = []
    for d, subdirs, names in os.walk(root):
        subdirs[:] = sorted(s for s in subdirs if s not in skip)
        files += [os.path.join(d, n) for n in sorted(names) if n.endswith(".py")]
    seen, docs = set(), []
    for path in tqdm(files, desc="stdlib docstrings", leave=False):
        try:
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and doc not in seen:
                    seen.add(doc)
                    docs.append(doc)
    return docs


STDLIB_VERSION = 1     # bump when the corpus recipe changes, so old caches are rebuilt


def prepare_stdlib(data_dir, root=None):
    """Gather the stdlib docstrings once, shuffle them (CORPUS_SEED), join, and cache the bytes as
    uint8 train.bin / val.bin (90/10). Its sidecar stdlib.json holds the recipe version, the source
    folder, the Python version (another Python's docstrings differ) and the files' sizes; a cache that
    disagrees (cut, older, of another Python) is rebuilt. (About 3 s: not kept in parts.)"""
    paths = [os.path.join(data_dir, f"{name}.bin") for name in ("train", "val")]
    key = dict(corpus="stdlib", version=STDLIB_VERSION, source=os.path.abspath(root or sysconfig.get_paths()["stdlib"]),
               python=platform.python_version())
    sidecar = os.path.join(data_dir, "stdlib.json")
    with data_lra.cache_lock(sidecar):                          # a second run at once waits, then reads it
        if not data_lra.cache_complete(sidecar, key, paths):
            docs = stdlib_docstrings(root)
            order = np.random.default_rng(CORPUS_SEED).permutation(len(docs))
            raw = np.frombuffer("\n\n".join(docs[i] for i in order).encode("utf-8"), dtype=np.uint8)
            for path, part in zip(paths, np.split(raw, [int(0.9 * len(raw))])):
                data_lra.write_atomically(path, part.tofile)
            data_lra.mark_complete(sidecar, key, paths)
            tqdm.write(f"gathered {len(docs)} docstrings ({len(raw) / 1e6:.2f} MB) from {key['source']} into {data_dir}")
        return tuple(np.fromfile(p, dtype=np.uint8) for p in paths)


def listops_expression(rng, depth):
    """A random ListOps expression as tokens (parens left out): an operator over 2
    or 3 arguments, each a digit or, while depth > 1, with probability 1/2 a nested
    expression."""
    ops = list(data_lra.LISTOPS_OPS)
    args = [listops_expression(rng, depth - 1) if depth > 1 and rng.random() < 0.5 else [str(rng.integers(10))]
            for _ in range(rng.integers(2, 4))]
    return [ops[rng.integers(len(ops))], *sum(args, []), "]"]


def listops_corpus(n, depth, block_size, seed=CORPUS_SEED):
    """n distinct expressions written as text, then '=', then their value, e.g.
    '[MAX 2 [SM 3 9 ] 0 ]=2', as an int64 array (n, 2, block_size): row 0 the input
    bytes (space-padded), row 1 the targets, -1 everywhere but at '=', whose target
    is the answer digit. So the loss, and the accuracy, read the answer only: how well the
    model evaluates the expression, a computation more loops can help. Longer than block_size
    + 1 bytes: drawn again; 20,000 draws in a row with nothing new: there are no more (depth 1
    has about 4,400), and fewer than n is refused."""
    rng, seen, rows, last_new = np.random.default_rng(seed), set(), [], 0
    for draw in tqdm(range(50 * n), desc="listops", leave=False):
        if draw - last_new > 20_000:                          # none new in 20,000 draws: as many as there are
            break
        tokens = listops_expression(rng, depth)
        text = f"{' '.join(tokens)}={data_lra.listops_value(tokens)}".encode()
        if len(text) <= block_size + 1 and text not in seen:
            seen.add(text)
            xy = np.array([[ord(" ")] * block_size, [-1] * block_size], dtype=np.int64)
            xy[0, :len(text) - 1] = list(text[:-1])
            xy[1, len(text) - 2] = text[-1]                   # the target after '=' is the value
            rows.append(xy)
            last_new = draw
            if len(rows) == n:
                return np.stack(rows)
    raise ValueError(f"only {len(rows)} distinct ListOps expressions of depth {depth} fit block_size={block_size}; "
                     f"ask for fewer (--listops_examples) or raise --block_size or --listops_depth")


def load_data(cfg):
    """(train, val, vocab_size, is_bytes) for --data=stdlib | listops | file.txt | DIR.
    ListOps: one corpus of distinct expressions (fixed seed, whatever the run's seed),
    the first --listops_val held out for val, the next --listops_examples for training.
    `cfg`, as every function here takes it: train_flt.py's config dict."""
    if cfg["data"] == "listops":
        n_val = cfg["listops_val"]
        rows = listops_corpus(cfg["listops_examples"] + n_val, cfg["listops_depth"], cfg["block_size"])
        return rows[n_val:], rows[:n_val], 256, False
    if cfg["data"] == "stdlib":
        return (*prepare_stdlib(cfg["data_dir"]), 256, True)
    if os.path.isdir(cfg["data"]):
        paths = [os.path.join(cfg["data"], f) for f in ("train.bin", "val.bin")]
        for p in (p for p in paths if not os.path.exists(p)):
            raise FileNotFoundError(f"{p}: missing; a token folder holds nanoGPT-style train.bin and val.bin (uint16 ids)")
        train, val = (np.memmap(p, dtype=np.uint16, mode="r") for p in paths)
        top = max([int(part.max()) for part in (train, val) if 0 < len(part) <= 5e7] + [0])
        if top >= cfg["vocab_size"]:
            raise ValueError(f"{cfg['data']} holds token id {top} >= --vocab_size={cfg['vocab_size']}; "
                             f"set --vocab_size to the tokenizer's vocabulary size")
        return train, val, cfg["vocab_size"], False
    if os.path.isfile(cfg["data"]):
        raw = np.fromfile(cfg["data"], dtype=np.uint8)
        n = int(0.9 * len(raw))
        return raw[:n], raw[n:], 256, True
    raise FileNotFoundError(f"--data={cfg['data']}: no such file or folder. Give 'stdlib', a text file, or a folder")


def get_batch(data, cfg, step, micro=0, rank=0, device="cpu"):
    """A training batch (x, y) of batch_size windows of block_size tokens (y = x
    shifted by one), drawn by a generator seeded with (seed, step, micro, rank): the
    same call always gives the same batch, which makes resume exact. ListOps data
    (n, 2, block_size) gives batch_size of its rows instead."""
    rng = np.random.default_rng([cfg["seed"], step, micro, rank])
    if data.ndim == 3:
        xy = torch.from_numpy(data[rng.integers(0, len(data), size=cfg["batch_size"])])
        return xy[:, 0].to(device), xy[:, 1].to(device)
    T = cfg["block_size"]
    ix = rng.integers(0, len(data) - T - 1, size=cfg["batch_size"])
    xy = torch.from_numpy(np.stack([np.asarray(data[i:i + T + 1], dtype=np.int64) for i in ix]))
    x, y = xy[:, :-1], xy[:, 1:]
    if device.startswith("cuda"):
        x, y = x.pin_memory(), y.pin_memory()
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def eval_set(val, cfg):
    """The fixed eval set (x, y), tensors (N, block_size): a function of the val split
    and the flags below only, never of the seed, so every seed and variant of a corpus is
    scored on the same text. ListOps: every held-out expression (N = --listops_val), once.
    A byte or token stream: eval_batches * batch_size windows evenly spaced over val."""
    if val.ndim == 3:
        xy = torch.from_numpy(np.asarray(val))
        return xy[:, 0], xy[:, 1]
    T, n = cfg["block_size"], cfg["eval_batches"] * cfg["batch_size"]
    starts = np.linspace(0, len(val) - T - 1, n).round().astype(np.int64)
    xy = torch.from_numpy(np.stack([np.asarray(val[i:i + T + 1], dtype=np.int64) for i in starts]))
    return xy[:, :-1], xy[:, 1:]


def unigram_entropy(data, vocab):
    """H = -sum_v p(v) log p(v) in nats: the loss of the best context-free model
    (for ListOps, of the answers)."""
    data = data[:, 1][data[:, 1] >= 0] if data.ndim == 3 else data[:10_000_000]
    counts = np.bincount(np.asarray(data), minlength=vocab).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
