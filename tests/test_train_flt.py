"""train_flt.py end to end at tiny sizes (files written, exact resume, DDP, NaN stop), its recipe and
diagnostics, the corpora it reads (corpora.py) and the figures of --compare (flt_report.py)."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import corpora  # noqa: E402
import data_lra  # noqa: E402
from plumbing import flt_report  # noqa: E402
from plumbing import flt_settings  # noqa: E402
import stability  # noqa: E402
import train_flt  # noqa: E402
from looped import LoopedTransformer  # noqa: E402
from plumbing import runfiles  # noqa: E402
from plumbing import training  # noqa: E402
from plumbing.training import load_checkpoint, read_log  # noqa: E402

TINY = ["--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=4", "--n_loops=2",
        "--warmup_steps=2", "--eval_batches=2", "--eval_interval=3", "--osc_steps=5"]


@pytest.fixture
def text_file(tmp_path):
    rng = np.random.default_rng(0)
    words = ["loop", "the", "state", "norm", "query", "key", "value", "layer", "token", "residual"]
    text = " ".join(rng.choice(words, size=1500)) + "\n"
    path = tmp_path / "tiny.txt"
    path.write_text(text)
    return str(path)


def run(tmp_path, text_file, name="run", *extra):
    out = str(tmp_path / name)
    return out, train_flt.main([f"--data={text_file}", f"--out_dir={out}", *TINY, *extra])


def test_configurator_rejects_bad_keys_through_the_script():
    bad = subprocess.run([sys.executable, "train_flt.py", "--n_loop=12"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode != 0 and "unknown key 'n_loop'" in bad.stderr and "n_loops" in bad.stderr
    assert bad.stderr.strip().startswith("error: ") and len(bad.stderr.strip().splitlines()) == 1   # no traceback
    with pytest.raises(ValueError, match="wrong type"):
        train_flt.main(["--n_loops=twelve"])
    helped = subprocess.run([sys.executable, "train_flt.py", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert helped.returncode == 0 and "--variant='FLT'" in helped.stdout and "--n_loops=12" in helped.stdout
    assert "--optim=adamw: lr=0.003" in helped.stdout and "--ckpt_interval=200" in helped.stdout   # recipes, plumbing


def test_missing_data_path_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.txt"):
        train_flt.main([f"--data={tmp_path}/nowhere.txt", f"--out_dir={tmp_path}/o"])
    with pytest.raises(FileNotFoundError, match="train.bin"):
        train_flt.main([f"--data={tmp_path}", f"--out_dir={tmp_path}/o"])


def test_tiny_run_writes_config_log_and_summary(tmp_path, text_file):
    out, summary = run(tmp_path, text_file, "run", "--max_steps=6", "--variant=FLT_res")
    assert json.load(open(os.path.join(out, "config.json")))["variant"] == "FLT_res"
    records = read_log(out)
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    for r in steps:
        assert set(r) == {"step", "loss", "lr", "grad_norm", "block_param_grad_norms", "residual_norms",
                          "out_output_grad_norms", "attn_output_grad_norms", "mlp_output_grad_norms"}
        assert len(r["block_param_grad_norms"]) == 1 and len(r["residual_norms"]) == 2
        for kind in ("out", "attn", "mlp"):
            assert [len(row) for row in r[f"{kind}_output_grad_norms"]] == [1, 1]      # one per (loop, block)
    assert [r["step"] for r in records if "val_loss" in r] == [3, 6]
    s = json.load(open(os.path.join(out, "summary.json")))
    assert s == json.loads(runfiles._to_json(summary))                  # strict JSON: a NaN is written as null
    res = np.array([r["residual_norms"] for r in steps])
    assert s["residual_norm_peak"] == res.max(0).tolist()
    assert s["residual_norm_peak_step"] == [steps[i]["step"] for i in res.argmax(0)]
    for key in ("final_val_loss", "final_val_bpb", "grad_volatility", "grad_dlog_ac1", "grad_zigzag",
                "max_residual_norm", "outcome", "outcome_reason", "inference_loops", "val_loss_by_loops", "hidden_norm_by_loops",
                "logit_entropy_by_loops", "params", "wall_time_s", "unigram_entropy", "val_steps", "val_curve"):
        assert key in s
    assert s["inference_loops"] == list(range(1, 13))                    # max(2K, 12): the budgets 1, 3, 6, 9, 12
    assert all(len(s[k]) == 12 for k in ("val_loss_by_loops", "hidden_norm_by_loops", "logit_entropy_by_loops"))
    assert s["final_val_loss"] == s["val_loss_by_loops"][1] == s["val_curve"][-1]    # K = 2, the same eval set
    assert s["val_steps"] == [3, 6] and s["eval_set_size"] == 2 * 4
    assert math.isclose(s["final_val_bpb"], s["final_val_loss"] / math.log(2))
    g = [r["grad_norm"] for r in steps[:5]]
    assert math.isclose(s["grad_volatility"], float(np.std(np.diff(np.log(g)))), rel_tol=1e-9)
    assert s["params"] == LoopedTransformer(train_flt.LoopedConfig(
        vocab_size=256, block_size=16, n_layer=1, n_head=2, n_embd=16)).num_params()
    assert (s["outcome"], s["outcome_reason"]) == stability.outcome(s["val_curve"], s["unigram_entropy"])
    for png in ("flt_loss.png", "flt_grad_norm.png", "flt_residual_norm.png", "flt_test_time_loops.png"):
        assert os.path.getsize(os.path.join(out, png)) > 1000


def test_resume_gives_the_identical_loss_curve(tmp_path, text_file):
    straight, _ = run(tmp_path, text_file, "straight", "--max_steps=8")
    split, _ = run(tmp_path, text_file, "split", "--max_steps=8", "--stop_step=4")
    assert load_checkpoint(os.path.join(split, "ckpt.pt"))["step"] == 4
    train_flt.main([f"--data={text_file}", f"--out_dir={split}", *TINY, "--max_steps=8", "--init_from=resume"])
    a, b = read_log(straight), [r for r in read_log(split) if "event" not in r]
    assert [r["step"] for r in read_log(split) if r.get("event") == "resume"] == [4]
    assert [r["step"] for r in b if "loss" in r] == list(range(1, 9))
    assert [r.get("loss", r.get("val_loss")) for r in a] == [r.get("loss", r.get("val_loss")) for r in b]
    sa, sb = (load_checkpoint(os.path.join(d, "ckpt.pt")) for d in (straight, split))
    assert all(torch.equal(sa["model"][k], sb["model"][k]) for k in sa["model"])


def test_batches_are_a_function_of_seed_and_step(text_file):
    train, _, _, _ = corpora.load_data({"data": text_file})
    cfg = {"seed": 1, "batch_size": 4, "block_size": 16}
    x1, y1 = corpora.get_batch(train, cfg, step=5)
    x2, _ = corpora.get_batch(train, cfg, step=5)
    x3, _ = corpora.get_batch(train, cfg, step=6)
    assert torch.equal(x1, x2) and not torch.equal(x1, x3) and torch.equal(x1[:, 1:], y1[:, :-1])


def test_nan_loss_stops_with_a_message_and_keeps_the_last_good_checkpoint(tmp_path, text_file, capsys, monkeypatch):
    calls = {"n": 0}
    forward = LoopedTransformer.forward

    def poisoned(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        if self.training:
            calls["n"] += 1
            if calls["n"] == 5:                       # the 5th training step
                out = (out[0], out[1] * float("inf"), *out[2:])
        return out

    monkeypatch.setattr(LoopedTransformer, "forward", poisoned)
    out, summary = run(tmp_path, text_file, "nan", "--max_steps=10", "--ckpt_interval=2")
    err = capsys.readouterr()
    assert "stopping: the loss is inf" in err.out + err.err and "last good checkpoint" in err.out + err.err
    assert summary["outcome"] == "diverged" and summary["nan_step"] == 5
    assert load_checkpoint(os.path.join(out, "ckpt.pt"))["step"] == 4
    assert max(r["step"] for r in read_log(out)) == 4


def test_token_folder_data(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "tokens"
    folder.mkdir()
    rng.integers(0, 50, 3000).astype(np.uint16).tofile(folder / "train.bin")
    rng.integers(0, 50, 500).astype(np.uint16).tofile(folder / "val.bin")
    with pytest.raises(ValueError, match="vocab_size"):
        train_flt.main([f"--data={folder}", f"--out_dir={tmp_path}/t", *TINY, "--vocab_size=10"])
    summary = train_flt.main([f"--data={folder}", f"--out_dir={tmp_path}/t", *TINY, "--vocab_size=50", "--max_steps=3"])
    assert "final_val_bpb" not in summary and summary["final_val_loss"] < math.log(50) + 0.1


def test_stdlib_docstrings_are_gathered_deduplicated_and_cached(tmp_path):
    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    (root / "test").mkdir()
    (root / "pkg" / "mod.py").write_text('"""Module doc."""\nclass A:\n    """Class doc."""\n'
                                         '    def f(self):\n        """Module doc."""\n')
    (root / "broken.py").write_text("def (:\n")
    (root / "test" / "test_x.py").write_text('"""Skipped test doc."""\n')
    docs = corpora.stdlib_docstrings(str(root))
    assert sorted(docs) == ["Class doc.", "Module doc."]
    train, val = corpora.prepare_stdlib(str(tmp_path / "cache"), root=str(root))
    assert train.dtype == np.uint8 and len(train) + len(val) == len("Class doc.\n\nModule doc.")
    assert os.path.exists(tmp_path / "cache" / "train.bin") and os.path.exists(tmp_path / "cache" / "val.bin")


def test_stdlib_cache_is_reused_and_rebuilt_when_damaged_or_of_another_format(tmp_path, monkeypatch):
    root, cache = tmp_path / "lib", tmp_path / "cache"
    root.mkdir()
    (root / "mod.py").write_text('"""Module doc."""\ndef f():\n    """Function doc."""\n')
    train, val = corpora.prepare_stdlib(str(cache), root=str(root))
    gathered = []
    monkeypatch.setattr(corpora, "stdlib_docstrings", lambda r: gathered.append(r) or ["Module doc.", "Function doc."])
    assert all(map(np.array_equal, corpora.prepare_stdlib(str(cache), root=str(root)), (train, val)))
    assert gathered == []                                            # a valid cache is read, not rebuilt
    for damage in (lambda: (cache / "val.bin").write_bytes(b"x"),    # an edited file
                   lambda: (cache / "stdlib.json").write_text('{"version": 1, "files": {}}')):   # another format
        damage()
        assert all(map(np.array_equal, corpora.prepare_stdlib(str(cache), root=str(root)), (train, val)))
    assert len(gathered) == 2
    monkeypatch.setattr(corpora.platform, "python_version", lambda: "3.99.0")   # another Python's docstrings
    corpora.prepare_stdlib(str(cache), root=str(root))
    other = tmp_path / "other_lib"                                   # another source folder
    other.mkdir()
    corpora.prepare_stdlib(str(cache), root=str(other))
    assert gathered == [str(root)] * 3 + [str(other)]
    corpora.prepare_stdlib(str(cache), root=str(other))
    assert len(gathered) == 4                                        # and the rebuilt cache is read again


def test_the_residual_figure_leaves_a_cell_without_a_run_blank(tmp_path, text_file, monkeypatch):
    a, _ = run(tmp_path, text_file, "a", "--max_steps=3", "--variant=LT")
    b, _ = run(tmp_path, text_file, "b", "--max_steps=3", "--variant=FLT", "--n_loops=3")
    shown = []
    def keep(plt, fig, path, dpi):                                   # the grid's cells, before the figure closes
        if path.endswith("flt_residual_norm.png"):
            shown.extend(sorted((ax.get_title(), ax.axison, ax.axison and any(t.get_visible() for t in ax.get_xticklabels()))
                                for ax in fig.axes))
        plt.close(fig)
    monkeypatch.setattr(flt_report, "save_figure", keep)
    flt_report.plot_runs([a, b], str(tmp_path / "figs"), quiet=True)
    # (FLT, 2) and (LT, 3) blank; each drawn cell is its column's lowest, so it keeps its step labels
    assert shown == [("", False, False), ("", False, False), ("FLT, K=3", True, True), ("LT, K=2", True, True)]


def test_the_curve_legends_name_each_variant_once_however_many_seeds(tmp_path, text_file, monkeypatch):
    runs = [run(tmp_path, text_file, f"s{s}", "--max_steps=3", "--variant=FLT", "--n_loops=2", f"--seed={s}")[0]
            for s in (1, 2)]
    runs.append(run(tmp_path, text_file, "lt", "--max_steps=3", "--variant=LT")[0])
    legends = {}
    def keep(plt, fig, path, dpi):
        legend = fig.axes[-1].get_legend() if fig.axes else None
        legends[os.path.basename(path)] = [t.get_text() for t in legend.get_texts()] if legend else None
        plt.close(fig)
    monkeypatch.setattr(flt_report, "save_figure", keep)
    flt_report.plot_runs(runs, str(tmp_path / "figs"), quiet=True)
    assert legends["flt_loss.png"] == ["FLT", "LT"] and legends["flt_grad_norm.png"] == ["FLT", "LT"]


def test_compare_draws_figures_from_finished_runs(tmp_path, text_file):
    a, _ = run(tmp_path, text_file, "a", "--max_steps=3", "--variant=LT")
    b, _ = run(tmp_path, text_file, "b", "--max_steps=3", "--variant=FLT", "--n_loops=3")
    figs = str(tmp_path / "figs")
    rows = train_flt.main([f"--compare={a},{b}", f"--out_dir={figs}"])
    assert len(rows) == 4 and "| LT | 2 |" in rows[2] and "| FLT | 3 |" in rows[3]
    for png in ("flt_loss.png", "flt_grad_norm.png", "flt_residual_norm.png", "flt_test_time_loops.png",
                "flt_map_muon.png", "flt_ladder_muon.png"):           # the map and the ladder of the default recipe
        assert os.path.getsize(os.path.join(figs, png)) > 1000
    tables = open(os.path.join(figs, "compare.md")).read()
    for header in ("| grad dlog ac1 | grad zigzag |", "minus its reference (paired)", "minus FLT's (paired by seed)",
                   "peak (loop, step) per seed",
                   "out grad norm per loop", "attn grad norm per loop", "| val_loss_by_loops |", "| hidden_norm_by_loops |",
                   "| logit_entropy_by_loops |"):
        assert header in tables
    with pytest.raises(FileNotFoundError, match="config.json"):
        train_flt.main([f"--compare={tmp_path}/nothing", f"--out_dir={figs}"])
    config = json.load(open(os.path.join(a, "config.json")))
    del config["optim"]                                               # a run that did not record its recipe
    runfiles.write_json(os.path.join(a, "config.json"), config)
    with pytest.raises(ValueError, match="no optim"):
        train_flt.main([f"--compare={a},{b}", f"--out_dir={figs}"])


@pytest.mark.slow   # two processes: with the DDP tests of train_spt.py in `pytest -m slow`, as the README says
def test_ddp_two_processes_gloo_keep_identical_weights(tmp_path, text_file):
    out = tmp_path / "ddp"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "train_flt.py", f"--data={text_file}", f"--out_dir={out}", *TINY, "--max_steps=4",
                           "--grad_accum=2"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.load(open(out / "summary.json"))
    assert summary["ddp_replicas_identical"] is True
    assert "world size 2" in proc.stderr + proc.stdout
    assert len([r for r in read_log(str(out)) if "loss" in r]) == 4


def test_default_recipe_is_the_authors_and_adamw_is_ours(tmp_path, text_file):
    out, _ = run(tmp_path, text_file, "muon", "--max_steps=2")
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert (cfg["optim"], cfg["lr"], cfg["embedding_lr"], cfg["unembedding_lr"]) == ("muon", 0.02, 0.2, 0.004)
    assert (cfg["schedule"], cfg["weight_decay"], cfg["beta1"], cfg["beta2"], cfg["adam_eps"]) == \
        ("warmdown", 0.0, 0.8, 0.95, 1e-10)
    assert cfg["qk_norm"] and cfg["softcap"] == 15.0 and cfg["lm_head_std"] == 1e-3
    out, _ = run(tmp_path, text_file, "adamw", "--max_steps=2", "--optim=adamw", "--weight_decay=0.05")
    cfg = json.load(open(os.path.join(out, "config.json")))
    given = {"weight_decay": 0.05, "warmup_steps": 2}                  # given flags win (warmup_steps: TINY)
    assert {k: cfg[k] for k in train_flt.RECIPES["adamw"]} == {**train_flt.RECIPES["adamw"], **given}
    assert cfg["lr"] == 3e-3 and cfg["schedule"] == "cosine" and not cfg["qk_norm"] and cfg["lm_head_std"] == 0
    with pytest.raises(ValueError, match="embedding_lr"):
        run(tmp_path, text_file, "bad", "--optim=adamw", "--embedding_lr=0.1")


def test_the_bare_command_runs_the_recipe_its_defaults_show():
    cfg = flt_settings.get_config(train_flt.DEFAULTS, train_flt.RECIPES, [], "")
    assert {k: cfg[k] for k in train_flt.DEFAULTS} == train_flt.DEFAULTS and train_flt.RECIPES["muon"] == {}
    adamw = flt_settings.get_config(train_flt.DEFAULTS, train_flt.RECIPES, ["--optim=adamw"], "")
    assert {k for k in train_flt.DEFAULTS if adamw[k] != cfg[k]} == set(train_flt.RECIPES["adamw"]) | {"optim"}


def test_warmdown_and_momentum_schedules():
    cfg = dict(schedule="warmdown", warmup_steps=0, warmdown_frac=0.2, max_steps=100, min_lr_frac=0.1)
    lrm = [train_flt.lr_multiplier(it, cfg) for it in (0, 50, 80, 81, 90, 99)]
    assert lrm == [1.0, 1.0, 1.0, 19 / 20, 10 / 20, 1 / 20]           # flat, then linear to 0 over the last 20
    mom = [train_flt.muon_momentum(it) for it in (0, 150, 300, 2000)]
    assert [round(m, 10) for m in mom] == [0.85, 0.9, 0.95, 0.95]


def test_muon_momentum_and_lr_reach_the_optimizers(tmp_path, text_file, monkeypatch):
    seen = []
    step = torch.optim.Muon.step

    def spy(self, *a, **k):
        seen.append((self.param_groups[0]["momentum"], self.param_groups[0]["lr"]))
        return step(self, *a, **k)

    monkeypatch.setattr(torch.optim.Muon, "step", spy)
    run(tmp_path, text_file, "spy", "--max_steps=10", "--warmup_steps=0")
    assert [round(m, 10) for m, _ in seen[:3]] == [0.85, round(0.85 + 0.1 / 300, 10), round(0.85 + 0.2 / 300, 10)]
    assert [round(lr, 10) for _, lr in seen] == [0.02] * 9 + [0.01]   # warmdown: the last 2 of 10 steps


def test_hooks_record_the_gradient_of_every_block_output_per_loop():
    torch.manual_seed(0)
    model = LoopedTransformer(train_flt.LoopedConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2,
                                                     n_embd=16, n_loops=3, variant="FLT", loss_type="STEP"))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    outs = {"out": {}, "attn": {}, "mlp": {}}

    def keeper(kind, i):
        def keep(module, args, out):
            out.retain_grad()
            outs[kind].setdefault(i, []).append(out)            # one call per loop, in loop order
        return keep

    spy = [m.register_forward_hook(keeper(kind, i)) for i, b in enumerate(model.blocks)
           for kind, m in (("out", b), ("attn", b.attn), ("mlp", b.mlp))]
    rec = stability.BlockGradRecorder(model.blocks)
    rec.start(3, 2)
    rec.next_micro()
    x = torch.randint(0, 32, (2, 8))
    model(x, x)[1].backward()
    got = rec.norms(1)
    for kind in ("out", "attn", "mlp"):
        assert [len(row) for row in got[kind]] == [2, 2, 2]
        want = [[round(outs[kind][i][t].grad.norm().item(), 6) for i in range(2)] for t in range(3)]
        assert np.allclose(got[kind], want, rtol=1e-5) and len(set(np.ravel(got[kind]))) == 6
    assert not np.allclose(got["attn"], got["mlp"])
    for h in spy:
        h.remove()



def test_compile_runs_the_recorders_steps_on_the_eager_module(tmp_path, text_file, monkeypatch):
    """--compile keeps the per-(loop, block) recorder: the steps it reads (every
    --block_grads_every-th) run on the eager module, which shares the weights, and the
    others on the compiled one. torch.compile is stood in for by a wrapper that counts its
    calls (the real one is timed and checked by tools/flt_speed.py): same losses, the
    norms at steps 1, 4, 7, 10, the compiled module on the 8 other steps."""
    calls = []

    class Compiled(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self._orig_mod = module

        def forward(self, *args, **kwargs):
            calls.append(1)
            return self._orig_mod(*args, **kwargs)
    monkeypatch.setattr(torch, "compile", Compiled)
    eager, _ = run(tmp_path, text_file, "eager", "--max_steps=12", "--block_grads_every=3")
    compiled, _ = run(tmp_path, text_file, "compiled", "--max_steps=12", "--block_grads_every=3", "--compile=True")
    a, b = ([r for r in read_log(d) if "loss" in r] for d in (eager, compiled))
    assert [r["loss"] for r in a] == [r["loss"] for r in b] and len(calls) == 8
    assert [r["step"] for r in b if "out_output_grad_norms" in r] == [1, 4, 7, 10]
    assert [r["out_output_grad_norms"] for r in a if "out_output_grad_norms" in r] == \
        [r["out_output_grad_norms"] for r in b if "out_output_grad_norms" in r]

def test_block_gradients_every_nth_step_keep_the_losses_and_the_statistics(tmp_path, text_file):
    """--block_grads_every=N (the window's speed-up candidate): the hooks only record, so
    50 steps give the same losses to 3 decimals (here: exactly) and the same gradient
    statistics (they read every step's total norm); the per-(loop, block) norms are
    logged at steps 1, N+1, 2N+1, ... only."""
    logs = {}
    for every in (1, 5):
        out, _ = run(tmp_path, text_file, f"every{every}", "--max_steps=50", "--osc_steps=50",
                     f"--block_grads_every={every}")
        logs[every] = [r for r in read_log(out) if "loss" in r]
        summary = json.loads(open(os.path.join(out, "summary.json")).read())
        logs[every, "stats"] = [summary[k] for k in ("grad_volatility", "grad_dlog_ac1", "grad_zigzag")]
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(logs[1], logs[5])) < 5e-4 and len(logs[5]) == 50
    assert logs[1, "stats"] == logs[5, "stats"]
    assert [r["step"] for r in logs[5] if "out_output_grad_norms" in r] == list(range(1, 51, 5))
    assert all("out_output_grad_norms" in r for r in logs[1])

H = 3.28                                                   # unigram entropy of the byte corpus
REFERENCE = [2.95, 2.45, 2.20, 2.05, 1.95, 1.86]           # the 1-loop run's val curve, at steps 50..250


def test_outcome_rule_on_made_up_curves():
    verdict = lambda losses, ref, h: stability.outcome(losses, h, ref)
    assert verdict([3.40, 3.31, 3.29, 3.28, 3.28, 3.28], REFERENCE, H) == ("did not learn", "never learned")
    # near the unigram level, not at it: 0.11 nats below H at best, where the reference gained 1.42
    assert verdict([3.28, 3.17, 3.21, 3.26, 3.17, 3.18], REFERENCE, H) == ("did not learn", "never learned")
    assert verdict([2.98, 2.60, 2.70, 3.10, 3.26, 3.27], REFERENCE, H) == ("collapsed", "back at the unigram level")
    assert verdict([2.98, 2.40, 2.35, 2.60, 2.80, 2.80], REFERENCE, H) == ("collapsed", "lost what it learned")
    assert verdict([3.05, 2.90, 2.82, 2.70, 2.58, 2.40], REFERENCE, H) == ("lagging", "still improving")
    assert verdict([2.95, 2.50, 2.30, 2.25, 2.24, 2.24], REFERENCE, H) == ("lagging", "stalled")
    assert verdict([2.96, 2.44, 3.20, 2.30, 2.00, 1.87], REFERENCE, H) == ("learned", "like the reference")
    assert verdict(REFERENCE, REFERENCE, H) == ("learned", "like the reference")
    assert verdict([2.9, 2.4, 2.1, 2.0, 1.9, 1.80], REFERENCE, H)[0] == "learned"          # better than it
    assert verdict([2.9, 2.4, float("nan")], REFERENCE[:3], H)[0] == "diverged"
    assert verdict([3.3, 3.29, 3.28], [3.3, 3.28, 3.26], H)[0] == "undetermined"     # the reference learned nothing
    with pytest.raises(ValueError, match="same steps"):
        verdict([2.9, 2.4], REFERENCE, H)
    # without a reference, the same rule: "near H" is within the margin (0.05 nats)
    assert stability.outcome([3.40, 3.30, 3.25], H) == ("did not learn", "never learned")
    assert stability.outcome([3.40, 3.00, 2.60], H) == ("learned", "below the unigram level")
    assert stability.outcome([3.00, 2.40, 3.26], H) == ("collapsed", "back at the unigram level")
    assert stability.outcome([2.98, 2.40, 2.35, 2.80], H) == ("collapsed", "lost what it learned")
    assert stability.outcome([], H) == ("diverged", "a NaN or inf loss")


def test_separation_rule_on_made_up_curves_of_three_seeds():
    """B beats A only when B's final val loss is below A's on every seed by more than the
    seed-to-seed spread, and B's collapse verdict (the whole curve) is no worse."""
    def variant(*finals, shape=(2.95, 2.45, 2.20, 2.05, 1.95)):          # a curve per seed ending at `final`
        curves = {seed: [*shape, f] for seed, f in zip((1, 2, 3), finals)}
        return {seed: (c[-1], stability.outcome(c, H, REFERENCE)[0]) for seed, c in curves.items()}
    flt = variant(1.86, 1.87, 1.85)                                      # sd 0.010
    rule = lambda a, b: stability.separation_verdict(a, b, "FLT", "LT_ia")
    assert rule(flt, variant(1.95, 1.97, 1.94)) == "FLT beats LT_ia"    # 0.09 behind on each seed, sd 0.015
    assert rule(variant(1.95, 1.97, 1.94), flt) == "LT_ia beats FLT"
    assert rule(flt, variant(1.87, 1.86, 1.86)) == "not separated"      # within 0.01: inside the spread
    assert rule(flt, variant(1.95, 1.87, 1.94)) == "not separated"      # seed 2 is level
    assert rule(flt, variant(1.90, 1.98, 2.10)) == "not separated"      # apart on each seed, but sd 0.10 > gap 0.04
    collapsed = {1: (1.80, "collapsed"), 2: (1.81, "learned"), 3: (1.79, "learned")}   # lower, but seed 1 collapsed
    assert rule(flt, collapsed) == "not separated"
    assert rule(flt, {1: flt[1], 2: flt[2]}) == "too few seeds (2 shared; 3 needed)"


def test_collapse_rule_calls_the_reported_slow_learner_lagging_not_collapsed():
    """A run whose val loss fell 2.817 -> 2.576 -> 2.397 at steps 100 / 200 / 250 while
    the 1-loop reference reached 1.86: the final-loss rule called it a partial collapse;
    on the whole curve it is a slow learner, still improving."""
    assert stability.outcome([2.817, 2.576, 2.397], H, [2.20, 1.95, 1.86]) == ("lagging", "still improving")


def test_reference_run_must_be_one_loop_trained_alike(tmp_path, text_file):
    ref, r = run(tmp_path, text_file, "ref", "--max_steps=15", "--n_loops=1")
    _, s = run(tmp_path, text_file, "k2", "--max_steps=15", f"--reference={ref}")
    assert s["reference_val_loss"] == r["final_val_loss"] < s["unigram_entropy"] - 0.05
    assert s["reference_val_curve"] == r["val_curve"] and s["val_steps"] == r["val_steps"] == [3, 6, 9, 12, 15]
    assert (s["outcome"], s["outcome_reason"]) == stability.outcome(
        s["val_curve"], s["unigram_entropy"], r["val_curve"])
    with pytest.raises(ValueError, match="max_steps"):
        run(tmp_path, text_file, "k2b", "--max_steps=5", f"--reference={ref}")
    with pytest.raises(ValueError, match="eval_interval"):
        run(tmp_path, text_file, "k2c", "--max_steps=15", "--eval_interval=5", f"--reference={ref}")
    # --compare judges from the files: a verdict in summary.json that is not the rule's is replaced
    path = os.path.join(tmp_path, "k2", "summary.json")
    json.dump({**s, "outcome": "partial", "outcome_reason": "not the rule's"}, open(path, "w"))
    again = flt_report.rejudge(flt_report.load_run(os.path.join(tmp_path, "k2"))).summary
    assert (again["outcome"], again["outcome_reason"]) == (s["outcome"], s["outcome_reason"])
    # ... and so it does from records (tools/flt_map.sh): the log gzipped, the reference's record beside it
    import gzip
    import shutil
    for name in ("k2", "ref"):
        shutil.copytree(tmp_path / name, tmp_path / "records" / name)
    log = tmp_path / "records" / "k2" / "log.jsonl"
    log.with_suffix(".jsonl.gz").write_bytes(gzip.compress(log.read_bytes()))
    log.unlink()
    shutil.rmtree(tmp_path / "ref")                                  # the reference's run folder is gone
    record = flt_report.rejudge(flt_report.load_run(str(tmp_path / "records" / "k2")))
    assert (record.summary["outcome"], record.summary["outcome_reason"]) == (s["outcome"], s["outcome_reason"])
    assert len(record.log) == len(flt_report.read_run_log(str(tmp_path / "k2")))


def made_up_gradient_norms(kind, n=200, seed=0):
    """A gradient-norm trace g_t around a slowly falling trend: 'noise' (independent
    per step), 'zigzag' (noise plus an up-down alternation), 'swing' (slow excursions
    over ~40 steps plus a little noise), 'noisy swing' (the same excursions under the
    full noise), 'spikes' (quiet noise plus isolated one-step spikes)."""
    rng, t = np.random.default_rng(seed), np.arange(n)
    log_g = np.log(1 + np.exp(-t / 80)) + (0.05 if kind == "swing" else 0.2) * rng.standard_normal(n)
    if kind == "zigzag":
        log_g += 0.4 * (-1.0) ** t
    if kind in ("swing", "noisy swing"):
        log_g += 1.0 * np.sin(2 * np.pi * t / 40)
    if kind == "spikes":
        log_g = np.log(1 + np.exp(-t / 80)) + 0.02 * rng.standard_normal(n)
        log_g[rng.choice(n, 8, replace=False)] += 1.5
    return np.exp(log_g)


def test_oscillation_statistics_tell_a_zigzag_from_noise_spikes_and_swings():
    kinds = ("noise", "zigzag", "swing", "noisy swing", "spikes")
    ac1 = {k: stability.grad_dlog_ac1(made_up_gradient_norms(k)) for k in kinds}
    assert abs(ac1["noise"] + 0.5) < 0.12 and abs(ac1["spikes"] + 0.5) < 0.12      # noise and spikes: -0.5
    assert ac1["zigzag"] < -0.8                                                    # a zig-zag: towards -1
    assert ac1["swing"] > 0.3                                                      # slow swings: above 0 ...
    assert ac1["noise"] + 0.1 < ac1["noisy swing"] < 0.0                           # ... noise pulls towards -0.5
    zz = {k: stability.grad_zigzag(made_up_gradient_norms(k)) for k in ("noise", "zigzag", "swing")}
    assert abs(zz["noise"] - 0.3) < 0.15 and zz["zigzag"] > 0.7 and zz["swing"] < zz["noise"]


def test_volatility_is_high_for_noise_and_spikes_alike_so_it_is_no_test_of_oscillation():
    vol = {k: stability.grad_volatility(made_up_gradient_norms(k)) for k in ("noise", "zigzag", "spikes")}
    assert vol["noise"] > 0.2 and vol["spikes"] > 0.2 and vol["zigzag"] > vol["noise"]
    calm = stability.grad_volatility(np.exp(0.01 * np.random.default_rng(0).standard_normal(200)))
    assert calm < 0.05 and math.isnan(stability.grad_volatility([1.0]))


def test_listops_loss_and_accuracy_read_only_the_answer():
    rows = corpora.listops_corpus(50, 3, 64)
    assert len({r.tobytes() for r in rows}) == 50
    for x, y in rows:
        (pos,) = np.nonzero(y >= 0)[0]                     # exactly one target per row ...
        text = bytes(x[:pos + 1].tolist()).decode()
        assert text.endswith("=")                          # ... the one after '=' ...
        assert y[pos] - ord("0") == data_lra.listops_value(text[:-1].split())   # ... and it is the value
    torch.manual_seed(0)
    model = LoopedTransformer(train_flt.LoopedConfig(vocab_size=256, block_size=64, n_layer=1, n_head=2,
                                                     n_embd=16, n_loops=2, lm_head_std=0.5))
    x, y = torch.from_numpy(rows[:8, 0]), torch.from_numpy(rows[:8, 1])
    logits, loss = model(x, y)
    at = y >= 0
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(logits[at], y[at]))
    rt = type("RT", (), {"device": "cpu", "autocast": staticmethod(lambda: torch.autocast("cpu", enabled=False))})
    xb, yb = corpora.eval_set(rows[:8], None)                       # every held-out row, once
    assert torch.equal(xb, x) and torch.equal(yb, y)
    ev = train_flt.evaluate(model, (xb, yb), 2, rt)
    assert math.isclose(ev["loss"][-1], loss.item(), rel_tol=1e-5) and len(ev["loss"]) == 2
    want = (logits.argmax(-1) == y)[at].float().mean().item()
    assert math.isclose(ev["accuracy"][-1], want)


def test_listops_run_reports_answer_accuracy_per_loop(tmp_path):
    s = train_flt.main(["--data=listops", f"--out_dir={tmp_path}/l", "--listops_examples=300", "--listops_val=200",
                        "--block_size=64", *TINY[:3], "--batch_size=4", "--n_loops=2", "--max_steps=3"])
    assert len(s["val_accuracy_by_loops"]) == 12 and s["final_val_accuracy"] == s["val_accuracy_by_loops"][1]
    assert s["eval_set_size"] == 200                                # every held-out expression, each once
    assert s["unigram_entropy"] < math.log(10) + 1e-9 and "final_val_bpb" not in s
    with pytest.raises(ValueError, match="listops"):
        train_flt.main(["--listops_depth=2", f"--out_dir={tmp_path}/m"])
    with pytest.raises(ValueError, match="eval_batches"):
        train_flt.main(["--data=listops", "--eval_batches=2", f"--out_dir={tmp_path}/m"])


def test_eval_set_is_fixed_whatever_the_seed_and_spans_the_val_split():
    val = np.arange(10_000, dtype=np.int64) % 251
    a = corpora.eval_set(val, dict(seed=1, eval_batches=5, batch_size=4, block_size=16))
    b = corpora.eval_set(val, dict(seed=2, eval_batches=5, batch_size=4, block_size=16))
    assert all(torch.equal(u, v) for u, v in zip(a, b)) and a[0].shape == (20, 16)
    starts = [int(x[0]) for x in a[0]]                       # val[i] = i % 251 names each window's start
    assert starts[0] == 0 and int(a[1][-1, -1]) == (10_000 - 1) % 251   # first and last byte of the split
    assert torch.equal(a[0][:, 1:], a[1][:, :-1])
    rows = corpora.listops_corpus(30, 3, 64)
    x, y = corpora.eval_set(rows, None)
    assert torch.equal(x, torch.from_numpy(rows[:, 0])) and torch.equal(y, torch.from_numpy(rows[:, 1]))


def test_evaluate_reads_hidden_norm_and_logit_entropy_per_loop():
    torch.manual_seed(0)
    model = LoopedTransformer(train_flt.LoopedConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16,
                                                     n_loops=3, lm_head_std=0.5))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x, y = torch.randint(0, 32, (5, 8)), torch.randint(0, 32, (5, 8))
    y[:, :3] = -1                                            # unscored positions
    rt = type("RT", (), {"device": "cpu", "autocast": staticmethod(lambda: torch.autocast("cpu", enabled=False))})
    ev = train_flt.evaluate(model, (x, y), 4, rt)
    with torch.no_grad():
        for t, (h, x_L) in enumerate(model.loops(x, 4)):
            p = torch.softmax(model.logits(h), -1)[y >= 0]
            assert math.isclose(ev["logit_entropy"][t], -(p * p.log()).sum(-1).mean().item(), rel_tol=1e-5)
            assert math.isclose(ev["hidden_norm"][t], x_L.norm(dim=-1).mean().item(), rel_tol=1e-5)
            assert math.isclose(ev["loss"][t], model(x, y, n_loops=t + 1)[1].item(), rel_tol=1e-5)  # forward at t loops


