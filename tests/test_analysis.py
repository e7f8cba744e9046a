"""analysis.py on hand-made attention maps (where the right answer is known) and
on real model.py layers: 1-D and 2-D proximity, score spread, position scores; and
its figures: proximity.png, and tools/attention_gif.py's GIF on made-up snapshots."""

import math

import pytest
import torch

import analysis
from model import Transformer, TransformerConfig


def neighbourhood_maps(side, radius):
    """Attention spread evenly over each pixel's Chebyshev neighbourhood of `radius`."""
    near = (analysis.grid_distance(side) <= radius).float()
    return [(near / near.sum(-1, keepdim=True))[None, None]]       # (1, 1, T, T)


def test_perfect_3x3_attention_scores_one_at_radius_one():
    mass = analysis.proximity_mass_2d(neighbourhood_maps(8, 1), radii=(0, 1, 2))
    assert mass["layers"][0][1] == pytest.approx(1.0)
    assert mass["layers"][0][0] < 0.2                               # itself only: 1/9 inside, 1/4-1/6 at edges
    one_d = analysis.proximity_mass(neighbourhood_maps(8, 1), widths=(2,))
    assert one_d["layers"][0][0] < 0.45                             # the 1-D statistic sees only a third


def test_uniform_attention_gives_the_uniform_baseline():
    T = 64
    maps = [torch.full((2, 3, T, T), 1.0 / T)]
    two_d = analysis.proximity_mass_2d(maps)
    assert two_d["layers"][0] == pytest.approx(two_d["uniform"])
    inner = 36 * 9 + 24 * 6 + 4 * 4                                 # 3x3 windows clipped at the border
    assert two_d["uniform"][1] == pytest.approx(inner / T / T)
    one_d = analysis.proximity_mass(maps)
    assert one_d["layers"][0] == pytest.approx(one_d["uniform"])


def test_a_row_wrap_pair_is_not_a_grid_neighbour():
    side, T = 8, 64
    m = torch.zeros(1, 1, T, T)
    for r in range(side - 1):                                       # (r, 7) attends to (r + 1, 0)
        m[0, 0, r * side + side - 1, (r + 1) * side] = 1.0
    rows = [r * side + side - 1 for r in range(side - 1)]
    pad = torch.ones(1, T, dtype=torch.bool)
    pad[0, rows] = False                                            # read only those queries
    assert analysis.proximity_mass([m], pad, widths=(1,))["layers"][0][0] == pytest.approx(1.0)
    dist = analysis.grid_distance(side)
    assert all(dist[q, q + 1] == side - 1 for q in rows)            # far apart on the grid
    assert (analysis.proximity_mass_2d([m], radii=(1,))["layers"][0][0]) < 0.02


def test_non_square_attention_is_refused_for_2d():
    with pytest.raises(ValueError, match="not a square image"):
        analysis.proximity_mass_2d([torch.full((1, 1, 10, 10), 0.1)])


def test_score_spread_of_uniform_and_of_peaked_attention():
    T = 16
    flat = analysis.score_spread([torch.full((1, 2, T, T), 1.0 / T)])
    assert flat["score_std"][0] == pytest.approx(0.0, abs=1e-6)
    assert flat["entropy"][0] == pytest.approx(math.log(T)) == pytest.approx(flat["entropy_uniform"])
    scores = torch.randn(1, 2, T, T) * 0.5
    peaked = analysis.score_spread([scores.softmax(-1)])
    centred = scores - scores.mean(-1, keepdim=True)
    assert peaked["score_std"][0] == pytest.approx(centred.pow(2).mean(-1).sqrt().mean().item(), rel=1e-4)


@pytest.mark.parametrize("init, lo, hi", [("torch", 0.2, 0.4), ("gpt2", 0.01, 0.04)])
def test_the_two_inits_give_the_documented_score_spread(init, lo, hi):
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=34, max_len=100, n_embd=64, n_head=4, init=init))
    _, maps = model.forward_with_maps(torch.randint(0, 32, (16, 100)))
    spread = analysis.score_spread(maps)
    assert lo < spread["score_std"][0] < hi


def test_position_scores_use_the_real_query_and_key():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=10, max_len=40, n_embd=16, n_head=2))
    attn, ln = model.blocks[0].attn, model.blocks[0].ln_1
    scores = analysis.position_scores(model)
    h = ln(model.pe[:40])
    q, k = attn.W_Q(h).view(40, 2, 8).transpose(0, 1), attn.W_K(h).view(40, 2, 8).transpose(0, 1)
    assert torch.allclose(scores, q @ k.transpose(-2, -1) / math.sqrt(8), atol=1e-5)
    with torch.no_grad():
        attn.W_Q.bias.add_(1.0)                                     # the bias is part of the query
    assert not torch.allclose(analysis.position_scores(model), scores)
    assert analysis.position_scores(Transformer(TransformerConfig(vocab_size=10, pos_enc="rope"))) is None


def test_toeplitz_score_is_one_for_a_function_of_i_minus_j():
    i = torch.arange(30)
    M = torch.exp(-(i[:, None] - i[None, :]).abs().float() / 3)
    score, near_far = analysis.toeplitz_stats(M)
    assert score == pytest.approx(1.0) and near_far > 1
    assert analysis.toeplitz_stats(torch.randn(30, 30))[0] < 0.3


