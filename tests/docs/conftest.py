"""The doc tests' shared pieces: a bin folder where `xpuspec` and `python` are this checkout's, and one
`xpuspec serve` per model, started once by the first block that needs it and stopped after the module."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.docs.blocks import REPO_ROOT
from tests.server.conftest import free_port

# The serve command each server= marker stands for, as the docs write it; a block's serve line must be
# this command, which the fixture then runs (on a free port in place of 8000).
SERVE_COMMANDS = {
    "default": "xpuspec serve --port 8000",
    "demo": "xpuspec serve --bundle demo --port 8000",
}
DOC_PORT = "8000"
# A first use converts the default model before serving it; on a loaded CI machine that takes minutes.
READY_TIMEOUT_S = 600.0
READY_LINE = "xpuspec serve: ready on "
LOG_SETTLE_S, LOG_SETTLE_MAX_S = 0.5, 5.0


def doc_environment(bin_dir: Path) -> dict[str, str]:
    """The environment a reader has after `source .venv/bin/activate`, with this checkout on the path."""
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env.pop("XPUSPEC_API_KEY", None)
    return env


@pytest.fixture(scope="module")
def doc_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`xpuspec` and `python` as the docs' blocks call them: this interpreter and this checkout's CLI."""
    bin_dir = tmp_path_factory.mktemp("doc_bin")
    scripts = {
        "xpuspec": f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m xpuspec.cli "$@"\n',
        "python": f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n',
    }
    for name, text in scripts.items():
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_dir


@dataclass
class DocServer:
    """One running `xpuspec serve`; its stderr (the access log) goes to a file the tests read."""

    name: str
    port: int
    process: subprocess.Popen[bytes]
    stdout_path: Path
    stderr_path: Path

    def log_size(self) -> int:
        return self.stderr_path.stat().st_size

    def log_since(self, offset: int) -> str:
        """The log written after `offset`, once it has settled: a request's access line is written when
        its response closes, which can be just after the client has read the whole response."""
        deadline, size = time.monotonic() + LOG_SETTLE_MAX_S, -1
        while size != self.log_size() and time.monotonic() < deadline:
            size = self.log_size()
            time.sleep(LOG_SETTLE_S)
        with self.stderr_path.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if READY_LINE in self.stdout_path.read_text(errors="replace"):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.5)
        raise AssertionError(
            f"`{SERVE_COMMANDS[self.name]}` did not become ready (exit {self.process.poll()}):\n"
            + self.stderr_path.read_text(errors="replace")[-4000:]
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # serve drains and exits 0 on SIGTERM
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class DocServers:
    """Started on first use, one per model, shared by every block that names it."""

    bin_dir: Path
    folder: Path
    running: dict[str, DocServer] = field(default_factory=dict)

    def get(self, name: str) -> DocServer:
        if name not in self.running:
            port = free_port()
            words = [port_word(word, port) for word in shlex.split(SERVE_COMMANDS[name])]
            stdout_path, stderr_path = self.folder / f"{name}.out", self.folder / f"{name}.err"
            with stdout_path.open("wb") as stdout, stderr_path.open("wb") as stderr:
                process = subprocess.Popen(
                    [sys.executable, "-m", "xpuspec.cli", *words[1:]],
                    cwd=self.folder,
                    env=doc_environment(self.bin_dir),
                    stdout=stdout,
                    stderr=stderr,
                )
            server = DocServer(name, port, process, stdout_path, stderr_path)
            self.running[name] = server
            server.wait_ready(READY_TIMEOUT_S)
        return self.running[name]

    def stop(self) -> None:
        for server in self.running.values():
            server.stop()


def port_word(word: str, port: int) -> str:
    return str(port) if word == DOC_PORT else word


@pytest.fixture(scope="module")
def doc_servers(doc_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocServers]:
    servers = DocServers(doc_bin, tmp_path_factory.mktemp("doc_servers"))
    yield servers
    servers.stop()
