"""research.bench.gguf_reference: the numpy Llama on a GGUF's tensors matches the IR OpenVINO GenAI's
reader makes of an F16 GGUF (whose weights it keeps exactly), so a gap on a Q4_1 GGUF is the reader's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from research.bench.gguf_reference import forward, load
from xpuspec.bench.quality import Candidate, compile_candidate, paged_plugin
from xpuspec.bench.quality_math import kl_divergence, log_softmax
from xpuspec.cli import main
from xpuspec.executor.properties import EXACT_PROPERTIES
from xpuspec.models.bundle import ModelBundle


def test_numpy_on_an_f16_gguf_is_the_ir_in_exact_mode(tmp_path: Path):
    pytest.importorskip("gguf")
    from tests.support.tiny_gguf import tiny_llama_gguf

    gguf = tiny_llama_gguf(tmp_path)
    assert main(["prepare", str(gguf), "-o", str(tmp_path / "bundle")]) == 0
    bundle = ModelBundle.open(tmp_path / "bundle")
    tensors, config = load(gguf)
    tokens = [5, 17, 42, 99, 3, 250, 7, 64, 128, 11, 200, 31]
    core = ov.Core()
    runner = compile_candidate(
        Candidate("exact", bundle.target, dict(EXACT_PROPERTIES)), core, paged_plugin("CPU", core), "CPU", 16
    )
    ir = log_softmax(runner.logits(tokens))
    reference = log_softmax(forward(tensors, config, tokens))
    assert np.all(ir.argmax(-1) == reference.argmax(-1))
    assert float(kl_divergence(reference, ir).max()) < 1e-4
