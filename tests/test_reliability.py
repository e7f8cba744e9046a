"""Nothing lost, nothing silently wrong: every user error is one line with no
traceback, a run folder is never silently reused, resume continues the folder
it is given, a NaN stops the run without a NaN checkpoint, cached data is verified.

Most cases run a script's command line in-process through configurator.run_cli, the
same wrapper its `__main__` calls; two subprocess checks confirm the wrapper is
what a user really gets."""

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import torch

import corpora
import train_flt
from plumbing import spt_phase, spt_settings
import train_spt
from plumbing import runfiles
from configurator import run_cli
from looped import LoopedTransformer
from plumbing.training import load_checkpoint, read_log, save_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPT = ["--task=synthetic", "--n_train=128", "--n_eval=64", "--batch_size=32", "--n_embd=16", "--n_head=2",
       "--epochs=1", "--pretrain_epochs=1", "--patience=0", "--log_every=1"]
FLT = ["--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=4", "--n_loops=2",
       "--warmup_steps=1", "--eval_batches=1", "--eval_interval=2", "--osc_steps=3", "--max_steps=4"]

def spt_config(argv):
    """train_spt.py's config of a command line (its DEFAULTS, then spt_settings' layers)."""
    return spt_settings.get_config(train_spt.DEFAULTS, argv)



def cli(script, *argv):
    """A script's command line, in-process: (exit status, the error line or '')."""
    try:
        run_cli(script.main, [str(a) for a in argv])
        return 0, ""
    except SystemExit as e:
        return (1, e.code) if isinstance(e.code, str) else (e.code or 0, "")


def fingerprint(folder):
    """Name -> sha256 of every file in a folder: to show that nothing was changed."""
    return {n: hashlib.sha256(open(os.path.join(folder, n), "rb").read()).hexdigest()
            for n in sorted(os.listdir(folder)) if os.path.isfile(os.path.join(folder, n))}


