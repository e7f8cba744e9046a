"""theory.py: the zero-gradient claim at uniform attention, checked in float64."""

import torch

import theory
from synthetic import load_split


def gradients(full, n=16):
    data = load_split("val", n=n, seed=0)
    model = theory.uniform_attention_model(data.vocab_size, data.max_len, seed=0)
    g = torch.Generator().manual_seed(0)
    return theory.score_gradients(model, data.tokens, data.labels, data.mask_id, full, g)


def test_centred_proximity_pattern_has_zero_column_and_row_sums():
    P = theory.centred_proximity(50, 3)
    assert P.sum(0).abs().max() < 1e-12 and P.sum(1).abs().max() < 1e-12
    assert P[10, 11] > 0 > P[10, 30]                      # still "near is more"


def test_mean_pool_gradient_blind_to_proximity():
    g_sup, g_rec = gradients(full=False)
    assert theory.rows_identical(g_sup) < 1e-12          # dL/dS = (1/T) 1 r^T
    for w in (1, 2, 5, 10):
        P = theory.centred_proximity(100, w)
        assert theory.cosine(g_sup, P).abs().max() < 1e-10
        assert theory.cosine(g_rec, P).abs().mean() > 1e-3


def test_reconstruction_descent_points_towards_neighbours_on_average():
    _, g_rec = gradients(full=False, n=32)
    P = theory.centred_proximity(100, 2)
    assert -theory.cosine(g_rec.mean((0, 1)), P) > 0


def test_full_layer_breaks_exact_blindness_but_supervised_stays_smaller():
    g_sup, g_rec = gradients(full=True)
    assert theory.rows_identical(g_sup) > 1e-3           # per-token nonlinearity: rows differ
    P = theory.centred_proximity(100, 2)
    sup, rec = theory.cosine(g_sup, P).abs().mean(), theory.cosine(g_rec, P).abs().mean()
    assert 0 < sup < rec


def test_theory_script_passes(capsys):
    assert theory.main(["--n_batches=1", "--batch_size=8"]) == 0
    out = capsys.readouterr().out
    assert "part 1 PASSES" in out and "Part 2" in out
