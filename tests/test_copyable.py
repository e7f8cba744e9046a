"""The files a user copies into another project work there alone: each is copied
into an empty folder of its own (analysis.py with the model.py it reads) and imported
from there, with no other path to this project."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# file -> (the project files it may bring along, a line that uses it)
COPYABLE = {
    "model.py": ((), "m.Transformer(m.TransformerConfig(n_embd=16, n_head=2, vocab_size=10))"),
    "looped.py": ((), "m.LoopedTransformer(m.LoopedConfig(n_embd=16, n_head=2, n_layer=1, n_loops=2))"),
    "synthetic.py": ((), "m.load_split('val', n=8)"),
    "pathfinder.py": ((), "m.generate(4, seed=0, contour_length=6)"),
    "analysis.py": (("model.py",), "m.proximity_mass([__import__('torch').full((1, 1, 8, 8), 1 / 8)])"),
    "theory.py": (("model.py",), "m.check(0, 4)"),
    "data_lra.py": (("pathfinder.py",), "m.generate_pathfinder(4, progress=False)"),
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
    project = sorted(f[:-3] for f in os.listdir(ROOT) if f.endswith(".py"))
    code = f"CHECKS = {checks!r}\nPROJECT = {project!r}\n" + CHECK
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={**env, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.stdout.split("\n")[:-1] == [f"ok {n[:-3]}" for n in COPYABLE], proc.stdout + proc.stderr[-2000:]


def test_the_check_fails_for_a_file_without_its_companion(tmp_path, monkeypatch):
    monkeypatch.setitem(COPYABLE, "analysis.py", ((), "m.proximity_mass"))     # model.py left behind
    with pytest.raises(AssertionError, match="FAILED analysis ModuleNotFoundError"):
        test_each_file_imports_alone_in_an_empty_folder(tmp_path)
