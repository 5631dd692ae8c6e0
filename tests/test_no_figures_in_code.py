"""No measured figure in the code's comments and docstrings, nor in the README.

The house rule: a measurement (a speed ratio, a rate, a duration, a share of time, a size, a date)
goes in docs/benchmarks.md with the command that produced it, or stays in the dated page of
docs/experiments/ it came from; the code says the qualitative reason and points there, and the
README links to docs/benchmarks.md. Design constants are not measurements, so the patterns leave out
what they usually look like: whole multiples (``4x the context``, ``3 x hidden``), percentages that
are margins (``5%``) and timeouts in seconds. The few design constants that do read like a
measurement are in :data:`ALLOWED`, each with why.

Only comments and string statements (docstrings) are read, not string expressions: a format string
such as ``f"{rate:.1f} tokens/s"`` reports a figure, it does not hold one.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCE_FOLDERS = ("xpuspec", "plugins")
README = ROOT / "README.md"

MEASURED_FIGURE = re.compile(
    r"\d+\.\d+\s*[x×](?!\w)"  # a measured ratio: 0.78x, 1.02×, 0.95-1.13x
    r"|\d\s*(?:tokens?|tok|requests?)/s\b"  # a rate
    r"|\d\s*(?:ms|µs|us)\b"  # a duration at the scale of a step
    r"|\d+(?:\.\d+)?\s*% of\b"  # a share (of the time, of a step)
    r"|\d\s*[KMG]i?B\b"  # a size
    r"|\b20\d\d-\d\d-\d\d\b"  # a date
)
# A dated page named as a reference (docs/experiments/2026-12-02-cost-model.md) is not a date.
DATED_PAGE = re.compile(r"[\w./-]*20\d\d-\d\d-\d\d[\w.-]*\.md")

# (file, text on the line): why it is not a measurement.
ALLOWED: dict[tuple[str, str], str] = {
    ("xpuspec/server/config.py", "25 ms is 40 frames a second"): (
        "DEFAULT_STREAM_INTERVAL_S, a design constant, as a frame rate"
    ),
    ("xpuspec/server/config.py", "48 ms at 16 streams"): (
        "the design constants' interval at 16 streams, as a frame rate"
    ),
    ("xpuspec/spec_decode/policy/cost_model.py", "a target step of ~40 ms growing"): (
        "the cost model's priors, design constants used before any measurement"
    ),
    ("xpuspec/spec_decode/policy/cost_model.py", "0.5 ms per token, a draft step ~15% of it"): (
        "the cost model's priors, design constants used before any measurement"
    ),
}


def commentary(source: str) -> list[tuple[int, str]]:
    """The (line number, text) of every comment line and every line of a string statement (module,
    class and function docstrings, attribute docstrings) in Python ``source``."""
    lines = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            lines.extend(
                (node.value.lineno + offset, text)
                for offset, text in enumerate(node.value.value.splitlines())
            )
    return sorted(lines)


def measured_figures(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The lines among ``lines`` that hold a measured figure."""
    return [(number, text) for number, text in lines if MEASURED_FIGURE.search(DATED_PAGE.sub("", text))]


def allowed(path: str, text: str) -> bool:
    return any(file == path and fragment in text for file, fragment in ALLOWED)


def source_files() -> list[Path]:
    return sorted(path for folder in SOURCE_FOLDERS for path in (ROOT / folder).rglob("*.py"))


def figures_in_code() -> list[str]:
    found = []
    for path in source_files():
        relative = path.relative_to(ROOT).as_posix()
        for number, text in measured_figures(commentary(path.read_text(encoding="utf-8"))):
            if not allowed(relative, text):
                found.append(f"{relative}:{number}: {text.strip()}")
    return found


def test_no_measured_figure_in_comments_or_docstrings() -> None:
    found = figures_in_code()
    assert not found, (
        "measured figures in code (move them to docs/benchmarks.md with their command, or link the "
        "dated page of docs/experiments/ they came from):\n" + "\n".join(found)
    )


def test_no_measured_figure_in_the_readme() -> None:
    text = README.read_text(encoding="utf-8")
    found = measured_figures(list(enumerate(text.splitlines(), start=1)))
    assert not found, f"measured figures in README.md (link docs/benchmarks.md instead): {found}"
    assert "(docs/benchmarks.md)" in text


def test_every_allowed_line_still_exists() -> None:
    """An allowance whose line is gone would silently allow the next figure written there."""
    for file, fragment in ALLOWED:
        lines = measured_figures(commentary((ROOT / file).read_text(encoding="utf-8")))
        assert any(fragment in text for _, text in lines), (file, fragment)


PLANTED = '''"""A module.

Measured on 2026-12-02: adaptive γ ran at 0.78x target-only (docs/experiments/2026-12-02-cost-model.md).
"""

SUMMARY = "ran at 0.78x, 385.4 tokens/s"
STEP_S = 0.0148  # a step took 14.8 ms


def step() -> None:
    """Most of it: 78% of the device time, 385.4 tokens/s, a 16 MB bundle."""
    return None  # 4x the context, 3 x hidden, a 5% margin: design, not measured
'''


@pytest.mark.parametrize(
    ("line", "figure"),
    [(3, "0.78x"), (3, "2026-12-02:"), (7, "14.8 ms"), (11, "78% of"), (11, "385.4 tokens/s"), (11, "16 MB")],
)
def test_the_scanner_catches_planted_figures(line: int, figure: str) -> None:
    found = dict(measured_figures(commentary(PLANTED)))
    assert figure in found[line]
    assert MEASURED_FIGURE.search(figure)


def test_the_scanner_passes_code_strings_design_constants_and_dated_pages() -> None:
    found = dict(measured_figures(commentary(PLANTED)))
    assert set(found) == {3, 7, 11}  # not the string in code (6) nor the design constants (12)
    assert measured_figures([(1, "see docs/experiments/2026-12-02-cost-model.md")]) == []
    assert measured_figures([(1, "Measured on 2026-12-02.")]) == [(1, "Measured on 2026-12-02.")]
