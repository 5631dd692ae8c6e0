"""A tiny Q4_1 GGUF through ``prepare``: OpenVINO GenAI's reader rounds each block's minimum to a u4 zero
point, which left the file's own f32 computation (the numpy reference, research.bench.gguf_reference);
prepare keeps the minima (xpuspec.prepare.gguf_minima), so its IR in exact mode is that computation, and
research.bench.gguf_exact_minima finds nothing left to fix in it."""

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


def test_a_prepared_q4_1_gguf_computes_the_files_weights(tmp_path: Path):
    pytest.importorskip("gguf")
    from tests.support.tiny_checkpoints import make_tiny_checkpoint
    from tests.support.tiny_gguf import write_gguf_from_checkpoint

    checkpoint = make_tiny_checkpoint(tmp_path / "target", "llama", hidden_size=64, num_layers=2, seed=0)
    gguf = write_gguf_from_checkpoint(checkpoint, tmp_path / "tiny.gguf", dtype="Q4_1")
    assert main(["prepare", str(gguf), "-o", str(tmp_path / "bundle")]) == 0
    tensors, config = load(gguf)
    reference = log_softmax(forward(tensors, config, TOKENS))
    prepared = kl_divergence(reference, _exact_rows(tmp_path / "bundle")).mean()
    assert prepared < 1e-5, prepared
    assert exact_minima_copy(tmp_path / "bundle", gguf, tmp_path / "copy") == 0  # no u4 zero point left