def test_evaluate_checkpoint_gives_the_test_time_curve_of_the_summary(tmp_path, text_file, capsys):
    out, s = run(tmp_path, text_file, "ck", "--max_steps=4")
    curve = train_flt.main([f"--evaluate={out}", "--test_loops=5"])
    assert np.allclose(curve["loss"], s["val_loss_by_loops"][:5], rtol=1e-5)
    assert np.allclose(curve["hidden_norm"], s["hidden_norm_by_loops"][:5], rtol=1e-5)
    assert "5 loops" in capsys.readouterr().out
    ckpt = load_checkpoint(os.path.join(out, "ckpt.pt"))
    del ckpt["config"]["osc_steps"]                                  # a config without one of the flags
    training.save_checkpoint(os.path.join(out, "ckpt.pt"), ckpt)
    with pytest.raises(ValueError, match="has no osc_steps"):
        train_flt.main([f"--evaluate={out}"])


def test_seed_table_gives_mean_and_spread_over_seeds_and_the_paired_gap():
    from types import SimpleNamespace as NS

    def fake(seed, variant, K, loss, ref):
        s = dict(final_val_loss=loss, reference_val_loss=ref, outcome="learned", outcome_reason="like the reference",
                 max_residual_norm=40.0, grad_volatility=0.2, grad_dlog_ac1=-0.5, grad_zigzag=0.3,
                 val_loss_by_loops=[loss] * (2 * K))
        return NS(dir=f"{variant}{K}s{seed}", cfg=dict(data="stdlib", optim="muon", variant=variant, n_loops=K,
                                                      lr_mult=1.0, seed=seed), summary=s)
    runs = [fake(1, "FLT", 6, 1.90, 1.88), fake(2, "FLT", 6, 1.86, 1.85), fake(3, "FLT", 6, 1.88, 1.84)]
    rows = flt_report.seed_table(runs)
    assert len(rows) == 3 and "| FLT | 6 | 1.0 | 1, 2, 3 |" in rows[2]
    assert "1.880 ± 0.020 (1.900, 1.860, 1.880)" in rows[2] and "0.023 ± 0.015" in rows[2]
    table = flt_report.test_time_table(runs)
    assert "| 12 loops |" in table[0] and table[2].count("1.880 ± 0.020") == 5
    runs += [fake(1, "LT_i", 6, 1.91, 1.88), fake(3, "LT_i", 6, 1.86, 1.84)]
    paired = flt_report.paired_table(runs)                 # seeds 1 and 3 have both: +0.010, -0.020
    assert len(paired) == 3 and "| LT_i | 6 | 1.0 | 1, 3 | -0.005 ± 0.021 (0.010, -0.020) |" in paired[2]


