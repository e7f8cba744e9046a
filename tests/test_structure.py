"""The repository's promises to a reader, checked: what lies at the top level, how long each
file is (the README's reading order gives these counts, and this file is the code that counts
them), and which way the imports point, so each paper's files can be copied on their own."""

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP = {"model.py", "looped.py", "data_lra.py", "synthetic.py", "train_spt.py", "train_flt.py", "theory.py",
       "configurator.py", "training.py", "pathfinder.py", "corpora.py", "analysis.py", "stability.py"}
MAX_LINES = {"train_spt.py": 548, "train_flt.py": 500, "configurator.py": 100, "training.py": 401}   # REPORT, round seven: why not 500 and 350
TOTAL_MAX = 4_895          # every .py outside tests/ and tools/ (config/ included); REPORT, round seven: why not 4,500


def lines(path):
    return len(Path(path).read_text().splitlines())


def paper_lines():
    """The lines of every .py file outside tests/ and tools/: what a reader of the papers reads."""
    return {str(p.relative_to(ROOT)): lines(p) for p in ROOT.rglob("*.py")
            if p.relative_to(ROOT).parts[0] not in ("tests", "tools", ".git")}


def test_the_top_level_holds_the_papers_files_and_no_plumbing_folder():
    assert {p.name for p in ROOT.glob("*.py")} == TOP
    assert not (ROOT / "plumbing").exists()


@pytest.mark.parametrize("name", sorted(MAX_LINES))
def test_file_fits_its_reading_budget(name):
    assert lines(ROOT / name) <= MAX_LINES[name], f"{name} has {lines(ROOT / name)} lines"


def test_the_papers_fit_in_an_afternoon():
    total = sum(paper_lines().values())
    assert total <= TOTAL_MAX, f"{total} lines outside tests/ and tools/: {paper_lines()}"


def test_the_readme_reading_order_gives_the_true_line_counts():
    """Each `| file | lines | ...` row of the README's reading order states the file's length."""
    rows = re.findall(r"^\| `([\w/.]+\.py)` \| (\d[\d,]*) \|", (ROOT / "README.md").read_text(), re.M)
    assert len(rows) >= 10, "the README's reading order table is missing"
    for name, n in rows:
        assert int(n.replace(",", "")) == lines(ROOT / name), name


def imports(name):
    tree = ast.parse((ROOT / name).read_text())
    found = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return found | {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


# what each copyable file may import from this project (nothing else of the project)
MAY_IMPORT = {"model.py": set(), "looped.py": set(), "synthetic.py": set(), "pathfinder.py": set(),
              "stability.py": set(), "data_lra.py": {"pathfinder"}, "analysis.py": {"model"},
              "theory.py": {"model"}, "corpora.py": {"data_lra"}, "configurator.py": set(), "training.py": set()}


@pytest.mark.parametrize("name", sorted(MAY_IMPORT))
def test_copyable_files_import_only_their_companions(name):
    project = {p[:-3] for p in TOP} | {"config", "tools", "tests"}
    assert imports(name) & project <= MAY_IMPORT[name], name


def test_paper_b_loads_nothing_of_paper_a():
    assert not imports("train_flt.py") & {"train_spt", "model", "synthetic", "analysis", "theory"}


def test_the_import_check_sees_a_wrong_way_import(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "model.py").write_text("import training\n")
    with pytest.raises(AssertionError):
        test_copyable_files_import_only_their_companions("model.py")
