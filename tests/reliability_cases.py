"""The hostile-user cases behind the README's "Reliability" table, run against any
checkout of this project (a few minutes on 2 cores; the fast tests of the same
families are tests/test_reliability.py):

    python tests/reliability_cases.py REPO_DIR results.json

Every case runs a real command in a fresh temporary folder and is classed as
ok | traceback | silent (exit 0, or a wrong result, where an error or a specific
result is expected) | data-loss (an earlier run's files changed) | hang (timed out)."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

REPO = os.path.abspath(sys.argv[1])
RESULTS = os.path.abspath(sys.argv[2])
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

    spt_flags = ["--batch_size=-4", "--batch_size=0", "--grad_accum=0", "--log_every=0", "--epochs=0",
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
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    open("flt_lock/run.lock", "w").write(str(sleeper.pid))
    open("flt_lock/config.json", "w").write("{}")
    before = fp("flt_lock")
    rc, o = run("train_flt.py", flt + ["--out_dir=flt_lock", "--overwrite=True"], work)
    sleeper.kill()
    results["flt second writer while one is live"] = classify(rc, o, changed=fp("flt_lock") != before)
    json.dump(results, open(RESULTS, "w"), indent=1)
    counts = {}
    for v in results.values():
        counts[v] = counts.get(v, 0) + 1
    print(len(results), "cases:", counts)
    for k, v in results.items():
        if v != "ok":
            print(f"  {v:10s} {k}")


main()
