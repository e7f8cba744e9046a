"""
The minimal synthetic task of the SPT paper: binary classification of length-100
sequences, for a 1-layer Transformer, whose label depends on an interaction
between NEIGHBOURING tokens that no bag-of-tokens model can see.

The task: "smooth walk or scrambled walk?"

  values      tokens 0..V-1 (V = n_values = 32), plus pad_id = V and mask_id = V+1
  every row   starts as a lazy random walk on the circle Z_V:
                x_0 ~ Uniform{0..V-1},  x_{i+1} = (x_i + s_i) mod V,  s_i ~ Uniform{-1, 0, +1}
              so neighbouring tokens are strongly correlated (|x_{i+1} - x_i| <= 1 mod V):
              a masked token is predictable from its neighbours, which gives
              masked reconstruction a reason to attend to them.
  label 1     the walk as it is ("smooth").
  label 0     the same kind of walk, with a random subset of round(scramble_frac * T)
              positions (default 10 of 100) permuted among themselves
              ("scrambled"); the rest keep their local correlations. The rare
              row that comes out smooth anyway (~2 in 10^4) is scrambled again,
              so every label-0 row has at least one broken neighbouring pair.

Why a bag of tokens cannot see it: a permutation of positions keeps the
multiset of tokens, so the token counts of a scrambled row have exactly the
distribution of the counts of a smooth row. Each position's marginal is uniform
in both classes too (the walk starts uniformly on the circle). The label lives
only in pairs of neighbouring positions: is |x_{i+1} - x_i| mod V <= 1
everywhere (label 1), or broken at the scrambled positions (label 0)?

A 1-layer model solves it once attention looks at the neighbours (a proximity
bias): each token compares itself with its neighbourhood, and mean pooling
counts the broken pairs. At uniform attention each position sees only the mean
of all tokens, a bag of tokens, which is at chance.

Labels are exactly balanced in every split; generation is seeded, vectorised
with numpy, and fast (100k sequences in well under a second).

The interface matches data_lra.py: a torch Dataset of (tokens, label) with
vocab_size, n_classes, max_len, pad_id, mask_id and a collate method.
This file imports only numpy and torch.
"""

import numpy as np
import torch

SPLIT_SEEDS = {"train": 0, "val": 1, "test": 2}   # split k is drawn with seed + 1000 * k (load_split)


def make_walks(n, length, n_values, rng):
    """Lazy random walks on Z_V: x_{i+1} = x_i + s_i (mod V), s_i in {-1, 0, +1}."""
    start = rng.integers(0, n_values, size=(n, 1))
    steps = rng.integers(-1, 2, size=(n, length - 1))
    return np.mod(np.cumsum(np.concatenate([start, steps], axis=1), axis=1), n_values)


def scramble(x, frac, rng):
    """Permute a random subset of round(frac * T) positions of each row among themselves."""
    n, T = x.shape
    k = int(round(frac * T))
    chosen = np.argsort(rng.random((n, T)), axis=1)[:, :k]                # which positions
    shuffled = np.take_along_axis(chosen, np.argsort(rng.random((n, k)), axis=1), axis=1)
    out = x.copy()
    np.put_along_axis(out, chosen, np.take_along_axis(x, shuffled, axis=1), axis=1)
    return out


def make_data(n, length=100, n_values=32, scramble_frac=0.1, seed=0):
    """Tokens (n, length) int64 and labels (n,) int64, exactly half of each class."""
    if n < 2 or length < 2:
        raise ValueError(f"need n >= 2 and length >= 2, got n={n}, length={length}")
    if not 0.0 < scramble_frac <= 1.0:
        raise ValueError(f"scramble_frac={scramble_frac} must be in (0, 1]")
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % 2)                            # balanced
    x = make_walks(n, length, n_values, rng)
    scrambled = scramble(x, scramble_frac, rng)
    while (still := smooth_fraction(scrambled, n_values) == 1.0).any():
        scrambled[still] = scramble(x[still], scramble_frac, rng)
    tokens = np.where(labels[:, None] == 1, x, scrambled)
    return tokens.astype(np.int64), labels.astype(np.int64)


def smooth_fraction(tokens, n_values=32):
    """Fraction of neighbouring pairs with |x_{i+1} - x_i| mod V <= 1 (1.0 for label 1)."""
    d = np.mod(np.diff(tokens, axis=1), n_values)
    return ((d <= 1) | (d == n_values - 1)).mean(axis=1)


class SyntheticDataset(torch.utils.data.Dataset):
    """(tokens, label) pairs with the same attributes as the data_lra.py datasets."""

    n_classes = 2

    def __init__(self, tokens, labels, n_values):
        self.tokens = torch.as_tensor(tokens, dtype=torch.long)
        self.labels = torch.as_tensor(labels, dtype=torch.long)
        self.n_values = n_values
        self.pad_id, self.mask_id = n_values, n_values + 1
        self.vocab_size = n_values + 2
        self.max_len = self.tokens.size(1)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.tokens[i], int(self.labels[i])

    def collate(self, batch):
        """-> tokens (B, T), pad_mask None (all rows have the same length), labels (B,)."""
        tokens = torch.stack([t for t, _ in batch])
        labels = torch.tensor([y for _, y in batch], dtype=torch.long)
        return tokens, None, labels


def load_split(split, n=None, length=100, n_values=32, scramble_frac=0.1, seed=0):
    """One split of the task. Default sizes: train 10000, val 2000, test 2000.
    Split k (train 0, val 1, test 2) is drawn with seed + 1000 * k, so for seeds below
    1000 every (seed, split) pair has its own random stream (with seed + k, seed 1's
    train would be seed 0's val)."""
    if split not in SPLIT_SEEDS:
        raise ValueError(f"split={split!r}; choose one of {list(SPLIT_SEEDS)}")
    n = n or (10000 if split == "train" else 2000)
    tokens, labels = make_data(n, length, n_values, scramble_frac, seed + 1000 * SPLIT_SEEDS[split])
    return SyntheticDataset(tokens, labels, n_values)


if __name__ == "__main__":
    ds = load_split("train", n=8)
    for tokens, label in ds:
        print(label, " ".join(f"{t:2d}" for t in tokens[:30].tolist()), "...")
    frac = smooth_fraction(ds.tokens.numpy())
    print("smooth-pair fraction per row:", np.round(frac, 2), "labels:", ds.labels.tolist())
