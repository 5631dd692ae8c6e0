"""`xpuspec generate` streams from a running `xpuspec serve` of the same model, with no load of its own
(as `ollama run` does), and loads locally when no such server answers or when asked to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.conftest import LiveServer, free_port, start_server, stop_server
from xpuspec.cli import main


@pytest.fixture(scope="module")
def server(pair_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(pair_bundle, tmp_path_factory.mktemp("generate-server") / "server.log")
    yield live
    stop_server(live)


def _generate(pair_bundle: Path, *extra: str) -> list[str]:
    return ["generate", "--bundle", str(pair_bundle), "hello there", "--max-tokens", "6", *extra]


def test_a_running_server_of_the_same_model_answers(pair_bundle, server, capsys):
    assert main(_generate(pair_bundle, "--server", server.base_url, "--temperature", "0")) == 0
    out, err = capsys.readouterr()
    assert out.strip() and "loading" not in err
    assert err.strip().splitlines()[-1].startswith(f"[server {server.base_url}] 6 tokens in")
    assert "POST /v1/chat/completions" in server.log()


def test_raw_prompts_go_to_completions(pair_bundle, server, capsys):
    assert main(_generate(pair_bundle, "--server", server.base_url, "--raw")) == 0
    out, err = capsys.readouterr()
    assert out.startswith("hello there") and "[server " in err
    assert "POST /v1/completions" in server.log()


def test_local_and_load_time_flags_load_here(pair_bundle, server, capsys):
    for flags in (["--local"], ["--property", "INFERENCE_PRECISION_HINT=f32"]):
        assert main(_generate(pair_bundle, "--server", server.base_url, *flags)) == 0
        err = capsys.readouterr().err
        assert "loading" in err and "[server " not in err


def test_no_server_there_loads_here(pair_bundle, capsys):
    assert main(_generate(pair_bundle, "--server", f"http://127.0.0.1:{free_port()}")) == 0
    err = capsys.readouterr().err
    assert "loading" in err and "[server " not in err


def test_the_servers_refusal_is_one_line(pair_bundle, server, capsys):
    assert main(_generate(pair_bundle, "--server", server.base_url, "--temperature", "3")) == 2
    assert "temperature" in capsys.readouterr().err
