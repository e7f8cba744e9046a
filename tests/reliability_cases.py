"""The hostile-user cases behind REPORT.md's "Reliability" table, run against any
checkout of this project (a few minutes on 2 cores; the fast tests of the same
families are tests/test_reliability.py):

    python tests/reliability_cases.py REPO_DIR results.json
    python tests/reliability_cases.py REPO_DIR results.json 5     # the fifth round alone
    python tests/reliability_cases.py REPO_DIR results.json 6     # the sixth: the sweep driver, records, caches

Every case runs a real command in a fresh temporary folder and is classed as
ok | traceback | silent (exit 0, or a wrong result, where an error or a specific
result is expected) | data-loss (an earlier run's files changed) | hang (timed out)."""
import hashlib
import json
import os
import pickle
import shutil
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

REPO = os.path.abspath(sys.argv[1])
RESULTS = os.path.abspath(sys.argv[2])
ONLY = sys.argv[3] if len(sys.argv) > 3 else ""
SPT = ["--task=synthetic", "--n_train=128", "--n_eval=64", "--batch_size=32", "--n_embd=16", "--n_head=2",
       "--epochs=1", "--pretrain_epochs=1", "--patience=0", "--log_every=1"]
FLT = ["--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=4", "--n_loops=2",
       "--warmup_steps=1", "--eval_batches=1", "--eval_interval=2", "--osc_steps=3", "--max_steps=4"]


def run(script, args, cwd):
    try:
        p = subprocess.run([sys.executable, os.path.join(REPO, script), *args], cwd=cwd, capture_output=True,
                           text=True, timeout=180, env=dict(os.environ, OMP_NUM_THREADS="1"))
        return p.returncode, p.stderr + p.stdout
    except subprocess.TimeoutExpired:
        return None, "hang"


def fp(folder):
    if not os.path.isdir(folder):
        return None
    return {n: hashlib.sha256(open(os.path.join(folder, n), "rb").read()).hexdigest()
            for n in sorted(os.listdir(folder)) if n != "run.lock" and os.path.isfile(os.path.join(folder, n))}


def classify(rc, out, expect_error=True, changed=False, wrong=False):
    if rc is None:
        return "hang"
    if "Traceback" in out:
        return "traceback"
    if changed:
        return "data-loss"
    if wrong or (expect_error and rc == 0):
        return "silent"
    return "ok"