def test_image_attention_figure_reads_the_3x3_mass_of_each_query(tmp_path):
    side = 8
    T = side * side
    image = torch.zeros(T, dtype=torch.long)
    image[[9, 10, 11, 12]] = 255                                      # a short stroke on row 1
    local = (analysis.grid_distance(side) <= 1).float()
    local = (local / local.sum(-1, keepdim=True))[None].expand(2, T, T)   # 2 heads, 3x3 only
    uniform = torch.full((2, T, T), 1.0 / T)
    path = tmp_path / "a.png"
    masses = analysis.plot_image_attention(image, {"init": uniform, "after SPT": local}, path)
    assert path.stat().st_size > 0
    assert all(abs(m - 1.0) < 1e-6 for m in masses["after SPT"])
    assert all(abs(m - 9 / T) < 1e-6 for m in masses["init"])       # every query is off the border


def test_tied_init_attends_to_itself_and_its_neighbours_and_independent_inits_do_not():
    """Amos et al.'s W_Q = W_K = W_V = W_O: at init every seed puts more than uniform mass
    on the query itself and on |i-j| <= 2 (tools/attention_at_init.py, 5 seeds: 2.66 +- 0.13x
    and 1.70 +- 0.05x); independent projections (torch) and small ones (gpt2) do not."""
    from synthetic import load_split
    data = load_split("val", n=32, seed=0)
    stats = {}
    for init in ("torch", "gpt2", "amos"):
        config = TransformerConfig(vocab_size=data.vocab_size, max_len=100, n_embd=64, n_head=4, init=init)
        stats[init] = analysis.attention_at_init(config, data.tokens, seeds=(0, 1, 2))
    assert min(stats["amos"]["self"]) > 2.0 and min(stats["amos"]["near"]) > 1.4
    for init in ("torch", "gpt2"):
        for key in ("self", "near"):
            assert 0.9 < sum(stats[init][key]) / 3 < 1.1, (init, key)
    assert max(stats["gpt2"]["score_std"]) < 0.05 < min(stats["torch"]["score_std"])


def test_attention_at_init_reads_the_grid_neighbourhood_of_images():
    side = 8
    image = torch.zeros(2, side * side, dtype=torch.long)
    config = TransformerConfig(vocab_size=258, max_len=side * side, n_embd=32, n_head=2, init="amos",
                               pixel_encoder="linear")
    stats = analysis.attention_at_init(config, image, seeds=(0, 1), image_side=side)
    assert set(stats) == {"self", "near", "grid", "score_std"} and all(len(v) == 2 for v in stats.values())
    assert min(stats["grid"]) > 1.0                                  # tied: local on the grid too


def test_proximity_figure_labels_its_heatmaps_gives_each_a_colour_bar_and_fits_its_titles(tmp_path):
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=10, max_len=40, n_embd=16, n_head=2))
    _, maps = model.forward_with_maps(torch.randint(0, 10, (2, 40)))
    reports, scores = {}, {}
    for stage in ("init", "start", "finetune"):
        reports[stage], scores[stage] = analysis.attention_report(model, maps)
    fig = analysis.plot_proximity(reports, scores, tmp_path / "proximity.png")
    assert (tmp_path / "proximity.png").stat().st_size > 1000
    heatmaps = [ax for ax in fig.axes if ax.images]
    assert len(heatmaps) == 3
    for ax in heatmaps:
        assert (ax.get_xlabel(), ax.get_ylabel()) == ("key position j", "query position i")
        assert ax.images[0].colorbar is not None and ax.images[0].colorbar.ax.get_ylabel()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(fig)                                   # pyplot let go of it once saved
    canvas.draw()
    renderer, box = canvas.get_renderer(), fig.bbox
    for ax in fig.axes:                                             # nothing drawn outside the canvas
        extent = ax.title.get_window_extent(renderer)
        assert box.x0 <= extent.x0 and extent.x1 <= box.x1 and extent.y1 <= box.y1, ax.get_title()


def fake_snapshots(phases_steps, seed):
    g = torch.Generator().manual_seed(seed)
    return [dict(phase=phase, step=step, mass=[0.1] * 7, map=torch.rand(8, 8, generator=g).softmax(-1).tolist())
            for phase, step in phases_steps]


def test_attention_gif_pairs_the_runs_step_by_step_and_draws_one_frame_each(tmp_path):
    from PIL import Image
    from tools import attention_gif
    for name, steps, seed in (("spt", [("spt", 2), ("spt", 4), ("finetune", 2), ("finetune", 4)], 0),
                              ("scratch", [("finetune", s) for s in (2, 4, 6, 8)], 1)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "snapshots.jsonl").write_text(
            "".join(__import__("json").dumps(s) + "\n" for s in fake_snapshots(steps, seed)))
    spt, scratch = (attention_gif.read_snapshots(tmp_path / name) for name in ("spt", "scratch"))
    frames = attention_gif.frames(spt, scratch)
    assert [t for t, _, _ in frames] == [2, 4, 6, 8]                 # finetuning counted after SPT's 4 steps
    assert [(left["phase"], left["step"], right["step"]) for _, left, right in frames] == \
        [("spt", 2, 2), ("spt", 4, 4), ("finetune", 2, 6), ("finetune", 4, 8)]
    assert attention_gif.draw(frames, tmp_path / "a.gif", fps=4, hold=1.0) == 4
    gif = Image.open(tmp_path / "a.gif")
    assert gif.n_frames == 4                                         # the held copies merge into the last
    gif.seek(3)
    assert gif.info["duration"] > 1000
    with pytest.raises(FileNotFoundError, match="snapshot_attn_every"):
        attention_gif.read_snapshots(tmp_path)
