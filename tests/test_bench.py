"""bench.py: its pieces run on a tiny config and return well-formed numbers.
No test here asserts a timing: timings live in `python bench.py`'s table."""

import torch

from tools import bench


def test_throughput_row_gives_both_models_and_the_ratio():
    dims = dict(n_layer=1, n_embd=16, n_head=2, ffn_mult=2)
    row, ours = bench.throughput_row("tiny", dims, T=8, B=2, reps=2)
    assert row["ours_tok_s"] > 0 and row["ref_tok_s"] > 0 and row["ratio"] > 0
    assert len(row["ours_s"]) == len(row["ref_s"]) == 2
    assert bench.flops_per_step(ours, 2, 8) > 0


def test_reference_matches_our_sizes():
    dims = dict(n_layer=2, n_embd=16, n_head=2, ffn_mult=2)
    ours, ref = bench.build_pair(dims, T=8)
    # same parameter count in the encoder, up to the reconstruction head that classify never uses
    n_ours = sum(p.numel() for n, p in ours.named_parameters() if not n.startswith("lm_head"))
    assert n_ours == sum(p.numel() for p in ref.parameters())
    assert ref.classify(torch.zeros(3, 8, dtype=torch.long)).shape == (3, 2)


def test_interleaving_alternates_order_and_paired_ratio_is_a_median():
    calls = []
    times = bench.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, reps=3, warmup=0)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert all(len(t) == 3 for t in times.values())
    assert bench.paired_ratio([2.0, 4.0, 9.0], [1.0, 1.0, 1.0]) == 4.0


def test_markdown_table_formats_and_marks_missing():
    text = bench.markdown_table([{"a": "x", "b": 1.23456}, {"a": "y"}], [("a", "name", ""), ("b", "value", ".2f")])
    assert text.splitlines() == ["| name | value |", "|---|---|", "| x | 1.23 |", "| y | - |"]


def test_peak_lookup_and_cuda_section_skips_on_cpu():
    assert bench.peak_bf16("NVIDIA H100 80GB HBM3") == 989e12
    assert bench.peak_bf16("some unknown card") is None
    assert "skipped" in bench.bench_cuda(dict(quick=True, reps=1, compile=False, peak_flops=0.0), "cpu")
