"""The README is checked, not only read. Its install block installs the CPU build of torch before
the requirements; every `python ...` command it shows (in a code block or inline) is accepted by
the scripts' current flags, run in a tiny form that trains nothing, downloads nothing and writes
no file; its test command is the one .ci/run calls; its numbers are numbers REPORT.md records;
its links land on REPORT.md's anchors; each claim has one verdict word of the defined set and at
most 25 words of evidence; and it fits in 180 lines."""

import contextlib
import importlib.util
import io
import os
import re
import shlex
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 180
VERDICTS = ("yes", "partly", "not shown", "no")
CLAIMS = [f"A{i}" for i in range(1, 10)] + [f"B{i}" for i in range(1, 8)]
MAX_EVIDENCE_WORDS = 25


def read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


# -----------------------------------------------------------------------------
# Reading the README: code blocks, shell commands, inline commands, the claims table

def code_blocks(markdown):
    """The text inside every ``` fence."""
    return re.findall(r"^```[^\n]*\n(.*?)^```", markdown, re.S | re.M)


def shell_commands(block):
    """Each simple command of a bash block as a token list: NAME="..." assignments are expanded
    where $NAME is used, comments dropped, `a & b; wait | c && d` split into a, b, wait, c, d,
    and leading VAR=value words (OMP_NUM_THREADS=1 python ...) dropped."""
    names, commands = {}, []
    for line in block.splitlines():
        line = line.strip()
        if line.startswith("export "):
            line = line[len("export "):]
        assignment = re.fullmatch(r'(\w+)="([^"]*)"', line)
        if assignment:
            names[assignment[1]] = assignment[2]
            continue
        for name, value in names.items():
            line = re.sub(rf"\${{?{name}\b}}?", value, line)
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        command = []
        for token in list(lexer) + [";"]:
            if token in (";", "&", "&&", "|", "||"):
                while command and re.fullmatch(r"\w+=\S*", command[0]):
                    command.pop(0)
                if command:
                    commands.append(command)
                command = []
            else:
                command.append(token)
    return commands


def inline_commands(markdown):
    """`python ...` spans in the prose (outside the code blocks)."""
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    return [shlex.split(span) for span in re.findall(r"`(python3? [^`\n]+)`", prose)]


def python_commands(markdown):
    """(script, argv) of every `python script.py ...` the README shows, in order; `python -m`
    (the test command) is checked on its own."""
    found = [c for b in code_blocks(markdown) for c in shell_commands(b)] + inline_commands(markdown)
    return [(c[1], c[2:]) for c in found if c[0] in ("python", "python3") and len(c) > 1 and c[1] != "-m"]


def claim_rows(markdown):
    """{claim id: (verdict, evidence)} from the claims table's `| A1 | says | verdict | evidence |`."""
    rows = re.findall(r"^\| ([AB]\d) \| [^|\n]+ \| ([^|\n]+) \| ([^|\n]+) \|$", markdown, re.M)
    return {c: (verdict.strip(), evidence.strip()) for c, verdict, evidence in rows}


# -----------------------------------------------------------------------------
# A command's tiny form: the flags checked by the script's own code, no work done

def load(script):
    """The script as a module (its main guard keeps it from running)."""
    name = "readme_" + re.sub(r"\W", "_", script[:-3])
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, script))
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, ROOT)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def check_command(script, argv):
    """Raise (ValueError, SystemExit with a message, ...) when the current code would refuse
    `python script argv`; return what it printed. Training scripts: their config function on
    argv (every flag, type, range and choice checked; nothing trained). theory.py: its check at
    1 seed of 2 sequences. `lra_rescue.py commands`: run (it only reads the records). Other tools:
    their flags parsed against their DEFAULTS, an action word naming one of their functions."""
    module = load(script)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            if hasattr(module, "get_config"):
                module.get_config(argv)
            elif script == "theory.py":
                assert module.main(argv + ["--seeds=1", "--batch_size=2"]) == 0, "theory.py's check failed"
            elif script == "tools/lra_rescue.py" and argv[:1] == ["commands"]:
                module.main(argv)
            else:
                from configurator import configure
                if argv and not argv[0].startswith("--"):
                    assert "action" in module.DEFAULTS and callable(getattr(module, argv[0], None)), \
                        f"{script} has no action {argv[0]!r}"
                    argv = [f"--action={argv[0]}"] + argv[1:]
                configure(module.DEFAULTS, argv)
        except SystemExit as e:                              # --help exits 0; a refusal exits with its line
            if e.code not in (0, None):
                raise
    return out.getvalue()


