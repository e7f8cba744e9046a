"""synthetic.py: balanced, locally correlated, and invisible to a bag of tokens."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from synthetic import load_split, make_data, smooth_fraction


def test_labels_are_balanced_in_every_split():
    for split in ("train", "val", "test"):
        ds = load_split(split, n=1000)
        assert ds.labels.sum().item() == 500
        assert ds.tokens.shape == (1000, 100) and ds.max_len == 100


def test_label_is_the_neighbour_interaction():
    tokens, labels = make_data(2000, seed=1)
    frac = smooth_fraction(tokens)
    assert (frac[labels == 1] == 1.0).all()          # smooth rows: every pair within 1
    assert frac[labels == 0].max() < 1.0             # scrambled rows: broken pairs
    assert np.median(frac[labels == 0]) < 0.95
    assert (tokens.min() >= 0) and (tokens.max() < 32)


def test_token_counts_are_identical_in_distribution_across_classes():
    """A scrambled row is a permutation of a smooth-walk row: same multiset of tokens."""
    rng = np.random.default_rng(0)
    from synthetic import make_walks, scramble
    x = make_walks(50, 100, 32, rng)
    y = scramble(x, 0.1, rng)
    assert (np.sort(x, axis=1) == np.sort(y, axis=1)).all()
    assert (x != y).any(axis=1).all()


def test_a_classifier_on_token_counts_stays_at_chance():
    tokens, labels = make_data(6000, seed=3)
    counts = torch.tensor(np.stack([np.bincount(r, minlength=32) for r in tokens]), dtype=torch.float32)
    X = torch.cat([counts, counts ** 2], dim=1)            # counts and their squares
    X = (X - X.mean(0)) / (X.std(0) + 1e-6)
    y = torch.tensor(labels, dtype=torch.float32)
    w = torch.zeros(X.size(1), requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    opt = torch.optim.Adam([w, b], lr=0.05)
    for _ in range(300):
        loss = F.binary_cross_entropy_with_logits(X[:4000] @ w + b, y[:4000])
        opt.zero_grad()
        loss.backward()
        opt.step()
    held_out = ((X[4000:] @ w + b > 0).float() == y[4000:]).float().mean().item()
    assert 0.45 < held_out < 0.56


def test_generation_is_seeded_and_splits_differ():
    a, b = load_split("train", n=100, seed=5), load_split("train", n=100, seed=5)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.tokens, load_split("val", n=100, seed=5).tokens)


def test_collate_matches_the_lra_interface():
    ds = load_split("val", n=10)
    assert (ds.vocab_size, ds.pad_id, ds.mask_id, ds.n_classes) == (34, 32, 33, 2)
    tokens, pad_mask, labels = ds.collate([ds[i] for i in range(4)])
    assert tokens.shape == (4, 100) and tokens.dtype == torch.long
    assert pad_mask is None and labels.tolist() == ds.labels[:4].tolist()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="split='dev'"):
        load_split("dev")
    with pytest.raises(ValueError, match="scramble_frac=0"):
        make_data(10, scramble_frac=0)
