"""`xpuspec serve` as a newcomer meets it: a taken port or a bad bundle is one line, readiness is one
line printed only once requests succeed, every served name and alias works, one access line per request."""

from __future__ import annotations

import os
import re
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import F32
from tests.server.conftest import NUM_KV_BLOCKS, REPO_ROOT, STARTUP_TIMEOUT_S, free_port
from xpuspec.edge import templates

READY = re.compile(r"^xpuspec serve: ready on (http://\S+) \(model: ([^;)]+)(?:; aliases: ([^)]*))?\)$")


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "xpuspec.cli", "serve", *args]


def environment() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("XPUSPEC_API_KEY", None)
    return env


def run_to_exit(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        serve_command(*args),
        cwd=REPO_ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_taken_port_is_one_line_and_exit_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_to_exit("--port", str(port))
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("xpuspec: error: cannot listen on ")  # the form every command uses
    assert f"127.0.0.1:{port}" in lines[0] and "--port" in lines[0]
    assert "Traceback" not in result.stderr and "terminate called" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("kind", ["missing folder", "not a bundle"])
def test_a_bad_bundle_is_one_line_and_exit_2_without_a_ready_line(tmp_path: Path, kind: str) -> None:
    bundle = tmp_path / "nothing-here"
    if kind == "not a bundle":
        bundle.mkdir()
    result = run_to_exit("--bundle", str(bundle), "--port", str(free_port()))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bundle) in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert "ready" not in result.stdout and "listening" not in result.stdout + result.stderr


