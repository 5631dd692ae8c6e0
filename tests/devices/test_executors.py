"""create_runner and compile_ahead (xpuspec.devices.executors): a draft compiled ahead, in a thread,
makes the same runner as one compiled in create_runner."""

from __future__ import annotations

import dataclasses

import numpy as np
import openvino as ov
import pytest

from tests.conftest import EXACT_PRESET
from xpuspec.core.chunks import SequenceChunk
from xpuspec.devices.executors import compile_ahead, create_runner
from xpuspec.devices.placement import ResolvedDevice, resolve_device
from xpuspec.devices.registry import default_registry
from xpuspec.models.resolve import resolve_bundle
from xpuspec_plugins.npu import NpuPlugin

LIMITS = {"max_draft_tokens": 4, "max_sequences": 2, "max_context": 128}
CUT_VOCAB = 1000


@pytest.fixture(scope="module")
def demo_draft():
    return resolve_bundle("demo").draft


def _logits(runner) -> np.ndarray:
    chunk = SequenceChunk(token_ids=[5, 17, 42, 8], past_length=0, block_table=[0], num_logits=4)
    return runner.forward([chunk]).copy()


def test_a_draft_compiled_ahead_runs_as_one_compiled_in_create_runner(demo_draft):
    core = ov.Core()
    device = resolve_device("CPU", core, default_registry())
    options = {"logits_vocab": CUT_VOCAB, "core": core, **LIMITS}
    ahead = compile_ahead(device, demo_draft, "draft", EXACT_PRESET, **options)
    assert ahead is not None
    compiled = ahead.result()
    # The graph create_runner would compile for a draft: its decode lane and its cut LM head.
    assert compiled.decode_lane is not None
    built = create_runner(
        device, demo_draft, "draft", EXACT_PRESET, num_blocks=4, precompiled=compiled, **options
    )
    own = create_runner(device, demo_draft, "draft", EXACT_PRESET, num_blocks=4, **options)
    assert built.compiled_model is compiled.main and built.has_decode_lane
    assert built.vocab_size == own.vocab_size == CUT_VOCAB
    np.testing.assert_allclose(_logits(built), _logits(own), atol=1e-5)


def test_a_compile_error_comes_out_of_the_result(demo_draft, tmp_path):
    core = ov.Core()
    device = resolve_device("CPU", core, default_registry())
    empty = dataclasses.replace(demo_draft, path=tmp_path)  # no model there
    ahead = compile_ahead(device, empty, "draft", None, core=core, **LIMITS)
    assert ahead is not None
    with pytest.raises(ValueError, match="no openvino_model.xml"):
        ahead.result()


def test_only_the_paged_executor_compiles_ahead(demo_draft):
    # The stateful executor (an NPU's) compiles in create_runner: nothing starts early.
    device = ResolvedDevice("NPU", NpuPlugin())
    assert compile_ahead(device, demo_draft, "draft", None, core=None, **LIMITS) is None