def test_residual_table_reads_the_whole_window_of_longer_runs():
    from types import SimpleNamespace as NS

    def fake(seed, steps):   # a made-up norm that grows with the step, largest in the last loop
        log = [{"step": t, "residual_norms": [t / 10, t / 5]} for t in range(1, steps + 1)]
        return NS(dir=f"s{seed}", log=log, summary={"final_val_loss": 1.5},
                  cfg=dict(data="stdlib", optim="muon", variant="FLT", n_loops=12, lr_mult=1.0, seed=seed))
    short = flt_report.residual_table([fake(1, 250)])
    assert "| step 25 | step 50 | step 100 | step 150 | step 200 | step 250 |" in short[0]
    window = flt_report.residual_table([fake(1, 2000), fake(2, 2000)])
    assert "| step 25 | step 250 | step 500 | step 1000 | step 1500 | step 2000 |" in window[0]
    assert "| stdlib | FLT | 12 | 2 | 5 | 50 | 100 | 200 | 300 | 400 |" in window[2]


def test_gradient_statistics_over_the_window_read_the_first_steps_apart_from_the_rest():
    from types import SimpleNamespace as NS
    rng = np.random.default_rng(0)

    def fake(seed, steps):   # a zig-zag for the first 1,000 steps, independent noise after
        g = [1.0 + (t % 2) if t <= 1000 else float(np.exp(rng.normal(0, 0.1))) for t in range(1, steps + 1)]
        return NS(dir=f"s{seed}", log=[{"step": t, "grad_norm": x} for t, x in zip(range(1, steps + 1), g)],
                  summary={"final_val_loss": 1.5},
                  cfg=dict(data="stdlib", optim="muon", variant="LT", n_loops=12, lr_mult=1.0, seed=seed))
    assert flt_report.grad_window_table([fake(1, 250)]) == []
    rows = flt_report.grad_window_table([fake(1, 2000), fake(2, 2000)])
    assert "| dlog ac1 1-200 | dlog ac1 1-2000 | dlog ac1 1001-2000 |" in rows[0]
    cells = rows[2].strip("|").split("|")
    assert float(cells[7].split("±")[0]) < -0.95                # the zig-zag of the first 200 steps
    assert -0.6 < float(cells[9].split("±")[0]) < -0.4          # noise in the second half: about -0.5


