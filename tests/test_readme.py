"""The README teaches and REPORT.md records: every number the README's quick start quotes
(a result, a spread, a time) is a number REPORT.md holds, so the two cannot drift apart."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# 0.912, 2.3e-17, 1.34e-2, 10,000; in "200-240" each end is a number. Not a digit inside a
# word (K12, a8 in "#a8") or after a decimal point. A time keeps its unit ("2.5 min", "7 s"),
# so it must be recorded as a time.
NUMBER = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d+)?(?: (?:ms|s|min|h)\b)?")


def read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


def quick_start(readme):
    """The text from '## Quick start' up to the next '## ' heading."""
    start = re.search(r"^## Quick start", readme, re.M).start()
    end = re.search(r"^## ", readme[start + 3:], re.M)
    return readme[start:start + 3 + end.start() if end else len(readme)]


def quoted_numbers(markdown):
    """The numbers of the prose: code blocks and `code` (commands, flags, seeds, file
    names) are left out, and so are integers under 10 (list items, seed and layer counts)."""
    prose = re.sub(r"`[^`\n]*`", " ", re.sub(r"```.*?```", " ", markdown, flags=re.S))
    return {n for n in NUMBER.findall(prose) if not (n.isdigit() and int(n) < 10)}


def missing_from_report(readme, report):
    return sorted(quoted_numbers(quick_start(readme)) - set(NUMBER.findall(report)))


def test_every_number_of_the_readme_quick_start_is_recorded_in_the_report():
    missing = missing_from_report(read("README.md"), read("REPORT.md"))
    assert not missing, f"README's quick start quotes {missing}, which REPORT.md does not record"


def test_a_number_changed_in_the_readme_alone_is_caught():
    readme, report = read("README.md"), read("REPORT.md")
    section = quick_start(readme)
    number = next(n for n in sorted(quoted_numbers(section)) if "." in n and "e" not in n and " " not in n)
    changed = number + "7"                                       # 0.912 -> 0.9127, ...
    while changed in NUMBER.findall(report):                     # ... or longer, until REPORT.md lacks it
        changed += "7"
    edited = re.sub(rf"(?<![\w.]){re.escape(number)}(?![\w.])", changed, section, count=1)
    assert changed in missing_from_report(readme.replace(section, edited), report)


def test_commands_and_small_integers_are_not_read_as_results():
    text = ("## Quick start\n```bash\npython x.py --max_steps=250\n```\nRun `OMP_NUM_THREADS=1 a.py --seed=17`: "
            "3 seeds, K12, [A8](REPORT.md#a8), 0.912 ± 0.011, 2.3e-17 and 1.34e-2, 200-240, 10,000, 7 s, 2.5 min.\n"
            "## Next\n42")
    assert quoted_numbers(quick_start(text)) == {"0.912", "0.011", "2.3e-17", "1.34e-2", "200", "240", "10,000",
                                                 "7 s", "2.5 min"}
