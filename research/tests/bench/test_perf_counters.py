"""The per-layer counter tool runs on the demo bundle and reports every variant and node type."""

from __future__ import annotations

import pytest

from research.bench.perf_counters import VARIANTS, main, measure
from xpuspec.models.demo import demo_bundle_path


def test_counters_cover_each_variant_and_the_attention_node():
    variants = {name: VARIANTS[name] for name in ("bf16+u8kv", "bf16+bf16kv")}
    results = measure(demo_bundle_path() / "target", variants, steps=3, rounds=2)
    assert set(results) == set(variants)
    for name, result in results.items():
        if "error" in result:  # an AVX2-only CPU refuses a bf16 KV cache, and the tool says so
            assert name == "bf16+bf16kv" and "bf16" in result["error"]
            continue
        assert len(result["round_ms"]) == 2 and all(ms > 0 for ms in result["round_ms"])
        assert result["nodes_ms"]["PagedAttentionExtension"] > 0


def test_command_line(capsys):
    assert main(["--role", "draft", "--steps", "2", "--rounds", "1", "--variants", "exact"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("exact ") and "per step, by node type" in out


def test_verification_steps_of_several_tokens(capsys):
    results = measure(
        demo_bundle_path() / "target", {"exact": VARIANTS["exact"]}, steps=3, rounds=1, tokens=4
    )
    assert len(results["exact"]["round_ms"]) == 1 and results["exact"]["named_ms"]
    assert main(["--steps", "2", "--rounds", "1", "--variants", "exact", "--tokens", "1,3"]) == 0
    out = capsys.readouterr().out
    assert "1 token per step:" in out and "3 tokens per step:" in out and "costliest nodes" in out


def test_tokens_must_be_positive():
    with pytest.raises(SystemExit):
        main(["--tokens", "0"])


def test_a_missing_bundle_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--bundle", str(tmp_path / "nowhere")])
    assert exit_info.value.code == 2
    assert "no such bundle folder" in capsys.readouterr().err
