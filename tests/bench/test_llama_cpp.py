"""The llama.cpp peer (xpuspec.bench.llama_cpp): finding the binary, the bundle's GGUF, the rows, the
summary; and, where a llama-server is built, a real comparison on the default model."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from xpuspec.bench import llama_cpp
from xpuspec.bench.llama_cpp import ChatResult, Row, RowRound, ServeComparison
from xpuspec.bundles import resolve_bundle


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


def _round(texts: list[str], tokens: int, seconds: float, start: float = 1.0) -> RowRound:
    return RowRound(start, [ChatResult(text, tokens, seconds, 0.01) for text in texts], 500.0)


def test_the_summary_takes_medians_ratios_and_agreement():
    ours, theirs = Row("xpuspec", "xpuspec default"), Row("llama.cpp", "llama.cpp -t 1")
    comparison = ServeComparison([ours, theirs], exact_texts=["a", "b"])
    comparison.rounds = {
        ours.label: [
            _round(["a", "b"], 100, 1.0),
            _round(["a", "b"], 100, 0.5),
            _round(["a", "b"], 100, 2.0),
        ],
        theirs.label: [_round(["a", "x"], 100, 1.0)] * 3,
    }
    summary = llama_cpp.summarise(comparison)
    by_row = {row["row"]: row for row in summary["rows"]}
    assert by_row["xpuspec default"]["tokens_per_s"] == pytest.approx(100.0)  # the median of 50, 100, 200
    assert by_row["xpuspec default"]["vs_llama_cpp_best"] == pytest.approx(1.0)
    assert by_row["xpuspec default"]["agreement_with_exact"] == 2
    assert by_row["llama.cpp -t 1"]["agreement_with_exact"] == 1
    table = llama_cpp.markdown(summary)
    assert "| xpuspec default | 100.0 | 1.00 |" in table and "1/2" in table


def test_a_missing_peer_is_one_line_in_the_table():
    summary = {"rows": [], "not_run": {"llama.cpp": "no llama-server"}}
    assert "llama.cpp: not run: no llama-server" in llama_cpp.markdown(summary)


# Looked up at import, in the user's cache: the tests' own private cache holds no build.
BUILT_LLAMA_SERVER = llama_cpp.find_llama_server()


@pytest.mark.slow
@pytest.mark.smollm2
@pytest.mark.skipif(
    BUILT_LLAMA_SERVER is None,
    reason="no llama-server built (scripts/build-llama-server.sh takes 10-30 min on 2 cores; not in CI)",
)
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
    assert all(row["tokens_per_s"] > 0 and row["peak_rss_mb"] for row in rows.values())
    assert "Paris" in comparison.exact_texts[0]
    assert os.path.exists(tmp_path / "servers" / "llama.cpp -t 1.log")
