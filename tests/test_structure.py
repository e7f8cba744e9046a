"""The shape of the code a reader follows: the scripts' lengths, short argument lists,
theory.py readable alone. These are the repository's promises to a reader (README's
reading order), checked so that they stay true."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_LINES = {"train_spt.py": 600, "train_flt.py": 550, "theory.py": 150}
SHORT_SIGNATURES = ("train_spt.py", "train_flt.py", "training.py", "configurator.py")


def n_params(fn):
    a = fn.args
    return len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)


@pytest.mark.parametrize("name", list(MAX_LINES))
def test_script_fits_its_reading_budget(name):
    n = len((ROOT / name).read_text().splitlines())
    assert n <= MAX_LINES[name], f"{name} has {n} lines, more than {MAX_LINES[name]}"


@pytest.mark.parametrize("name", SHORT_SIGNATURES)
def test_no_function_takes_more_than_six_parameters(name):
    tree = ast.parse((ROOT / name).read_text())
    long = [f"{f.name} ({n_params(f)})" for f in ast.walk(tree)
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and n_params(f) > 6]
    assert not long, f"{name}: {', '.join(long)} take more than 6 parameters (self counted)"


def test_theory_imports_only_torch_numpy_stdlib_and_model():
    import sys
    tree = ast.parse((ROOT / "theory.py").read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    allowed = set(sys.stdlib_module_names) | {"torch", "numpy", "model"}
    assert names <= allowed, f"theory.py imports {sorted(names - allowed)}"
