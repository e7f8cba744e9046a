"""The guarantees a researcher relies on, each tested on the real
train_spt.py, run as a user runs it (a subprocess, in a fresh folder), or on the
training.py / configurator.py function that gives it where that is much faster:

  1. a run stopped by SIGTERM, Ctrl-C, SIGUSR1 or SIGHUP exits 128 + N, and
     --init_from=resume then ends exactly as the run that was never stopped
  2. a finished run's folder is never overwritten without --overwrite=True; a folder in
     use by a live run is refused; a kill -9 never blocks the resume (kernel flock)
  3. --init_from=resume takes the checkpoint's config: an experiment flag that differs is
     refused in one line, a plumbing flag (device, logging) may change
  4. checkpoints are written atomically, never with NaN weights, and loaded weights_only
  5. every bad flag is one line 'error: ...' before any work
  6. a NaN or inf loss stops the run, names the step and keeps the last good checkpoint
  7. --help gives each flag with the comment beside it in DEFAULTS
"""

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import train_spt  # noqa: E402
import training  # noqa: E402
from configurator import run_cli  # noqa: E402

SCRIPT = os.path.join(ROOT, "train_spt.py")
TINY = ["--task=synthetic", "--n_train=512", "--n_eval=32", "--batch_size=32", "--pretrain_epochs=1", "--epochs=1",
        "--log_every=1"]                     # 16 SPT steps, then 16 finetuning steps: seconds
RESUME = ["--init_from=resume", "--out_dir=run"]
ENV = dict(os.environ, OMP_NUM_THREADS="1")
pytestmark = pytest.mark.xdist_group("guarantees")     # one worker makes the reference run once


# -----------------------------------------------------------------------------
# Helpers: run the script, stop it, read what it left

def train(cwd, *flags):
    """train_spt.py with these flags, in cwd, to its end: (exit status, stdout, stderr)."""
    p = subprocess.run([sys.executable, SCRIPT, *flags], cwd=cwd, env=ENV, capture_output=True, text=True,
                       timeout=300)
    return p.returncode, p.stdout, p.stderr


def stop(cwd, flags, sig, when):
    """Start train_spt.py, send `sig` once its log.jsonl holds a record for which when(record)
    is true, and wait for it to end: (exit status, stderr)."""
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen([sys.executable, SCRIPT, *flags], cwd=cwd, env=ENV, stdout=subprocess.DEVNULL,
                             stderr=err, text=True)
        deadline = time.time() + 240
        while not any(when(r) for r in records(os.path.join(cwd, "run"))):
            if p.poll() is not None or time.time() > deadline:
                p.kill()
                p.wait()
                err.seek(0)
                pytest.fail(f"the run ended (status {p.returncode}) before the record awaited:\n{err.read()[-3000:]}")
            time.sleep(0.01)
        p.send_signal(sig)
        p.wait(timeout=240)
        err.seek(0)
        return p.returncode, err.read()


def records(folder):
    """log.jsonl's records ([] before it exists; a line being written is left out)."""
    try:
        with open(os.path.join(folder, "log.jsonl")) as f:
            lines = f.read().split("\n")[:-1]
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line]


def at(phase, step):
    """A log record of this phase at or after this step."""
    return lambda r: r["phase"] == phase and r["step"] >= step


def screen(text):
    """The lines a terminal shows: a progress bar's carriage returns overwrite the line."""
    return [line.split("\r")[-1].strip() for line in text.split("\n") if line.split("\r")[-1].strip()]


def one_error(status, stderr, *words):
    """Exit status 1 and one line 'error: ...' holding `words`, no traceback: that line."""
    errors = [line for line in screen(stderr) if line.startswith("error:")]
    assert status == 1 and len(errors) == 1 and "Traceback" not in stderr, (status, stderr[-3000:])
    assert all(w in errors[0] for w in words), errors[0]
    return errors[0]


def cli(cwd, monkeypatch, *argv):
    """train_spt.py's command line in this process (run_cli, as its __main__): the error line."""
    monkeypatch.chdir(cwd)
    with pytest.raises(SystemExit) as stopped:
        run_cli(train_spt.main, list(argv))
    return stopped.value.code


