"""The llama.cpp peer (xpuspec.bench.llama_cpp): finding the binary, the bundle's GGUF, the rows, the
summary; and, where a llama-server is built, real comparisons: concurrent clients on a tiny GGUF, one
chat at a time on the default model."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from xpuspec.bench import llama_cpp
from xpuspec.bench.chat_clients import ChatResult, ClientsRound
from xpuspec.bench.llama_cpp import Row, RowRound, ServeComparison
from xpuspec.models.resolve import resolve_bundle


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_the_binary_is_the_given_one_then_the_env_then_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XPUSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(llama_cpp.LLAMA_SERVER_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert llama_cpp.find_llama_server() is None
    cached = _executable(tmp_path / "cache" / "llama.cpp" / "11434.0.0" / "bin" / "llama-server")
    assert llama_cpp.find_llama_server() == cached
    from_env = _executable(tmp_path / "env" / "llama-server")
    monkeypatch.setenv(llama_cpp.LLAMA_SERVER_ENV, str(from_env))
    assert llama_cpp.find_llama_server() == from_env
    given = _executable(tmp_path / "given")
    assert llama_cpp.find_llama_server(given) == given
    assert llama_cpp.find_llama_server(tmp_path / "absent") is None


def test_only_a_bundle_prepared_from_a_gguf_names_one():
    assert llama_cpp.bundle_gguf(resolve_bundle("demo")) is None


@pytest.mark.smollm2
def test_the_default_model_names_its_gguf():
    path = llama_cpp.bundle_gguf(resolve_bundle(None))
    assert path is not None and path.suffix == ".gguf" and path.is_file()


def test_rows_cover_threads_with_and_without_ngram_speculation():
    rows = llama_cpp.llama_rows((1, 2))
    assert [row.args for row in rows] == [
        ("-t", "1"),
        ("-t", "1", "--spec-type", "ngram-mod"),
        ("-t", "2"),
        ("-t", "2", "--spec-type", "ngram-mod"),
    ]


def _round(texts: list[str], tokens: int, wall_s: float, clients: int = 1, ttft_s: float = 0.01) -> RowRound:
    results = [ChatResult(text, tokens, wall_s, ttft_s, index) for index, text in enumerate(texts)]
    return RowRound(1.0, ClientsRound(clients, results, wall_s), 500.0)


def test_the_summary_takes_medians_ratios_and_agreement_per_client_count():
    ours, theirs = Row("xpuspec", "xpuspec default"), Row("llama.cpp", "llama.cpp -t 1")
    comparison = ServeComparison([ours, theirs], clients=(1, 16), exact_texts=["a", "b"])
    comparison.rounds = {
        (ours.label, 1): [
            _round(["a", "b"], 100, 2.0),
            _round(["a", "b"], 100, 1.0),
            _round(["a", "b"], 100, 4.0),
        ],
        (theirs.label, 1): [_round(["a", "x"], 100, 2.0)] * 3,
        (ours.label, 16): [_round(["a", "b"], 100, 0.5, clients=16)] * 3,
        (theirs.label, 16): [_round(["y", "b"], 100, 1.0, clients=16)] * 3,
    }
    summary = llama_cpp.summarise(comparison)
    by_row = {(row["row"], row["clients"]): row for row in summary["rows"]}
    one = by_row[("xpuspec default", 1)]
    assert one["tokens_per_s"] == pytest.approx(100.0)  # 200 tokens over 2 s: the median of 50, 100, 200
    assert one["vs_llama_cpp_best"] == pytest.approx(1.0)
    assert one["agreement_with_exact"] == 2 and by_row[("llama.cpp -t 1", 1)]["agreement_with_exact"] == 1
    assert by_row[("xpuspec default", 16)]["tokens_per_s"] == pytest.approx(400.0)
    assert by_row[("llama.cpp -t 1", 16)]["requests"] == 6
    assert summary["default_vs_llama_cpp_best"] == {"1": pytest.approx(1.0), "16": pytest.approx(2.0)}
    table = llama_cpp.markdown(summary)
    assert (
        "| xpuspec default | 1 | 100.0 | 1.00 |" in table
        and "| xpuspec default | 16 | 400.0 | 2.00 |" in table
    )


def test_ttft_percentiles_are_over_every_request_of_every_round():
    row = Row("xpuspec", "xpuspec default")
    rounds = [_round(["a"] * 50, 10, 1.0, ttft_s=0.010), _round(["a"] * 50, 10, 1.0, ttft_s=0.010)]
    rounds[1].results[-1].ttft_s = 1.0  # one slow first token among 100 requests
    summary = llama_cpp.summarise(ServeComparison([row], exact_texts=["a"], rounds={(row.label, 1): rounds}))
    entry = summary["rows"][0]
    assert entry["ttft_p50_ms"] == pytest.approx(10.0)
    assert 10.0 < entry["ttft_p99_ms"] < 1000.0 and entry["requests"] == 100


def test_each_llama_server_slot_holds_a_chat_within_the_model_window(tmp_path):
    bundle = resolve_bundle("demo")
    assert llama_cpp.slot_context(bundle, 128) == min(bundle.max_context, 2048)
    server = llama_cpp.LlamaServer(
        tmp_path / "llama-server",
        tmp_path / "m.gguf",
        Row("llama.cpp", "x"),
        1024,
        tmp_path / "log",
        slots=16,
    )
    assert server.command[server.command.index("-np") + 1] == "16"
    assert server.command[server.command.index("-c") + 1] == str(16 * 1024)


def test_a_missing_peer_is_one_line_in_the_table():
    summary = {"rows": [], "not_run": {"llama.cpp": "no llama-server"}}
    assert "llama.cpp: not run: no llama-server" in llama_cpp.markdown(summary)


# Looked up at import, in the user's cache: the tests' own private cache holds no build.
BUILT_LLAMA_SERVER = llama_cpp.find_llama_server()


NO_LLAMA_SERVER = (
    "no llama-server built (scripts/build-llama-server.sh takes 10-30 min on 2 cores; not in CI)"
)


@pytest.fixture(scope="module")
def tiny_gguf_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle prepared from a tiny random Llama written as an F16 GGUF, which llama-server loads too."""
    pytest.importorskip("gguf")
    from tests.support.tiny_gguf import tiny_llama_gguf
    from xpuspec.cli import main

    work = tmp_path_factory.mktemp("tiny_gguf")
    gguf = tiny_llama_gguf(work)
    assert main(["prepare", str(gguf), "-o", str(work / "bundle")]) == 0
    return work / "bundle"