class ServeProcess:
    """A `serve` process whose stdout is read line by line (to catch the ready line the moment it comes)."""

    def __init__(self, args: list[str], stderr_path: Path) -> None:
        self._stderr = stderr_path.open("wb")
        self.stderr_path = stderr_path
        self.process = subprocess.Popen(
            serve_command(*args),
            cwd=REPO_ROOT,
            env=environment(),
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        self.stdout_lines: list[str] = []

    def wait_for_line(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        assert self.process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if not selector.select(timeout=0.5):
                    continue
                line = self.process.stdout.readline().decode()
                if not line:
                    break  # the process ended
                self.stdout_lines.append(line.rstrip("\n"))
                match = pattern.match(line.rstrip("\n"))
                if match:
                    return match
        raise AssertionError(
            f"no line matching {pattern.pattern}; stdout {self.stdout_lines}:\n{self.stderr()}"
        )

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._stderr.close()
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode


def test_ready_line_then_every_name_answers_at_once(pair_bundle: Path, tmp_path: Path) -> None:
    properties = [arg for key, value in F32.items() for arg in ("--property", f"{key}={value}")]
    port = free_port()
    server = ServeProcess(
        [
            "--bundle",
            str(pair_bundle),
            "--port",
            str(port),
            "--num-kv-blocks",
            str(NUM_KV_BLOCKS),
            "--served-model-name",
            "tiny-pair",
            "--served-model-name",
            "alias-one",
            "--max-queue",
            "4",
            *properties,
        ],  # fmt: skip
        tmp_path / "stderr.log",
    )
    try:
        ready = server.wait_for_line(READY, STARTUP_TIMEOUT_S)
        # At once, no polling of /health: the ready line promises that requests succeed.
        client = openai.OpenAI(base_url=f"{ready.group(1)}/v1", api_key="unused", max_retries=0, timeout=60)
        for name in ("tiny-pair", "alias-one"):
            completion = client.completions.create(model=name, prompt="hello", max_tokens=4, temperature=0)
            assert completion.model == "tiny-pair"  # responses name the served model
            assert completion.usage is not None and completion.usage.completion_tokens == 4
        assert ready.group(1) == f"http://127.0.0.1:{port}"
        assert (ready.group(2), ready.group(3)) == ("tiny-pair", "alias-one")
        assert [model.id for model in client.models.list()] == ["tiny-pair"]  # one name per model
        assert client.models.retrieve("alias-one").id == "tiny-pair"
        ollama_names = [
            m["name"] for m in httpx.get(f"{ready.group(1)}/api/tags", timeout=10).json()["models"]
        ]
        assert ollama_names == ["tiny-pair:latest"]
        # The name /api/tags lists works on the OpenAI routes too.
        tagged = client.chat.completions.create(
            model="tiny-pair:latest", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert tagged.model == "tiny-pair"
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model=pair_bundle.name, prompt="hello", max_tokens=2)
        # n=5 can never fit a queue of 4: a 400 (the official client would retry a 503).
        with pytest.raises(openai.BadRequestError) as never:
            client.completions.create(model="alias-one", prompt="hello", max_tokens=2, n=5)
        assert never.value.body["param"] == "n"  # type: ignore[index]
        assert (
            client.completions.create(model="alias-one", prompt="hi", max_tokens=2, n=4).choices[3].index == 3
        )
        request_id = httpx.get(f"{ready.group(1)}/v1/models", timeout=10).headers["X-Request-Id"]
    finally:
        assert server.stop() == 0, server.stderr()[-3000:]
    log = server.stderr()
    # One access line per request: method, path, status, tokens, time, request id.
    access = [line for line in log.splitlines() if " /v1/" in line]
    assert len(access) == 9, log
    assert re.search(r"POST /v1/completions 200 tokens=4 \d+\.\d{3}s id=[0-9a-f]{32}$", access[0]), access[0]
    assert re.search(r"POST /v1/completions 404 tokens=- ", access[5]), access[5]
    assert re.search(r"POST /v1/completions 400 tokens=- ", access[6]), access[6]
    assert access[-1].endswith(f"id={request_id}")
    assert "Traceback" not in log
    assert server.stdout_lines == [ready.group(0)]  # nothing but the ready line on stdout


def test_quiet_turns_the_access_log_off(pair_bundle: Path, tmp_path: Path) -> None:
    server = ServeProcess(
        ["--bundle", str(pair_bundle), "--port", str(free_port()), "--num-kv-blocks", "64", "--quiet"],
        tmp_path / "stderr.log",
    )
    try:
        ready = server.wait_for_line(READY, STARTUP_TIMEOUT_S)
        assert ready.group(2) == pair_bundle.name  # the default name: the bundle folder's
        for _ in range(3):
            assert httpx.get(f"{ready.group(1)}/v1/models", timeout=10).status_code == 200
    finally:
        assert server.stop() == 0
    assert "/v1/models" not in server.stderr()


@pytest.mark.parametrize("log_health", [False, True])
def test_health_probes_are_logged_only_when_asked(
    pair_bundle: Path, tmp_path: Path, log_health: bool
) -> None:
    """A cache-keyed folder name serves its plain name, the folder's name an alias; /health's access
    lines only with --log-health."""
    keyed = tmp_path / "tiny-pair-0123456789ab"
    keyed.symlink_to(pair_bundle, target_is_directory=True)
    args = ["--bundle", str(keyed), "--port", str(free_port()), "--num-kv-blocks", "64"]
    server = ServeProcess([*args, *(["--log-health"] if log_health else [])], tmp_path / "stderr.log")
    try:
        ready = server.wait_for_line(READY, STARTUP_TIMEOUT_S)
        assert (ready.group(2), ready.group(3)) == ("tiny-pair", keyed.name)
        for _ in range(3):
            assert httpx.get(f"{ready.group(1)}/health", timeout=10).status_code == 200
        client = openai.OpenAI(base_url=f"{ready.group(1)}/v1", api_key="unused", max_retries=0, timeout=60)
        assert [model.id for model in client.models.list()] == ["tiny-pair"]
        reply = client.completions.create(model=keyed.name, prompt="hi", max_tokens=2, temperature=0)
        assert reply.model == "tiny-pair"
    finally:
        assert server.stop() == 0
    log = server.stderr()
    assert "GET /v1/models 200" in log and "POST /v1/completions 200" in log
    assert log.count("GET /health 200") == (3 if log_health else 0), log


def test_the_edge_launcher_serves_the_names_serve_would(tmp_path: Path) -> None:
    # run.sh passes the plain name and the aliases from edge.json (what `xpuspec serve` answers for
    # the same bundle), after any --served-model-name of the user's.
    (tmp_path / "edge.json").write_text(
        '{"bundle": {"path": "bundle", "name": "b_mine", "aliases": ["b_mine-0123456789ab"]}}'
    )
    script = templates.render(templates.RUN_SH, wheel="x.whl").splitlines()
    start = next(i for i, line in enumerate(script) if line.startswith("names="))
    loop = script[start : script.index("done", start) + 1]
    shell = "\n".join([f"python={sys.executable}", "set -- --port 1", *loop, 'printf "%s\\n" "$@"'])
    result = subprocess.run(["sh", "-c", shell], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert result.stdout.split() == [
        "--port",
        "1",
        "--served-model-name=b_mine",
        "--served-model-name=b_mine-0123456789ab",
    ]
    powershell = templates.render(templates.RUN_PS1, wheel="x.whl")
    assert "$bundleFacts.aliases" in powershell and '"--served-model-name=$_"' in powershell


BUDGET_LINE = re.compile(r"memory budget (\d+) MiB: KV cache (\d+) MiB = target (\d+) MiB \((\d+) tokens\)")


def test_the_memory_budget_is_logged_at_start_and_sizes_the_kv_cache(
    pair_bundle: Path, tmp_path: Path
) -> None:
    state = {}
    for budget in ("1", "2"):
        server = ServeProcess(
            ["--bundle", str(pair_bundle), "--port", str(free_port()), "--memory-budget", budget, "--quiet"],
            tmp_path / f"stderr-{budget}.log",
        )
        try:
            ready = server.wait_for_line(READY, STARTUP_TIMEOUT_S)
            state[budget] = httpx.get(f"{ready.group(1)}/v1/xpuspec/state", timeout=10).json()
        finally:
            assert server.stop() == 0
        lines = [line for line in server.stderr().splitlines() if "memory budget" in line]
        assert len(lines) == 1, server.stderr()[-2000:]
        found = BUDGET_LINE.search(lines[0])
        assert found is not None, lines[0]
        assert found.group(1) == budget and int(found.group(2)) <= int(budget)
        assert "compiled-shape cache 64 entries per model" in lines[0]
    # Twice the budget, about twice the blocks (each budget rounds down to whole blocks).
    assert 1.8 < state["2"]["kv_blocks_total"] / state["1"]["kv_blocks_total"] < 2.2