def test_the_last_line_says_the_one_rules_outcome_from_made_up_summaries():
    base = dict(variant="LT", n_loops=12, final_val_loss=3.326, unigram_entropy=3.281, max_residual_norm=123.4,
                nan_step=None)
    line = flt_report.verdict_line(dict(base, outcome="did not learn", outcome_reason="never learned"))
    assert line.startswith("LT, 12 loops: final val loss 3.326") and "did not learn (never learned" in line
    assert "stability.outcome" in line and "peak 123" in line
    assert ": learned (" in flt_report.verdict_line(dict(base, outcome="learned", outcome_reason="x"))
    assert "diverged (a NaN at step 7" in flt_report.verdict_line(dict(base, outcome="diverged", outcome_reason="x",
                                                                            nan_step=7))


@pytest.mark.slow
def test_window_sweep_records_each_run_and_compare_reads_the_records_alone(tmp_path, text_file):
    """tools/flt_map.sh window at a tiny size, one seed: each finished run's record lands
    in RESULTS (logs gzipped over GZIP_OVER bytes), a second call runs nothing, and
    --compare on the records alone (no run folder) rejudges each run against its
    reference's record and tables the separation rule."""
    import shutil
    tiny = (f"--data={text_file} --n_layer=1 --n_embd=16 --n_head=2 --block_size=16 --batch_size=4 "
            "--max_steps=6 --eval_interval=3 --eval_batches=1 --test_loops=2 --osc_steps=4")
    env = dict(os.environ, SEEDS="1", OUT=str(tmp_path / "out"), RESULTS=str(tmp_path / "results"), EXTRA=tiny,
               GZIP_OVER="2000")
    call = lambda: subprocess.run(["bash", "tools/flt_map.sh", "window"], cwd=ROOT, env=env, capture_output=True,
                                  text=True, timeout=600)
    first = call()
    assert first.returncode == 0 and first.stdout.count("recorded: ") == 6 and "failed" not in first.stdout, first
    records = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert records == sorted(f"w_{v}_K12_s1" for v in ("ref", "FLT", "LT_ia", "LT_i", "FLT_res", "LT")) \
        or records == sorted(["w_ref_K1_s1"] + [f"w_{v}_K12_s1" for v in ("FLT", "LT_ia", "LT_i", "FLT_res", "LT")])
    flt = tmp_path / "results" / "w_FLT_K12_s1"
    assert (flt / "log.jsonl.gz").exists() and not (flt / "log.jsonl").exists()
    assert {"summary.json", "config.json", "command.txt"} <= {p.name for p in flt.iterdir()}
    assert "recorded: " not in call().stdout                                # nothing runs again
    shutil.rmtree(tmp_path / "out")                                         # the run folders are gone
    dirs = [str(p) for p in sorted((tmp_path / "results").iterdir())]
    rows = flt_report.compare(dirs, str(tmp_path / "figures"))
    table = (tmp_path / "figures" / "compare.md").read_text()
    assert "| the rule |" in table and "too few seeds (1 shared; 3 needed)" in table
    assert len(rows) > 2 and (tmp_path / "figures" / "flt_loss.png").exists()
    judged = flt_report.rejudge(flt_report.load_run(str(flt))).summary
    assert judged["outcome"] in ("learned", "lagging", "collapsed", "did not learn", "undetermined")


