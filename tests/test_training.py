"""training.py, the core both scripts share: flags, schedule, checkpoints, the Run and its log, --dtype=fast."""

import os

import pytest
import torch

from plumbing import cost
from plumbing import spt_settings
from plumbing import training
from configurator import configure
from model import Transformer, TransformerConfig
from plumbing.training import Run, Schedule, load_checkpoint, load_weights, read_log, save_checkpoint


def test_configure_parses_types_and_rejects_the_rest():
    defaults = dict(lr=1e-3, depth=1, task="pathfinder", compile=False)
    cfg = configure(defaults, ["--lr=3e-4", "--depth=2", "--task=listops", "--compile=True"])
    assert cfg == dict(lr=3e-4, depth=2, task="listops", compile=True)
    assert configure(defaults, ["--lr=1"])["lr"] == 1.0                # an int is a fine float
    for bad, message in ((["--dpeth=2"], "unknown key 'dpeth'; valid keys: lr, depth"),
                         (["--depth=2.5"], "--depth=2.5 has the wrong type"),
                         (["--compile=yes"], "--compile=yes has the wrong type"),
                         (["depth=2"], "not of the form --key=value")):
        with pytest.raises(ValueError, match=message):
            configure(defaults, bad)


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    lrs = [Schedule("cosine", 100, warmup_steps=10, min_lr_frac=0.1).lr(s, 1.0) for s in range(101)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[100] == pytest.approx(0.1)
    assert Schedule("linear", 100, min_lr_frac=0.0).lr(50, 1.0) == pytest.approx(0.5)
    assert [Schedule("constant", 100, 5).lr(s, 2.0) for s in (0, 4, 5, 99)] == [0.4, 2.0, 2.0, 2.0]


def test_warmdown_is_flat_then_linear_to_zero_over_the_last_fraction():
    lrs = [Schedule("warmdown", 100, warmdown_frac=0.2).lr(s, 1.0) for s in range(101)]
    assert lrs[:81] == [1.0] * 81 and lrs[90] == pytest.approx(0.5) and lrs[100] == 0.0
    assert Schedule("warmdown", 100, warmup_steps=4).lr(0, 1.0) == pytest.approx(0.25)


def test_checkpoint_is_written_atomically_and_loads_weights_only(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, dict(model={"w": torch.ones(2)}, config={"lr": 1e-3}, step=3))
    assert os.listdir(tmp_path) == ["ckpt.pt"]                         # no temp file left
    assert load_checkpoint(path)["step"] == 3
    with pytest.raises(FileNotFoundError, match="nothere.pt does not exist"):
        load_checkpoint(tmp_path / "nothere.pt")


def test_mismatched_checkpoint_lists_every_bad_parameter():
    small = Transformer(TransformerConfig(n_embd=32, vocab_size=10))
    big = Transformer(TransformerConfig(n_embd=64, vocab_size=10))
    with pytest.raises(ValueError) as err:
        load_weights(small, big.state_dict())
    message = str(err.value)
    assert "tok_emb.weight: checkpoint (10, 64) vs model (10, 32)" in message
    assert "blocks.0.attn.W_Q.weight" in message and "n_embd" in message


def test_load_weights_takes_only_the_names_given(tmp_path):
    a, b = (Transformer(TransformerConfig(n_embd=16, n_head=2, vocab_size=10)) for _ in range(2))
    save_checkpoint(tmp_path / "a.pt", dict(model=a.state_dict()))
    before = {k: v.clone() for k, v in b.state_dict().items()}
    load_weights(b, tmp_path / "a.pt", names={"tok_emb.weight"})
    after = b.state_dict()
    assert torch.equal(after["tok_emb.weight"], a.state_dict()["tok_emb.weight"])
    assert all(torch.equal(after[k], before[k]) for k in before if k != "tok_emb.weight")
    with pytest.raises(ValueError, match="missing in checkpoint: no_such"):
        load_weights(b, tmp_path / "a.pt", names={"no_such"})


def run_in(tmp_path, **flags):
    cfg = {**dict(out_dir=str(tmp_path / "run"), overwrite=False, init_from="", device="cpu", dtype="float32",
                  seed=0), **flags}
    return Run(cfg, "train_spt.py", ["--x=1"], lambda ckpt, c, argv: dict(ckpt["config"], resumes=[{}]))


def test_run_writes_its_log_and_keeps_only_records_before_the_resume_point(tmp_path):
    with run_in(tmp_path) as run:
        run.begin()
        for step in range(1, 6):
            run.log(step=step, loss=float(step))
        run.save_resume(torch.nn.Linear(2, 2), [], step=3)
    assert [r["step"] for r in read_log(tmp_path / "run")] == [1, 2, 3, 4, 5]
    with pytest.raises(FileExistsError, match="already holds a run"):
        with run_in(tmp_path):
            pass
    with run_in(tmp_path, init_from="resume") as run:
        assert run.ckpt["step"] == 3
        run.begin(keep=lambda r: r["step"] <= 3, at=dict(step=3))
        run.log(step=4, loss=40.0)
    assert [(r["step"], r.get("loss"), r.get("event")) for r in read_log(tmp_path / "run")] == \
        [(1, 1.0, None), (2, 2.0, None), (3, 3.0, None), (3, None, "resume"), (4, 40.0, None)]
    assert (tmp_path / "run" / "command.txt").read_text() == "python train_spt.py --x=1\n" * 2
    assert not (tmp_path / "run" / "run.lock").exists()


def test_read_jsonl_drops_a_cut_last_line_and_refuses_a_bad_line_before_it(tmp_path, capsys):
    path = tmp_path / "log.jsonl"
    path.write_text('{"step": 1}\n\n{"step": 2}\n{"step": 3, "lo')
    assert read_log(tmp_path) == [{"step": 1}, {"step": 2}]
    assert "dropped its last line" in capsys.readouterr().err
    path.write_text('{"step": 1}\ngarbage\n{"step": 3}\n')
    with pytest.raises(ValueError, match="log.jsonl, line 2"):
        read_log(tmp_path)


def test_flag_value_takes_the_last_occurrence_as_configure_does():
    import configurator
    import train_spt
    argv = ["--preset=cpu", "--task=listops", "--preset=", "--task=pathfinder"]
    assert configurator.flag_value(argv, "task", "synthetic") == "pathfinder"
    assert configurator.flag_value(argv, "depth", 3) == 3
    cfg = spt_settings.get_config(train_spt.DEFAULTS, argv)   # the defaults layered are those of the last flags
    assert (cfg["task"], cfg["preset"], cfg["difficulty"]) == ("pathfinder", "", "contour_length_14")


@pytest.mark.parametrize("seconds,expected", [({torch.float32: 1.30, torch.bfloat16: 1.07}, torch.bfloat16),
                                              ({torch.float32: 2.4, torch.bfloat16: 12.0}, torch.float32),
                                              ({torch.float32: 13.3, torch.bfloat16: 14.9}, torch.float32)])
def test_fast_dtype_is_the_one_that_times_faster(seconds, expected):
    assert cost.fastest_dtype(seconds.get) == expected


def test_choose_dtype_times_the_run_model_and_leaves_rng_and_gradients(tmp_path, monkeypatch):
    model = Transformer(TransformerConfig(n_embd=16, n_head=2, vocab_size=10))
    x = torch.randint(0, 10, (2, 8))
    with run_in(tmp_path, dtype="fast") as run:
        assert run.rt.ptdtype == torch.float32                         # on a CPU: float32 until timed
        timed = []
        monkeypatch.setattr(cost, "step_seconds", lambda f, kind, d: timed.append(d) or {torch.float32: 2.0,
                                                                                        torch.bfloat16: 1.0}[d])
        rng = torch.get_rng_state()
        cost.choose_dtype(run, model, lambda: model.classify(x).sum())
        assert run.rt.ptdtype == torch.bfloat16 and timed == [torch.float32, torch.bfloat16]
        assert torch.equal(torch.get_rng_state(), rng)
        monkeypatch.undo()
        cost.choose_dtype(run, model, lambda: model.classify(x).sum())   # timed for real: either, no grads left
        assert all(p.grad is None for p in model.parameters())
    assert training.setup_runtime("cpu", "auto").ptdtype == torch.float32     # auto never picks bf16 on a CPU
