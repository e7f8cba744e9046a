"""train_flt.py end to end at tiny sizes (files written, exact resume after a halt and after a
stop signal, DDP, the NaN stop), its flags, recipe and diagnostics, the corpora it reads
(corpora.py) and the rules that read a run (stability.py). The figures and tables of several
runs are tools/flt_compare.py's (tests/test_tools.py)."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import corpora  # noqa: E402
import data_lra  # noqa: E402
import stability  # noqa: E402
import train_flt  # noqa: E402
from configurator import run_cli  # noqa: E402
from looped import LoopedTransformer  # noqa: E402
from training import finite, load_checkpoint, read_log, save_checkpoint  # noqa: E402

TINY = ["--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=4", "--n_loops=2",
        "--warmup_steps=2", "--eval_batches=2", "--eval_interval=3", "--osc_steps=5"]
PLOT, GET_BATCH = train_flt.plot_run, train_flt.get_batch
CPU = type("RT", (), {"device": "cpu", "autocast": staticmethod(lambda: torch.autocast("cpu", enabled=False))})


@pytest.fixture(autouse=True)
def no_figures(monkeypatch):
    """The figures take a second a run: drawn only where a test asks for them (PLOT)."""
    monkeypatch.setattr(train_flt, "plot_run", lambda *args: None)


@pytest.fixture
def text_file(tmp_path):
    rng = np.random.default_rng(0)
    words = ["loop", "the", "state", "norm", "query", "key", "value", "layer", "token", "residual"]
    path = tmp_path / "tiny.txt"
    path.write_text(" ".join(rng.choice(words, size=1500)) + "\n")
    return str(path)


def run(tmp_path, text_file, name="run", *extra):
    out = str(tmp_path / name)
    return out, train_flt.main([f"--data={text_file}", f"--out_dir={out}", *TINY, *extra])


def numbers(summary):
    """A summary's numbers as JSON text (a NaN as null), without the wall time."""
    return json.dumps(finite({k: v for k, v in summary.items() if k != "wall_time_s"}))


# -----------------------------------------------------------------------------
# Flags

def test_every_bad_flag_is_one_line_before_anything_is_written(tmp_path, text_file, capsys):
    out = str(tmp_path / "never")
    error = lambda *flags: run_cli(train_flt.main, [f"--data={text_file}", f"--out_dir={out}", *flags]) or ""
    for flags, says in ((["--n_loop=12"], "error: unknown flag --n_loop; did you mean --n_loops?"),
                        (["--n_loops=twelve"], "error: --n_loops=twelve: expected a int"),
                        (["--n_loops=0"], "error: --n_loops=0 must be > 0"),
                        (["--beta1=1.0"], "error: --beta1=1.0 must be in [0, 1)"),
                        (["--variant=XLT"], "error: --variant='XLT' is not one of 'LT', 'LT_i'"),
                        (["--optim=sgd"], "error: --optim='sgd' is not one of 'muon', 'adamw'"),
                        (["--osc_steps=1"], "error: --osc_steps=1 must be >= 2"),
                        (["--listops_depth=2"], "error: --listops_depth applies only to --data=listops"),
                        (["--optim=adamw", "--embedding_lr=0.1"], "error: --embedding_lr applies only to --optim=muon"),
                        (["--n_embd=18"], "error: n_embd=18 / n_head=4 must be an even"),
                        ([f"--reference={tmp_path}/none"], f"error: --reference={tmp_path}/none is not a finished run"),
                        ([f"--data={tmp_path}/nowhere.txt"], f"error: --data={tmp_path}/nowhere.txt: no such file"),
                        ([f"--data={tmp_path}"], f"error: {tmp_path}/train.bin: missing")):
        with pytest.raises(SystemExit) as stop:
            error(*flags)
        assert str(stop.value.code).startswith(says) and "\n" not in str(stop.value.code), (flags, stop.value.code)
        assert not os.path.exists(out)                                  # nothing written, not even the folder
    with pytest.raises(SystemExit) as done:
        train_flt.main(["--help"])
    helped = capsys.readouterr().out
    assert done.value.code == 0 and "--variant='FLT'  # the model (looped.py): LT, LT_i, LT_ia" in helped
    assert "--optim=adamw sets lr=0.003" in helped and "--halt_after_steps=0  # stop after" in helped


