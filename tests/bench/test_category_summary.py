"""The arithmetic of `bench --mode categories`' summary (xpuspec.bench.category_summary) from hand-made
rounds, its Markdown and its plot: ratios of medians, pooled acceptance, and the overall line."""

from __future__ import annotations

from pathlib import Path

import pytest

from xpuspec.bench import category_summary
from xpuspec.bench.categories import CategoriesRun, CategoryResult, Session, Speculation
from xpuspec.bench.chat_clients import ChatResult, ClientsRound
from xpuspec.bench.llama_cpp import XPUSPEC_ROWS, llama_rows
from xpuspec.bench.plots import CATEGORY_PLOT, write_category_plot

DEFAULT, TARGET_ONLY = (row.label for row in XPUSPEC_ROWS)
PLAIN, NGRAM = (row.label for row in llama_rows((2,)))


def _result(tokens: int, wall_s: float, speculation: Speculation | None = None) -> CategoryResult:
    """One category's round: two requests of ``tokens`` each (TTFT 10 and 30 ms) over ``wall_s``."""
    results = [ChatResult("x", tokens, wall_s / 2, 0.010, 0), ChatResult("y", tokens, wall_s / 2, 0.030, 1)]
    return CategoryResult(ClientsRound(1, results, wall_s), speculation or Speculation())


def _session(**categories: CategoryResult) -> Session:
    return Session(1.0, dict(categories))


def _run() -> CategoriesRun:
    """Two categories, three rounds. Per round (tokens over seconds):

    - default: chat 100/1, 100/2, 100/4 s; rag 100/1 s each round (drafts: 10 proposed, 6 accepted, over
      3 verifications, 80 tokens in 40 target passes, per category and round);
    - target-only: chat 100/2 s, rag 100/2 s;
    - llama.cpp plain: chat 100/4 s, rag 100/2 s; n-gram: chat 100/2 s, rag 100/4 s (4 drafted, 3 kept).
    """
    spec = Speculation(drafted=10, accepted=6, verification_steps=3, target_passes=40, generated=80)
    plain = Speculation(drafted=0, accepted=0, verification_steps=0, target_passes=200, generated=200)
    llama = Speculation(drafted=4, accepted=3)
    sessions = {
        (DEFAULT, 1): [
            _session(chat=_result(50, s, spec), rag=_result(50, 1.0, spec)) for s in (1.0, 2.0, 4.0)
        ],
        (TARGET_ONLY, 1): [_session(chat=_result(50, 2.0, plain), rag=_result(50, 2.0, plain))] * 3,
        (PLAIN, 1): [_session(chat=_result(50, 4.0), rag=_result(50, 2.0))] * 3,
        (NGRAM, 1): [_session(chat=_result(50, 2.0, llama), rag=_result(50, 4.0, llama))] * 3,
    }
    return CategoriesRun(
        rows=[*XPUSPEC_ROWS, *llama_rows((2,))],
        prompts={"chat": 2, "rag": 2},
        clients=(1,),
        max_tokens=50,
        rounds=3,
        sessions=sessions,
        left_out={"summarization": 8},
        environment={
            "cpu": "Test CPU",
            "cpu_flags": ["avx2"],
            "cores": 2,
            "load_average_at_start": [0.5, 0.4, 0.3],
        },
        bundle="demo",
    )


@pytest.fixture(scope="module")
def summary() -> dict:
    return category_summary.summarise(_run())


def test_each_category_takes_the_median_over_rounds_and_ratios_of_medians(summary: dict):
    chat, rag = summary["levels"][0]["categories"]
    assert chat["name"] == "multi-turn chat" and rag["name"] == "retrieval-augmented QA"
    default = chat["rows"][DEFAULT]
    assert default["tokens_per_s_by_round"] == [100.0, 50.0, 25.0]
    assert default["tokens_per_s"] == pytest.approx(50.0)
    assert default["ttft_p50_ms"] == pytest.approx(20.0) and default["requests"] == 6
    assert chat["default_vs_target_only"] == pytest.approx(1.0)  # 50 / 50
    assert chat["ngram_vs_plain"] == {NGRAM: pytest.approx(2.0)}  # 50 / 25
    assert chat["llama_cpp_best"] == NGRAM and chat["default_vs_llama_cpp_best"] == pytest.approx(1.0)
    assert rag["default_vs_target_only"] == pytest.approx(2.0)  # 100 / 50
    assert rag["ngram_vs_plain"] == {NGRAM: pytest.approx(0.5)}
    assert rag["llama_cpp_best"] == PLAIN and rag["default_vs_llama_cpp_best"] == pytest.approx(2.0)