def files(folder):
    """Name -> bytes of every file in a folder, but the lock: to show that nothing changed."""
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder)) if n != "run.lock"}


def weights(path):
    return training.load_checkpoint(str(path))["model"]


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def numbers(folder):
    """summary.json without the wall time (and init_from: see test_a_run_finetuning_from_a_path_resumes)."""
    summary = json.load(open(os.path.join(folder, "summary.json")))
    return {k: v for k, v in summary.items() if k not in ("wall_time_s", "init_from")}


def assert_same_run(folder, reference, keep=lambda record: True):
    """The same log records (losses, lr, gradient norms; those keep() selects), the same
    summary numbers and bit-identical weights in every checkpoint."""
    assert records(folder) == [r for r in records(reference) if keep(r)]
    assert numbers(folder) == numbers(reference)
    for name in ("ckpt.pt", "spt_best.pt", "finetune_best.pt"):
        assert same_weights(weights(folder / name), weights(reference / name)), name


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The tiny run, never stopped: what every stopped and resumed run must end as."""
    cwd = tmp_path_factory.mktemp("reference")
    status, _, err = train(cwd, *TINY, "--out_dir=run")
    assert status == 0, err[-3000:]
    return cwd / "run"


# -----------------------------------------------------------------------------
# 1. Stopped by a signal, resumed: bit-exactly the run that was never stopped

def test_sigterm_then_kill_9_then_resume_ends_as_the_uninterrupted_run(tmp_path, reference):
    run = tmp_path / "run"
    status, err = stop(tmp_path, [*TINY, "--out_dir=run", "--ckpt_every=4"], signal.SIGTERM, at("spt", 3))
    assert status == 128 + signal.SIGTERM and "SIGTERM" in err and "--init_from=resume --out_dir=run" in err, err
    assert training.load_checkpoint(str(run / "ckpt.pt"))["step"] >= 3          # its resume point
    # resumed on a changed plumbing flag, then killed with no chance to save (in finetuning, past
    # its step 4 checkpoint): the kernel drops its lock, so the folder resumes
    status, _ = stop(tmp_path, [*RESUME, "--device=cpu"], signal.SIGKILL, at("finetune", 6))
    assert status == -signal.SIGKILL
    assert json.load(open(run / "config.json"))["device"] == "cpu"
    status, _, err = train(tmp_path, *RESUME)
    assert status == 0, err[-3000:]
    assert_same_run(run, reference)


@pytest.mark.slow
@pytest.mark.parametrize("sig, when", [(signal.SIGINT, at("spt", 5)), (signal.SIGUSR1, at("finetune", 3)),
                                       (signal.SIGHUP, at("spt", 12))], ids=["SIGINT", "SIGUSR1", "SIGHUP"])
def test_ctrl_c_sigusr1_sighup_stop_and_resume_ends_as_the_uninterrupted_run(tmp_path, reference, sig, when):
    status, err = stop(tmp_path, [*TINY, "--out_dir=run"], sig, when)
    assert status == 128 + sig and signal.Signals(sig).name in err, err
    status, _, err = train(tmp_path, *RESUME)
    assert status == 0, err[-3000:]
    assert_same_run(tmp_path / "run", reference)


def run_object(tmp_path, **cfg):
    """A training.Run in tmp_path/run, as the scripts make one."""
    cfg = {**dict(out_dir=str(tmp_path / "run"), init_from="", overwrite=False, device="cpu", dtype="float32",
                  seed=0, halt_after_steps=0), **cfg}
    return training.Run(cfg, "train_spt.py", [], train_spt.FREE)


@pytest.mark.parametrize("sig", training.STOP_SIGNALS, ids=lambda sig: signal.Signals(sig).name)
def test_each_stop_signal_saves_the_resume_point_at_the_end_of_the_step_and_exits_128_plus_n(tmp_path, sig):
    with pytest.raises(KeyboardInterrupt) as stopped:
        with run_object(tmp_path) as run:
            run.begin()
            run.saver = lambda: run.save_resume(torch.nn.Linear(2, 2), [], step=run.steps)
            os.kill(os.getpid(), sig)                     # mid-step: nothing happens yet
            assert not os.path.exists(run.ckpt_path)
            run.tick()                                    # the step's end: saved, stopped
    assert training.load_checkpoint(run.ckpt_path)["step"] == 1 and stopped.value.status == 128 + sig
    assert signal.Signals(sig).name in str(stopped.value) and "--init_from=resume" in str(stopped.value)
    assert signal.getsignal(sig) is not run.on_signal     # the handlers are given back


def test_a_signal_before_the_loop_stops_at_once_with_its_own_status(tmp_path):
    with pytest.raises(KeyboardInterrupt) as stopped:
        with run_object(tmp_path):
            os.kill(os.getpid(), signal.SIGTERM)          # while the data loads, say: nothing to save
    assert stopped.value.status == 128 + signal.SIGTERM and "SIGTERM" in str(stopped.value)
    assert not (tmp_path / "run").exists()                # a run that never began leaves no folder


def test_halt_after_steps_saves_the_resume_point(tmp_path):
    with pytest.raises(SystemExit):
        with run_object(tmp_path, halt_after_steps=2) as run:
            run.begin()
            run.saver = lambda: run.save_resume(torch.nn.Linear(2, 2), [], step=run.steps)
            run.tick()
            run.tick()
    assert training.load_checkpoint(run.ckpt_path)["step"] == 2


# -----------------------------------------------------------------------------
# 2 and 3. The run folder: never overwritten silently, locked while in use; resume takes its config

def test_a_finished_run_is_kept_without_overwrite_and_replaced_with_it_then_halts_resume_exactly(
        tmp_path, monkeypatch, reference):
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    before = files(run)
    message = cli(tmp_path, monkeypatch, *TINY, "--out_dir=run", "--halt_after_steps=1")   # if let through: 1 step
    assert message.startswith("error:") and "--overwrite=True" in message and "\n" not in message, message
    assert files(run) == before
    # --overwrite=True replaces it: a new run, halted after 3 steps (its resume point saved)
    status, _, err = train(tmp_path, *TINY, "--out_dir=run", "--overwrite=True", "--halt_after_steps=3")
    assert not (run / "summary.json").exists() and not (run / "finetune_best.pt").exists(), err[-3000:]
    assert [r["step"] for r in records(run)] == [1, 2, 3]
    # resumed with other plumbing flags: logged every 4 steps from here, not halted again
    status, _, err = train(tmp_path, *RESUME, "--halt_after_steps=0", "--log_every=4")
    assert status == 0, err[-3000:]
    logged = lambda r: "loss" not in r or (r["phase"] == "spt" and r["step"] <= 3) or r["step"] % 4 == 0 \
        or r["step"] == 1
    assert_same_run(run, reference, keep=logged)
    assert json.load(open(run / "config.json"))["log_every"] == 4


def test_a_folder_in_use_by_a_live_run_is_refused_in_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)         # the live run
        status, out, err = train(tmp_path, *TINY, "--out_dir=run")
    assert screen(err) == [one_error(status, err, "--out_dir=run is in use")]
    assert set(os.listdir(run)) <= {"run.lock"}                  # nothing written


def test_a_refused_run_leaves_the_live_runs_lock_so_the_next_one_is_refused_too(tmp_path, monkeypatch):
    path = tmp_path / "run" / "run.lock"
    path.parent.mkdir()
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)         # the live run (flock: per open file)
        assert "is in use" in cli(tmp_path, monkeypatch, *TINY, "--out_dir=run")
        assert path.exists() and os.stat(path).st_ino == os.fstat(lock.fileno()).st_ino


@pytest.mark.parametrize("flag", ["--lr=0.01", "--mask_ratio=0.3", "--seed=1"])
def test_resume_refuses_an_experiment_flag_that_differs_from_the_checkpoint(tmp_path, monkeypatch, reference, flag):
    shutil.copytree(reference, tmp_path / "run")
    before = files(tmp_path / "run")
    message = cli(tmp_path, monkeypatch, *RESUME, flag, "--log_every=5", "--device=cpu")
    assert message.startswith("error:") and flag in message and "\n" not in message, message
    assert "--log_every" not in message and "--device" not in message          # plumbing may change
    assert files(tmp_path / "run") == before


def test_a_run_finetuning_from_a_path_resumes_as_the_run_that_was_never_stopped(tmp_path, reference):
    spt = str(reference / "spt_best.pt")              # finetuning from it is the reference's own phase 2
    status, _, err = train(tmp_path, *TINY, "--out_dir=run", f"--init_from={spt}", "--halt_after_steps=3")
    assert [r["step"] for r in records(tmp_path / "run")] == [1, 2, 3], err[-3000:]
    status, _, err = train(tmp_path, *RESUME, "--halt_after_steps=0")
    assert status == 0, err[-3000:]
    assert records(tmp_path / "run") == [r for r in records(reference) if r["phase"] == "finetune"]
    assert same_weights(weights(tmp_path / "run" / "ckpt.pt"), weights(reference / "ckpt.pt"))
    assert json.load(open(tmp_path / "run" / "summary.json"))["init_from"] == spt


# -----------------------------------------------------------------------------
# 4. Checkpoints: atomic, never non-finite, loaded weights_only

def test_a_checkpoint_cut_mid_save_or_holding_nan_leaves_the_old_one(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt.pt")
    training.save_checkpoint(path, dict(model={"w": torch.ones(3)}, step=1))
    assert os.listdir(tmp_path) == ["ckpt.pt"]
    with pytest.raises(FloatingPointError, match="NaN or inf"):
        training.save_checkpoint(path, dict(model={"w": torch.tensor([1.0, float("nan"), 1.0])}, step=2))

    def killed_mid_save(obj, f):                      # half a file written, then the process dies
        open(f, "wb").write(b"half a checkpoint")
        raise KeyboardInterrupt
    monkeypatch.setattr(torch, "save", killed_mid_save)
    with pytest.raises(KeyboardInterrupt):
        training.save_checkpoint(path, dict(model={"w": torch.zeros(3)}, step=3))
    monkeypatch.undo()
    assert training.load_checkpoint(path)["step"] == 1 and torch.equal(weights(path)["w"], torch.ones(3))


class Payload:
    """Unpickling this runs code: it creates the file it names."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def test_a_checkpoint_loads_weights_only_and_a_bad_one_is_one_line(tmp_path):
    evil, marker = str(tmp_path / "evil.pt"), str(tmp_path / "code_ran")
    torch.save(dict(model={"w": torch.ones(1)}, extra=Payload(marker)), evil)
    with pytest.raises(ValueError, match="evil.pt cannot be read") as refused:
        training.load_checkpoint(evil)
    assert not os.path.exists(marker) and "\n" not in str(refused.value)
    cut = str(tmp_path / "cut.pt")
    training.save_checkpoint(cut, dict(model={"w": torch.ones(1000)}))
    data = open(cut, "rb").read()
    open(cut, "wb").write(data[:len(data) // 2])
    with pytest.raises(ValueError, match="cut.pt cannot be read") as refused:
        training.load_checkpoint(cut)
    assert "\n" not in str(refused.value)
    with pytest.raises(FileNotFoundError, match="nothere.pt does not exist"):
        training.load_checkpoint(str(tmp_path / "nothere.pt"))


def test_a_cut_checkpoint_on_resume_is_one_line(tmp_path, monkeypatch, reference):
    shutil.copytree(reference, tmp_path / "run")
    data = (tmp_path / "run" / "ckpt.pt").read_bytes()
    (tmp_path / "run" / "ckpt.pt").write_bytes(data[:len(data) // 2])
    message = cli(tmp_path, monkeypatch, *RESUME)
    assert message.startswith("error: checkpoint run/ckpt.pt cannot be read") and "\n" not in message, message


def test_a_log_line_cut_by_a_kill_is_dropped(tmp_path):
    (tmp_path / "log.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')
    assert training.read_log(tmp_path) == [{"step": 1}, {"step": 2}]


# -----------------------------------------------------------------------------
# 5. A bad flag: one line, before any work

@pytest.mark.parametrize("flag, words", [
    ("--mask_ratoi=0.3", ["unknown flag --mask_ratoi", "did you mean --mask_ratio?"]),
    ("--pretrain_epoch=1", ["did you mean --pretrain_epochs?"]),
    ("--epochs=abc", ["--epochs=abc", "int"]),
    ("--epochs=1.5", ["--epochs=1.5", "int"]),
    ("--compile=maybe", ["--compile=maybe", "bool"]),
    ("--lr=-1", ["--lr=-1", "> 0"]),
    ("--batch_size=0", ["--batch_size=0", "> 0"]),
    ("--mask_ratio=1.5", ["--mask_ratio=1.5", "[0, 1)"]),
    ("--dropout=1.0", ["--dropout=1.0", "[0, 1)"]),
    ("--task=nope", ["--task=nope", "synthetic"]),
    ("--schedule=nope", ["--schedule=", "nope", "cosine"]),
    ("--preset=nope", ["--preset=nope", "cpu"]),
    ("lr=3", ["--key=value"]),
])
def test_a_bad_flag_is_one_line_before_any_work(tmp_path, monkeypatch, flag, words):
    message = cli(tmp_path, monkeypatch, *TINY, "--halt_after_steps=1", flag)      # if let through: 1 step
    assert isinstance(message, str) and message.startswith("error:") and "\n" not in message, message
    assert all(w in message for w in words), message
    assert os.listdir(tmp_path) == []                                # no out_dir, nothing written


def test_a_bad_flag_on_the_real_command_line_exits_1_with_one_line(tmp_path):
    status, out, err = train(tmp_path, "--task=synthetic", "--lr=-1")
    assert screen(err) == [one_error(status, err, "--lr=-1")] and out == ""
    assert os.listdir(tmp_path) == []


# -----------------------------------------------------------------------------
# 6. A NaN or inf loss stops the run

def test_a_nan_loss_stops_the_run_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    run = tmp_path / "run"                            # lr 1e30: step 1's update is finite, step 2's loss is not
    status, _, err = train(tmp_path, *TINY, "--out_dir=run", "--pretrain_lr=1e30", "--ckpt_every=1")
    line = one_error(status, err, "NaN or inf", "step 2", "ckpt.pt")
    assert "stopped before its update" in line                         # on a CPU
    assert training.load_checkpoint(str(run / "ckpt.pt"))["step"] == 1
    for name in os.listdir(run):
        assert not name.endswith(".tmp"), name
        if name.endswith(".pt"):
            assert all(w.isfinite().all() for w in weights(run / name).values() if w.is_floating_point()), name


# -----------------------------------------------------------------------------
# 7. --help

def source_comments():
    """Each key of train_spt.DEFAULTS -> the comment beside it in the source ('' if none)."""
    source = open(SCRIPT).read().split("DEFAULTS = dict(")[1].split("\n)")[0]
    return {k: line.partition("#")[2].strip() for line in source.splitlines()
            for k in re.findall(r"(?:^\s+|,\s*)(\w+)=", line.partition("#")[0])}


def help_lines(cwd, monkeypatch, capsys):
    """--help's line for each flag (it exits 0 and writes nothing)."""
    assert cli(cwd, monkeypatch, "--help") in (0, None) and os.listdir(cwd) == []
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  --")]
    return {line.split("=")[0].strip()[2:]: line for line in lines}


def test_help_lists_every_flag(tmp_path, monkeypatch, capsys):
    assert set(help_lines(tmp_path, monkeypatch, capsys)) == set(train_spt.DEFAULTS)
    assert set(source_comments()) == set(train_spt.DEFAULTS)
    assert {"mask_ratio", "lr", "init", "halt_after_steps"} <= {k for k, c in source_comments().items() if c}


@pytest.mark.parametrize("key", [k for k, comment in source_comments().items() if comment])
def test_help_gives_each_flag_with_the_comment_beside_it(tmp_path, monkeypatch, capsys, key):
    assert source_comments()[key] in help_lines(tmp_path, monkeypatch, capsys)[key]