def test_out_dir_is_named_after_the_variant_the_loops_and_each_flag_that_differs():
    name = lambda *flags: train_flt.get_config(list(flags))["out_dir"] or train_flt.auto_out_dir(
        train_flt.get_config(list(flags)))
    assert name() == os.path.join("out", "flt_FLT_K12")
    assert name("--variant=LT", "--n_loops=6", "--lr_mult=2", "--device=cpu", "--seed=1337") == \
        os.path.join("out", "flt_LT_K6_lr_mult-2.0")                    # the device changes no result
    assert name("--optim=adamw") == os.path.join("out", "flt_FLT_K12_optim-adamw")   # not the recipe's own values
    assert name("--out_dir=here") == "here"


def test_the_bare_command_runs_the_recipe_its_defaults_show():
    cfg = train_flt.get_config([])
    assert cfg == train_flt.DEFAULTS and train_flt.RECIPES["muon"] == {}
    adamw = train_flt.get_config(["--optim=adamw"])
    assert {k for k in train_flt.DEFAULTS if adamw[k] != cfg[k]} == set(train_flt.RECIPES["adamw"]) | {"optim"}


# -----------------------------------------------------------------------------
# A run: its files, its resume, its NaN stop, DDP

def test_tiny_run_writes_config_log_summary_and_figures(tmp_path, text_file, monkeypatch, capsys):
    monkeypatch.setattr(train_flt, "plot_run", PLOT)
    out, summary = run(tmp_path, text_file, "run", "--max_steps=6", "--variant=FLT_res")
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("[run] FLT_res, 2 loops: final val loss ")
    assert json.load(open(os.path.join(out, "config.json")))["variant"] == "FLT_res"
    records = read_log(out)
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    for r in steps:
        assert list(r) == ["step", "loss", "lr", "grad_norm", "block_param_grad_norms", "residual_norms",
                           "out_output_grad_norms", "attn_output_grad_norms", "mlp_output_grad_norms"]
        assert len(r["block_param_grad_norms"]) == 1 and len(r["residual_norms"]) == 2
        for kind in ("out", "attn", "mlp"):
            assert [len(row) for row in r[f"{kind}_output_grad_norms"]] == [1, 1]      # one per (loop, block)
    assert [r["step"] for r in records if "val_loss" in r] == [3, 6]
    s = json.load(open(os.path.join(out, "summary.json")))
    assert s == json.loads(json.dumps(finite(summary)))                 # strict JSON: a NaN is written as null
    res = np.array([r["residual_norms"] for r in steps])
    assert s["residual_norm_peak"] == res.max(0).tolist()
    assert s["residual_norm_peak_step"] == [steps[i]["step"] for i in res.argmax(0)]
    assert list(s) == ["variant", "n_loops", "n_layer", "n_embd", "loss_type", "params", "steps", "final_train_loss",
                       "min_train_loss", "final_val_loss", "val_steps", "val_curve", "eval_set_size", "unigram_entropy",
                       "grad_volatility", "grad_dlog_ac1", "grad_zigzag", "grad_osc_steps", "max_grad_norm",
                       "residual_norm_first", "residual_norm_last", "residual_norm_peak", "residual_norm_peak_step",
                       "max_residual_norm", "outcome", "outcome_reason", "nan_step", "inference_loops",
                       "val_loss_by_loops", "hidden_norm_by_loops", "logit_entropy_by_loops", "wall_time_s",
                       "final_val_bpb"]                                 # the keys of the records under results/
    assert s["inference_loops"] == list(range(1, 13))                    # max(2K, 12): the budgets 1, 3, 6, 9, 12
    assert all(len(s[k]) == 12 for k in ("val_loss_by_loops", "hidden_norm_by_loops", "logit_entropy_by_loops"))
    assert s["final_val_loss"] == s["val_loss_by_loops"][1] == s["val_curve"][-1]    # K = 2, the same eval set
    assert s["val_steps"] == [3, 6] and s["eval_set_size"] == 2 * 4
    assert math.isclose(s["final_val_bpb"], s["final_val_loss"] / math.log(2))
    assert math.isclose(s["final_train_loss"], np.mean([r["loss"] for r in steps[-1:]]))   # the last 10%
    g = [r["grad_norm"] for r in steps[:5]]
    assert math.isclose(s["grad_volatility"], float(np.std(np.diff(np.log(g)))), rel_tol=1e-9)
    assert s["params"] == LoopedTransformer(train_flt.LoopedConfig(
        vocab_size=256, block_size=16, n_layer=1, n_head=2, n_embd=16)).num_params()
    assert (s["outcome"], s["outcome_reason"]) == stability.outcome(s["val_curve"], s["unigram_entropy"])
    for png in ("flt_loss.png", "flt_grad_norm.png", "flt_residual_norm.png", "flt_test_time_loops.png"):
        assert os.path.getsize(os.path.join(out, png)) > 1000
    with pytest.raises(FileExistsError, match="already holds a run"):  # a finished run is never overwritten ...
        run(tmp_path, text_file, "run", "--max_steps=6")
    assert run(tmp_path, text_file, "run", "--max_steps=2", "--overwrite=True")[1]["steps"] == 2   # ... unless asked


