"""training.py: flags, schedule, checkpoints and run logs."""

import os

import pytest
import torch

from model import Transformer, TransformerConfig
from configurator import configure
import training
from training import RunLog, load_checkpoint, load_state, lr_at, read_log, save_checkpoint


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
    lrs = [lr_at(s, 100, 1.0, warmup_steps=10, min_lr_frac=0.1) for s in range(101)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[100] == pytest.approx(0.1)
    assert lr_at(50, 100, 1.0, schedule="linear", min_lr_frac=0.0) == pytest.approx(0.5)


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
        load_state(small, big.state_dict())
    message = str(err.value)
    assert "tok_emb.weight: checkpoint (10, 64) vs model (10, 32)" in message
    assert "blocks.0.attn.W_Q.weight" in message and "n_embd" in message


def test_run_log_keeps_only_records_before_the_checkpoint_on_resume(tmp_path):
    log = RunLog(tmp_path, {"a": 1})
    for step in range(1, 6):
        log.log(step=step, loss=float(step))
    RunLog(tmp_path, {"a": 1}, keep=training.up_to_step(3)).log(step=4, loss=40.0)
    assert [(r["step"], r["loss"]) for r in read_log(tmp_path)] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]
    RunLog(tmp_path, {"a": 1})                                         # a new run starts anew
    assert read_log(tmp_path) == []


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
    cfg = train_spt.get_config(argv)                    # the defaults layered are those of the last flags
    assert (cfg["task"], cfg["preset"], cfg["difficulty"]) == ("pathfinder", "", "contour_length_14")


@pytest.mark.parametrize("flags,expected", [({"avx2", "fma"}, torch.float32),
                                            ({"avx2", "avx512f", "avx512_bf16"}, torch.bfloat16),
                                            ({"amx_bf16"}, torch.bfloat16), (set(), torch.float32)])
def test_fast_dtype_is_bf16_only_where_the_cpu_computes_it(monkeypatch, flags, expected):
    monkeypatch.setattr(training, "cpu_flags", lambda: flags)
    assert training.setup_runtime("cpu", "fast").ptdtype == expected
    assert training.setup_runtime("cpu", "auto").ptdtype == torch.float32     # auto never picks bf16 on a CPU


def test_cpu_flags_reads_this_machine_or_nothing():
    flags = training.cpu_flags()
    assert isinstance(flags, set) and all(isinstance(f, str) for f in flags)