@pytest.fixture
def text_file(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "tiny.txt"
    path.write_text(" ".join(rng.choice(["loop", "the", "norm", "key", "value"], size=800)))
    return str(path)


@pytest.fixture(scope="module")
def finished_spt(tmp_path_factory):
    """One finished tiny train_spt run, to try reruns and resumes against."""
    out = tmp_path_factory.mktemp("spt") / "run"
    assert cli(train_spt, *SPT, f"--out_dir={out}", "--ckpt_every=2") == (0, "")
    return out


# -----------------------------------------------------------------------------
# Every flag range-checked before any work, one line naming it

@pytest.mark.parametrize("flag, words", [
    ("--batch_size=-4", "--batch_size=-4 is out of range"),
    ("--grad_accum=0", "--grad_accum=0 is out of range"),
    ("--log_every=0", "--log_every=0 is out of range"),
    ("--epochs=-1", "--epochs=-1 is out of range"),
    ("--pretrain_epochs=-1", "--pretrain_epochs=-1 is out of range"),
    ("--lr=nan", "--lr=nan is not a finite number"),
    ("--lr=1e309", "--lr=1e309 is not a finite number"),
    ("--save_epochs=abc", "--save_epochs=abc must be a comma list"),
    ("--max_len=100", "--max_len=100 does not apply to --task=synthetic"),
    ("--difficulty=baseline", "--difficulty=baseline does not apply"),
    ("--device=cuda:7" if not torch.cuda.is_available() else "--device=tpu", "--device="),
    ("--n_train=10", "fewer than one global batch"),
    ("--n_head=3", "not divisible by n_head=3"),
    ("--device=mps", "--device=mps"),
    ("--freeze=all", "--freeze=all leaves nothing to train"),
    ("--n_embd=10000000", "lower --n_embd or the depth"),
    ("--data_dir=/nonexistent", "--data_dir=/nonexistent does not apply to --task=synthetic"),
    ("--seed=-1", "--seed=-1 is out of range"),
    ("--seed=99999999999999", "--seed=99999999999999 is out of range"),
    ("--pretrain_task=listops", "has vocabulary (size, pad, mask)"),
])
def test_spt_bad_flag_is_one_line_before_any_work(tmp_path, flag, words):
    status, message = cli(train_spt, *SPT, f"--out_dir={tmp_path}/o", flag)
    assert status == 1 and words in message and "\n" not in message
    assert not os.path.exists(tmp_path / "o")                    # nothing written


@pytest.mark.parametrize("flags, words", [
    (["--pretrain_epochs=0", "--init_params=qk"], "--init_params=qk does not apply"),
    (["--pretrain_epochs=0", "--spt_objective=causal"], "--spt_objective=causal does not apply"),
    (["--pretrain_epochs=0", "--mask_ratio=0.9"], "--mask_ratio=0.9 does not apply"),
    (["--pretrain_epochs=0", "--pretrain_lr=5.0"], "--pretrain_lr=5.0 does not apply"),
    (["--report=out", "--lr=5.0"], "--report gathers finished runs and takes no other flag"),
])
def test_a_flag_that_would_do_nothing_is_refused(tmp_path, flags, words):
    status, message = cli(train_spt, *SPT, f"--out_dir={tmp_path}/o", *flags)
    assert status == 1 and words in message
    assert not os.path.exists(tmp_path / "o")


def test_pretraining_asked_for_beside_a_checkpoint_to_finetune_is_refused(finished_spt, tmp_path):
    status, message = cli(train_spt, *SPT, f"--out_dir={tmp_path}/o", f"--init_from={finished_spt}/spt_best.pt",
                          "--pretrain_epochs=5")
    assert status == 1 and "--pretrain_epochs=5 does not apply" in message


def test_nan_weights_in_a_checkpoint_to_finetune_from_are_named(finished_spt, tmp_path):
    state = load_checkpoint(finished_spt / "spt_best.pt")
    name = next(k for k, v in state["model"].items() if v.is_floating_point())
    state["model"][name] = state["model"][name] * float("nan")
    torch.save(state, tmp_path / "nan.pt")                        # save_checkpoint would refuse it
    status, message = cli(train_spt, *SPT, f"--out_dir={tmp_path}/o", f"--init_from={tmp_path}/nan.pt",
                          "--pretrain_epochs=0")
    assert status == 1 and "nan.pt holds NaN or inf weights" in message and "--lr" not in message


@pytest.mark.parametrize("flag, words", [
    ("--n_head=3", "n_head"), ("--variant=XL", "--variant=XL is not one of"),
    ("--batch_size=0", "--batch_size=0 is out of range"), ("--max_steps=-1", "--max_steps=-1 is out of range"),
    ("--block_size=100000", "too short for block_size=100000"), ("--vocab_size=50", "--vocab_size applies only"),
    ("--eval_interval=0", "--eval_interval=0 is out of range"), ("--init_from=resume", "ckpt.pt does not exist"),
])
def test_flt_bad_flag_is_one_line_before_any_work(tmp_path, text_file, flag, words):
    status, message = cli(train_flt, *FLT, f"--data={text_file}", f"--out_dir={tmp_path}/o", flag)
    assert status == 1 and words in message and "\n" not in message
    assert not os.path.exists(tmp_path / "o")


@pytest.mark.parametrize("flags, words", [
    (["--min_lr_frac=5.0", "--schedule=cosine"], "--min_lr_frac=5.0 is out of range"),
    (["--seed=-5"], "--seed=-5 is out of range"),
    (["--n_embd=10000000", "--n_head=1"], "lower --n_embd or the depth"),
    (["--device=mps"], "--device=mps"),
])
def test_flt_bad_flag_writes_nothing(tmp_path, text_file, flags, words):
    status, message = cli(train_flt, *FLT, f"--data={text_file}", f"--out_dir={tmp_path}/o", *flags)
    assert status == 1 and words in message
    assert not os.path.exists(tmp_path / "o")


def test_compare_never_writes_into_a_run_and_takes_no_training_flag(tmp_path, text_file):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        assert cli(train_flt, *FLT, f"--data={text_file}", f"--out_dir={out}")[0] == 0
    before = fingerprint(b)
    status, message = cli(train_flt, f"--compare={a}", f"--out_dir={b}")
    assert status == 1 and "holds a run" in message and fingerprint(b) == before
    status, message = cli(train_flt, f"--compare={a}", "--n_loops=0", "--lr=-5")
    assert status == 1 and "leave out --n_loops, --lr" in message
    assert cli(train_flt, f"--compare={a},{b}", f"--out_dir={tmp_path}/cmp")[0] == 0
    assert (tmp_path / "cmp" / "compare.md").exists()


def test_resume_needs_its_own_script_and_its_log(tmp_path, text_file, finished_spt):
    status, message = cli(train_flt, f"--data={text_file}", f"--out_dir={finished_spt}", "--init_from=resume")
    assert status == 1 and "holds a run of another script" in message
    out = tmp_path / "flt"
    assert cli(train_flt, *FLT, f"--data={text_file}", f"--out_dir={out}", "--stop_step=2")[0] == 0
    status, message = cli(train_spt, "--task=synthetic", f"--out_dir={out}", "--init_from=resume")
    assert status == 1 and "holds a run of another script (train_flt.py)" in message     # its manifest says
    os.remove(out / "log.jsonl")
    status, message = cli(train_flt, f"--data={text_file}", f"--out_dir={out}", "--init_from=resume")
    assert status == 1 and "log.jsonl is gone" in message


def test_listops_that_cannot_fit_block_size_is_refused_quickly(tmp_path):
    flags = [f for f in FLT if not f.startswith("--eval_batches")]
    status, message = cli(train_flt, *flags, "--data=listops", "--block_size=8", f"--out_dir={tmp_path}/o")
    assert status == 1 and "fit block_size=8" in message and not os.path.exists(tmp_path / "o")


def test_debug_shows_the_traceback_that_the_one_line_error_hides(tmp_path):
    """A user error is one line 'error: ...' (on each script's real entry point too:
    test_command_line_error_is_one_clear_line for train_spt.py and
    test_configurator_rejects_bad_keys_through_the_script for train_flt.py); --debug=True
    shows the traceback instead."""
    argv = [sys.executable, "train_spt.py", "--task=synthetic", "--batch_size=0"]
    for status, message in (cli(train_spt, *argv[2:]), cli(train_flt, "--n_head=3", f"--out_dir={tmp_path}/o")):
        assert status == 1 and message.startswith("error: ") and "\n" not in message
    debug = subprocess.run(argv + ["--debug=True"], cwd=ROOT, capture_output=True, text=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert debug.returncode == 1 and "Traceback" in debug.stderr


# -----------------------------------------------------------------------------
# Run folders: refused when in use, replaced only when asked, distinct by default

def test_a_finished_run_is_not_overwritten_without_the_flag(finished_spt):
    before = fingerprint(finished_spt)
    status, message = cli(train_spt, *SPT, f"--out_dir={finished_spt}", "--lr=3e-3")
    assert status == 1 and "already holds a run" in message and "--overwrite=True" in message
    assert fingerprint(finished_spt) == before


def test_overwrite_never_touches_a_folder_that_is_not_a_run(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("plot.png", "my_model.pt", "config.json", "notes.txt"):
        (mine / name).write_text("the user's")
    before = fingerprint(mine)
    status, message = cli(train_spt, *SPT, f"--out_dir={mine}", "--overwrite=True")
    assert status == 1 and "not a run folder of this project" in message
    assert fingerprint(mine) == before


def test_a_refused_run_leaves_no_folder_and_a_dead_writers_temp_file_is_cleared(tmp_path):
    out = tmp_path / "run"
    assert cli(train_spt, *SPT, f"--out_dir={out}", "--n_train=10")[0] == 1   # refused after the lock
    assert not out.exists()
    out.mkdir()
    (out / f"{runfiles._TMP_PREFIX}.99999999.ckpt.pt").write_bytes(b"half a checkpoint")   # a killed writer's
    assert cli(train_spt, *SPT, f"--out_dir={out}")[0] == 0
    assert not [n for n in os.listdir(out) if n.startswith(runfiles._TMP_PREFIX)]


def test_a_users_file_named_like_a_temp_file_is_never_removed(tmp_path):
    out = tmp_path / "u"
    out.mkdir()
    (out / "thesis.tmp.docx").write_text("the user's")
    status, message = cli(train_spt, *SPT, f"--out_dir={out}")
    assert status == 1 and "thesis.tmp.docx" in message and "not a run folder" in message
    assert os.listdir(out) == ["thesis.tmp.docx"]


def test_a_full_disk_is_one_line_and_leaves_no_temp_file(tmp_path, monkeypatch):
    """Before the first checkpoint: the advice is to start again (resume would find none)."""
    def full(*a, **k):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file")
    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr(runfiles.shutil, "disk_usage", lambda p: types.SimpleNamespace(free=0))
    status, message = cli(train_spt, *SPT, f"--out_dir={tmp_path}/o")
    assert status == 1 and "no space left to write" in message
    assert "start it again with --overwrite=True" in message and "resume" not in message
    assert not [n for n in os.listdir(tmp_path / "o") if n.startswith(runfiles._TMP_PREFIX)]


def failing_on_call(n, error):
    """A stand-in that raises `error` from its n-th call on, and calls the real one before."""
    calls = []

    def wrap(real):
        def call(*args, **kwargs):
            calls.append(1)
            if len(calls) >= n:
                raise error
            return real(*args, **kwargs)
        return call
    return wrap


NO_SPACE = OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("what", ("checkpoint", "log", "figure"))
def test_a_disk_that_fills_mid_run_is_one_line_and_loses_nothing_written_before(tmp_path, monkeypatch, what):
    out = tmp_path / "o"
    if what == "checkpoint":        # torch.save's own words on a full disk; the disk reads as not full afterwards
        pos = RuntimeError("[enforce fail at inline_container.cc:819] . unexpected pos 64 vs 2048")
        monkeypatch.setattr(torch, "save", failing_on_call(3, pos)(torch.save))
    elif what == "log":                                                # the third append to log.jsonl
        real, appends = runfiles._open_nofollow, []

        def open_(path, flags, mode="w"):
            appends.extend([path] if flags & os.O_APPEND else [])
            if flags & os.O_APPEND and len(appends) >= 3:
                raise NO_SPACE
            return real(path, flags, mode)
        monkeypatch.setattr(runfiles, "_open_nofollow", open_)
    else:
        import matplotlib.figure
        monkeypatch.setattr(matplotlib.figure.Figure, "savefig", failing_on_call(1, NO_SPACE)(None))
    status, message = cli(train_spt, *SPT, f"--out_dir={out}")
    assert status == 1 and message.count("\n") == 0, message
    assert ("could not write" if what == "checkpoint" else "no space left to write") in message, message
    assert not [n for n in os.listdir(out) if n.startswith(runfiles._TMP_PREFIX)]
    if what == "checkpoint":                                           # the two written before still load
        assert load_checkpoint(out / "spt_best.pt")["epoch"] == 1 and (out / "spt_epoch1.pt").exists()
    if what == "log":                                                  # the records written before are whole
        assert len(read_log(out)) >= 1


def test_ctrl_c_says_how_to_go_on_and_exits_130(tmp_path, monkeypatch, capsys):
    def interrupt(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(spt_phase.PhaseLedger, "end_of_epoch", interrupt)
    with pytest.raises(SystemExit) as e:
        run_cli(train_spt.main, [*SPT, f"--out_dir={tmp_path}/o"])
    assert e.value.code == 130
    assert "no usable checkpoint" in capsys.readouterr().err          # none yet: it says so


def test_debug_in_any_case_shows_the_traceback(tmp_path):
    with pytest.raises(ValueError):
        run_cli(train_spt.main, [*SPT, "--batch_size=0", "--debug=true"])


def test_resuming_a_finished_run_keeps_its_spt_loss_and_adds_up_its_time(tmp_path):
    out = tmp_path / "run"
    assert cli(train_spt, *SPT, f"--out_dir={out}", "--halt_after_steps=5", "--ckpt_every=1")[0] == 1
    first = load_checkpoint(out / "ckpt.pt")["wall_time"]
    assert cli(train_spt, *SPT, f"--out_dir={out}", "--init_from=resume")[0] == 0
    summary = json.load(open(out / "summary.json"))
    assert summary["wall_time_s"] > first
    saved = load_checkpoint(out / "ckpt.pt")["wall_time"]       # at the last checkpoint, before the test pass
    assert cli(train_spt, *SPT, f"--out_dir={out}", "--init_from=resume")[0] == 0     # again, finished
    again = json.load(open(out / "summary.json"))
    assert again["spt_best_val_loss"] == summary["spt_best_val_loss"] is not None
    assert again["wall_time_s"] > saved                     # this call's time added to the checkpoint's


def test_a_damaged_checkpoint_is_refused_by_its_checksum(finished_spt, tmp_path):
    data = bytearray(open(finished_spt / "spt_best.pt", "rb").read())
    i = data.index(b"data/0") + 200                                 # inside the first tensor's bytes
    data[i:i + 64] = bytes(64)
    (tmp_path / "bad.pt").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="bad.pt is damaged"):
        load_checkpoint(tmp_path / "bad.pt")


def test_overwrite_removes_the_old_results_first(tmp_path):
    out = tmp_path / "run"
    assert cli(train_spt, *SPT, f"--out_dir={out}", "--save_epochs=1")[0] == 0
    assert (out / "spt_epoch1.pt").exists()
    assert cli(train_spt, *SPT, f"--out_dir={out}", "--pretrain_epochs=0", "--overwrite=True")[0] == 0
    assert not (out / "spt_epoch1.pt").exists() and not (out / "spt_best.pt").exists()   # no mix
    assert json.load(open(out / "summary.json"))["pretrain_epochs"] == 0


def test_a_live_writer_keeps_a_second_one_out(tmp_path, text_file):
    out = tmp_path / "run"
    out.mkdir()
    holder = "import fcntl, os, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); " \
             "f.write(str(os.getpid())); f.flush(); print('held', flush=True); time.sleep(60)"
    sleeper = subprocess.Popen([sys.executable, "-c", holder, str(out / "run.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert sleeper.stdout.readline().strip() == "held"
        status, message = cli(train_flt, *FLT, f"--data={text_file}", f"--out_dir={out}")
        assert status == 1 and f"in use by another run (pid {sleeper.pid}" in message
    finally:
        sleeper.kill()
        sleeper.wait()
    assert cli(train_flt, *FLT, f"--data={text_file}", f"--out_dir={out}")[0] == 0   # its lock died with it
    assert not (out / "run.lock").exists()                       # released at the end


def test_default_out_dir_names_the_flags_that_differ():
    names = {spt_config(["--task=synthetic", *extra])["out_dir"]
             for extra in ([], ["--pos_enc=rope"], ["--pos_enc=learned"], ["--freeze=attn", "--seed=1"])}
    assert len(names) == 4 and "out/synthetic_d1_10ep_pos_enc-rope" in names


def test_out_dir_that_is_a_file_is_refused(tmp_path, text_file):
    (tmp_path / "afile").write_text("x")
    status, message = cli(train_flt, *FLT, f"--data={text_file}", f"--out_dir={tmp_path}/afile")
    assert status == 1 and "is a file, not a folder" in message


# -----------------------------------------------------------------------------
# Resume continues the folder it is given; changed flags applied or refused

def test_a_moved_run_resumes_where_it_is_and_records_the_new_lr(tmp_path):
    first = tmp_path / "first"
    assert cli(train_spt, *SPT, f"--out_dir={first}", "--ckpt_every=2", "--halt_after_steps=6")[0] == 1
    moved = tmp_path / "moved"
    os.rename(first, moved)
    status, message = cli(train_spt, "--task=synthetic", f"--out_dir={moved}", "--init_from=resume", "--lr=5e-4")
    assert (status, message) == (0, "")
    assert not first.exists()                                    # nothing written to the old path
    config = json.load(open(moved / "config.json"))
    assert config["out_dir"] == str(moved) and config["lr"] == 5e-4
    events = [r for r in read_log(moved) if r.get("event") == "resume"]
    assert events[0]["changed"]["lr"] == [1e-3, 5e-4]
    assert os.path.exists(moved / "summary.json")


def test_resume_refuses_a_flag_that_would_change_the_run(finished_spt, text_file, tmp_path):
    before = fingerprint(finished_spt)
    status, message = cli(train_spt, "--task=synthetic", f"--out_dir={finished_spt}", "--init_from=resume",
                          "--n_embd=32")
    assert status == 1 and "cannot change --n_embd=32 (the checkpoint has 16)" in message
    assert fingerprint(finished_spt) == before
    out = tmp_path / "flt"
    assert cli(train_flt, *FLT, f"--data={text_file}", f"--out_dir={out}", "--stop_step=2")[0] == 0
    status, message = cli(train_flt, f"--data={text_file}", f"--out_dir={out}", "--init_from=resume", "--seed=7")
    assert status == 1 and "cannot change --seed=7" in message


def test_a_cut_last_log_line_is_dropped_on_resume(tmp_path, text_file, capsys):
    out = tmp_path / "run"
    assert cli(train_flt, *FLT, f"--data={text_file}", f"--out_dir={out}", "--stop_step=2")[0] == 0
    with open(out / "log.jsonl", "a") as f:
        f.write('{"step": 3, "lo')                              # killed mid-write
    assert cli(train_flt, *FLT, f"--data={text_file}", f"--out_dir={out}", "--init_from=resume")[0] == 0
    assert "dropped its last line" in capsys.readouterr().err
    assert [r["step"] for r in read_log(out) if "loss" in r] == [1, 2, 3, 4]
    with open(out / "log.jsonl", "r+") as f:                    # damage in the middle is an error
        lines = f.readlines()
        f.seek(0)
        f.writelines(lines[:1] + ["garbage\n"] + lines[1:])
    with pytest.raises(ValueError, match="log.jsonl, line 2"):
        read_log(out)


# -----------------------------------------------------------------------------
# NaN: stop at the step, no NaN checkpoint, name the last good one

def test_nan_stops_at_the_step_and_never_writes_nan_weights(tmp_path):
    out = tmp_path / "run"
    status, message = cli(train_spt, *SPT, f"--out_dir={out}", "--lr=1e6", "--pretrain_lr=1e6",
                          "--grad_clip=0", "--ckpt_every=2", "--log_every=10")
    assert status == 1 and "became NaN or inf at step" in message
    for name in os.listdir(out):
        if name.endswith(".pt"):
            assert all(torch.isfinite(v).all() for v in load_checkpoint(out / name)["model"].values()
                       if v.is_floating_point())
    if (out / "ckpt.pt").exists():
        assert f"the last good checkpoint is {out / 'ckpt.pt'}" in message
    else:
        assert "no usable checkpoint" in message


def test_nan_weights_are_never_saved(tmp_path):
    with pytest.raises(FloatingPointError, match="NaN or inf"):
        save_checkpoint(tmp_path / "c.pt", dict(model={"w": torch.tensor([1.0, float("nan")])}))
    assert os.listdir(tmp_path) == []


# -----------------------------------------------------------------------------
# Bad files: one line naming the file and what is wrong

class NotATensor:
    pass


def test_bad_checkpoints_are_named_and_refused(tmp_path):
    good = tmp_path / "good.pt"
    save_checkpoint(good, dict(model={"w": torch.ones(3)}, step=1))
    cases = {"truncated": open(good, "rb").read()[:200], "empty": b"", "not a checkpoint": b"hello world\n"}
    for words, data in cases.items():
        (tmp_path / "bad.pt").write_bytes(data)
        with pytest.raises(ValueError, match=f"bad.pt is .*{words}"):
            load_checkpoint(tmp_path / "bad.pt")
    torch.save({"model": {}, "payload": NotATensor()}, tmp_path / "payload.pt")
    with pytest.raises(ValueError, match="payload.pt refused: it contains objects that are not tensors") as e:
        load_checkpoint(tmp_path / "payload.pt")
    assert "weights_only=False" not in str(e.value)             # never advise the unsafe load
    torch.save({"weights": torch.ones(1)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a checkpoint of this project"):
        load_checkpoint(tmp_path / "other.pt")


def test_a_truncated_checkpoint_on_resume_is_one_line(tmp_path, text_file):
    out = tmp_path / "run"
    assert cli(train_flt, *FLT, f"--data={text_file}", f"--out_dir={out}", "--stop_step=2")[0] == 0
    data = open(out / "ckpt.pt", "rb").read()
    (out / "ckpt.pt").write_bytes(data[: len(data) // 2])
    status, message = cli(train_flt, f"--data={text_file}", f"--out_dir={out}", "--init_from=resume")
    assert status == 1 and "ckpt.pt is truncated" in message


def test_token_files_of_odd_size_are_refused(tmp_path):
    folder = tmp_path / "tok"
    folder.mkdir()
    np.arange(100, dtype=np.uint16).tofile(folder / "train.bin")
    (folder / "val.bin").write_bytes(b"\x01\x00\x02")
    status, message = cli(train_flt, *FLT, f"--data={folder}", f"--out_dir={tmp_path}/o", "--vocab_size=200")
    assert status == 1 and "val.bin holds 3 bytes, not a whole number of uint16" in message


def test_stdlib_cache_is_verified_and_rebuilt(tmp_path):
    root = tmp_path / "lib"
    root.mkdir()
    (root / "m.py").write_text('"""' + "A docstring that is long enough. " * 20 + '"""\n')
    cache = tmp_path / "cache"
    train, val = corpora.prepare_stdlib(str(cache), root=str(root))
    (cache / "train.bin").write_bytes(bytes(train[:50]))        # truncated by hand
    train2, val2 = corpora.prepare_stdlib(str(cache), root=str(root))
    assert np.array_equal(train2, train) and np.array_equal(val2, val)


# -----------------------------------------------------------------------------
# Files the run does not own: never written through a link, never removed by name

def test_a_link_in_the_run_folder_is_never_written_through(tmp_path, text_file):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's")
    for name, script, flags in (("run.lock", train_spt, SPT), ("command.txt", train_flt, [*FLT, f"--data={text_file}"])):
        out = tmp_path / name.replace(".", "_")
        out.mkdir()
        os.symlink(victim, out / name)
        status, message = cli(script, *flags, f"--out_dir={out}")
        assert status == 1 and name in message
        assert victim.read_text() == "the user's" and os.path.islink(out / name)


def test_atomic_write_refuses_a_link_and_names_its_temp_file_by_pid(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's")
    os.symlink(victim, tmp_path / "out.json")
    with pytest.raises(FileExistsError, match="symbolic link"):
        runfiles.write_json(str(tmp_path / "out.json"), {"a": 1})
    assert victim.read_text() == "the user's"
    assert os.path.basename(runfiles._temp_path("d/x.pt")) == f"{runfiles._TMP_PREFIX}.{os.getpid()}.x.pt"


def test_a_folder_of_user_files_named_like_ours_is_not_a_run(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("curves.png", "proximity.png"):
        (mine / name).write_text("the user's")
    before = fingerprint(mine)
    for flags in ([], ["--overwrite=True"]):
        status, message = cli(train_spt, *SPT, f"--out_dir={mine}", *flags)
        assert status == 1 and "not a run folder" in message
    assert fingerprint(mine) == before


def test_overwrite_removes_only_the_files_the_run_listed(finished_spt, tmp_path):
    out = tmp_path / "run"
    assert cli(train_spt, *SPT, f"--out_dir={out}")[0] == 0
    (out / "attention_for_paper.png").write_text("the user's")
    status, message = cli(train_spt, *SPT, f"--out_dir={out}", "--overwrite=True")
    assert status == 1 and "attention_for_paper.png" in message
    os.rename(out / "attention_for_paper.png", tmp_path / "kept.png")
    assert cli(train_spt, *SPT, f"--out_dir={out}", "--overwrite=True")[0] == 0
    manifest = json.load(open(out / runfiles._MANIFEST))
    assert manifest["script"] == "train_spt.py" and set(manifest["files"]) == set(os.listdir(out)) - {
        runfiles._MANIFEST}


def test_a_live_run_whose_lock_was_deleted_keeps_a_second_one_out(tmp_path):
    out = tmp_path / "run"
    assert cli(train_spt, *SPT, f"--out_dir={out}")[0] == 0
    holder = "import sys, time; f = open(sys.argv[1], 'a'); print('held', flush=True); time.sleep(60)"
    live = subprocess.Popen([sys.executable, "-c", holder, str(out / "run.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout.readline().strip() == "held"
        os.remove(out / "run.lock")                                # someone deleted the live run's lock
        manifest = json.load(open(out / runfiles._MANIFEST))
        runfiles.write_json(str(out / runfiles._MANIFEST), dict(manifest, pid=live.pid))
        before = fingerprint(out)
        status, message = cli(train_spt, *SPT, f"--out_dir={out}", "--overwrite=True")
        assert status == 1 and f"in use by another run (pid {live.pid}" in message
        assert fingerprint(out) == before
    finally:
        live.kill()
        live.wait()


# -----------------------------------------------------------------------------
# Outputs that are not run folders replace only what they wrote

def test_report_never_replaces_a_file_it_did_not_write(finished_spt, tmp_path, monkeypatch, capsys):
    results = tmp_path / "results"
    results.mkdir()
    shutil.copytree(finished_spt, results / "run")
    os.symlink(results / "run", results / "again")                    # a link: not followed, not counted twice
    (results / "report.md").write_text("the user's")
    capsys.readouterr()
    status, message = cli(train_spt, f"--report={results}")
    assert status == 1 and "report.md" in message and (results / "report.md").read_text() == "the user's"
    assert "| run |" not in capsys.readouterr().out                      # refused before its table is shown
    os.remove(results / "report.md")
    assert cli(train_spt, f"--report={results}")[0] == 0
    assert (results / "report.md").read_text().count("| " + str(results / "run") + " |") == 1
    assert cli(train_spt, f"--report={results}")[0] == 0                 # its own report: replaced
    monkeypatch.chdir(tmp_path)
    parent = fingerprint(finished_spt.parent)
    assert cli(train_spt, f"--report={finished_spt}")[0] == 0           # a single run: not its parent
    assert fingerprint(finished_spt.parent) == parent
    assert (tmp_path / "out" / "spt_report" / "report.md").exists()


def test_compare_and_bench_never_replace_a_file_they_did_not_write(tmp_path, text_file):
    from tools import bench
    run = tmp_path / "a"
    assert cli(train_flt, *FLT, f"--data={text_file}", f"--out_dir={run}")[0] == 0
    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "flt_loss.png").write_text("the user's")
    status, message = cli(train_flt, f"--compare={run}", f"--out_dir={figures}")
    assert status == 1 and "flt_loss.png" in message and (figures / "flt_loss.png").read_text() == "the user's"
    assert os.listdir(figures) == ["flt_loss.png"]                      # refused before writing anything
    status, message = cli(train_flt, f"--compare={run},{tmp_path / 'nothing'}", f"--out_dir={tmp_path}/new")
    assert status == 1 and not (tmp_path / "new").exists()              # a run it cannot read: nothing made
    (tmp_path / "mine.json").write_text("{}")
    status, message = cli(bench, "--only=data", "--quick=True", f"--out={tmp_path}/mine.json")
    assert status == 1 and "not written by bench.py" in message and (tmp_path / "mine.json").read_text() == "{}"
    for flag in ("--threads=-1", "--peak_flops=-5", "--reps=-3"):
        assert cli(bench, flag, f"--out={tmp_path}/b.json")[0] == 1
    if not torch.cuda.is_available():
        assert "no cuda device" in cli(bench, "--device=cuda", f"--out={tmp_path}/b.json")[1]


# -----------------------------------------------------------------------------
# Strict JSON: what a strict reader (JSON.parse) accepts

def strict_load(text):
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_every_json_file_a_tiny_run_writes_is_strict_json(tmp_path, text_file):
    spt, flt = tmp_path / "spt", tmp_path / "flt"
    assert cli(train_spt, *SPT, f"--out_dir={spt}", "--snapshot_attn_every=2")[0] == 0
    assert cli(train_flt, *FLT, f"--data={text_file}", f"--out_dir={flt}")[0] == 0      # osc_steps=3: NaN statistics
    assert json.load(open(flt / "summary.json"))["grad_dlog_ac1"] is None
    checked = 0
    for folder in (spt, flt):
        for name in os.listdir(folder):
            text = (folder / name).read_text() if name.endswith((".json", ".jsonl")) else None
            if text is not None:
                lines = text.splitlines() if name.endswith(".jsonl") else [text]
                [strict_load(line) for line in lines if line.strip()]
                checked += 1
    assert checked == 9       # config, log, summary, manifest of each; snapshots of the SPT run


# -----------------------------------------------------------------------------
# Resume rewinds everything to the checkpoint

def test_three_halts_and_a_sigterm_with_dropout_end_in_the_uninterrupted_weights_log_and_snapshots(
        tmp_path, monkeypatch, capsys):
    flags = [*SPT, "--dropout=0.1", "--batch_size=16", "--pretrain_epochs=2", "--epochs=2", "--snapshot_attn_every=2"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert cli(train_spt, *flags, f"--out_dir={whole}")[0] == 0
    assert cli(train_spt, *flags, f"--out_dir={cut}", "--ckpt_every=3", "--halt_after_steps=5")[0] == 1
    for _ in range(2):
        assert cli(train_spt, "--task=synthetic", f"--out_dir={cut}", "--init_from=resume",
                   "--halt_after_steps=5")[0] == 1
    with monkeypatch.context() as m:                  # a real SIGTERM in the 2nd step of this call: step 17,
        sigterm_at_call(m, train_spt.Classification, 2)   # mid-epoch in finetuning (8 steps an epoch)
        assert cli(train_spt, "--task=synthetic", f"--out_dir={cut}", "--init_from=resume")[0] == 143
    said = capsys.readouterr().err
    assert "terminated; the last good checkpoint is" in said and f"--init_from=resume --out_dir={cut}" in said
    assert not (cut / "run.lock").exists()
    stopped = load_checkpoint(cut / "ckpt.pt")
    assert (stopped["phase"], stopped["step"], stopped["step_in_epoch"]) == ("finetune", 2, 2)   # saved mid-epoch
    assert cli(train_spt, "--task=synthetic", f"--out_dir={cut}", "--init_from=resume")[0] == 0
    a, b = load_checkpoint(whole / "ckpt.pt")["model"], load_checkpoint(cut / "ckpt.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)                        # bit-exact
    strip = lambda recs: [r for r in recs if r.get("event") != "resume"]
    assert strip(read_log(cut)) == strip(read_log(whole))                 # no record twice, none lost
    snaps = lambda d: [(s["phase"], s["step"]) for s in runfiles.read_records(d / "snapshots.jsonl")]
    assert snaps(cut) == snaps(whole)
    summary = json.load(open(cut / "summary.json"))
    assert summary["init_from"] == json.load(open(whole / "summary.json"))["init_from"] == ""


def sigterm_at_call(monkeypatch, cls, n):
    """A real SIGTERM to this process from inside the n-th training forward pass of cls."""
    forward, calls = cls.forward, []

    def forward_then_signal(self, *args, **kwargs):
        calls.extend([1] if self.training else [])
        if self.training and len(calls) == n:
            os.kill(os.getpid(), signal.SIGTERM)
        return forward(self, *args, **kwargs)
    monkeypatch.setattr(cls, "forward", forward_then_signal)


def test_sigterm_mid_run_of_train_flt_saves_the_resume_point_and_resumes_to_the_same_weights(
        tmp_path, text_file, monkeypatch, capsys):
    flags = [*FLT, f"--data={text_file}", "--max_steps=6", "--ckpt_interval=100"]    # train_spt's: the halts' test
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert cli(train_flt, *flags, f"--out_dir={whole}")[0] == 0
    with monkeypatch.context() as m:
        sigterm_at_call(m, LoopedTransformer, 3)                          # a real SIGTERM in the 3rd step
        assert cli(train_flt, *flags, f"--out_dir={cut}")[0] == 143
    said = capsys.readouterr().err
    assert "terminated; the last good checkpoint is" in said and f"--init_from=resume --out_dir={cut}" in said
    assert not (cut / "run.lock").exists()
    assert load_checkpoint(cut / "ckpt.pt")["step"] == 3                  # saved at the end of that step
    assert cli(train_flt, f"--out_dir={cut}", "--init_from=resume")[0] == 0
    a, b = load_checkpoint(whole / "ckpt.pt")["model"], load_checkpoint(cut / "ckpt.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)                        # bit-exact
    strip = lambda recs: [r for r in recs if r.get("event") != "resume"]
    assert strip(read_log(cut)) == strip(read_log(whole))


def test_a_second_sigterm_or_one_before_the_loop_stops_at_once(tmp_path, monkeypatch):
    def early(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
    monkeypatch.setattr(train_spt, "load_splits", early)              # before the loop: nothing to save
    out = tmp_path / "run"
    status, _ = cli(train_spt, *SPT, f"--out_dir={out}")
    assert status == 143 and not out.exists()                         # the refused-run rule: nothing left


def test_a_kill_between_the_val_record_and_the_checkpoint_leaves_one_val_record(tmp_path, monkeypatch):
    out = tmp_path / "run"
    real = spt_phase.PhaseLedger.save
    calls = []

    def killed_at_the_epoch_end(phase):
        calls.append(phase.name)
        if len(calls) == 2:                       # step 4 (ckpt_every) saved; the epoch end's is never written
            raise SystemExit("killed")
        return real(phase)
    monkeypatch.setattr(spt_phase.PhaseLedger, "save", killed_at_the_epoch_end)
    assert cli(train_spt, *SPT, f"--out_dir={out}", "--ckpt_every=4")[0] == 1
    monkeypatch.setattr(spt_phase.PhaseLedger, "save", real)
    assert cli(train_spt, "--task=synthetic", f"--out_dir={out}", "--init_from=resume")[0] == 0
    vals = [(r["phase"], r["epoch"]) for r in read_log(out) if "val_loss" in r]
    assert vals == [("spt", 1), ("finetune", 1)]


def test_resume_keeps_init_from_and_refuses_other_data(finished_spt, tmp_path, text_file):
    out = tmp_path / "ft"
    flags = [*SPT, "--pretrain_epochs=0", f"--init_from={finished_spt}/spt_best.pt", "--epochs=2"]
    assert cli(train_spt, *flags, f"--out_dir={out}", "--halt_after_steps=5", "--ckpt_every=1")[0] == 1
    assert cli(train_spt, "--task=synthetic", f"--out_dir={out}", "--init_from=resume")[0] == 0
    assert json.load(open(out / "config.json"))["init_from"] == f"{finished_spt}/spt_best.pt"
    assert json.load(open(out / "summary.json"))["init_from"] == f"{finished_spt}/spt_best.pt"
    flt = tmp_path / "flt"
    assert cli(train_flt, *FLT, f"--data={text_file}", f"--out_dir={flt}", "--stop_step=2")[0] == 0
    config = json.load(open(flt / "config.json"))
    open(text_file, "a").write(" replaced")
    status, message = cli(train_flt, *FLT, f"--data={text_file}", f"--out_dir={flt}", "--init_from=resume")
    assert status == 1 and "not the data this run was trained on" in message
    assert json.load(open(flt / "config.json")) == config


# -----------------------------------------------------------------------------
# Bounds before any work; readers take only their own script's runs

@pytest.mark.parametrize("script, flags, words", [
    (train_spt, ["--lr=" + "9" * 401], "401 digits"),
    (train_spt, ["--n_embd=" + "9" * 401], "401 digits"),
    (train_spt, ["--epochs=" + "9" * 401], "401 digits"),
    (train_spt, ["--out_dir=" + "x" * 300], "more than 255"),
    (train_spt, ["--task=listops", "--n_generate=1000000000000"], "too many listops examples"),
    (train_flt, ["--evaluate=nowhere", "--test_loops=100000000"], "--test_loops=100000000 is out of range"),
    (train_flt, ["--evaluate=nowhere", "--test_loops=-5"], "--test_loops=-5 is out of range"),
])
def test_numbers_and_paths_are_bounded_before_any_work(tmp_path, script, flags, words):
    status, message = cli(script, *flags)
    assert status == 1 and words in message


def test_data_lra_sizes_and_a_pickle_that_claims_more_than_it_holds(tmp_path):
    import pickle

    import data_lra
    for task in ("listops", "pathfinder"):
        with pytest.raises(ValueError, match="too many"):
            data_lra.parse_args([f"--task={task}", "--generate", "--n=1000000000000"])

    class Claim:
        def __reduce__(self):
            return (np.ndarray, ((1000000, 3072), np.dtype("u1")))
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({b"data": Claim(), b"labels": [0]}, protocol=2))
    with pytest.raises(ValueError, match="refusing an array of 3,072,000,000 bytes"):
        data_lra.read_cifar_batch(str(path))


def test_listops_that_has_too_few_expressions_is_refused_quickly(tmp_path):
    flags = [f for f in FLT if not f.startswith("--eval_batches")]
    status, message = cli(train_flt, *flags, "--data=listops", "--listops_depth=1", "--listops_examples=1000000",
                          f"--out_dir={tmp_path}/o")
    assert status == 1 and "distinct ListOps expressions" in message


def test_readers_take_only_their_own_scripts_runs(finished_spt, tmp_path, text_file):
    for flags in ([f"--evaluate={finished_spt}"], [f"--compare={finished_spt}", f"--out_dir={tmp_path}/c"]):
        status, message = cli(train_flt, *flags)
        assert status == 1 and "not a run of train_flt.py" in message
    tree = tmp_path / "tree"
    shutil.copytree(finished_spt, tree / "spt")
    assert cli(train_flt, *FLT, f"--data={text_file}", f"--out_dir={tree}/flt")[0] == 0
    assert cli(train_spt, f"--report={tree}")[0] == 0                    # the FLT run is left out
    early = tmp_path / "early"
    assert cli(train_flt, *FLT, f"--data={text_file}", f"--out_dir={early}", "--stop_step=1")[0] == 0
    runfiles.write_file(str(early / "log.jsonl"), "")                      # still in its first step
    status, message = cli(train_flt, f"--compare={early}", f"--out_dir={tmp_path}/c2")
    assert status in (0, 1) and "Traceback" not in message


def test_a_checkpoint_of_another_shape_or_script_is_refused_before_anything_is_written(finished_spt, tmp_path,
                                                                                          text_file):
    flt = tmp_path / "flt"
    assert cli(train_flt, *FLT, f"--data={text_file}", f"--out_dir={flt}", "--stop_step=2")[0] == 0
    for ckpt, flags, words in ((finished_spt / "spt_best.pt", ["--n_embd=32"], "--n_embd=16 there, 32 here"),
                               (flt / "ckpt.pt", [], "not written by train_spt.py")):
        out = tmp_path / "o"
        status, message = cli(train_spt, *SPT, "--pretrain_epochs=0", f"--init_from={ckpt}", *flags,
                              f"--out_dir={out}")
        assert status == 1 and words in message and not out.exists()


# Round four: what a hostile user found on db7084f

@pytest.mark.parametrize("sig, status", [(signal.SIGHUP, 129), (signal.SIGUSR1, 138)])
def test_sighup_and_sigusr1_stop_a_run_like_sigterm_with_its_resume_point(tmp_path, text_file, monkeypatch,
                                                                          capsys, sig, status):
    """A closed terminal (SIGHUP) and SLURM's warning ahead of a time limit (SIGUSR1):
    the step ends, ckpt.pt is saved, the lock is released, the exit status is 128 + N."""
    forward, calls = LoopedTransformer.forward, []

    def forward_then_signal(self, *args, **kwargs):
        calls.extend([1] if self.training else [])
        if self.training and len(calls) == 2:
            os.kill(os.getpid(), sig)
        return forward(self, *args, **kwargs)
    monkeypatch.setattr(LoopedTransformer, "forward", forward_then_signal)
    out = tmp_path / "run"
    assert cli(train_flt, *FLT, f"--data={text_file}", "--max_steps=6", f"--out_dir={out}")[0] == status
    assert "terminated; the last good checkpoint is" in capsys.readouterr().err
    assert load_checkpoint(out / "ckpt.pt")["step"] == 2 and not (out / "run.lock").exists()


def test_a_manifest_that_names_a_path_outside_its_folder_deletes_nothing(finished_spt, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_spt, run)
    outside = tmp_path / "x"
    outside.write_text("not the run's")
    manifest = json.loads((run / "manifest.json").read_text())
    for name in ("../x", str(outside)):
        (run / "manifest.json").write_text(json.dumps(dict(manifest, files=manifest["files"] + [name])))
        before = fingerprint(run)
        status, message = cli(train_spt, *SPT, f"--out_dir={run}", "--overwrite=True")
        assert status == 1 and "names a file outside its folder" in message
        assert outside.read_text() == "not the run's" and fingerprint(run) == before


def test_overwrite_refuses_to_finetune_from_a_checkpoint_in_the_folder_it_would_empty(finished_spt, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_spt, run)
    before = fingerprint(run)
    flags = [f for f in SPT if not f.startswith("--pretrain_epochs")]
    status, message = cli(train_spt, *flags, f"--out_dir={run}", "--overwrite=True", f"--init_from={run / 'spt_best.pt'}")
    assert status == 1 and "lies in --out_dir" in message and fingerprint(run) == before


def test_a_checkpoint_copied_in_from_a_run_of_another_size_is_not_resumed(tmp_path, text_file):
    small, big = tmp_path / "small", tmp_path / "big"
    flags = [*FLT, f"--data={text_file}", "--max_steps=3"]
    assert cli(train_flt, *flags, "--n_embd=16", f"--out_dir={small}")[0] == 0
    assert cli(train_flt, *flags, "--n_embd=32", f"--out_dir={big}")[0] == 0
    shutil.copy(small / "ckpt.pt", big / "ckpt.pt")
    before = fingerprint(big)
    status, message = cli(train_flt, f"--out_dir={big}", "--init_from=resume")
    assert status == 1 and "is not the run of this folder: its n_embd is 16" in message
    assert fingerprint(big) == before


def test_data_generation_cut_by_sigterm_leaves_no_worker_traceback_and_no_folder(tmp_path):
    """The pool's workers no longer inherit the run's signal handler: a SIGTERM while
    PathFinder is generated ends the run with 143, one line, no worker traceback, no
    run folder, and the advice to run the same command again. The signal is sent once
    the progress bar shows generation under way (100,000 images: seconds to go)."""
    argv = [sys.executable, "train_spt.py", "--task=pathfinder", "--n_generate=100000", "--depth=1",
            f"--data_dir={tmp_path / 'data'}", f"--out_dir={tmp_path / 'run'}"]
    p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    seen, deadline = b"", time.time() + 120
    while b"250/100000" not in seen and time.time() < deadline and p.poll() is None:
        seen += os.read(p.stderr.fileno(), 4096)                   # the bar: generation has begun
    p.send_signal(signal.SIGTERM)
    err = (seen + p.communicate(timeout=60)[1]).decode()
    assert p.returncode == 143 and "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "run the same command again" in err and not (tmp_path / "run").exists()


def test_resume_refuses_a_run_whose_log_is_gone_in_both_scripts(tmp_path, text_file):
    spt, flt = tmp_path / "spt", tmp_path / "flt"
    assert cli(train_spt, *SPT, "--epochs=3", "--halt_after_steps=6", f"--out_dir={spt}")[0] == 1
    assert cli(train_flt, *FLT, f"--data={text_file}", "--max_steps=6", "--stop_step=2", f"--out_dir={flt}")[0] == 0
    for script, out in ((train_spt, spt), (train_flt, flt)):
        os.remove(out / "log.jsonl")
        before = fingerprint(out)
        status, message = cli(script, f"--out_dir={out}", "--init_from=resume")
        assert status == 1 and "log.jsonl is gone" in message and fingerprint(out) == before


@pytest.mark.parametrize("make, words", [
    (lambda d: "", "--out_dir is empty"),
    (lambda d: (os.symlink(d / "nowhere", d / "link"), str(d / "link"))[1], "which does not exist"),
    (lambda d: os.fsdecode(os.fsencode(str(d)) + b"/x\xff"), "holds bytes that are not UTF-8"),
])
def test_an_out_dir_that_cannot_hold_a_run_is_one_line_and_nothing_is_made(tmp_path, make, words):
    out = make(tmp_path)
    before = sorted(os.listdir(tmp_path))
    for script, flags in ((train_spt, SPT), (train_flt, FLT))[1 if out == "" else 0:]:   # spt: "" = its own name
        status, message = cli(script, *flags, f"--out_dir={out}")
        assert status == 1 and words in message and "\n" not in message
        assert sorted(os.listdir(tmp_path)) == before


def test_a_data_folder_that_is_the_run_folder_is_refused_at_the_start(tmp_path):
    out = tmp_path / "same"
    status, message = cli(train_spt, "--task=pathfinder", "--n_generate=200", f"--data_dir={out}", f"--out_dir={out}")
    assert status == 1 and "give the data and the run separate folders" in message and not out.exists()


def test_a_result_file_replaced_by_a_folder_is_refused_before_any_work(finished_spt, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_spt, run)
    os.remove(run / "summary.json")
    os.mkdir(run / "summary.json")
    before = fingerprint(run)
    status, message = cli(train_spt, *SPT, f"--out_dir={run}", "--overwrite=True")
    assert status == 1 and "summary.json is a folder where the run writes a file" in message
    assert fingerprint(run) == before and (run / "summary.json").is_dir()


def test_an_exploding_residual_stream_stops_the_run_as_a_nan_does(tmp_path, text_file):
    """--lr=1e9: the residual norms overflow to inf while the loss (after the final norm)
    stays finite; the guard stops the run there, and the summary is written (exit 2)."""
    out = tmp_path / "o"
    cli(train_flt, *FLT, f"--data={text_file}", "--lr=1e9", f"--out_dir={out}")    # in-process: no exit status
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcome"] == "diverged" and summary["nan_step"] >= 1


def test_a_batch_too_large_for_memory_is_refused_before_any_work(tmp_path, text_file, monkeypatch):
    import configurator
    monkeypatch.setattr(configurator, "memory_available", lambda: 2**30)
    status, message = cli(train_flt, *FLT, f"--data={text_file}", "--batch_size=1000000", f"--out_dir={tmp_path}/o")
    assert status == 1 and "lower --batch_size" in message and not (tmp_path / "o").exists()


def run_script(argv, tmp_path, limit_files=None, **kwargs):
    """A script as a user runs it, in a subprocess (optionally under `ulimit -n`)."""
    def limit():
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit_files, limit_files))
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"),
                          preexec_fn=limit if limit_files else None, text=True, **kwargs)


@pytest.mark.slow
def test_the_main_commands_first_screen_has_no_traceback(tmp_path):
    """README's main command on a small PathFinder: the pool generates it, and the
    screen shows no worker's traceback (they used to inherit the run's signal handler).
    Slow (20-40 s); the same command through the same pool, checked for a traceback, runs
    by default in test_a_low_open_file_limit_ends_within_a_minute_in_one_line_or_a_run[48]."""
    p = run_script(["train_spt.py", "--task=pathfinder", "--depth=1", "--n_generate=2000", "--halt_after_steps=2",
                    f"--data_dir={tmp_path / 'data'}", f"--out_dir={tmp_path / 'run'}"], tmp_path,
                   capture_output=True, timeout=240)
    assert "halted after 2 steps" in p.stderr and "Traceback" not in p.stderr + p.stdout, p.stderr[-2000:]


@pytest.mark.parametrize("files", [12, 48])
def test_a_low_open_file_limit_ends_within_a_minute_in_one_line_or_a_run(tmp_path, files):
    """Under `ulimit -n 12` a run is refused first, in one line; at 48 PathFinder is
    generated with the workers the limit leaves room for, and the run goes on."""
    p = run_script(["train_spt.py", "--task=pathfinder", "--depth=1", "--n_generate=1000", "--halt_after_steps=1",
                    "--n_embd=32", "--n_head=2", "--batch_size=8",                 # a smaller model: faster steps
                    f"--data_dir={tmp_path / 'data'}", f"--out_dir={tmp_path / 'run'}"], tmp_path, files,
                   capture_output=True, timeout=60)
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert ("ulimit -n" in p.stderr and not (tmp_path / "run").exists()) if files == 12 else \
        "halted after 1 steps" in p.stderr


@pytest.mark.parametrize("how", ["closed pipe", "full stdout", "full stderr", "ascii terminal"])
def test_a_broken_or_narrow_terminal_never_stops_training(tmp_path, how):
    out = tmp_path / ("dé" if how == "ascii terminal" else "run")
    argv = ["train_spt.py", *SPT, f"--out_dir={out}"]
    if how == "closed pipe":                                     # `| head -1`, read end closed first
        read, write = os.pipe()
        os.close(read)
        p = run_script(argv, tmp_path, stdout=write, stderr=subprocess.DEVNULL)
        os.close(write)
    elif how == "ascii terminal":
        p = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONIOENCODING="ascii"))
    else:
        with open("/dev/full", "w") as full:
            p = run_script(argv, tmp_path, **{"stdout" if how == "full stdout" else "stderr": full})
    assert p.returncode == 0 and (out / "summary.json").exists()


def test_sigterm_to_the_process_group_with_data_workers_saves_the_resume_point(tmp_path):
    """A cluster's SIGTERM reaches every process of the job: the DataLoader workers leave
    it to the run, which ends its step, saves ckpt.pt and exits 143, with no traceback."""
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "train_spt.py", "--task=synthetic", "--num_workers=2", "--epochs=20",
                          "--pretrain_epochs=0", "--n_embd=16", "--n_head=2", f"--out_dir={out}"], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    seen, deadline = b"", time.time() + 120
    while seen.count(b"it/s") < 3 and time.time() < deadline and p.poll() is None:
        seen += os.read(p.stderr.fileno(), 4096)                  # a few steps of finetuning have run
    os.killpg(p.pid, signal.SIGTERM)
    err = (seen + p.communicate(timeout=60)[1]).decode()
    assert p.returncode == 143 and "Traceback" not in err and load_checkpoint(out / "ckpt.pt")["step"] >= 1


@pytest.mark.parametrize("value", ["0", "abc", ""])
def test_an_omp_num_threads_torch_would_ignore_is_one_line_before_any_work(tmp_path, monkeypatch, value):
    """torch takes every core when OMP_NUM_THREADS is 0, empty or a word: not what was asked."""
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    for script, flags in ((train_spt, SPT), (train_flt, FLT)):
        status, message = cli(script, *flags, f"--out_dir={tmp_path / 'run'}")
        assert status == 1 and f"OMP_NUM_THREADS={value!r} is not a positive whole number" in message
        assert not (tmp_path / "run").exists()


def test_a_run_resumed_under_changed_defaults_keeps_its_own_and_says_which(tmp_path, monkeypatch, capsys):
    """Resume across versions: this code's default changed since the run began; the resumed
    run keeps its own value, and one line says which default differs."""
    run = tmp_path / "run"
    cli(train_spt, *SPT, "--ckpt_every=1", "--halt_after_steps=2", f"--out_dir={run}")
    monkeypatch.setitem(train_spt.DEFAULTS, "pool", "max")                 # this code's default now
    capsys.readouterr()
    argv = [f"--out_dir={run}", "--init_from=resume"]
    cfg = spt_settings.resume_config(load_checkpoint(run / "ckpt.pt"), spt_config(argv), argv)
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "pool='mean' (this code: 'max')" in notes[0] and cfg["pool"] == "mean"


def test_report_names_the_runs_not_finished_and_a_summary_that_is_not_json(finished_spt, tmp_path, capsys):
    """--report over a tree: a run stopped mid-line (no summary.json, its log's last line cut)
    is drawn and said to have no row; a damaged summary.json is one line naming its run,
    before any output."""
    tree = tmp_path / "tree"
    shutil.copytree(finished_spt, tree / "done")
    shutil.copytree(finished_spt, tree / "cut")
    os.remove(tree / "cut" / "summary.json")
    with open(tree / "cut" / "log.jsonl", "a") as f:
        f.write('{"step": 3, "lo')
    assert cli(train_spt, f"--report={tree}", f"--out_dir={tmp_path / 'rep'}")[0] == 0
    assert f"given no row: {tree / 'cut'}" in capsys.readouterr().out
    (tree / "done" / "summary.json").write_text('{"test_acc": 0.6')
    status, message = cli(train_spt, f"--report={tree}", f"--out_dir={tmp_path / 'rep2'}")
    assert status == 1 and f"{tree / 'done'} holds a summary.json or config.json that is not JSON" in message
    assert not (tmp_path / "rep2").exists()


def test_compare_names_the_runs_not_finished_and_a_summary_that_is_not_json(tmp_path, text_file, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    cli(train_flt, *FLT, f"--data={text_file}", f"--out_dir={a}")
    cli(train_flt, *FLT, f"--data={text_file}", "--stop_step=2", f"--out_dir={b}")          # stopped, resumable
    capsys.readouterr()
    assert cli(train_flt, f"--compare={a},{b}", f"--out_dir={tmp_path / 'cmp'}")[0] == 0
    assert f"given no row in the tables: {b}" in capsys.readouterr().out
    (a / "summary.json").write_text("{")
    status, message = cli(train_flt, f"--compare={a},{b}", f"--out_dir={tmp_path / 'cmp2'}")
    assert status == 1 and f"{a} holds a config.json or summary.json that is not JSON" in message
    assert not (tmp_path / "cmp2").exists()
