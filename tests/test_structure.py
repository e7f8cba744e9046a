"""The shape of the code a reader follows: the scripts' lengths, short argument lists,
theory.py readable alone. These are the repository's promises to a reader (README's
reading order), checked so that they stay true."""

import ast
import inspect
import pathlib
import re
import sys

import pytest

import train_spt

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_LINES = {"train_spt.py": 600, "train_flt.py": 550, "theory.py": 150, "training.py": 400}
SHORT_SIGNATURES = ("train_spt.py", "train_flt.py", "training.py", "configurator.py", "runfiles.py")
SCRIPTS = ("train_spt.py", "train_flt.py")
PLUMBING = ("configurator", "training", "runfiles", "spt_settings", "flt_settings")


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


def plumbing_names(script):
    """The names a script takes from the plumbing modules: `from M import a, b` and `M.a`."""
    tree = ast.parse((ROOT / script).read_text())
    names = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module in PLUMBING
             for a in n.names}
    names |= {(n.value.id, n.attr) for n in ast.walk(tree) if isinstance(n, ast.Attribute)
              and isinstance(n.value, ast.Name) and n.value.id in PLUMBING}
    return names


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_script_takes_at_most_twelve_names_from_the_plumbing(script):
    names = plumbing_names(script)
    assert len(names) <= 12, f"{script} takes {len(names)} plumbing names: {sorted(names)}"


def test_the_plumbing_count_sees_both_import_forms(tmp_path, monkeypatch):
    (tmp_path / "s.py").write_text("import training\nfrom runfiles import a, b\ntraining.Run(); training.x.y\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert plumbing_names("s.py") == {("runfiles", "a"), ("runfiles", "b"), ("training", "Run"), ("training", "x")}


def defined(module_file):
    tree = ast.parse((ROOT / module_file).read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))} | \
        {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}


def test_the_guard_the_schedule_the_resume_point_and_the_run_state_are_defined_once_and_shared():
    for script in SCRIPTS:
        text = (ROOT / script).read_text()
        names = {name for _, name in plumbing_names(script)}
        assert {"NonFiniteGuard", "Schedule", "Run", "wrap"} <= names, script          # one guard, schedule, run
        assert "run.save_resume(" in text and "torch.save" not in text, script         # one resume-point writer
        assert not re.search(r"DistributedDataParallel|isfinite\(loss|class Run\b|def lr_at|signal\.", text), script
    assert {"NonFiniteGuard", "Schedule", "Run", "wrap"} <= defined("training.py")
    assert "def save_resume" in (ROOT / "training.py").read_text()


def test_the_safety_module_exposes_at_most_nine_names():
    public = {n for n in defined("runfiles.py") if not n.startswith("_")}   # the 8 of the file layer and
    assert len(public) <= 9, sorted(public)                             # data_fingerprint (resume's data check)
    assert "runfiles" not in (ROOT / "train_spt.py").read_text() + (ROOT / "train_flt.py").read_text()


def test_copyable_files_never_import_training():
    for name in ("data_lra.py", "analysis.py", "model.py", "looped.py", "synthetic.py", "pathfinder.py", "theory.py"):
        tree = ast.parse((ROOT / name).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "training" not in imported, name


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
# Each table's bold header says "(N lines, about M minutes)": N the table's sum, M at about
# LINES_PER_MINUTE. The budgets sit a little above the paths a reader needs (759 and 338
# lines when they were set): a path that grows past them is a path to shorten, or to re-count.
READING_BUDGETS = {"Paper A": 800, "Paper B": 360}
LINES_PER_MINUTE = 20
HEADER = re.compile(r"\((\d+) lines, about (\d+) minutes\)")


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


def reading_headers():
    """Each paper's bold header line, e.g. '**Paper A, self-pretraining** (759 lines, about 40 minutes)'."""
    section = (ROOT / "README.md").read_text().split("## Reading order", 1)[1].split("\n## ", 1)[0]
    return {paper: f"**{paper}" + section.split(f"**{paper}", 1)[1].split("\n", 1)[0] for paper in READING_BUDGETS}


def header_problems(header, total):
    """What a header says wrong about a table of `total` lines: its line count must be the
    total, its minutes the total at LINES_PER_MINUTE, rounded to 5 minutes at most."""
    found = HEADER.search(header)
    if not found:
        return [f"{header!r} does not say '(N lines, about M minutes)'"]
    lines, minutes = int(found[1]), int(found[2])
    problems = []
    if lines != total:
        problems.append(f"{header!r} says {lines} lines, its table holds {total}")
    if abs(minutes - total / LINES_PER_MINUTE) > 2.5:
        problems.append(f"{header!r} says about {minutes} minutes, {total} lines at {LINES_PER_MINUTE} "
                        f"a minute take about {total / LINES_PER_MINUTE:.0f}")
    return problems


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


def test_each_reading_header_states_its_tables_total_and_time_at_twenty_lines_a_minute():
    headers = reading_headers()
    for paper, rows in reading_tables().items():
        problems = header_problems(headers[paper], sum(n for *_, n in rows))
        assert not problems, problems


def test_the_header_check_catches_a_wrong_count_a_wrong_time_and_no_time():
    assert header_problems("**Paper A, x** (500 lines, about 25 minutes)", 500) == []
    assert header_problems("**Paper A, x** (500 lines, about 27 minutes)", 500) == []   # rounded
    assert "take about 25" in " ".join(header_problems("**Paper A, x** (500 lines, about 30 minutes)", 500))
    assert "holds 520" in " ".join(header_problems("**Paper A, x** (500 lines, about 25 minutes)", 520))
    assert "about 40 minutes" in " ".join(header_problems("**Paper A, x** (500 lines, about 40 minutes)", 500))
    assert "does not say" in " ".join(header_problems("**Paper A, x** (500 lines, about half an hour)", 500))