# -----------------------------------------------------------------------------
# The checks

def install_problems(markdown):
    """What is wrong with the install lines: no CPU wheel line, or `-r requirements.txt`
    before the CPU build of torch (pip would fetch the multi-GB CUDA build first)."""
    lines = [" ".join(c) for b in code_blocks(markdown) for c in [shlex.split(l, comments=True)
             for l in b.splitlines()] if c[:2] == ["pip", "install"]]
    cpu = next((i for i, line in enumerate(lines) if "download.pytorch.org/whl/cpu" in line), None)
    if cpu is None:
        return ["no install line takes torch's CPU wheel (download.pytorch.org/whl/cpu)"]
    problems = [f"{line!r} comes before the CPU wheel" for line in lines[:cpu] if "requirements.txt" in line]
    line = lines[cpu]
    if "-r requirements.txt" not in line or line.index("requirements.txt") < line.index("whl/cpu"):
        problems.append(f"{line!r}: the CPU wheel, then `&& pip install -r requirements.txt`")
    return problems


def test_the_readme_fits_in_180_lines():
    n = len(read("README.md").splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines"


def test_the_install_block_installs_the_cpu_wheel_before_the_requirements():
    assert install_problems(read("README.md")) == []


def test_a_requirements_line_before_the_cpu_wheel_is_caught():
    wrong = ("```bash\npip install -r requirements.txt\npip install torch --index-url "
             "https://download.pytorch.org/whl/cpu && pip install -r requirements.txt\n```\n")
    assert install_problems(wrong)
    assert install_problems("```bash\npip install -r requirements.txt  # then torch (whl/cpu)\n```\n")


def readme_commands():
    return python_commands(read("README.md"))


def test_the_readme_shows_the_papers_commands():
    scripts = {script for script, _ in readme_commands()}
    assert {"train_spt.py", "train_flt.py", "theory.py", "tools/lra_rescue.py"} <= scripts, scripts


@pytest.mark.parametrize("script,argv", readme_commands(), ids=lambda x: " ".join(x) if isinstance(x, list) else x)
def test_every_python_command_of_the_readme_is_accepted_by_the_current_flags(script, argv):
    assert os.path.exists(os.path.join(ROOT, script)), f"the README runs {script}, which is gone"
    printed = check_command(script, argv)
    if argv[:1] == ["commands"]:                             # one shell command a line, for xargs or an array
        assert all("python" in line for line in printed.splitlines() if line.strip()), printed


def test_a_wrong_flag_in_a_readme_command_is_caught():
    block = 'Q="--task=synthetic --n_eval=1000"\npython train_spt.py $Q --epoch=5 --out_dir=out/x &  # SPT\n'
    [(script, argv)] = python_commands(f"```bash\n{block}```\n")
    assert argv == ["--task=synthetic", "--n_eval=1000", "--epoch=5", "--out_dir=out/x"]
    with pytest.raises(ValueError, match="did you mean --epochs"):
        check_command(script, argv)
    with pytest.raises(ValueError):
        check_command("train_spt.py", ["--task=pathfinder", "--preset=gpu"])     # no such preset


def test_the_readme_test_command_is_the_one_ci_runs():
    tests = [c for b in code_blocks(read("README.md")) for c in shell_commands(b) if c[1:3] == ["-m", "pytest"]]
    assert tests, "the README shows no test command"
    ci = [shlex.split(l) for l in read(".ci/run").splitlines() if "pytest" in l and not l.lstrip().startswith("#")]
    assert [c[1:] for c in ci] and tests[0][1:] == ci[-1][1:], (tests[0], ci)


def test_every_image_the_readme_shows_exists():
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", read("README.md"))
    assert images and all(os.path.exists(os.path.join(ROOT, i)) for i in images), images


def test_the_readme_links_land_on_report_anchors():
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', read("REPORT.md")))
    missing = sorted(set(re.findall(r"REPORT\.md#([\w-]+)", read("README.md"))) - anchors)
    assert not missing, f"README links to REPORT.md#{missing}, which REPORT.md has no anchor for"


def test_every_claim_has_one_verdict_and_at_most_25_words_of_evidence():
    rows = claim_rows(read("README.md"))
    assert sorted(rows, key=CLAIMS.index) == CLAIMS, sorted(rows)
    for claim, (verdict, evidence) in rows.items():
        assert verdict in VERDICTS, f"{claim}: verdict {verdict!r} is not one of {VERDICTS}"
        assert len(evidence.split()) <= MAX_EVIDENCE_WORDS, f"{claim}: {len(evidence.split())} words"
        assert "(REPORT.md#" in evidence, f"{claim} links to no REPORT section"


def test_a_long_evidence_cell_or_a_new_verdict_word_is_caught():
    row = "| A1 | says | {} | {} [A1](REPORT.md#a1) |"
    [(verdict, evidence)] = claim_rows(row.format("SPT ahead", " ".join(["word"] * 25))).values()
    assert verdict not in VERDICTS and len(evidence.split()) > MAX_EVIDENCE_WORDS


# 0.912, 2.3e-17, 1.34e-2, 10,000; in "200-240" each end is a number. Not a digit inside a word
# (K12, a8 in "#a8") or after a decimal point. A time keeps its unit ("63 s"): it must be recorded
# as a time.
NUMBER = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d+)?(?: (?:ms|s|min|h)\b)?")


