"""research.bench.gguf_exact_minima on a tiny Q4_1 GGUF: OpenVINO GenAI's reader rounds each block's
minimum to a u4 zero point, so its IR in exact mode leaves the file's own f32 computation (the numpy
reference); with the zero points made exact it is that computation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from research.bench.gguf_exact_minima import exact_minima_copy
from research.bench.gguf_reference import forward, load
from xpuspec.bench.quality import Candidate, compile_candidate, paged_plugin
from xpuspec.bench.quality_math import kl_divergence, log_softmax
from xpuspec.cli import main
from xpuspec.executor.properties import EXACT_PROPERTIES
from xpuspec.models.bundle import ModelBundle

TOKENS = [5, 17, 42, 99, 3, 250, 7, 64, 128, 11, 200, 31]


def _exact_rows(bundle: Path) -> np.ndarray:
    core = ov.Core()
    target = ModelBundle.open(bundle, verify=True).target
    exact = Candidate("exact", target, dict(EXACT_PROPERTIES))
    return log_softmax(compile_candidate(exact, core, paged_plugin("CPU", core), "CPU", 16).logits(TOKENS))


def test_exact_zero_points_make_the_ir_the_files_weights(tmp_path: Path):
    pytest.importorskip("gguf")
    from tests.support.tiny_checkpoints import make_tiny_checkpoint
    from tests.support.tiny_gguf import write_gguf_from_checkpoint

    checkpoint = make_tiny_checkpoint(tmp_path / "target", "llama", hidden_size=64, num_layers=2, seed=0)
    gguf = write_gguf_from_checkpoint(checkpoint, tmp_path / "tiny.gguf", dtype="Q4_1")
    assert main(["prepare", str(gguf), "-o", str(tmp_path / "bundle")]) == 0
    tensors, config = load(gguf)
    reference = log_softmax(forward(tensors, config, TOKENS))
    as_read = kl_divergence(reference, _exact_rows(tmp_path / "bundle")).mean()
    assert exact_minima_copy(tmp_path / "bundle", gguf, tmp_path / "fixed") == 2 * 7  # 2 layers x 7 matrices
    fixed = kl_divergence(reference, _exact_rows(tmp_path / "fixed")).mean()
    assert as_read > 1e-3 and fixed < 1e-5, (as_read, fixed)