@pytest.mark.slow
@pytest.mark.skipif(BUILT_LLAMA_SERVER is None, reason=NO_LLAMA_SERVER)
def test_concurrent_clients_reach_both_servers(tiny_gguf_bundle: Path, tmp_path: Path):
    prompts = [[{"role": "user", "content": "Hello"}], [{"role": "user", "content": "Name a colour."}]]
    comparison = llama_cpp.run_serve_comparison(
        tiny_gguf_bundle,
        resolve_bundle(tiny_gguf_bundle),
        prompts,
        rounds=1,
        max_tokens=8,
        out=tmp_path,
        llama_server=BUILT_LLAMA_SERVER,
        threads=(1,),
        clients=(3,),
    )
    assert comparison.not_run == {}
    summary = llama_cpp.summarise(comparison)
    rows = {row["row"]: row for row in summary["rows"]}
    assert set(rows) == {"xpuspec default", "xpuspec target-only", "llama.cpp -t 1", "llama.cpp -t 1 n-gram"}
    # Three clients, two prompts: the prompts are cycled so that every client sends one at least.
    assert all(
        row["clients"] == 3 and row["requests"] == 3 and row["tokens_per_s"] > 0 for row in rows.values()
    )
    assert all(row["ttft_p99_ms"] >= row["ttft_p50_ms"] > 0 for row in rows.values())
    assert summary["default_vs_llama_cpp_best"]["3"] > 0
    # llama-server ran with a slot per client.
    log = (tmp_path / "servers" / "llama.cpp -t 1 at 3 clients.log").read_text()
    assert "n_slots = 3" in log
    assert len(comparison.exact_texts) == 2


@pytest.mark.slow
@pytest.mark.smollm2
@pytest.mark.skipif(BUILT_LLAMA_SERVER is None, reason=NO_LLAMA_SERVER)
def test_a_real_comparison_with_llama_server(tmp_path):
    bundle = resolve_bundle(None)
    prompts = [[{"role": "user", "content": "What is the capital of France?"}]]
    comparison = llama_cpp.run_serve_comparison(
        None,
        bundle,
        prompts,
        rounds=1,
        max_tokens=16,
        out=tmp_path,
        llama_server=BUILT_LLAMA_SERVER,
        threads=(1,),
    )
    summary = llama_cpp.summarise(comparison)
    rows = {row["row"]: row for row in summary["rows"]}
    assert {"llama.cpp -t 1", "llama.cpp -t 1 n-gram", "xpuspec default"} <= set(rows)
    assert all(row["clients"] == 1 for row in rows.values())
    assert all(row["tokens_per_s"] > 0 and row["peak_rss_mb"] for row in rows.values())
    assert "Paris" in comparison.exact_texts[0]
    assert os.path.exists(tmp_path / "servers" / "llama.cpp -t 1.log")


def test_the_serve_mode_refuses_a_client_count_below_one(capfd):
    from xpuspec.api.errors import EXIT_USAGE
    from xpuspec.cli import main

    assert main(["bench", "--mode", "serve", "--concurrency", "0", "--bundle", "demo"]) == EXIT_USAGE
    assert "client counts must be >= 1" in capfd.readouterr().err


def test_rounds_rotate_the_rows_and_a_failing_row_stays_out_of_its_client_count(tmp_path):
    rows = [Row("xpuspec", "a"), Row("xpuspec", "b"), Row("xpuspec", "c")]
    plan = llama_cpp.ServerRows(rows, {}, None, None, None, 1024, tmp_path)
    order: list[tuple[str, int]] = []

    def session(row: Row, opened: object, clients: int) -> str:
        order.append((row.label, clients))
        if row.label == "b":
            raise RuntimeError("b failed\nand more")
        return row.label

    results = llama_cpp.run_rounds(plan, 3, (1, 4), session)
    per_count = ["a", "b", "c", "c", "a", "c", "a"]  # rotated each round; b out after it failed
    assert order == [(label, 1) for label in per_count] + [(label, 4) for label in per_count]
    assert results == {("a", 1): ["a"] * 3, ("c", 1): ["c"] * 3, ("a", 4): ["a"] * 3, ("c", 4): ["c"] * 3}
    assert plan.not_run["b"].startswith("b failed (log: ") and "b at 4 clients" in plan.not_run
