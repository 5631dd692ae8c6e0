"""compile_paged and warm_up_compiled: the compile half of the paged runner, run ahead (in a thread),
and the first passes through the compiled graphs before the runner exists."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from xpuspec.core.chunks import SequenceChunk
from xpuspec.executor.paged_compile import compile_in_background, compile_paged
from xpuspec.executor.paged_runner import PagedModelRunner, warm_up_compiled

F32_PROPERTIES = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
NUM_BLOCKS = 8


@pytest.fixture(scope="module")
def ir_dir(tiny_ir_dir: Callable[[str], Path]) -> Path:
    return tiny_ir_dir("llama")


def _logits(runner: PagedModelRunner) -> np.ndarray:
    prompt = SequenceChunk([3, 14, 15, 92, 65], 0, [1], num_logits=5)
    step = SequenceChunk([35], 5, [1], num_logits=1)
    return np.concatenate([runner.forward([prompt]).copy(), runner.forward([step]).copy()])


def test_a_runner_on_a_compile_warmed_in_a_thread_computes_as_one_that_compiled_itself(ir_dir):
    def work():
        compiled = compile_paged(ir_dir, properties=F32_PROPERTIES, decode_lane=True)
        warm_up_compiled(compiled, max_context=256)  # on a cache of its own: the runner's is untouched
        return compiled

    compiled = compile_in_background(work).result()
    ahead = PagedModelRunner(ir_dir, properties=F32_PROPERTIES, num_blocks=NUM_BLOCKS, compiled=compiled)
    own = PagedModelRunner(ir_dir, properties=F32_PROPERTIES, num_blocks=NUM_BLOCKS, decode_lane=True)
    assert ahead.has_decode_lane and ahead.compiled_model is compiled.main
    np.testing.assert_allclose(_logits(ahead), _logits(own), atol=1e-5)


def test_openvinos_compiled_model_cache_does_not_load_a_paged_model_back(ir_dir, tmp_path):
    # Why xpuspec sets no CACHE_DIR (docs/benchmarks.md, start-up): OpenVINO's CPU plugin needs the
    # head sizes the paged-attention transformation leaves in each attention node's rt_info, which
    # its compiled blob does not keep, so every start compiled again and rewrote the blob. When this
    # fails, OpenVINO loads paged models from its cache: the start can use it.
    core = ov.Core()
    core.set_property({"CACHE_DIR": str(tmp_path)})
    for _ in range(2):
        compiled = compile_paged(ir_dir, core=core)
    assert any(tmp_path.glob("*.blob"))  # the blob is written...
    assert compiled.main.get_property("LOADED_FROM_CACHE") is False  # ...and not loaded back
