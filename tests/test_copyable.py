"""The files a user copies into another project work there alone: each is copied
into an empty folder (analysis.py with the model.py it reads) and imported by a
fresh Python whose only path to this project is that folder."""

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


@pytest.mark.parametrize("name", sorted(COPYABLE))
def test_file_imports_alone_in_an_empty_folder(tmp_path, name):
    extra, use = COPYABLE[name]
    for f in (name, *extra):
        shutil.copy(os.path.join(ROOT, f), tmp_path / f)
    code = f"import importlib; m = importlib.import_module({name[:-3]!r}); {use}; print('ok')"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={**env, "OMP_NUM_THREADS": "1"}, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