def stop_at(monkeypatch, step, signum):
    """Send this process `signum` while step `step` (1-based) draws its batch."""
    def batch(data, cfg, it, *args, **kwargs):
        if it == step - 1:
            os.kill(os.getpid(), signum)
        return GET_BATCH(data, cfg, it, *args, **kwargs)
    monkeypatch.setattr(train_flt, "get_batch", batch)


def test_resume_continues_bit_exactly_after_a_halt_sigterm_or_ctrl_c(tmp_path, text_file, monkeypatch):
    straight, whole = run(tmp_path, text_file, "straight", "--max_steps=8")
    with pytest.raises(SystemExit, match="halted after 4 steps"):
        run(tmp_path, text_file, "halt", "--max_steps=8", "--halt_after_steps=4")
    assert load_checkpoint(os.path.join(tmp_path, "halt", "ckpt.pt"))["step"] == 4
    for name, signum, step in (("sigterm", signal.SIGTERM, 3), ("ctrl_c", signal.SIGINT, 5)):
        stop_at(monkeypatch, step, signum)
        with pytest.raises(KeyboardInterrupt) as stopped:
            run(tmp_path, text_file, name, "--max_steps=8")
        assert stopped.value.status == 128 + signum and "--init_from=resume" in str(stopped.value)
        assert load_checkpoint(os.path.join(tmp_path, name, "ckpt.pt"))["step"] == step   # the step it was in
    monkeypatch.setattr(train_flt, "get_batch", GET_BATCH)
    with pytest.raises(ValueError, match="differ from its checkpoint"):  # an experiment flag may not change
        train_flt.main([f"--out_dir={tmp_path}/halt", "--init_from=resume", "--variant=LT"])
    want = open(os.path.join(straight, "log.jsonl")).read()
    weights = load_checkpoint(os.path.join(straight, "ckpt.pt"))["model"]
    for name in ("halt", "sigterm", "ctrl_c"):
        again = train_flt.main([f"--out_dir={tmp_path}/{name}", "--init_from=resume", "--device=cpu"])
        assert open(os.path.join(tmp_path, name, "log.jsonl")).read() == want, name      # byte for byte
        assert numbers(again) == numbers(whole)
        resumed = load_checkpoint(os.path.join(tmp_path, name, "ckpt.pt"))["model"]
        assert all(torch.equal(weights[k], resumed[k]) for k in weights)