def main():
    results = {}
    work = tempfile.mkdtemp()
    os.chdir(work)
    text = os.path.join(work, "tiny.txt")
    rng = np.random.default_rng(0)
    open(text, "w").write(" ".join(rng.choice(["loop", "the", "norm", "key", "value"], size=800)))
    flt = FLT + [f"--data={text}"]
    if ONLY == "5":
        run("train_spt.py", SPT + ["--out_dir=spt_done"], work)
        round_five(results, work, flt)
        return tell(results)
    if ONLY == "6":
        round_six(results, work, flt)
        return tell(results)

    spt_flags = ["--batch_size=-4", "--batch_size=0", "--grad_accum=0", "--log_every=0", "--epochs=-1",
                 "--pretrain_epochs=-1", "--lr=nan", "--lr=1e309", "--save_epochs=abc", "--max_len=100",
                 "--device=cuda", "--n_head=3", "--n_train=10", "--init_from=nothing.pt", "--dropout=1.5",
                 "--warmup_frac=2.0", "--mask_ratio=0.0", "--max_hours=0.0"]
    for i, f in enumerate(spt_flags):
        out = f"spt_flag{i}"
        rc, o = run("train_spt.py", SPT + [f"--out_dir={out}", f], work)
        results[f"spt {f}"] = classify(rc, o, wrong=rc != 0 and os.path.exists(out) and bool(os.listdir(out)))
    rc, o = run("train_spt.py", ["--task=pathfinder", "--max_len=100", "--n_generate=200", "--out_dir=pfx"], work)
    results["spt --task=pathfinder --max_len=100"] = classify(rc, o)

    flt_flags = ["--n_head=3", "--variant=XL", "--block_size=100000", "--batch_size=0", "--max_steps=-1",
                 "--eval_interval=0", "--init_from=resume", "--lr=inf", "--osc_steps=0", "--n_loop=3"]
    for i, f in enumerate(flt_flags):
        out = f"flt_flag{i}"
        rc, o = run("train_flt.py", flt + [f"--out_dir={out}", f], work)
        results[f"flt {f}"] = classify(rc, o, wrong=rc != 0 and os.path.exists(out) and bool(os.listdir(out)))
    open("afile", "w").write("x")
    rc, o = run("train_flt.py", flt + ["--out_dir=afile"], work)
    results["flt out_dir is a file"] = classify(rc, o)

    # finished runs reused
    run("train_spt.py", SPT + ["--out_dir=spt_done", "--ckpt_every=2"], work)
    before = fp("spt_done")
    rc, o = run("train_spt.py", SPT + ["--out_dir=spt_done", "--lr=3e-3"], work)
    results["spt rerun into a finished folder"] = classify(rc, o, changed=fp("spt_done") != before)
    before = fp("spt_done")
    rc, o = run("train_spt.py", ["--task=synthetic", "--out_dir=spt_done", "--init_from=resume", "--n_embd=32"], work)
    results["spt resume with a model flag changed"] = classify(rc, o, changed=fp("spt_done") != before)
    run("train_flt.py", flt + ["--out_dir=flt_done"], work)
    before = fp("flt_done")
    rc, o = run("train_flt.py", flt + ["--out_dir=flt_done", "--variant=LT"], work)
    results["flt rerun into a finished folder"] = classify(rc, o, changed=fp("flt_done") != before)

    # moved folder resumes where it is
    run("train_spt.py", SPT + ["--out_dir=spt_a", "--ckpt_every=2", "--halt_after_steps=6"], work)
    shutil.move("spt_a", "spt_b")
    rc, o = run("train_spt.py", ["--task=synthetic", "--out_dir=spt_b", "--init_from=resume"], work)
    results["spt resume of a moved folder"] = classify(rc, o, expect_error=False,
                                                      wrong=os.path.exists("spt_a") or rc != 0)
    # a lower lr on resume is applied
    run("train_flt.py", flt + ["--out_dir=flt_lr", "--stop_step=2"], work)
    rc, o = run("train_flt.py", flt + ["--out_dir=flt_lr", "--init_from=resume", "--lr=1e-4"], work)
    lr = json.load(open("flt_lr/config.json")).get("lr") if os.path.exists("flt_lr/config.json") else None
    results["flt resume with a lower --lr"] = classify(rc, o, expect_error=False, wrong=lr != 1e-4 or rc != 0)
    run("train_spt.py", SPT + ["--out_dir=spt_lr", "--ckpt_every=2", "--halt_after_steps=6"], work)
    rc, o = run("train_spt.py", ["--task=synthetic", "--out_dir=spt_lr", "--init_from=resume", "--lr=1e-4"], work)
    lr = json.load(open("spt_lr/config.json")).get("lr")
    results["spt resume with a lower --lr"] = classify(rc, o, expect_error=False, wrong=lr != 1e-4 or rc != 0)

    # NaN
    rc, o = run("train_spt.py", SPT + ["--out_dir=spt_nan", "--lr=1e6", "--pretrain_lr=1e6", "--grad_clip=0",
                                       "--ckpt_every=2", "--log_every=10"], work)
    bad_ckpt = False
    for n in os.listdir("spt_nan") if os.path.isdir("spt_nan") else []:
        if n.endswith(".pt"):
            m = torch.load(os.path.join("spt_nan", n), weights_only=True)["model"]
            bad_ckpt |= not all(torch.isfinite(v).all() for v in m.values() if v.is_floating_point())
    results["spt NaN stop"] = classify(rc, o, wrong=bad_ckpt)

    # bad files
    run("train_flt.py", flt + ["--out_dir=flt_trunc", "--stop_step=2"], work)
    data = open("flt_trunc/ckpt.pt", "rb").read()
    open("flt_trunc/ckpt.pt", "wb").write(data[: len(data) // 2])
    rc, o = run("train_flt.py", flt + ["--out_dir=flt_trunc", "--init_from=resume"], work)
    results["flt resume from a truncated ckpt"] = classify(rc, o)
    run("train_flt.py", flt + ["--out_dir=flt_empty", "--stop_step=2"], work)
    open("flt_empty/ckpt.pt", "wb").close()
    rc, o = run("train_flt.py", flt + ["--out_dir=flt_empty", "--init_from=resume"], work)
    results["flt resume from an empty ckpt"] = classify(rc, o)
    open("notckpt.pt", "w").write("hello\n")
    rc, o = run("train_spt.py", SPT + ["--out_dir=spt_nc", "--init_from=notckpt.pt"], work)
    results["spt init_from a text file"] = classify(rc, o)

    class Payload:
        def __reduce__(self):
            return (print, ("payload ran",))
    torch.save({"model": {}, "p": Payload()}, "payload.pt")
    rc, o = run("train_spt.py", SPT + ["--out_dir=spt_pl", "--init_from=payload.pt"], work)
    results["spt init_from a payload"] = classify(rc, o, wrong="payload ran" in o or "weights_only=False" in o)
    os.makedirs("tok", exist_ok=True)
    np.arange(100, dtype=np.uint16).tofile("tok/train.bin")
    open("tok/val.bin", "wb").write(b"\x01\x00\x02")
    rc, o = run("train_flt.py", FLT + ["--data=tok", "--vocab_size=200", "--out_dir=flt_tok"], work)
    results["flt odd-size uint16 bin"] = classify(rc, o)
    run("train_flt.py", flt + ["--out_dir=flt_cut", "--stop_step=2"], work)
    open("flt_cut/log.jsonl", "a").write('{"step": 3, "lo')
    rc, o = run("train_flt.py", flt + ["--out_dir=flt_cut", "--init_from=resume"], work)
    results["flt resume with a cut log line"] = classify(rc, o, expect_error=False, wrong=rc != 0)
    # a live writer
    os.makedirs("flt_lock", exist_ok=True)
    holder = ("import fcntl, os, sys, time; f = open('flt_lock/run.lock', 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
              "f.write(str(os.getpid())); f.flush(); print('held', flush=True); time.sleep(120)")
    sleeper = subprocess.Popen([sys.executable, "-c", holder], cwd=work, stdout=subprocess.PIPE, text=True)
    sleeper.stdout.readline()
    open("flt_lock/config.json", "w").write("{}")
    before = fp("flt_lock")
    rc, o = run("train_flt.py", flt + ["--out_dir=flt_lock", "--overwrite=True"], work)
    sleeper.kill()
    results["flt second writer while one is live"] = classify(rc, o, changed=fp("flt_lock") != before)
    round_two(results, work, flt)
    round_three(results, work, flt)
    round_four(results, work, flt)
    round_five(results, work, flt)
    round_six(results, work, flt)
    tell(results)


def tell(results):
    """results.json, the counts per class, and every case that is not ok."""
    json.dump(results, open(RESULTS, "w"), indent=1)
    counts = {}
    for v in results.values():
        counts[v] = counts.get(v, 0) + 1
    print(len(results), "cases:", counts)
    for k, v in results.items():
        if v != "ok":
            print(f"  {v:10s} {k}")


def inproc(script, argv, patch=""):
    """A script's command line run in a fresh Python after `patch` (a line of Python that
    simulates what a test cannot arrange for real, e.g. a full disk)."""
    code = (f"import sys; sys.path.insert(0, {REPO!r}); import configurator, torch, shutil, types; "
            f"from plumbing import training, runfiles, spt_phase; "
            f"import {script} as s; {patch}; configurator.run_cli(s.main, {argv!r})")
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        return p.returncode, p.stderr + p.stdout
    except subprocess.TimeoutExpired:
        return None, "hang"


def timed(script, args, cwd, limit):
    """run(), and 'slow' when a refusal took longer than `limit` seconds."""
    t0 = time.time()
    rc, o = run(script, args, cwd)
    return rc, o, time.time() - t0 > limit


def one_line_error(rc, o):
    lines = [line for line in o.strip().splitlines() if line.startswith("error: ")]
    return rc == 1 and len(lines) == 1


def round_two(results, work, flt):
    """The second hostile audit's families: data loss, tracebacks, silently wrong, unclear."""
    # data loss: --overwrite on a folder that is not a run
    os.makedirs("mine", exist_ok=True)
    for name in [f"plot{i}.png" for i in range(16)] + ["my_model.pt", "config.json", "notes.txt"]:
        open(os.path.join("mine", name), "w").write("the user's")
    before = fp("mine")
    rc, o = run("train_spt.py", SPT + ["--out_dir=mine", "--overwrite=True"], work)
    results["2 overwrite on a folder that is not a run"] = classify(rc, o, changed=fp("mine") != before)
    # data loss: --compare into a finished run
    run("train_flt.py", flt + ["--out_dir=cmp_a"], work)
    run("train_flt.py", flt + ["--out_dir=cmp_b"], work)
    before = fp("cmp_b")
    rc, o = run("train_flt.py", ["--compare=cmp_a", "--out_dir=cmp_b"], work)
    results["2 compare into a run folder"] = classify(rc, o, changed=fp("cmp_b") != before)
    # data loss: two runs started together on one folder (one prepares ListOps data first)
    procs = [subprocess.Popen([sys.executable, os.path.join(REPO, "train_spt.py"), *a, "--out_dir=race"], cwd=work,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
             for a in (SPT, ["--task=listops", "--n_generate=400", "--n_train=64", "--n_eval=32", "--depth=1",
                             "--n_embd=16", "--n_head=2", "--batch_size=32", "--epochs=1", "--pretrain_epochs=1",
                             "--max_len=600", "--data_dir=race_data"])]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    codes = sorted(p.returncode for p in procs)
    task = json.load(open("race/config.json"))["task"] if os.path.exists("race/config.json") else None
    winner = "synthetic" if procs[0].returncode == 0 else "listops"
    results["2 two runs started together on one folder"] = (
        "ok" if codes == [0, 1] and task == winner and any("in use by another run" in o for o in outs) else
        "traceback" if any("Traceback" in o for o in outs) else "data-loss")
    # tracebacks that must be one line
    patch = ("torch.save = lambda *a, **k: (_ for _ in ()).throw(RuntimeError('[enforce fail at "
             "inline_container.cc:672] . PytorchStreamWriter failed writing file')); "
             "runfiles.shutil.disk_usage = lambda p: types.SimpleNamespace(free=0)")
    rc, o = inproc("train_spt", SPT + ["--out_dir=full_spt"], patch)
    tmp_left = os.path.isdir("full_spt") and any(".tmp." in n for n in os.listdir("full_spt"))
    results["2 spt disk full mid-run"] = classify(rc, o, wrong=tmp_left or not one_line_error(rc, o))
    rc, o = inproc("train_flt", flt + ["--out_dir=full_flt"], patch)
    tmp_left = os.path.isdir("full_flt") and any(".tmp." in n for n in os.listdir("full_flt"))
    results["2 flt disk full mid-run"] = classify(rc, o, wrong=tmp_left or not one_line_error(rc, o))
    rc, o = run("train_flt.py", ["--compare=cmp_a", "--out_dir=/sys/not_writable"], work)
    results["2 compare into a folder that cannot be written"] = classify(rc, o, wrong=not one_line_error(rc, o))
    for name, script, args in (("spt --device=mps", "train_spt.py", SPT + ["--device=mps", "--out_dir=mps"]),
                               ("flt --device=mps", "train_flt.py", flt + ["--device=mps", "--out_dir=mps"]),
                               ("spt --freeze=all", "train_spt.py", SPT + ["--freeze=all", "--out_dir=frz"]),
                               ("bench --only=bogus", "tools/bench.py", ["--only=bogus"])):
        rc, o = run(script, args, work)
        results[f"2 {name}"] = classify(rc, o, wrong=not one_line_error(rc, o) or os.path.exists("frz"))
    rc, o, slow = timed("train_spt.py", SPT + ["--n_embd=10000000", "--n_head=1", "--out_dir=huge"], work, 20)
    results["2 spt --n_embd=10000000"] = classify(rc, o, wrong=slow or not one_line_error(rc, o))
    os.makedirs("lo_bad/listops-1000", exist_ok=True)
    for split in ("train", "val", "test"):
        open(f"lo_bad/listops-1000/basic_{split}.tsv", "w").write("Source\tTarget\n( [MAX 2 [FOO ] )\t3\n")
    for name, args in (("bad ListOps row", ["--task=listops", "--data_dir=lo_bad"]),
                       ("--difficulty=bogus", ["--difficulty=bogus"]),
                       ("--task=text without files", ["--task=text", "--data_dir=nothing_here"]),
                       ("--resolution=7", ["--resolution=7"]),
                       ("--n=-5", ["--task=listops", "--generate", "--n=-5", "--data_dir=neg"])):
        rc, o = run("data_lra.py", args, work)
        results[f"2 data_lra.py {name}"] = classify(rc, o, wrong=not one_line_error(rc, o))
    # silently wrong
    for name, script, args in (
            ("compare with training flags", "train_flt.py", ["--compare=cmp_a", "--n_loops=0", "--lr=-5"]),
            ("report with training flags", "train_spt.py", ["--report=spt_done", "--lr=5.0", "--out_dir=x"]),
            ("synthetic --data_dir", "train_spt.py", SPT + ["--data_dir=/nonexistent", "--out_dir=dd"]),
            ("--pretrain_epochs=0 --init_params=qk", "train_spt.py",
             SPT + ["--pretrain_epochs=0", "--init_params=qk", "--out_dir=ip"]),
            ("SPT flags without SPT", "train_spt.py", SPT + ["--pretrain_epochs=0", "--spt_objective=causal",
                                                             "--mask_ratio=0.9", "--pretrain_lr=5.0", "--out_dir=so"]),
            ("--init_from=CKPT --pretrain_epochs=5", "train_spt.py",
             SPT + ["--init_from=spt_done/spt_best.pt", "--pretrain_epochs=5", "--out_dir=if"]),
            ("flt --min_lr_frac=5.0", "train_flt.py", flt + ["--min_lr_frac=5.0", "--schedule=cosine", "--out_dir=ml"]),
            ("data_lra --n=-5", "data_lra.py", ["--task=listops", "--generate", "--n=-5"])):
        rc, o = run(script, args, work)
        results[f"2 {name}"] = classify(rc, o)
    rc, o = run("train_spt.py", ["--task=synthetic", "--batch_size=0", "--debug=true"], work)
    results["2 --debug=true shows the traceback"] = "ok" if "Traceback" in o else "silent"
    data = bytearray(open("spt_done/spt_best.pt", "rb").read())
    i = data.index(b"data/0") + 200
    data[i:i + 64] = bytes(64)
    open("damaged.pt", "wb").write(bytes(data))
    rc, o = run("train_spt.py", SPT + ["--pretrain_epochs=0", "--init_from=damaged.pt", "--out_dir=dmg"], work)
    results["2 checkpoint with 64 bytes overwritten"] = classify(rc, o)
    rc, o = inproc("data_lra", [], patch=(
        "import numpy as np, os; from PIL import Image; D = s; root = 'rel_data'; "
        "imgs, labels = D.ensure_pathfinder(root, n=20, seed=0, difficulty='baseline', progress=False); "
        "D.export_pathfinder_lra(D.pathfinder_folder(root, 32, 'baseline'), imgs, labels, contour_length=6); "
        "a = D.load_task('pathfinder', 'train', root, difficulty='baseline', progress=False); "
        "d = D.pathfinder_folder(root, 32, 'baseline'); m = open(os.path.join(d, 'metadata', '0.npy')).read().split(); "
        "png = os.path.join(d, m[0], m[1]); st = os.stat(png); "
        "Image.fromarray(np.full((32, 32), 200, np.uint8), mode='L').save(png); "
        "os.utime(png, ns=(st.st_atime_ns, st.st_mtime_ns)); "
        "b = D.load_task('pathfinder', 'train', root, difficulty='baseline', progress=False); "
        "same = all(torch.equal(a[i][0], b[i][0]) for i in range(len(a))); "
        "print('STALE' if same else 'FRESH'); sys.exit(0)"))
    results["2 PathFinder release cache after a PNG is replaced"] = "ok" if "FRESH" in o else classify(rc, o, wrong=True)
    run("train_spt.py", SPT + ["--out_dir=fin", "--halt_after_steps=5", "--ckpt_every=1"], work)
    run("train_spt.py", ["--task=synthetic", "--out_dir=fin", "--init_from=resume"], work)
    first = json.load(open("fin/summary.json"))
    rc, o = run("train_spt.py", ["--task=synthetic", "--out_dir=fin", "--init_from=resume"], work)
    again = json.load(open("fin/summary.json"))
    results["2 resume of a finished run keeps its SPT loss and time"] = classify(
        rc, o, expect_error=False, wrong=again["spt_best_val_loss"] is None or
        again["wall_time_s"] < first["wall_time_s"])
    run("train_flt.py", flt + ["--out_dir=nolog", "--stop_step=2"], work)
    os.remove("nolog/log.jsonl")
    rc, o = run("train_flt.py", flt + ["--out_dir=nolog", "--init_from=resume"], work)
    results["2 flt resume after log.jsonl was deleted"] = classify(rc, o)
    # unclear messages
    for name, script, args, words in (
            ("spt --seed=-1", "train_spt.py", SPT + ["--seed=-1", "--out_dir=s1"], "--seed=-1"),
            ("spt huge seed", "train_spt.py", SPT + ["--seed=99999999999999999999", "--out_dir=s2"], "--seed="),
            ("flt --seed=-5", "train_flt.py", flt + ["--seed=-5", "--out_dir=s3"], "--seed=-5"),
            ("spt ckpt resumed by flt", "train_flt.py", flt + ["--out_dir=spt_done", "--init_from=resume"],
             "another script"),
            ("flt ckpt resumed by spt", "train_spt.py", ["--task=synthetic", "--out_dir=flt_done",
                                                          "--init_from=resume"], "another script")):
        rc, o = run(script, args, work)
        unclear = words not in o or os.path.exists("s3")
        results[f"2 {name}"] = classify(rc, o, wrong=unclear)
    state = torch.load("spt_done/spt_best.pt", weights_only=True)
    k = next(k for k, v in state["model"].items() if v.is_floating_point())
    state["model"][k] = state["model"][k] * float("nan")
    torch.save(state, "nanw.pt")
    rc, o = run("train_spt.py", SPT + ["--pretrain_epochs=0", "--init_from=nanw.pt", "--out_dir=nw"], work)
    results["2 NaN weights in --init_from"] = classify(rc, o, wrong="nanw.pt" not in o or "--lr" in o)
    os.makedirs("lo_utf/listops-1000", exist_ok=True)
    for split in ("train", "val", "test"):
        open(f"lo_utf/listops-1000/basic_{split}.tsv", "wb").write(b"Source\tTarget\n( [MAX \xff ] )\t3\n")
    rc, o = run("train_spt.py", ["--task=listops", "--data_dir=lo_utf", "--data_source=release", "--out_dir=u8"], work)
    results["2 ListOps file that is not UTF-8"] = classify(rc, o, wrong="basic_train.tsv, line 2" not in o)
    os.makedirs("pid1", exist_ok=True)
    open("pid1/run.lock", "w").write("1")
    rc, o = run("train_flt.py", flt + ["--out_dir=pid1"], work)
    results["2 a lock naming a live unrelated pid (1)"] = classify(rc, o, expect_error=False, wrong=rc != 0)
    # The child gets Ctrl-C's default handling even when this harness was started in the
    # background, where a shell sets SIGINT to "ignore" and every child inherits that.
    p = subprocess.Popen([sys.executable, os.path.join(REPO, "train_spt.py"), *SPT, "--epochs=50", "--out_dir=cc"],
                         cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    while not os.path.exists("cc/log.jsonl") and p.poll() is None:
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    o = p.communicate(timeout=120)[0]
    right = p.returncode == 130 and ("continue with --init_from=resume" in o or "start again" in o)
    results["2 Ctrl-C says how to go on, exit 130"] = "traceback" if "Traceback" in o else "ok" if right else "silent"
    rc, o, slow = timed("train_flt.py", FLT + ["--data=listops", "--block_size=8", "--out_dir=lo8"], work, 30)
    results["2 flt listops --block_size=8 refused quickly"] = classify(rc, o, wrong=slow)
    rc, o, slow = timed("train_spt.py", SPT + ["--pretrain_task=listops", "--data_dir=pt_lo", "--out_dir=ptl"], work, 20)
    results["2 spt --pretrain_task=listops refused quickly"] = classify(rc, o, wrong=slow or os.path.exists("pt_lo"))


def same_text(path, text):
    """Whether the file at `path` still holds `text` (False when it is gone or changed)."""
    try:
        with open(path, "rb") as f:
            return f.read() == text.encode()
    except OSError:
        return False


def same_weights(a, b):
    """Whether two checkpoints hold bit-identical weights (False when either is missing)."""
    try:
        a, b = (torch.load(p, weights_only=True)["model"] for p in (a, b))
    except (OSError, RuntimeError):
        return False
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def strict_json_ok(folder):
    """Every .json and .jsonl file in `folder` parses with a reader that refuses NaN."""
    def refuse(constant):
        raise ValueError(constant)
    try:
        for name in os.listdir(folder):
            if name.endswith((".json", ".jsonl")):
                for line in open(os.path.join(folder, name)).read().splitlines() if name.endswith("l") else \
                        [open(os.path.join(folder, name)).read()]:
                    if line.strip():
                        json.loads(line, parse_constant=refuse)
    except (OSError, ValueError):
        return False
    return True


def round_three(results, work, flt):
    """The third hostile audit's families: security, data loss, silently wrong, hangs,
    tracebacks, unclear messages, checks made too late."""
    spt_r = ["--task=synthetic"]
    # security: a link at a file the run writes is never written through
    open("victim.txt", "w").write("the user's")
    for name, script, args in (("run.lock", "train_spt.py", SPT), ("command.txt", "train_flt.py", flt)):
        d = "ln_" + name.replace(".", "_")
        os.makedirs(d, exist_ok=True)
        os.symlink(os.path.abspath("victim.txt"), os.path.join(d, name))
        rc, o = run(script, args + [f"--out_dir={d}"], work)
        results[f"3 security: a link at {name}"] = classify(rc, o, changed=not same_text("victim.txt", "the user's"))
    # data loss: files the run does not own
    os.makedirs("u", exist_ok=True)
    open("u/thesis.tmp.docx", "w").write("the user's")
    rc, o = run("train_spt.py", SPT + ["--out_dir=u"], work)
    results["3 a user's *.tmp.* file in out_dir"] = classify(rc, o, changed=not os.path.exists("u/thesis.tmp.docx"))
    os.makedirs("figs", exist_ok=True)
    for name in ("curves.png", "proximity.png"):
        open(os.path.join("figs", name), "w").write("the user's")
    before = fp("figs")
    rc, o = run("train_spt.py", SPT + ["--out_dir=figs"], work)
    results["3 a folder of user files named like ours"] = classify(rc, o, changed=fp("figs") != before)
    run("train_spt.py", SPT + ["--out_dir=own"], work)
    for name in ("attention_for_paper.png", "spt_epoch_final_keep.pt"):
        open(os.path.join("own", name), "w").write("the user's")
    before = fp("own")
    rc, o = run("train_spt.py", SPT + ["--out_dir=own", "--overwrite=True"], work)
    results["3 --overwrite beside user files matching the run's names"] = classify(rc, o, changed=fp("own") != before)
    live = subprocess.Popen([sys.executable, os.path.join(REPO, "train_spt.py"), *SPT, "--epochs=200", "--out_dir=lv"],
                            cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    while not os.path.exists("lv/log.jsonl") and live.poll() is None:
        time.sleep(0.2)
    if os.path.exists("lv/run.lock"):
        os.remove("lv/run.lock")
    rc, o = run("train_spt.py", SPT + ["--out_dir=lv", "--overwrite=True"], work)
    alive = live.poll() is None
    live.kill()
    live.wait()
    results["3 --overwrite on a live run whose run.lock was deleted"] = classify(
        rc, o, changed=not alive or "in use by another run" not in o)
    os.makedirs("results", exist_ok=True)
    shutil.copytree("spt_done", "results/run")
    open("results/report.md", "w").write("the user's")
    rc, o = run("train_spt.py", ["--report=results"], work)
    results["3 --report over a folder holding the user's report.md"] = classify(
        rc, o, changed=not same_text("results/report.md", "the user's"))
    shutil.copytree("spt_done", "parent/myrun")
    rc, o = run("train_spt.py", ["--report=parent/myrun"], work)
    results["3 --report on one run writes nothing into its parent"] = classify(
        rc, o, expect_error=False, changed=os.listdir("parent") != ["myrun"])
    open("mine.json", "w").write("{}")
    rc, o = run("tools/bench.py", ["--only=data", "--quick", "--out=mine.json"], work)
    results["3 bench.py --out over a file it did not write"] = classify(rc, o, changed=not same_text("mine.json", "{}"))
    os.makedirs("cmpfig", exist_ok=True)
    open("cmpfig/flt_loss.png", "w").write("the user's")
    rc, o = run("train_flt.py", ["--compare=cmp_a", "--out_dir=cmpfig"], work)
    results["3 --compare over a user's figure"] = classify(
        rc, o, changed=not same_text("cmpfig/flt_loss.png", "the user's"))
    round_three_resume(results, work, flt)
    round_three_bounds(results, work, flt, spt_r)


def round_three_resume(results, work, flt):
    """Resume rewinds everything to the checkpoint."""
    flags = SPT + ["--dropout=0.1", "--batch_size=16", "--pretrain_epochs=2", "--epochs=2", "--snapshot_attn_every=2"]
    run("train_spt.py", flags + ["--out_dir=dw"], work)
    run("train_spt.py", flags + ["--out_dir=dc", "--ckpt_every=3", "--halt_after_steps=5"], work)
    for _ in range(2):
        run("train_spt.py", ["--task=synthetic", "--out_dir=dc", "--init_from=resume", "--halt_after_steps=5"], work)
    rc, o = run("train_spt.py", ["--task=synthetic", "--out_dir=dc", "--init_from=resume"], work)
    results["3 dropout 0.1, three halts: bit-exact weights"] = classify(
        rc, o, expect_error=False, wrong=not same_weights("dw/ckpt.pt", "dc/ckpt.pt"))
    snaps = lambda d: [(r["phase"], r["step"]) for r in (json.loads(x) for x in open(f"{d}/snapshots.jsonl")
                                                         if x.strip())] if os.path.exists(f"{d}/snapshots.jsonl") else None
    results["3 snapshots.jsonl trimmed on resume"] = classify(rc, o, expect_error=False, wrong=snaps("dc") != snaps("dw"))
    s = json.load(open("dc/summary.json")) if os.path.exists("dc/summary.json") else {}
    results["3 a resumed run keeps its init_from"] = classify(rc, o, expect_error=False, wrong=s.get("init_from") != "")
    patch = ("real = spt_phase.PhaseLedger.save; calls = []; "
             "spt_phase.PhaseLedger.save = lambda self: (calls.append(1), sys.exit('killed') if len(calls) == 2 else real(self))")
    inproc("train_spt", SPT + ["--out_dir=kv", "--ckpt_every=4"], patch)
    rc, o = run("train_spt.py", ["--task=synthetic", "--out_dir=kv", "--init_from=resume"], work)
    vals = [r for r in map(json.loads, open("kv/log.jsonl")) if "val_loss" in r] if os.path.exists("kv/log.jsonl") else []
    results["3 a kill between the val record and ckpt.pt"] = classify(rc, o, expect_error=False, wrong=len(vals) != 2)
    shutil.copy(flt[-1].split("=", 1)[1], "data2.txt")
    fl2 = flt[:-1] + ["--data=data2.txt"]
    run("train_flt.py", fl2 + ["--out_dir=fd", "--stop_step=2"], work)
    open("data2.txt", "a").write(" replaced")
    rc, o = run("train_flt.py", fl2 + ["--out_dir=fd", "--init_from=resume"], work)
    results["3 flt resume on a replaced --data file"] = classify(rc, o)
    run("train_spt.py", SPT + ["--pretrain_epochs=0", "--init_from=spt_done/spt_best.pt", "--epochs=2",
                               "--out_dir=ft", "--halt_after_steps=5", "--ckpt_every=1"], work)
    rc, o = run("train_spt.py", ["--task=synthetic", "--out_dir=ft", "--init_from=resume"], work)
    cfg = json.load(open("ft/config.json")) if os.path.exists("ft/config.json") else {}
    results["3 a run finetuned from --init_from=CKPT resumes"] = classify(
        rc, o, expect_error=False, wrong=rc != 0 or cfg.get("init_from") != "spt_done/spt_best.pt")
    run("train_spt.py", SPT + ["--out_dir=cs", "--snapshot_attn_every=2", "--halt_after_steps=5", "--ckpt_every=1"], work)
    open("cs/snapshots.jsonl", "a").write('{"phase": "spt", "st')
    rc, o = run("train_spt.py", ["--task=synthetic", "--out_dir=cs", "--init_from=resume"], work)
    results["3 a cut last line in snapshots.jsonl"] = classify(rc, o, expect_error=False, wrong=rc != 0)
    results["3 strict JSON in every file of a run"] = "ok" if all(
        strict_json_ok(d) for d in ("flt_done", "spt_done", "dc")) else "silent"


def round_three_bounds(results, work, flt, spt_r):
    """Numbers, sizes and paths bounded before any work; readers of their own runs only."""
    flt_lo = [f for f in FLT if not f.startswith("--eval_batches")]
    for name, script, args in (
            ("flt --evaluate --test_loops=100000000", "train_flt.py", ["--evaluate=flt_done", "--test_loops=100000000"]),
            ("data_lra.py listops --n=10**12", "data_lra.py", ["--task=listops", "--generate", "--n=1000000000000"]),
            ("spt listops --n_generate=10**12", "train_spt.py", ["--task=listops", "--n_generate=1000000000000",
                                                                 "--out_dir=ng"]),
            ("flt listops of depth 1, 10**6 examples", "train_flt.py", flt_lo + [
                "--data=listops", "--listops_depth=1", "--listops_examples=1000000", "--out_dir=l1"])):
        rc, o, slow = timed(script, args, work, 60)
        results[f"3 hang: {name}"] = classify(rc, o, wrong=slow or not one_line_error(rc, o))
    cases = [("spt --lr=<401 digits>", "train_spt.py", SPT + ["--lr=" + "9" * 401, "--out_dir=b1"]),
             ("spt --n_embd=<401 digits>", "train_spt.py", SPT + ["--n_embd=" + "9" * 401, "--out_dir=b2"]),
             ("spt --epochs=<401 digits>", "train_spt.py", SPT + ["--epochs=" + "9" * 401, "--out_dir=b3"]),
             ("out_dir component of 300 bytes", "train_spt.py", SPT + ["--out_dir=" + "x" * 300]),
             ("flt --evaluate --test_loops=-5", "train_flt.py", ["--evaluate=flt_done", "--test_loops=-5"]),
             ("bench.py --threads=-1", "tools/bench.py", ["--threads=-1", "--out=b.json"]),
             ("bench.py --peak_flops=-5", "tools/bench.py", ["--peak_flops=-5", "--out=b.json"]),
             ("bench.py --reps=-3", "tools/bench.py", ["--reps=-3", "--out=b.json"]),
             ("data_lra.py pathfinder --n=10**12", "data_lra.py", ["--task=pathfinder", "--generate",
                                                                   "--n=1000000000000"]),
             ("flt --evaluate on an SPT run", "train_flt.py", ["--evaluate=spt_done"]),
             ("flt --compare on an SPT run", "train_flt.py", ["--compare=spt_done", "--out_dir=c_spt"]),
             ("spt --init_from of another width", "train_spt.py", SPT + [
                 "--pretrain_epochs=0", "--init_from=spt_done/spt_best.pt", "--n_embd=32", "--out_dir=w32"]),
             ("spt --init_from an FLT checkpoint", "train_spt.py", SPT + [
                 "--pretrain_epochs=0", "--init_from=flt_done/ckpt.pt", "--out_dir=wflt"])]
    if not torch.cuda.is_available():
        cases.append(("bench.py --device=cuda without CUDA", "tools/bench.py", ["--device=cuda", "--out=b.json"]))
    os.symlink("sl", "sl") if not os.path.lexists("sl") else None
    cases.append(("--data_dir that links to itself", "train_spt.py", [
        "--task=listops", "--n_generate=100", "--data_dir=sl", "--out_dir=sl_run"]))
    for name, script, args in cases:
        rc, o = run(script, args, work)
        wrote = any(os.path.exists(d) for d in ("b1", "b2", "b3", "w32", "wflt", "sl_run"))
        results[f"3 {name}"] = classify(rc, o, wrong=not one_line_error(rc, o) or wrote)
    class Claim:
        def __reduce__(self):
            return (np.ndarray, ((1000000, 3072), np.dtype("u1")))
    os.makedirs("cif/cifar-10-batches-py", exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(os.path.join("cif/cifar-10-batches-py", name), "wb") as f:
            pickle.dump({b"data": Claim(), b"labels": [0]}, f, protocol=2)
    rc, o = run("data_lra.py", ["--task=image", "--data_dir=cif"], work)
    results["3 a CIFAR pickle claiming 2.9 GB"] = classify(rc, o, wrong="refusing an array" not in o)
    os.makedirs("tree", exist_ok=True)
    shutil.copytree("spt_done", "tree/spt")
    shutil.copytree("flt_done", "tree/flt")
    rc, o = run("train_spt.py", ["--report=tree"], work)
    results["3 --report over a tree holding an FLT run"] = classify(rc, o, expect_error=False, wrong=rc != 0)
    run("train_flt.py", flt + ["--out_dir=first", "--stop_step=1"], work)
    open("first/log.jsonl", "w").close()
    rc, o = run("train_flt.py", ["--compare=first", "--out_dir=c_first"], work)
    results["3 --compare on a run in its first step"] = classify(rc, o, expect_error=False)
    p = subprocess.Popen([sys.executable, os.path.join(REPO, "data_lra.py"), "--task=listops", "--generate",
                          "--n=200000", "--data_dir=cc_data"], cwd=work, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    while "generating" not in p.stdout.readline() and p.poll() is None:     # its imports done, generating
        pass
    time.sleep(1)
    p.send_signal(signal.SIGINT)
    o = p.communicate(timeout=120)[0]
    results["3 Ctrl-C during data_lra.py --generate"] = "traceback" if "Traceback" in o else \
        "ok" if p.returncode == 130 else "silent"



def round_four(results, work, flt):
    """The fourth audit's cases: a full disk that torch.save reports in its own words,
    SIGTERM (a cluster's warning before a kill) in both scripts, and refusals that must
    come before any output."""
    patch = ("torch.save = lambda *a, **k: (_ for _ in ()).throw(RuntimeError('[enforce fail at "
             "inline_container.cc:819] . unexpected pos 64 vs 2048'))")       # the disk reads as not full
    for script, args in (("train_spt", SPT), ("train_flt", flt)):
        out = f"pos_{script}"
        rc, o = inproc(script, args + [f"--out_dir={out}"], patch)
        tmp_left = os.path.isdir(out) and any(".tmp." in n for n in os.listdir(out))
        results[f"4 {script} torch.save 'unexpected pos'"] = classify(rc, o, wrong=tmp_left or
                                                                      not one_line_error(rc, o))
    for script, args, whole in (("train_spt.py", SPT + ["--n_train=2048", "--batch_size=8", "--dropout=0.1"], "sw"),
                                ("train_flt.py", flt + ["--max_steps=400", "--ckpt_interval=1000"], "fw")):
        run(script, args + [f"--out_dir={whole}"], work)
        cut = whole + "_cut"
        p = subprocess.Popen([sys.executable, os.path.join(REPO, script), *args, f"--out_dir={cut}"], cwd=work,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, OMP_NUM_THREADS="1"))
        while p.poll() is None and not (os.path.exists(f"{cut}/log.jsonl") and
                                        sum(1 for _ in open(f"{cut}/log.jsonl")) > 20):
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=120)
        stopped = p.returncode == 143 and "terminated; the last good checkpoint" in err and \
            not os.path.exists(f"{cut}/run.lock")
        rc, o = run(script, [f"--out_dir={cut}", "--init_from=resume"] + (["--task=synthetic"] if "spt" in script
                                                                          else []), work)
        same = rc == 0 and all(torch.equal(a, b) for a, b in zip(
            torch.load(f"{whole}/ckpt.pt", weights_only=True)["model"].values(),
            torch.load(f"{cut}/ckpt.pt", weights_only=True)["model"].values()))
        results[f"4 {script} SIGTERM mid-run, then resume"] = "traceback" if "Traceback" in err + o else \
            "ok" if stopped and same else "silent"
    os.makedirs("rep", exist_ok=True)
    shutil.copytree("spt_done", "rep/run")
    open("rep/report.md", "w").write("the user's")
    rc, o = run("train_spt.py", ["--report=rep"], work)
    results["4 --report refused before its table"] = classify(rc, o, wrong="| run |" in o)
    rc, o = run("train_flt.py", ["--compare=flt_done,spt_done", "--out_dir=cmp_new"], work)
    results["4 --compare refused before writing"] = classify(rc, o, wrong=os.path.exists("cmp_new"))


def started(argv, cwd, marker, **kwargs):
    """A script started in the background, once `marker` has appeared on its stderr."""
    p = subprocess.Popen([sys.executable, *argv], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), **kwargs)
    seen, deadline = b"", time.time() + 120
    while marker not in seen and time.time() < deadline and p.poll() is None:
        seen += os.read(p.stderr.fileno(), 4096)
    return p, seen


def stopped_by(p, seen, sig, group=False):
    """(exit status, stderr) after `sig` reaches p (or its process group)."""
    (os.killpg if group else os.kill)(p.pid, sig)
    try:
        err = p.communicate(timeout=120)[1]
    except subprocess.TimeoutExpired:
        p.kill()
        return None, "hang"
    return p.returncode, (seen + err).decode(errors="replace")


def shell(command, cwd, timeout=120):
    """(exit status, output) of a shell line (for ulimit, pipes, odd paths)."""
    try:
        p = subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, OMP_NUM_THREADS="1", PY=sys.executable, REPO=REPO))
        return p.returncode, p.stderr + p.stdout
    except subprocess.TimeoutExpired:
        return None, "hang"


def round_five(results, work, flt):
    """The fifth audit (the 'Nothing lost, round four' replay): concurrency, signals
    during data generation and with data workers, encodings, manifest paths, overwrite
    with init_from, foreign checkpoints, resource limits, a broken terminal."""
    spt, fl, S = os.path.join(REPO, "train_spt.py"), os.path.join(REPO, "train_flt.py"), " ".join(SPT)
    F = " ".join(flt)
    shutil.copytree("spt_done", "m_run")                                 # a manifest naming ../x
    open("m_x", "w").write("the user's")
    m = json.load(open("m_run/manifest.json"))
    json.dump(dict(m, files=m["files"] + ["../m_x"]), open("m_run/manifest.json", "w"))
    rc, o = run("train_spt.py", SPT + ["--out_dir=m_run", "--overwrite=True"], work)
    results["5 a manifest naming ../x, then --overwrite"] = classify(rc, o, changed=not os.path.exists("m_x"))
    shutil.copytree("spt_done", "ow_run")
    before = fp("ow_run")
    rc, o = run("train_spt.py", [a for a in SPT if not a.startswith("--pretrain_epochs")] +
                ["--out_dir=ow_run", "--overwrite=True", "--init_from=ow_run/spt_best.pt"], work)
    results["5 --overwrite with --init_from inside the folder"] = classify(rc, o, changed=fp("ow_run") != before)
    run("train_flt.py", flt + ["--n_embd=16", "--out_dir=fc_small"], work)
    run("train_flt.py", flt + ["--n_embd=32", "--out_dir=fc_big"], work)
    shutil.copy("fc_small/ckpt.pt", "fc_big/ckpt.pt")
    rc, o = run("train_flt.py", ["--out_dir=fc_big", "--init_from=resume"], work)
    results["5 a foreign ckpt.pt copied in, then resume"] = classify(rc, o)
    for i in range(3):                                                   # two runs on one folder at once
        a, b = (subprocess.Popen([sys.executable, fl, *flt, "--max_steps=20", f"--out_dir=race{i}"], cwd=work,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2))
        codes = sorted([a.wait(timeout=180), b.wait(timeout=180)])
        steps = sum(1 for r in open(f"race{i}/log.jsonl") if '"loss"' in r)
        ok = codes[0] == 0 and codes[1] != 0 and steps == 20
        results[f"5 two train_flt.py on one folder at once ({i + 1})"] = "ok" if ok else "silent"
    gen = [spt, "--task=pathfinder", "--depth=1", "--n_generate=100000", "--data_dir=g_data", "--out_dir=g_run"]
    rc, o = stopped_by(*started(gen, work, b"250/100000"), signal.SIGTERM)
    results["5 SIGTERM during PathFinder generation"] = classify(rc, o, wrong=rc != 143 or os.path.exists("g_run")
                                                                 or "KeyboardInterrupt" in o)
    for sig, code in ((signal.SIGHUP, 129), (signal.SIGUSR1, 138)):
        out = f"sig{code}"
        p, seen = started([spt, *SPT, "--n_train=4096", "--batch_size=8", f"--out_dir={out}"], work, b"loss=")
        rc, o = stopped_by(p, seen, sig)
        results[f"5 {sig.name} mid-run"] = classify(rc, o, wrong=rc != code or os.path.exists(f"{out}/run.lock")
                                                    or not os.path.exists(f"{out}/ckpt.pt"))
    p, seen = started([spt, "--task=synthetic", "--num_workers=2", "--epochs=20", "--pretrain_epochs=0", "--n_embd=16",
                       "--n_head=2", "--out_dir=pg_run"], work, b"finetune epoch 1/20:  ", start_new_session=True)
    rc, o = stopped_by(p, seen, signal.SIGTERM, group=True)
    results["5 SIGTERM to the process group, 2 data workers"] = classify(rc, o, wrong=rc != 143 or
                                                                         not os.path.exists("pg_run/ckpt.pt"))
    cases = {   # name: (shell line, what must hold besides no traceback: "runs", "halted", or an error's words)
        "5 ulimit -n 14, PathFinder generation": (f'ulimit -n 14; "$PY" {spt} --task=pathfinder --depth=1 '
                                                  f'--n_generate=1000 --data_dir=u_data --out_dir=u_run', "ulimit -n"),
        "5 ulimit -n 8": (f'ulimit -n 8; "$PY" {spt} {S} --out_dir=u8', "ulimit -n"),
        "5 PYTHONIOENCODING=ascii, a non-ASCII --out_dir": (f'PYTHONIOENCODING=ascii "$PY" {spt} {S} '
                                                            f'--out_dir=dé', "runs"),
        "5 an --out_dir holding the byte 0xff": (f'"$PY" {spt} {S} --out_dir=$(printf "x\\xff")', "not UTF-8"),
        "5 an --out_dir that is a dangling link": (f'ln -s nowhere dang; "$PY" {spt} {S} --out_dir=dang',
                                                   "does not exist"),
        "5 --out_dir= (empty), train_flt.py": (f'"$PY" {fl} {F} --out_dir=', "--out_dir is empty"),
        "5 --data_dir equal to --out_dir": (f'"$PY" {spt} --task=pathfinder --n_generate=200 --depth=1 --epochs=1 '
                                            f'--pretrain_epochs=0 --data_dir=ddo --out_dir=ddo', "separate folders"),
        "5 summary.json replaced by a folder, then --overwrite": (
            f'cp -r spt_done sf && rm sf/summary.json && mkdir sf/summary.json && "$PY" {spt} {S} --out_dir=sf '
            f'--overwrite=True', "is a folder where the run writes a file"),
        "5 train_flt.py --lr=1e9": (f'"$PY" {fl} {F} --lr=1e9 --out_dir=lr9; test $? = 2', "runs"),
        "5 --batch_size=1000000 under ulimit -v": (f'ulimit -v 6000000; "$PY" {fl} {F} --batch_size=1000000 '
                                                   f'--out_dir=bs; rc=$?; test -e bs && exit 9; exit $rc',
                                                   "lower --batch_size"),
        "5 resume after log.jsonl was deleted": (f'"$PY" {spt} {S} --epochs=3 --halt_after_steps=6 --out_dir=ld; '
                                                 f'rm ld/log.jsonl; "$PY" {spt} --out_dir=ld --init_from=resume',
                                                 "log.jsonl is gone"),
        "5 | head -1": (f'"$PY" {spt} {S} --out_dir=hd | head -1; test ${{PIPESTATUS[0]}} = 0 -a -e hd/summary.json',
                        "runs"),
        "5 stdout on /dev/full": (f'"$PY" {spt} {S} --out_dir=fo > /dev/full && test -e fo/summary.json', "runs"),
        "5 stderr on /dev/full": (f'"$PY" {spt} {S} --out_dir=fe 2> /dev/full && test -e fe/summary.json', "runs"),
        "5 the main command's first screen": (f'"$PY" {spt} --task=pathfinder --depth=1 --n_generate=2000 '
                                              f'--halt_after_steps=2 --data_dir=fs_data --out_dir=fs', "halted"),
    }
    for name, (line, want) in cases.items():
        rc, o = shell(line, work, timeout=60 if "ulimit -n" in line else 240)
        error = want not in ("runs", "halted")
        wrong = rc != 0 if want == "runs" else "halted after 2 steps" not in o if want == "halted" else \
            not one_line_error(rc, o) or want not in o
        results[name] = classify(rc, o, expect_error=error, wrong=wrong)
    rc, o = inproc("train_spt", SPT + ["--out_dir=fd_run"], "torch.save = lambda *a, **k: (_ for _ in ()).throw("
                   "RuntimeError('PytorchStreamWriter failed writing file')); runfiles.shutil.disk_usage = "
                   "lambda p: types.SimpleNamespace(free=0)")
    results["5 a full disk before the first checkpoint"] = classify(rc, o, wrong="resume" in o or
                                                                    not one_line_error(rc, o))


def round_six(results, work, flt):
    """The sixth audit ('Nothing lost, round five'): the sweep driver (tools/lra_rescue.py)
    at a tiny size, its records, the data caches, reports on unfinished runs, the
    environment, resume across versions, and two round-four cases in other forms."""
    six_driver(results, work)
    six_records(results, work)
    six_caches(results, work)
    six_reports(results, work, flt)
    six_environment(results, work, flt)


RESCUE = os.path.join("tools", "lra_rescue.py")


def sweep(work, name, *more):
    """A tiny two-run sweep of the driver (spt_pretrain_s0, 60 steps; spt_s0; qk_s0 waits for the gate)."""
    tiny = (f"--n_generate=200 --data_dir={work}/r6_data --n_train=16 --n_eval=16 --n_embd=16 --n_head=2 "
            "--batch_size=8 --log_every=1 --dtype=float32")
    return [f"--extra={tiny}", "--extra_spt=--pretrain_epochs=2 --n_train=240", "--arms=spt,qk", "--seeds=0",
            f"--out={work}/{name}_out", f"--results={work}/{name}_res", *more]


def driver(work, name, *more):
    """A driver started in its own session, once it has started its first run."""
    p = subprocess.Popen([sys.executable, os.path.join(REPO, RESCUE), "run", *sweep(work, name), *more], cwd=work,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    seen = ""
    while "start: " not in seen and p.poll() is None:
        seen += p.stdout.readline()
    return p, seen


def runs_of(folder):
    """Pids of live processes whose command line names `folder` (runs left going)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if folder.encode() in open(f"/proc/{pid}/cmdline", "rb").read():
                pids.append(int(pid))
        except OSError:
            pass
    return pids


def gone(folder, within=90):
    deadline = time.time() + within
    while runs_of(folder) and time.time() < deadline:
        time.sleep(0.5)
    return not runs_of(folder)


def six_driver(results, work):
    # SIGTERM, then SIGKILL, to the driver mid-sweep; then the driver again: it resumes, records each run once
    for sig, name in ((signal.SIGTERM, "st"), (signal.SIGKILL, "sk")):
        p, seen = driver(work, name)
        time.sleep(4)
        os.kill(p.pid, sig)
        out = seen + p.communicate(timeout=120)[0]
        orphans = not gone(f"{work}/{name}_out/", within=10)      # a run saves its resume point in a second
        rc, o = run(RESCUE, ["run", *sweep(work, name)], work)
        records = sorted(os.listdir(f"{work}/{name}_res")) if os.path.isdir(f"{work}/{name}_res") else []
        whole = [r for r in records if not r.startswith(".")] == ["spt_pretrain_s0", "spt_s0"]
        results[f"6 {sig.name} to the driver mid-sweep, then run again"] = classify(
            rc, out + o, expect_error=False, wrong=orphans or not whole or "FAILED" in o or rc != 0 or
            (sig == signal.SIGTERM and "run again to resume" not in out))
    # a second driver on the same records
    p, _ = driver(work, "two")
    rc, o = run(RESCUE, ["run", *sweep(work, "two")], work)
    os.kill(p.pid, signal.SIGTERM)
    p.communicate(timeout=120)
    results["6 a second driver on the same results folder"] = classify(
        rc, o, wrong=not one_line_error(rc, o) or "another lra_rescue.py run" not in o or not gone(f"{work}/two_out/"))
    # a kill while a record is copied: its .partial folder left, the run's folder whole
    shutil.rmtree(f"{work}/st_res/spt_s0")
    os.makedirs(f"{work}/st_res/spt_s0.partial")
    shutil.copy(f"{work}/st_out/spt_s0/log.jsonl", f"{work}/st_res/spt_s0.partial")
    rc, o = run(RESCUE, ["record", *sweep(work, "st")], work)
    rc2, o2 = run(RESCUE, ["report", *sweep(work, "st")], work)
    results["6 a kill while a record was copied, then record and report"] = classify(
        rc + rc2 if rc is not None and rc2 is not None else None, o + o2, expect_error=False,
        wrong=os.path.exists(f"{work}/st_res/spt_s0.partial") or
        not os.path.isfile(f"{work}/st_res/spt_s0/summary.json"))
    # a cluster's lines: a wave-2 line run before wave 1 is refused
    rc, o = run(RESCUE, ["commands", *sweep(work, "cl")], work)
    lines = [line.split(" && ", 1)[-1] for line in o.splitlines() if "python tools/lra_rescue.py one" in line]
    rc2, o2 = run(RESCUE, shlex.split(lines[1])[2:], work) if len(lines) == 3 else (1, f"not 3 lines: {o}")
    results["6 commands, then a wave-2 line before wave 1"] = classify(
        rc2, o2, wrong=not one_line_error(rc2, o2) or "not recorded yet: run the lines of wave 1 first" not in o2)


def six_records(results, work):
    """A damaged, NaN, foreign or half-copied record, a missing one a verdict needs, and a
    read-only results folder: report and run refuse in one line naming it, before any work."""
    def cut(path):
        data = open(path, "rb").read()
        open(path, "wb").write(data[:len(data) // 2])

    def edit(path, old, new):
        text = open(path).read()
        open(path, "w").write(text.replace(old, new))
    damages = {
        "a record without summary.json": ("spt_s0", lambda d: os.remove(f"{d}/spt_s0/summary.json")),
        "a truncated summary.json": ("spt_s0", lambda d: cut(f"{d}/spt_s0/summary.json")),
        "a truncated spt_best.pt": ("spt_pretrain_s0", lambda d: cut(f"{d}/spt_pretrain_s0/spt_best.pt")),
        "a NaN summary": ("spt_s0", lambda d: edit(f"{d}/spt_s0/summary.json", '"test_acc": ',
                                                   '"test_acc": NaN, "x": ')),
        "a record of another preset": ("spt_s0", lambda d: edit(f"{d}/spt_s0/config.json", '"cpu_rescue"', '"cpu"')),
        "a missing record a verdict needs": ("spt_pretrain_s0", lambda d: (    # gone here and where it was made
            shutil.rmtree(f"{d}/spt_pretrain_s0"), edit(f"{d}/spt_s0/config.json", work, "/gone"))),
    }
    for i, (case, (named, damage)) in enumerate(damages.items()):
        res = f"{work}/dmg{i}_res"
        shutil.copytree(f"{work}/st_res", res)
        damage(res)
        before = fp(f"{res}/spt_s0")
        for action in ("report", "run"):
            rc, o = run(RESCUE, [action, *sweep(work, f"dmg{i}")], work)
            results[f"6 {case}, then {action}"] = classify(
                rc, o, changed=fp(f"{res}/spt_s0") != before,
                wrong=not one_line_error(rc, o) or named not in o or "start: " in o)
    rc, o = run(RESCUE, ["run", *sweep(work, "ro")[:-1], "--results=/proc/r6_records"], work)
    results["6 a results folder that cannot be written, then run"] = classify(
        rc, o, wrong=not one_line_error(rc, o) or "cannot be written" not in o or "start: " in o)


def together(argvs, cwd, env=None):
    """(exit statuses, outputs) of commands started at once."""
    procs = [subprocess.Popen([sys.executable, *a], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))) for a in argvs]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    return [p.returncode for p in procs], outs


def six_caches(results, work):
    spt, fl = os.path.join(REPO, "train_spt.py"), os.path.join(REPO, "train_flt.py")
    small = ["--n_train=16", "--n_eval=16", "--n_embd=16", "--n_head=2", "--batch_size=8", "--epochs=1",
             "--pretrain_epochs=0"]
    pf = [spt, "--task=pathfinder", "--depth=1", "--n_generate=3000", *small, f"--data_dir={work}/c_pf"]
    lo = [spt, "--task=listops", "--n_generate=400", "--max_len=600", *small, f"--data_dir={work}/c_lo"]
    st = [fl, "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=4", "--n_loops=2",
          "--max_steps=2", "--eval_interval=2", "--eval_batches=1", "--osc_steps=3", f"--data_dir={work}/c_st"]
    for name, argv, made in (("PathFinder", pf, "generating PathFinder"), ("ListOps", lo, "generating ListOps"),
                             ("stdlib", st, "gathered")):
        codes, outs = together([argv + [f"--out_dir=c_{name}{i}"] for i in (1, 2)], work)
        again = run(argv[0], argv[1:] + [f"--out_dir=c_{name}3"], work)[1]
        results[f"6 two runs making one {name} cache at once"] = "traceback" if any("Traceback" in o for o in outs) \
            else "ok" if codes == [0, 0] and sum(o.count(made) for o in outs) == 1 and made not in again else "silent"
    path = next((os.path.join(f"{work}/c_pf/generated", f) for f in os.listdir(f"{work}/c_pf/generated")
                 if f.endswith("-n3000.npz")), "no cache made")
    for case, damage in (("truncated", lambda b: b[:len(b) // 2]),
                         ("bit-flipped", lambda b: b[:len(b) // 2] + bytes([b[len(b) // 2] ^ 1]) +
                          b[len(b) // 2 + 1:])):
        data = open(path, "rb").read() if os.path.exists(path) else b""
        open(path, "wb").write(damage(data))
        rc, o = run(spt, pf[1:] + [f"--out_dir=c_{case}"], work)
        results[f"6 a {case} PathFinder cache"] = classify(rc, o, expect_error=False,
                                                           wrong=rc != 0 or "generating PathFinder" not in o)
    before = fp(f"{work}/c_pf/generated")
    for flag in ("--difficulty=contour_length_9", "--n_generate=2000"):
        rc, o = run(spt, pf[1:] + [flag, f"--out_dir=c_{flag[2:6]}"], work)
        kept = {k: v for k, v in fp(f"{work}/c_pf/generated").items() if k in before} == before
        results[f"6 a cache of another {flag.split('=')[0]} in the same folder"] = classify(
            rc, o, expect_error=False, changed=not kept, wrong=rc != 0 or "generating PathFinder" not in o)
    big = [spt, "--task=pathfinder", "--depth=1", "--n_generate=20000", *small, f"--data_dir={work}/k_pf"]
    for i in range(3):                                                  # killed at random points
        p = subprocess.Popen([sys.executable, *big, f"--out_dir=k{i}"], cwd=work, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
        time.sleep(random.uniform(3, 15))
        p.kill()
        p.wait()
    left = gone(f"{work}/k_pf", within=30)
    rc, o = run(spt, big[1:] + ["--out_dir=k_last"], work)
    temps = [f for _, _, fs in os.walk(f"{work}/k_pf") for f in fs if f.startswith(".sptflt-tmp")]
    results["6 PathFinder generation killed at random points, then run again"] = classify(
        rc, o, expect_error=False, wrong=rc != 0 or bool(temps) or not left)


def six_reports(results, work, flt):
    spt, fl = os.path.join(REPO, "train_spt.py"), os.path.join(REPO, "train_flt.py")
    run("train_spt.py", SPT + ["--out_dir=rt/done"], work)
    run("train_spt.py", SPT + ["--epochs=3", "--ckpt_every=2", "--halt_after_steps=6", "--out_dir=rt/crashed"], work)
    shutil.copytree(f"{work}/rt/crashed", f"{work}/rt/empty")
    open(f"{work}/rt/empty/log.jsonl", "w").close()
    shutil.copytree(f"{work}/rt/crashed", f"{work}/rt/cut")
    open(f"{work}/rt/cut/log.jsonl", "a").write('{"step": 3, "lo')
    live = subprocess.Popen([sys.executable, spt, *SPT, "--n_train=4096", "--batch_size=8", "--epochs=3",
                             "--out_dir=rt/running"], cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not os.path.exists(f"{work}/rt/running/log.jsonl") and live.poll() is None:
        time.sleep(0.2)
    rc, o = run("train_spt.py", ["--report=rt", "--out_dir=rt_report"], work)
    results["6 --report over running, crashed, empty-log and cut-log runs"] = classify(
        rc, o, expect_error=False, wrong=rc != 0 or not all(f"rt/{d}" in o.split("given no row:")[-1]
                                                            for d in ("crashed", "empty", "cut", "running")))
    run("train_flt.py", flt + ["--out_dir=ct_done"], work)
    run("train_flt.py", flt + ["--stop_step=2", "--out_dir=ct_stopped"], work)
    rc, o = run("train_flt.py", ["--compare=ct_done,ct_stopped", "--out_dir=ct_cmp"], work)
    results["6 --compare of a stopped run"] = classify(rc, o, expect_error=False,
                                                       wrong=rc != 0 or "ct_stopped" not in o.split("no row")[-1])
    live.send_signal(signal.SIGTERM)
    live.wait(timeout=120)


def six_environment(results, work, flt):
    spt, fl, S, F = os.path.join(REPO, "train_spt.py"), os.path.join(REPO, "train_flt.py"), " ".join(SPT), " ".join(flt)
    cases = {   # name: (shell line, "runs" or an error's words)
        "6 train_spt.py --device=cuda without CUDA": (f'"$PY" {spt} {S} --device=cuda --out_dir=e1', "no cuda device"),
        "6 train_flt.py --device=cuda without CUDA": (f'"$PY" {fl} {F} --device=cuda --out_dir=e2', "no cuda device"),
        "6 train_spt.py --device=mps without MPS": (f'"$PY" {spt} {S} --device=mps --out_dir=e3', "no mps device"),
        "6 --compile=True on a CPU": (f'"$PY" {spt} {S} --compile=True --out_dir=e4', "runs"),
        "6 OMP_NUM_THREADS=0": (f'OMP_NUM_THREADS=0 "$PY" {spt} {S} --out_dir=e5', "OMP_NUM_THREADS"),
        "6 OMP_NUM_THREADS=abc, train_flt.py": (f'OMP_NUM_THREADS=abc "$PY" {fl} {F} --out_dir=e6', "OMP_NUM_THREADS"),
        "6 LANG=C, a non-ASCII --out_dir": (f'LANG=C LC_ALL=C "$PY" {spt} {S} --out_dir=é7', "runs"),
        "6 a HOME that cannot be written": (f'HOME=/proc/no_home "$PY" {spt} {S} --out_dir=e8', "runs"),
        "6 summary.json replaced by a folder, then --overwrite, train_flt.py": (
            f'"$PY" {fl} {F} --out_dir=e9 > /dev/null && rm e9/summary.json && mkdir e9/summary.json && '
            f'"$PY" {fl} {F} --out_dir=e9 --overwrite=True', "is a folder where the run writes a file"),
        "6 --data_dir equal to --out_dir, ListOps": (f'"$PY" {spt} --task=listops --n_generate=400 --depth=1 '
                                                     f'--data_dir=e10 --out_dir=e10', "separate folders"),
        "6 --data_dir equal to --out_dir, stdlib (train_flt.py)": (f'"$PY" {fl} {F.split(" --data=")[0]} '
                                                                   f'--data_dir=e11 --out_dir=e11', "separate folders"),
    }
    for name, (line, want) in cases.items():
        rc, o = shell(line, work, timeout=240)
        wrong = rc != 0 if want == "runs" else not one_line_error(rc, o) or want not in o
        results[name] = classify(rc, o, expect_error=want != "runs", wrong=wrong)
    # resume across versions: this code's DEFAULTS changed since the run began
    copy = os.path.join(work, "r6_repo")
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".git", "out*", "data", "results", "__pycache__"))
    rc, o = shell(f'cd {copy} && "$PY" train_spt.py {S} --ckpt_every=1 --halt_after_steps=2 --out_dir={work}/v_run; '
                  f'sed -i \'0,/pool="mean"/s//pool="max"/\' train_spt.py && '
                  f'"$PY" train_spt.py --out_dir={work}/v_run --init_from=resume', work)
    results["6 resume after a DEFAULTS value changed in the code"] = classify(
        rc, o, expect_error=False, wrong=rc != 0 or "pool='mean' (this code: 'max')" not in o)


main()
