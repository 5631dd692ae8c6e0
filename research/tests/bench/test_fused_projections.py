"""The fused-projections timer compiles the demo target both ways, checks their logits agree and times
each pass length."""

from __future__ import annotations

import pytest

from research.bench.fused_projections import main


def test_prints_the_logit_difference_and_a_line_per_pass_length(capsys):
    exact = ["--property", "INFERENCE_PRECISION_HINT=f32", "--property", "KV_CACHE_PRECISION=f32"]
    exact += ["--property", "DYNAMIC_QUANTIZATION_GROUP_SIZE=0"]
    assert main(["--bundle", "demo", "--tokens", "1,3", "--steps", "2", "--rounds", "2", *exact]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("largest logit difference, fused against unfused:")
    assert float(lines[0].rsplit(":", 1)[1]) < 1e-5
    assert [line.split(":")[0] for line in lines[1:]] == ["1 tokens", "3 tokens"]
    assert all("fused ÷ unfused" in line and "(median of 2 rounds)" in line for line in lines[1:])


def test_bad_arguments_are_usage_errors(tmp_path):
    for argv in (["--tokens", "x"], ["--tokens", "0"], ["--bundle", str(tmp_path / "none")]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