def test_speculation_counts_pool_the_rounds(summary: dict):
    chat = summary["levels"][0]["categories"][0]
    default = chat["rows"][DEFAULT]
    assert (default["drafted"], default["accepted"], default["verification_steps"]) == (30, 18, 9)
    assert default["acceptance"] == pytest.approx(0.6)
    assert default["accepted_per_verification"] == pytest.approx(2.0)
    assert default["tokens_per_target_pass"] == pytest.approx(2.0)  # 240 tokens in 120 passes
    assert chat["rows"][TARGET_ONLY]["acceptance"] is None  # nothing drafted
    assert chat["rows"][TARGET_ONLY]["tokens_per_target_pass"] == pytest.approx(1.0)
    assert chat["rows"][NGRAM]["acceptance"] == pytest.approx(0.75)
    assert chat["rows"][NGRAM]["accepted_per_verification"] is None  # llama.cpp does not report passes
    assert chat["rows"][PLAIN]["acceptance"] is None


def test_overall_is_summed_tokens_over_summed_time_then_the_median(summary: dict):
    overall = summary["levels"][0]["overall"]
    # Default per round: 200 tokens over 2, 3 and 5 s.
    assert overall["rows"][DEFAULT]["tokens_per_s_by_round"] == [100.0, pytest.approx(66.67, abs=0.01), 40.0]
    assert overall["rows"][DEFAULT]["tokens_per_s"] == pytest.approx(200 / 3)
    assert overall["rows"][TARGET_ONLY]["tokens_per_s"] == pytest.approx(50.0)  # 200 over 4 s
    assert overall["default_vs_target_only"] == pytest.approx(4 / 3)
    assert overall["ngram_vs_plain"] == {NGRAM: pytest.approx(1.0)}  # both 200 over 6 s
    assert overall["default_vs_llama_cpp_best"] == pytest.approx((200 / 3) / (200 / 6))
    assert overall["rows"][DEFAULT]["acceptance"] == pytest.approx(0.6) and overall["prompts"] == 4
    assert "summed" in summary["overall_method"]


def test_the_markdown_names_the_cpu_every_category_and_what_was_left_out(summary: dict):
    text = category_summary.markdown(summary)
    assert "CPU: Test CPU (avx2), 2 cores; load average at start (1/5/15 min): 0.50 / 0.40 / 0.30" in text
    assert "| multi-turn chat | 2 | 50.0 · 20 ms | 50.0 · 20 ms | 25.0 · 20 ms | 50.0 · 20 ms |" in text
    assert f"| {NGRAM} ÷ plain |" in text and "| default ÷ llama.cpp best |" in text
    # chat: default ÷ target-only, n-gram ÷ plain, ÷ best, acceptance of the default and the n-gram row,
    # accepted per verifying pass, tokens per target pass.
    assert "| multi-turn chat | 1.00 | 2.00 | 1.00 | 60% | 75% | 2.00 | 2.00 |" in text
    assert "| **overall** | 1.33 | 1.00 | 2.00 | 60% | 75% | 2.00 | 2.00 |" in text
    assert "summarization: 8 prompt(s) left out" in text
    assert "summed over every category" in text


def test_without_llama_cpp_its_row_is_one_line_and_no_column():
    run = _run()
    run.rows = list(XPUSPEC_ROWS)
    run.sessions = {key: value for key, value in run.sessions.items() if key[0] in (DEFAULT, TARGET_ONLY)}
    run.not_run = {"llama.cpp": "no llama-server: build one"}
    summary = category_summary.summarise(run)
    chat = summary["levels"][0]["categories"][0]
    assert chat["ngram_vs_plain"] == {} and chat["default_vs_llama_cpp_best"] is None
    text = category_summary.markdown(summary)
    assert "llama.cpp: not run: no llama-server: build one" in text and "llama.cpp best" not in text


def test_the_plot_is_written_where_matplotlib_is(summary: dict, tmp_path: Path):
    pytest.importorskip("matplotlib")
    assert write_category_plot(summary, tmp_path) == {"file": CATEGORY_PLOT}
    assert (tmp_path / CATEGORY_PLOT).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    empty = {**summary, "levels": []}
    assert "reason" in write_category_plot(empty, tmp_path)
