"""How the latency section pairs rows with their peer and with the exact reference (no timings run)."""

from __future__ import annotations

from xpuspec.bench.figures import LatencyResult, RequestTiming
from xpuspec.bench.latency import (
    ADAPTIVE,
    GENAI,
    GENAI_DEFAULT,
    XPUSPEC,
    XPUSPEC_DEFAULT,
    XPUSPEC_EXACT,
    _compare_tokens,
    _label,
    _peer_ratios,
    genai_default_properties,
)


def _result(engine: str, length, tokens: list[list[int]], seconds: float) -> LatencyResult:
    result = LatencyResult(_label(engine, length), engine, length)
    result.record_round([RequestTiming(3, ids, seconds / len(tokens), None, None) for ids in tokens])
    return result


def test_rows_pair_with_the_peer_of_their_group_and_the_exact_reference():
    exact = [[1, 2, 3], [4, 5, 6]]
    results = [
        _result(XPUSPEC_EXACT, None, exact, 2.0),
        _result(XPUSPEC, None, [[1, 2, 3], [4, 5, 7]], 1.0),  # 6 tokens/s
        _result(XPUSPEC, ADAPTIVE, exact, 0.5),  # 12 tokens/s
        _result(GENAI, None, exact, 2.0),  # 3 tokens/s
        _result(GENAI, 2, exact, 1.0),  # 6 tokens/s
        _result(GENAI, 4, exact, 0.75),  # 8 tokens/s: GenAI's best fixed γ
        _result(XPUSPEC_DEFAULT, None, exact, 0.5),  # 12 tokens/s
        _result(GENAI_DEFAULT, None, [[9, 9, 9], [4, 5, 6]], 1.5),  # 4 tokens/s
    ]
    summaries = {r.name: r.summary() for r in results}
    _compare_tokens(results, summaries)
    _peer_ratios(results, summaries)
    assert summaries["xpuspec target-only"]["same_tokens_as_exact"] == "1/2"
    assert summaries["OpenVINO GenAI default target-only"]["same_tokens_as_exact"] == "1/2"
    assert summaries["xpuspec exact target-only"]["same_tokens_as_exact"] == "2/2"
    assert summaries["xpuspec target-only"]["ratio_to_peers"][GENAI] == 2.0  # same properties, same γ
    assert summaries["xpuspec speculative (adaptive γ)"]["ratio_to_peers"][GENAI] == 1.5  # vs best fixed γ
    assert summaries["xpuspec default target-only"]["ratio_to_peers"] == {GENAI: 3.0}  # vs GenAI's default
    assert "ratio_to_peers" not in summaries["OpenVINO GenAI target-only"]


def test_genai_defaults_are_explicit_cpu_plugin_defaults():
    properties = genai_default_properties()
    assert properties["INFERENCE_PRECISION_HINT"] in ("bf16", "f16", "f32")
    assert properties["KV_CACHE_PRECISION"] != "u8"  # GenAI's cache ports follow the compute precision
    assert isinstance(properties["DYNAMIC_QUANTIZATION_GROUP_SIZE"], int)