def test_sigterm_to_a_running_process_saves_its_resume_point_and_exits_143(tmp_path, text_file):
    """A cluster's SIGTERM to `python train_flt.py`: the step ends, ckpt.pt is saved, the last
    line says how to continue, the exit status is 128 + 15; resumed, it equals a run never stopped."""
    flags, out = [f"--data={text_file}", *TINY, "--max_steps=5000", "--eval_interval=1000"], tmp_path / "killed"
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen([sys.executable, "train_flt.py", *flags, f"--out_dir={out}"], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.time() + 120
        while len(read_log(out) if (out / "log.jsonl").exists() else []) < 3 and time.time() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    last = (tmp_path / "stderr.txt").read_text().splitlines()[-1]
    assert last == f"[killed] SIGTERM: stopped; continue with: python train_flt.py --init_from=resume --out_dir={out}"
    step = load_checkpoint(out / "ckpt.pt")["step"]
    with pytest.raises(SystemExit, match="halted after 2 steps"):
        train_flt.main([f"--out_dir={out}", "--init_from=resume", "--halt_after_steps=2"])
    with pytest.raises(SystemExit, match=f"halted after {step + 2} steps"):
        train_flt.main([*flags, f"--out_dir={tmp_path}/straight", f"--halt_after_steps={step + 2}"])
    assert (out / "log.jsonl").read_text() == (tmp_path / "straight" / "log.jsonl").read_text()


def test_nan_loss_stops_before_its_update_and_no_nonfinite_weight_is_saved(tmp_path, text_file, capsys, monkeypatch):
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
    said = capsys.readouterr().out
    assert "stopping: the loss is inf" in said and "before its update" in said and "last good checkpoint" in said
    assert summary["outcome"] == "diverged" and summary["nan_step"] == 5 and summary["steps"] == 4
    assert "diverged (a NaN at step 5" in train_flt.last_line(summary, out)
    ckpt = load_checkpoint(os.path.join(out, "ckpt.pt"))
    assert ckpt["step"] == 4 and all(v.isfinite().all() for v in ckpt["model"].values())
    assert max(r["step"] for r in read_log(out)) == 4
    with pytest.raises(FloatingPointError, match="NaN or inf"):        # and none ever would be
        save_checkpoint(str(tmp_path / "bad.pt"), {"model": {"w": torch.tensor([float("nan")])}})


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


# -----------------------------------------------------------------------------
# The recipe and the diagnostics

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


def test_warmdown_cosine_and_momentum_schedules():
    cfg = dict(schedule="warmdown", warmup_steps=0, warmdown_frac=0.2, max_steps=100, min_lr_frac=0.1)
    lrm = [train_flt.lr_multiplier(it, cfg) for it in (0, 50, 80, 81, 90, 99)]
    assert lrm == [1.0, 1.0, 1.0, 19 / 20, 10 / 20, 1 / 20]           # flat, then linear to 0 over the last 20
    cos = dict(cfg, schedule="cosine", warmup_steps=10)
    assert [train_flt.lr_multiplier(it, cos) for it in (0, 9, 10)] == [0.1, 1.0, 1.0]   # warmup, then the peak
    assert math.isclose(train_flt.lr_multiplier(55, cos), 0.55) and train_flt.lr_multiplier(100, cos) == 0.1
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
    calls (REPORT's window section records the real one's timing): same losses, the
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
    """--block_grads_every=N (the window's speed-up): the hooks only record, so the losses
    are the same (here: exactly) and so are the gradient statistics (they read every step's
    total norm); the per-(loop, block) norms are logged at steps 1, N+1, 2N+1, ... only."""
    logs = {}
    for every in (1, 5):
        out, summary = run(tmp_path, text_file, f"every{every}", "--max_steps=50", "--osc_steps=50",
                           f"--block_grads_every={every}")
        logs[every] = [r for r in read_log(out) if "loss" in r]
        logs[every, "stats"] = [summary[k] for k in ("grad_volatility", "grad_dlog_ac1", "grad_zigzag")]
    assert [r["loss"] for r in logs[1]] == [r["loss"] for r in logs[5]] and len(logs[5]) == 50
    assert logs[1, "stats"] == logs[5, "stats"]
    assert [r["step"] for r in logs[5] if "out_output_grad_norms" in r] == list(range(1, 51, 5))
    assert all("out_output_grad_norms" in r for r in logs[1])


def test_reference_run_must_be_one_loop_trained_alike(tmp_path, text_file):
    ref, r = run(tmp_path, text_file, "ref", "--max_steps=9", "--n_loops=1")
    _, s = run(tmp_path, text_file, "k2", "--max_steps=9", f"--reference={ref}")
    assert s["reference_val_loss"] == r["final_val_loss"] and s["reference_val_curve"] == r["val_curve"]
    assert s["val_steps"] == r["val_steps"] == [3, 6, 9] == s["reference_val_steps"]
    assert math.isclose(s["gain_kept"], (s["unigram_entropy"] - s["final_val_loss"])
                        / (s["unigram_entropy"] - r["final_val_loss"]))
    assert (s["outcome"], s["outcome_reason"]) == stability.outcome(
        s["val_curve"], s["unigram_entropy"], r["val_curve"])
    with pytest.raises(ValueError, match="max_steps"):
        run(tmp_path, text_file, "k2b", "--max_steps=5", f"--reference={ref}")
    with pytest.raises(ValueError, match="eval_interval"):
        run(tmp_path, text_file, "k2c", "--max_steps=9", "--eval_interval=5", f"--reference={ref}")
    with pytest.raises(ValueError, match="n_loops=2"):                 # a reference has one loop
        run(tmp_path, text_file, "k2d", "--max_steps=9", f"--reference={tmp_path}/k2")


def test_the_last_line_says_the_one_rules_outcome_from_made_up_summaries():
    base = dict(variant="LT", n_loops=12, final_val_loss=3.326, unigram_entropy=3.281, max_residual_norm=123.4,
                nan_step=None)
    line = train_flt.last_line(dict(base, outcome="did not learn", outcome_reason="never learned"), "out/LT_K12/")
    assert line.startswith("[LT_K12] LT, 12 loops: final val loss 3.326") and "did not learn (never learned" in line
    assert "stability.outcome" in line and "peak 123" in line
    assert ": learned (" in train_flt.last_line(dict(base, outcome="learned", outcome_reason="x"), "o")
    assert "diverged (a NaN at step 7" in train_flt.last_line(dict(base, outcome="diverged", outcome_reason="x",
                                                                   nan_step=7), "o")


# -----------------------------------------------------------------------------
# The model read after every loop

def test_evaluate_reads_hidden_norm_and_logit_entropy_per_loop():
    torch.manual_seed(0)
    model = LoopedTransformer(train_flt.LoopedConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16,
                                                     n_loops=3, lm_head_std=0.5))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x, y = torch.randint(0, 32, (5, 8)), torch.randint(0, 32, (5, 8))
    y[:, :3] = -1                                            # unscored positions
    ev = train_flt.evaluate(model, (x, y), 4, CPU)
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
    del ckpt["config"]["variant"]                                    # another script's checkpoint
    save_checkpoint(os.path.join(out, "ckpt.pt"), ckpt)
    with pytest.raises(ValueError, match="not a run of train_flt.py"):
        train_flt.main([f"--evaluate={out}"])


