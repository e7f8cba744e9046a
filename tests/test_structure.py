"""The shape of the code a reader follows: the scripts' lengths, short argument lists,
theory.py readable alone. These are the repository's promises to a reader (README's
reading order), checked so that they stay true."""

import ast
import inspect
import pathlib

import pytest

import train_spt

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


# README's reading order: one table per paper, `| file | read | lines | what it teaches |`.
# "read" names definitions in backticks (`Class`, `Class.method`, `function`, `CONSTANT`),
# "the whole file", or "the module docstring"; "lines" must be what those spans hold.
READING_BUDGETS = {"Paper A": 600, "Paper B": 300}


def span_lines(path, read):
    """The lines a reading step covers: the whole file, its docstring, named definitions."""
    text = (ROOT / path).read_text()
    if "the whole file" in read:
        return len(text.splitlines())
    tree = ast.parse(text)
    total = 0
    if "the module docstring" in read:
        total += tree.body[0].end_lineno - tree.body[0].lineno + 1
    for name in [n.strip("`") for n in read.split("`")[1::2]]:
        scope = tree
        for part in name.split("."):
            found = [n for n in scope.body if getattr(n, "name", None) == part
                     or any(getattr(t, "id", None) == part for t in getattr(n, "targets", []))]
            assert found, f"README's reading order names {name} in {path}, which has no such definition"
            scope = found[0]
        lines = scope.end_lineno - scope.lineno + 1
        total += lines + len(getattr(scope, "decorator_list", []))
    return total


def reading_tables():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Reading order", 1)[1].split("\n## ", 1)[0]
    tables = {}
    for paper in READING_BUDGETS:
        block = section.split(f"**{paper}", 1)[1].split("\n\n", 2)[1]
        rows = [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()[2:]]
        tables[paper] = [(r[0].strip("`"), r[1], int(r[2])) for r in rows]
    return tables


def test_reading_order_counts_are_true_and_fit_the_budgets():
    for paper, rows in reading_tables().items():
        for path, read, stated in rows:
            assert span_lines(path, read) == stated, f"{paper}: {path} {read} holds " \
                f"{span_lines(path, read)} lines, README says {stated}"
        total = sum(n for *_, n in rows)
        assert total <= READING_BUDGETS[paper], f"{paper}'s reading order is {total} lines"


def test_span_lines_counts_a_method_a_function_and_a_constant():
    assert span_lines("train_spt.py", "`Phase.save`") == len(inspect.getsource(train_spt.Phase.save).splitlines())
    assert span_lines("train_spt.py", "`hybrid_init`") == len(inspect.getsource(train_spt.hybrid_init).splitlines())
    assert span_lines("train_spt.py", "`PHASES`") == 1
    with pytest.raises(AssertionError):
        span_lines("train_spt.py", "`no_such_function`")
