"""The doc-test convention as tests/docs/blocks.py reads it: every command block carries a marker, and a
marker that cannot be read, or that stands before no command block, is an error naming its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.blocks import Marker, MarkerError, all_blocks, parse_marker, read_blocks
from tests.docs.conftest import SERVE_COMMANDS


def blocks_of(tmp_path: Path, markdown: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "page.md"
    path.write_text(markdown)
    return read_blocks(path, "page.md")


def test_every_command_block_of_the_readme_and_docs_is_marked_and_most_run() -> None:
    blocks = all_blocks()  # raises MarkerError naming the first unmarked block
    pages = {block.page for block in blocks}
    assert {"README.md", "docs/api.md", "docs/server.md"} <= pages
    readme_runs = [block for block in blocks if block.page == "README.md" and block.marker.run]
    assert {block.language for block in readme_runs} >= {"bash", "python"}
    assert {block.marker.server for block in readme_runs} >= {"default"}


def test_markers_are_read_with_their_options() -> None:
    assert parse_marker("run") == Marker(run=True)
    assert parse_marker('run server=default expect="chat.completion"') == Marker(
        run=True, server="default", expect="chat.completion"
    )
    assert parse_marker("run default-model") == Marker(run=True, default_model=True)
    assert parse_marker("skip needs an NPU") == Marker(run=False, skip_reason="needs an NPU")


@pytest.mark.parametrize(
    "body",
    ["skip", "skip   ", "walk", "run server=gpu", "run fast", "run expect="],
)
def test_a_marker_that_says_nothing_clear_is_refused(body: str) -> None:
    with pytest.raises(MarkerError):
        parse_marker(body)


def test_a_block_is_found_with_its_marker_language_and_line(tmp_path: Path) -> None:
    (block,) = blocks_of(
        tmp_path,
        "# Page\n\n<!-- doc-test: run server=demo -->\n```bash\ncurl localhost:8000/health\n```\n"
        "\n```\ndiagram\n```\n",
    )
    assert (block.line, block.language, block.text) == (4, "bash", "curl localhost:8000/health\n")
    assert block.marker.server == "demo" and block.id == "page.md:4"


@pytest.mark.parametrize(
    "markdown, line",
    [
        ("text\n\n```python\nprint(1)\n```\n", "page.md:3"),  # a command block without a marker
        ("<!-- doc-test: run -->\n\nsome prose\n\n```bash\ntrue\n```\n", "page.md:1"),  # not directly before
        ("<!-- doc-test: run -->\n```toml\n[a]\n```\n", "page.md:1"),  # before a block that is no command
        ("<!-- doc-test: skip no reason given -->\n", "page.md:1"),  # before nothing at all
    ],
)
def test_a_missing_or_misplaced_marker_names_its_line(tmp_path: Path, markdown: str, line: str) -> None:
    with pytest.raises(MarkerError, match=line):
        blocks_of(tmp_path, markdown)


def test_each_server_a_marker_may_name_has_its_serve_command() -> None:
    from tests.docs.blocks import SERVERS

    assert set(SERVE_COMMANDS) == SERVERS
    assert all(command.startswith("xpuspec serve ") for command in SERVE_COMMANDS.values())