# -----------------------------------------------------------------------------
# The corpora (corpora.py)

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


def test_batches_are_a_function_of_seed_and_step(text_file):
    train, _, _, _ = corpora.load_data({"data": text_file})
    cfg = {"seed": 1, "batch_size": 4, "block_size": 16}
    x1, y1 = corpora.get_batch(train, cfg, step=5)
    x2, _ = corpora.get_batch(train, cfg, step=5)
    x3, _ = corpora.get_batch(train, cfg, step=6)
    assert torch.equal(x1, x2) and not torch.equal(x1, x3) and torch.equal(x1[:, 1:], y1[:, :-1])


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
    for damage in (lambda: (cache / "val.bin").write_bytes(b"x"),    # a cut file
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
    xb, yb = corpora.eval_set(rows[:8], None)                       # every held-out row, once
    assert torch.equal(xb, x) and torch.equal(yb, y)
    ev = train_flt.evaluate(model, (xb, yb), 2, CPU)
    assert math.isclose(ev["loss"][-1], loss.item(), rel_tol=1e-5) and len(ev["loss"]) == 2
    want = (logits.argmax(-1) == y)[at].float().mean().item()
    assert math.isclose(ev["accuracy"][-1], want)


def test_listops_run_reports_answer_accuracy_per_loop(tmp_path):
    s = train_flt.main(["--data=listops", f"--out_dir={tmp_path}/l", "--listops_examples=300", "--listops_val=200",
                        "--block_size=64", *TINY[:3], "--batch_size=4", "--n_loops=2", "--max_steps=3"])
    assert len(s["val_accuracy_by_loops"]) == 12 and s["final_val_accuracy"] == s["val_accuracy_by_loops"][1]
    assert s["eval_set_size"] == 200                                # every held-out expression, each once
    assert s["unigram_entropy"] < math.log(10) + 1e-9 and "final_val_bpb" not in s
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


# -----------------------------------------------------------------------------
# The rules that read a run (stability.py)

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
