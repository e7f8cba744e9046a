"""The files a user copies into another project work there alone: each is copied
into an empty folder of its own (analysis.py with the model.py it reads, data_lra.py
with pathfinder.py) and does its main work from there, files written included, with no
other path to this project."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# file -> (the project files it may bring along, as README's files table says, and code that uses it:
# each file's main work, with every file it writes)
DATA_LRA = """
import os, tempfile
d = tempfile.mkdtemp()
for task, make in (("pathfinder", "generate_pathfinder"), ("listops", "generate_listops")):
    first = m.load_task(task, "train", d, n=50, progress=False)            # generates, writes the cache
    real, calls = getattr(m, make), []
    setattr(m, make, lambda *a, **k: calls.append(1))                        # the second load must read it
    again = m.load_task(task, "train", d, n=50, progress=False)
    setattr(m, make, real)
    assert not calls and len(first) == len(again) > 0
    assert all(bool((first[i][0] == again[i][0]).all()) for i in range(len(first)))
written = [f for _, _, fs in os.walk(d) for f in fs]
assert any(f.endswith(".npz") for f in written) and any(f.endswith(".tsv") for f in written), written
assert not [f for f in written if "tmp" in f], written
"""
ANALYSIS = """
import os, tempfile, torch
d = tempfile.mkdtemp()
maps = [torch.softmax(torch.randn(2, 2, 16, 16), -1)]
mass = m.proximity_mass(maps)
m.plot_attention(maps, os.path.join(d, "a.png"), "maps")
m.plot_image_attention(torch.randint(0, 256, (16,)), {"init": maps[0][0]}, os.path.join(d, "b.png"), n_queries=1)
assert sorted(os.listdir(d)) == ["a.png", "b.png"] and all(os.path.getsize(os.path.join(d, f)) > 1000 for f in ("a.png", "b.png"))
"""
STABILITY = """
import torch
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn, self.mlp = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    def forward(self, x):
        return self.mlp(self.attn(x))
block = Block()
rec = m.BlockGradRecorder([block])
rec.start(1, 1)
rec.next_micro()
block(torch.ones(1, 2, requires_grad=True)).sum().backward()
norms = rec.norms(1)
assert set(norms) == {"out", "attn", "mlp"} and norms["out"][0][0] > 0, norms
assert m.grad_volatility([1.0, 2.0, 1.0, 2.0]) > 0
assert m.outcome([3.0, 3.0], 3.0, [3.0, 1.0])[0] == "did not learn"
"""
COPYABLE = {
    "model.py": ((), "m.Transformer(m.TransformerConfig(n_embd=16, n_head=2, vocab_size=10))"),
    "looped.py": ((), "m.LoopedTransformer(m.LoopedConfig(n_embd=16, n_head=2, n_layer=1, n_loops=2))"),
    "synthetic.py": ((), "m.load_split('val', n=8)"),
    "pathfinder.py": ((), "m.generate(4, seed=0, contour_length=6)"),
    "analysis.py": (("model.py",), ANALYSIS),
    "theory.py": (("model.py",), "m.check(0, 4)"),
    "stability.py": ((), STABILITY),
    "data_lra.py": (("pathfinder.py",), DATA_LRA),
}


# One fresh Python imports every file, each from its own folder, and forgets every module of
# this project in between: a file that needs a sibling it did not bring along fails there.
CHECK = """
import importlib, sys, traceback
for folder, name, use in CHECKS:
    for module in [k for k in sys.modules if k in PROJECT]:
        del sys.modules[module]
    sys.path.insert(0, folder)
    importlib.invalidate_caches()
    try:
        m = importlib.import_module(name)
        exec(use, {"m": m})
        print("ok", name)
    except Exception:
        print("FAILED", name, traceback.format_exc().splitlines()[-1])
    sys.path.remove(folder)
"""


def test_each_file_imports_alone_in_an_empty_folder(tmp_path):
    checks = []
    for name, (extra, use) in COPYABLE.items():
        folder = tmp_path / f"alone_{name[:-3]}"          # not a module name: no namespace package
        folder.mkdir()
        for f in (name, *extra):
            shutil.copy(os.path.join(ROOT, f), folder / f)
        checks.append((str(folder), name[:-3], use))
    project = sorted(f[:-3] for f in os.listdir(ROOT) if f.endswith(".py")) + ["config"]
    code = f"CHECKS = {checks!r}\nPROJECT = {project!r}\n" + CHECK
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={**env, "OMP_NUM_THREADS": "1"}, timeout=300)
    said = [line for line in proc.stdout.splitlines() if line.startswith(("ok ", "FAILED "))]   # not the files' own
    assert said == [f"ok {n[:-3]}" for n in COPYABLE], proc.stdout + proc.stderr[-2000:]


def test_the_check_fails_for_a_file_without_its_companion(tmp_path, monkeypatch):
    monkeypatch.setitem(COPYABLE, "analysis.py", ((), "m.proximity_mass"))     # model.py left behind
    with pytest.raises(AssertionError, match="FAILED analysis ModuleNotFoundError"):
        test_each_file_imports_alone_in_an_empty_folder(tmp_path)
