"""Every command block of the README and the docs pages runs as a reader would run it, so they cannot drift.

Shell blocks run in bash (`set -euo pipefail`) and Python blocks in this interpreter, each in an empty
folder, with `xpuspec` and `.venv/bin/xpuspec` meaning this checkout's CLI. A block marked
`server=NAME` runs against one shared `xpuspec serve` of that model: its own `xpuspec serve ... &` line
must be the command the fixture runs (tests/docs/conftest.py), and port 8000 (or the port of that
line) becomes the server's port.
A block passes when it exits 0, prints something on stdout (and `expect`, when given), writes no
traceback, and the server logged no 4xx/5xx answer to it. Identical blocks on two pages run once.
A skipped block prints its marker's reason (`pytest -ra`).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs.blocks import DocBlock, Marker, all_blocks
from tests.docs.conftest import DOC_PORT, SERVE_COMMANDS, DocServer, DocServers, doc_environment

# A hang guard, not a timing check: an example that streams to the end of the context (8192 tokens) runs
# past it, while the quick start's four commands take a few minutes on a loaded two-core machine.
BLOCK_TIMEOUT_S = 600
VENV_BIN = re.compile(r"(?<![\w./-])\.venv/bin/")
SERVE_LINE = re.compile(r"^\s*(?P<command>xpuspec serve\b[^&#]*?)\s*&\s*(?:#.*)?$")
PORT_OPTION = re.compile(r"--port[ =](?P<port>\d+)")
ERROR_ANSWER = re.compile(r"\b(?:GET|POST|PUT|DELETE|HEAD) (?P<route>/\S*) (?P<status>[45]\d\d)\b")


@dataclass(frozen=True)
class BlockRun:
    returncode: int
    stdout: str
    stderr: str
    server_log: str


_runs: dict[tuple[str, str, object], BlockRun] = {}  # identical blocks (README and a page) run once


def runnable_text(block: DocBlock) -> tuple[str, set[str]]:
    """The block as it runs here (the checkout's CLI, the shared server's start line taken out), and the
    ports it names for that server: 8000, or the `--port` of its serve line (Ollama's 11434, say)."""
    text = VENV_BIN.sub("", block.text)
    lines, ports = [], {DOC_PORT}
    for line in text.splitlines():
        match = SERVE_LINE.match(line)
        if match is None:
            lines.append(line)
            continue
        assert block.marker.server is not None, f"{block.id} starts a server: mark it server=default or demo"
        command = " ".join(match["command"].split())
        port = PORT_OPTION.search(command)
        if port is not None:
            ports.add(port["port"])
            command = PORT_OPTION.sub(f"--port {DOC_PORT}", command)
        assert command == SERVE_COMMANDS[block.marker.server], (
            f"{block.id} starts `{command}`, but server={block.marker.server} runs "
            f"`{SERVE_COMMANDS[block.marker.server]}` (tests/docs/conftest.py): make them agree"
        )
    return "\n".join(lines) + "\n", ports


def with_port(text: str, ports: set[str], server: DocServer | None) -> str:
    if server is None:
        return text
    return re.sub(rf"\b(?:{'|'.join(sorted(ports))})\b", str(server.port), text)


def run_block(block: DocBlock, folder: Path, bin_dir: Path, server: DocServer | None) -> BlockRun:
    text = with_port(*runnable_text(block), server)
    if block.is_shell:
        command = ["bash", "-c", "set -euo pipefail\n" + text]
    else:
        script = folder / "block.py"
        script.write_text(text)
        command = [sys.executable, str(script)]
    offset = server.log_size() if server is not None else 0
    result = subprocess.run(
        command,
        cwd=folder,
        env=doc_environment(bin_dir),
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    server_log = server.log_since(offset) if server is not None else ""
    return BlockRun(result.returncode, result.stdout, result.stderr, server_log)


def block_params() -> list[object]:
    params = []
    for block in all_blocks():
        marks = [pytest.mark.slow, pytest.mark.smollm2] if block.needs_default_model else []
        params.append(pytest.param(block, id=block.id, marks=marks))
    return params


@pytest.mark.parametrize("block", block_params())
def test_doc_block_runs(
    block: DocBlock,
    tmp_path: Path,
    doc_bin: Path,
    doc_servers: DocServers,
    request: pytest.FixtureRequest,
) -> None:
    if not block.marker.run:
        pytest.skip(f"{block.id}: {block.marker.skip_reason}")
    if block.needs_default_model:
        request.getfixturevalue("smollm2_gguf")  # skips without the default model's GGUF
    key = (block.language, block.text, block.marker)
    if key not in _runs:
        server = doc_servers.get(block.marker.server) if block.marker.server else None
        _runs[key] = run_block(block, tmp_path, doc_bin, server)
    run = _runs[key]
    found = problems(block, run)
    assert not found, "; ".join(found) + f"\n{block.id} ({block.language}):\n{block.text}\n{shown(run)}"


def problems(block: DocBlock, run: BlockRun) -> list[str]:
    """What a reader would see go wrong: an exit code, a traceback, no output, an error answer."""
    found = []
    if run.returncode != 0:
        found.append(f"exit {run.returncode}")
    if "Traceback" in run.stderr:
        found.append("a traceback on stderr")
    if not run.stdout.strip():
        found.append("nothing on stdout")
    if block.marker.expect is not None and block.marker.expect not in run.stdout:
        found.append(f"no {block.marker.expect!r} on stdout")
    errors = [match.group(0) for match in ERROR_ANSWER.finditer(run.server_log)]
    if errors:
        found.append(f"the server answered {errors}")
    return found


def shown(run: BlockRun) -> str:
    return (
        f"stdout:\n{run.stdout[-3000:]}\nstderr:\n{run.stderr[-3000:]}\nserver log:\n{run.server_log[-3000:]}"
    )


def test_a_block_the_server_answers_with_an_error_fails(
    tmp_path: Path, doc_bin: Path, doc_servers: DocServers
) -> None:
    """curl -s exits 0 on a 404; the access log still tells the test (as with a wrong model name)."""
    block = DocBlock(
        "page.md",
        1,
        "bash",
        "curl -s localhost:8000/v1/models/no-such-model\n",
        Marker(run=True, server="demo"),
    )
    run = run_block(block, tmp_path, doc_bin, doc_servers.get("demo"))
    assert run.returncode == 0 and run.stdout.strip(), shown(run)
    assert problems(block, run) == [f"the server answered {['GET /v1/models/no-such-model 404']}"], shown(run)


def test_a_serve_line_on_another_port_is_the_shared_server_on_its_port(
    tmp_path: Path, doc_bin: Path, doc_servers: DocServers
) -> None:
    block = DocBlock(
        "page.md",
        1,
        "bash",
        ".venv/bin/xpuspec serve --bundle demo --port 11434 &  # note\ncurl -s localhost:11434/v1/models\n",
        Marker(run=True, server="demo"),
    )
    assert runnable_text(block) == ("curl -s localhost:11434/v1/models\n", {"8000", "11434"})
    run = run_block(block, tmp_path, doc_bin, doc_servers.get("demo"))
    assert problems(block, run) == [] and "xpuspec-demo" in run.stdout, shown(run)


def test_a_serve_line_that_is_not_the_servers_command_is_refused() -> None:
    block = DocBlock(
        "page.md", 1, "bash", "xpuspec serve --api-key k &\n", Marker(run=True, server="default")
    )
    with pytest.raises(AssertionError, match="make them agree"):
        runnable_text(block)
    unmarked = DocBlock("page.md", 1, "bash", "xpuspec serve &\n", Marker(run=True))
    with pytest.raises(AssertionError, match="starts a server"):
        runnable_text(unmarked)