def quoted_numbers(markdown):
    """The numbers of the prose and the claims: code blocks, `code`, link targets and the
    reading order's line counts are left out, and so are integers under 10 (seeds, layers)."""
    prose = re.sub(r"^\| `[\w/.]+\.py` \| [\d,]+ \|", "|", markdown, flags=re.M)
    prose = re.sub(r"`[^`\n]*`", " ", re.sub(r"^```.*?^```", " ", prose, flags=re.S | re.M))
    prose = re.sub(r"\]\([^)\s]*\)", "]", prose)
    return {n for n in NUMBER.findall(prose) if not (n.isdigit() and int(n) < 10)}


def missing_from_report(readme, report):
    return sorted(quoted_numbers(readme) - set(NUMBER.findall(report)))


def test_every_number_of_the_readme_is_recorded_in_the_report():
    missing = missing_from_report(read("README.md"), read("REPORT.md"))
    assert not missing, f"README.md quotes {missing}, which REPORT.md does not record"


def test_a_number_changed_in_the_readme_alone_is_caught():
    readme, report = read("README.md"), read("REPORT.md")
    number = next(n for n in sorted(quoted_numbers(readme)) if "." in n and "e" not in n and " " not in n)
    changed = number + "7"                                       # 0.912 -> 0.9127, ...
    while changed in NUMBER.findall(report):                     # ... or longer, until REPORT.md lacks it
        changed += "7"
    edited = re.sub(rf"(?<![\w.]){re.escape(number)}(?![\w.])", changed, readme, count=1)
    assert changed in missing_from_report(edited, report)


def test_commands_links_and_small_integers_are_not_read_as_results():
    text = ("```bash\npython x.py --max_steps=250\n```\nRun `OMP_NUM_THREADS=1 a.py --seed=17`: "
            "3 seeds, K12, [A8](REPORT.md#a8), 0.912 ± 0.011, 2.3e-17 and 1.34e-2, 200-240, 10,000, 7 s, 2.5 min.\n"
            "| `model.py` | 444 | the model |\n")
    assert quoted_numbers(text) == {"0.912", "0.011", "2.3e-17", "1.34e-2", "200", "240", "10,000", "7 s", "2.5 min"}