def test_window_sweep_refuses_a_record_that_is_not_whole_before_its_run(tmp_path):
    """tools/flt_map.sh: a record folder without summary.json (a copy cut short) is named in
    one line and the sweep stops, instead of training the run again and moving its new record
    into the old folder."""
    (tmp_path / "results" / "w_ref_K1_s1").mkdir(parents=True)
    env = dict(os.environ, SEEDS="1", OUT=str(tmp_path / "out"), RESULTS=str(tmp_path / "results"),
               EXTRA="--data=/nowhere --max_steps=1")                  # a run would fail at once anyway
    done = subprocess.run(["bash", "tools/flt_map.sh", "window"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "w_ref_K1_s1 is not a whole record (no summary.json)" in done.stderr
    assert "python train_flt.py" not in done.stdout and os.listdir(tmp_path / "results" / "w_ref_K1_s1") == []


def test_window_sweep_appends_to_a_runs_log_instead_of_wiping_it(tmp_path):
    """tools/flt_map.sh: starting a run appends to its .out log, so a second process that
    starts the same run (and is refused by the run's lock) or a resume keeps what the log held."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "w_ref_K1_s1.out").write_text("the first process's progress\n")
    env = dict(os.environ, SEEDS="1", OUT=str(out), RESULTS=str(tmp_path / "results"),
               EXTRA="--data=/nowhere --max_steps=1")                  # each run fails at once
    done = subprocess.run(["bash", "tools/flt_map.sh", "window"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "failed: see" in done.stdout, done
    log = (out / "w_ref_K1_s1.out").read_text()
    assert log.startswith("the first process's progress\n") and "/nowhere" in log, log
