"""The command blocks of the README and the docs pages, read from the Markdown with their doc-test markers.

The convention (docs/architecture.md, "Commands in the docs are tested"): every fenced block whose info
string names a shell or Python is preceded by an HTML comment that says how the test treats it,

    <!-- doc-test: run [default-model] [server=default|demo] [expect=TEXT] -->
    <!-- doc-test: skip REASON -->

and tests/docs/test_doc_commands.py runs each `run` block and prints each `skip` block's reason.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# The dated notes under docs/experiments/ are kept as written; the pages a user follows are these.
DOC_PAGES = ("README.md", "docs/*.md")
SHELL_LANGUAGES = frozenset({"bash", "sh", "shell", "console"})
PYTHON_LANGUAGES = frozenset({"python", "py", "python3"})
COMMAND_LANGUAGES = SHELL_LANGUAGES | PYTHON_LANGUAGES
SERVERS = frozenset({"default", "demo"})

MARKER = re.compile(r"^<!--\s*doc-test:\s*(?P<body>.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<fence>```+|~~~+)\s*(?P<info>[^`\s]*)")


class MarkerError(ValueError):
    """A doc-test marker that cannot be read, or a command block without one."""


@dataclass(frozen=True)
class Marker:
    """What a `<!-- doc-test: ... -->` comment asks for."""

    run: bool
    skip_reason: str = ""
    server: str | None = None  # run against the shared `xpuspec serve` of that model
    default_model: bool = False  # loads the default model: skipped without its GGUF, marked slow
    expect: str | None = None  # text the block's standard output must contain


@dataclass(frozen=True)
class DocBlock:
    """One fenced command block: where it is, its language, its text and its marker."""

    page: str  # relative to the repository root
    line: int  # the 1-based line of the opening fence
    language: str
    text: str
    marker: Marker

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def is_shell(self) -> bool:
        return self.language in SHELL_LANGUAGES

    @property
    def needs_default_model(self) -> bool:
        return self.marker.default_model or self.marker.server == "default"


def parse_marker(body: str) -> Marker:
    """`run [default-model] [server=NAME] [expect=TEXT]` or `skip REASON` (the reason is required)."""
    verb, _, rest = body.partition(" ")
    if verb == "skip":
        reason = rest.strip()
        if not reason:
            raise MarkerError("a skipped block needs a one-line reason: <!-- doc-test: skip REASON -->")
        return Marker(run=False, skip_reason=reason)
    if verb != "run":
        raise MarkerError(f"doc-test marker {body!r}: the first word is 'run' or 'skip'")
    options: dict[str, str | bool] = {}
    for word in shlex.split(rest):
        key, equals, value = word.partition("=")
        if key == "default-model" and not equals:
            options["default_model"] = True
        elif key in ("server", "expect") and equals and value:
            options[key] = value
        else:
            raise MarkerError(f"doc-test marker {body!r}: unknown option {word!r}")
    if "server" in options and options["server"] not in SERVERS:
        raise MarkerError(f"doc-test marker {body!r}: server is one of {sorted(SERVERS)}")
    return Marker(run=True, **options)  # type: ignore[arg-type]


def read_blocks(path: Path, page: str) -> list[DocBlock]:
    """The command blocks of one Markdown file; a command block without a marker is an error."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[DocBlock] = []
    pending: tuple[int, Marker] | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        marker_match = MARKER.match(line.strip())
        fence_match = FENCE.match(line.strip())
        if marker_match:
            if pending is not None:
                raise MarkerError(f"{page}:{pending[0]}: a doc-test marker with no block after it")
            pending = (index + 1, parse_marker(marker_match["body"]))
        elif fence_match:
            fence, language = fence_match["fence"], fence_match["info"].lower()
            end = index + 1
            while end < len(lines) and not lines[end].strip().startswith(fence):
                end += 1
            body = "\n".join(lines[index + 1 : end]) + "\n"
            if language in COMMAND_LANGUAGES:
                if pending is None:
                    raise MarkerError(
                        f"{page}:{index + 1}: a {language} block without a doc-test marker before it "
                        "(<!-- doc-test: run --> or <!-- doc-test: skip REASON -->)"
                    )
                blocks.append(DocBlock(page, index + 1, language, body, pending[1]))
            elif pending is not None:
                raise MarkerError(f"{page}:{pending[0]}: a doc-test marker before a {language!r} block")
            pending = None
            index = end
        elif line.strip() and pending is not None:
            raise MarkerError(f"{page}:{pending[0]}: a doc-test marker not directly before a block")
        index += 1
    if pending is not None:
        raise MarkerError(f"{page}:{pending[0]}: a doc-test marker with no block after it")
    return blocks


def doc_pages(root: Path = REPO_ROOT) -> list[Path]:
    return sorted({path for pattern in DOC_PAGES for path in root.glob(pattern)})


def all_blocks(root: Path = REPO_ROOT) -> list[DocBlock]:
    return [
        block for path in doc_pages(root) for block in read_blocks(path, path.relative_to(root).as_posix())
    ]
