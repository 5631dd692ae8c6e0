"""Hidden-state taps (EAGLE-3 features) against transformers' hidden states, on tiny 4-layer models."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from tests.conftest import F32
from tests.support.tiny_checkpoints import make_tiny_checkpoint
from xpuspec.core.chunks import SequenceChunk
from xpuspec.executor.graph_edits import make_paged_model
from xpuspec.executor.hidden_taps import HIDDEN_STATES_OUTPUT, add_hidden_state_taps, find_layer_boundaries
from xpuspec.executor.paged_runner import MODEL_FILE, PagedModelRunner
from xpuspec.spec_decode.eagle3.config import eagle3_default_layers

pytestmark = pytest.mark.slow

NUM_LAYERS = 4
ALL_BOUNDARIES = tuple(range(NUM_LAYERS + 1))  # 0 = embeddings .. 4 = last layer's output, pre-norm
# f32 graph against f32 torch. The tiny models' states are ~0.1 in magnitude and measured differences
# <= 4e-7 (GenAI's GGUF graph; 3e-8 for optimum's); a neighbouring boundary differs by ~0.05.
REFERENCE_ATOL = 5e-6
# Logits (~5 in magnitude) of the tapped and the untapped graph: the plugin may fuse them differently.
RUNNER_ATOL = 1e-5
NUM_BLOCKS = 16
HIDDEN = 64


def export_ir(checkpoint: Path, ir_dir: Path) -> Path:
    from optimum.intel import OVModelForCausalLM

    from xpuspec.prepare.export import quiet_tracing

    with quiet_tracing():
        model = OVModelForCausalLM.from_pretrained(checkpoint, export=True, stateful=True, compile=False)
        model.save_pretrained(ir_dir)
        del model  # its temporary export folder goes now, inside quiet_tracing
    return ir_dir


@dataclass(frozen=True)
class TinyModel:
    architecture: str
    checkpoint: Path
    ir: Path


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """A 4-layer random checkpoint (the engine's tiny models have 2 layers: too few boundaries) and its IR."""
    work = tmp_path_factory.mktemp(f"taps-{request.param}")
    checkpoint = make_tiny_checkpoint(work / "checkpoint", request.param, num_layers=NUM_LAYERS)
    return TinyModel(request.param, checkpoint, export_ir(checkpoint, work / "ir"))


@pytest.fixture(scope="module")
def tapped(tiny: TinyModel) -> PagedModelRunner:
    return PagedModelRunner(
        tiny.ir, properties=F32, num_blocks=NUM_BLOCKS, hidden_state_layers=ALL_BOUNDARIES
    )


@pytest.fixture(scope="module")
def untapped(tiny: TinyModel) -> PagedModelRunner:
    return PagedModelRunner(tiny.ir, properties=F32, num_blocks=NUM_BLOCKS)


def reference_boundaries(checkpoint: Path, tokens: list[int], round_to_f16: bool = False) -> np.ndarray:
    """transformers' residual stream at every boundary: ``[NUM_LAYERS + 1, len(tokens), hidden]``.

    ``hidden_states[i]`` of ``output_hidden_states=True`` is the stream entering layer ``i`` for
    ``i < NUM_LAYERS``; its last entry is after the final norm, so boundary ``NUM_LAYERS`` is read
    from the norm's input instead.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    if round_to_f16:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.copy_(parameter.half().float())
    captured: dict[str, torch.Tensor] = {}
    model.model.norm.register_forward_pre_hook(lambda _module, args: captured.update(pre_norm=args[0]))
    with torch.no_grad():
        output = model(torch.tensor([tokens]), output_hidden_states=True)
        final_normed = model.model.norm(captured["pre_norm"])
    states = list(output.hidden_states[:NUM_LAYERS]) + [captured["pre_norm"]]
    # The convention this reference relies on: HF's last entry is the normed final state.
    np.testing.assert_allclose(output.hidden_states[NUM_LAYERS].numpy(), final_normed.numpy(), atol=1e-6)
    return np.stack([state[0].numpy() for state in states])


def as_boundaries(rows: np.ndarray, layers: tuple[int, ...]) -> np.ndarray:
    """Tapped rows ``[tokens, len(layers) * hidden]`` -> ``[len(layers), tokens, hidden]``."""
    return rows.reshape(rows.shape[0], len(layers), HIDDEN).transpose(1, 0, 2)


def blocks(runner: PagedModelRunner, first: int, num_tokens: int) -> list[int]:
    """Consecutive blocks from ``first`` holding ``num_tokens`` positions (each test its own blocks)."""
    return list(range(first, first + -(-num_tokens // runner.block_size)))


def random_tokens(count: int, seed: int, vocab_size: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, vocab_size, size=count).tolist()


def test_prefill_and_continuation_match_transformers(tiny: TinyModel, tapped: PagedModelRunner) -> None:
    tokens = random_tokens(45, seed=1, vocab_size=tapped.vocab_size)
    expected = reference_boundaries(tiny.checkpoint, tokens)  # [5, 45, hidden]
    assert tapped.hidden_state_width == len(ALL_BOUNDARIES) * HIDDEN
    table = blocks(tapped, 0, 45)
    # A prefill chunk crossing a block boundary that samples one row: the taps still cover all 40.
    tapped.forward([SequenceChunk(tokens[:40], 0, table, num_logits=1)])
    prefill = tapped.hidden_states().copy()
    assert prefill.shape == (40, tapped.hidden_state_width) and prefill.dtype == np.float32
    np.testing.assert_allclose(as_boundaries(prefill, ALL_BOUNDARIES), expected[:, :40], atol=REFERENCE_ATOL)
    # A following multi-token chunk (a verification) reads the KV of the first.
    tapped.forward([SequenceChunk(tokens[40:], 40, table, num_logits=5)])
    np.testing.assert_allclose(
        as_boundaries(tapped.hidden_states(), ALL_BOUNDARIES), expected[:, 40:], atol=REFERENCE_ATOL
    )


def test_rows_follow_chunk_order_in_a_mixed_batch(tiny: TinyModel, tapped: PagedModelRunner) -> None:
    first = random_tokens(12, seed=2, vocab_size=tapped.vocab_size)
    second = random_tokens(20, seed=3, vocab_size=tapped.vocab_size)
    first_table, second_table = blocks(tapped, 4, 12), blocks(tapped, 6, 20)
    tapped.forward([SequenceChunk(second[:17], 0, second_table, 0)])
    tapped.start([SequenceChunk(first, 0, first_table, 1), SequenceChunk(second[17:], 17, second_table, 0)])
    with pytest.raises(RuntimeError, match="no finished inference"):
        tapped.hidden_states()
    tapped.wait()
    rows = as_boundaries(tapped.hidden_states(), ALL_BOUNDARIES)
    assert rows.shape[1] == 12 + 3
    np.testing.assert_allclose(
        rows[:, :12], reference_boundaries(tiny.checkpoint, first), atol=REFERENCE_ATOL
    )
    np.testing.assert_allclose(
        rows[:, 12:], reference_boundaries(tiny.checkpoint, second)[:, 17:], atol=REFERENCE_ATOL
    )


def test_taps_leave_the_logits_unchanged(tapped: PagedModelRunner, untapped: PagedModelRunner) -> None:
    tokens = random_tokens(30, seed=4, vocab_size=tapped.vocab_size)
    table = blocks(tapped, 8, 30)
    chunks = [SequenceChunk(tokens[:26], 0, table, 3)]
    with_taps = tapped.forward(chunks).copy()
    np.testing.assert_allclose(with_taps, untapped.forward(chunks), rtol=0, atol=RUNNER_ATOL)
    follow = [SequenceChunk(tokens[26:], 26, table, 4)]
    np.testing.assert_allclose(tapped.forward(follow), untapped.forward(follow), rtol=0, atol=RUNNER_ATOL)


def test_untapped_runner_compiles_no_extra_output(untapped: PagedModelRunner) -> None:
    assert [sorted(port.get_names()) for port in untapped.compiled_model.outputs] == [["logits"]]
    assert untapped.hidden_state_layers is None and untapped.hidden_state_width == 0
    with pytest.raises(RuntimeError, match="hidden_state_layers"):
        untapped.hidden_states()


def test_decode_lane_taps_too(tiny: TinyModel) -> None:
    """One-token steps run on the decode lane (a second compiled copy): it must carry the taps."""
    layers = (1, 3)
    runner = PagedModelRunner(
        tiny.ir, properties=F32, num_blocks=4, decode_lane=True, hidden_state_layers=layers
    )
    tokens = random_tokens(10, seed=5, vocab_size=runner.vocab_size)
    expected = reference_boundaries(tiny.checkpoint, tokens)[list(layers)]
    table = blocks(runner, 0, 10)
    runner.forward([SequenceChunk(tokens[:8], 0, table, 1)])
    rows = [runner.hidden_states().copy()]
    for position in (8, 9):
        runner.forward([SequenceChunk([tokens[position]], position, table, 1)])
        rows.append(runner.hidden_states().copy())
    assert [len(row) for row in rows] == [8, 1, 1]
    np.testing.assert_allclose(as_boundaries(np.concatenate(rows), layers), expected, atol=REFERENCE_ATOL)


def test_a_projection_maps_the_taps_inside_the_graph(tiny: TinyModel) -> None:
    """An EAGLE-3 head's fc folded into the target: the runner returns ``taps @ W.T``, one row a token,
    in prefill and decode steps alike."""
    import openvino.opset13 as opset

    layers = (1, 2, 3)
    weight = np.random.default_rng(7).standard_normal((HIDDEN, len(layers) * HIDDEN)).astype(np.float32)
    runner = PagedModelRunner(
        tiny.ir,
        properties=F32,
        num_blocks=4,
        hidden_state_layers=layers,
        hidden_state_projection=lambda states: opset.matmul(
            states, opset.constant(weight), False, True
        ).output(0),
    )
    assert runner.hidden_state_width == HIDDEN
    tokens = random_tokens(9, seed=6, vocab_size=runner.vocab_size)
    table = blocks(runner, 0, 9)
    runner.forward([SequenceChunk(tokens[:8], 0, table, 1)])
    rows = [runner.hidden_states().copy()]
    runner.forward([SequenceChunk(tokens[8:], 8, table, 1)])
    rows.append(runner.hidden_states().copy())
    raw = reference_boundaries(tiny.checkpoint, tokens)[list(layers)]  # [3, 9, hidden]
    expected = np.concatenate(list(raw), axis=-1) @ weight.T  # [9, hidden]
    np.testing.assert_allclose(np.concatenate(rows), expected, atol=1e-4)


def test_bad_layer_ids_and_models_are_refused(tiny: TinyModel) -> None:
    core = ov.Core()
    paged = make_paged_model(core.read_model(tiny.ir / MODEL_FILE))
    for bad in ([NUM_LAYERS + 1], [-1], []):
        with pytest.raises(ValueError, match=f"boundaries 0..{NUM_LAYERS}"):
            add_hidden_state_taps(paged, bad)
    assert add_hidden_state_taps(paged, [2]) == HIDDEN_STATES_OUTPUT
    assert paged.outputs[-1].get_partial_shape() == ov.PartialShape([-1, HIDDEN])
    with pytest.raises(ValueError, match="already has"):
        add_hidden_state_taps(paged, [2])
    with pytest.raises(ValueError, match="paged_attention_transformation"):
        add_hidden_state_taps(core.read_model(tiny.ir / MODEL_FILE), [2])
    with pytest.raises(ValueError, match="boundaries 0..4"):
        PagedModelRunner(tiny.ir, properties=F32, num_blocks=2, hidden_state_layers=[7])


def test_eagle3_default_layers() -> None:
    assert eagle3_default_layers(32) == (2, 16, 29)
    assert eagle3_default_layers(30) == (2, 15, 27)
    with pytest.raises(ValueError, match="at least 6 layers"):
        eagle3_default_layers(NUM_LAYERS)


def test_genai_gguf_conversion_is_tapped_alike(tiny: TinyModel, tmp_path: Path) -> None:
    """The same boundaries on GenAI's GGUF-built graph (another builder, other node names)."""
    pytest.importorskip("gguf")
    openvino_genai = pytest.importorskip("openvino_genai")
    from tests.support.tiny_gguf import write_gguf_from_checkpoint

    if tiny.architecture != "llama":
        pytest.skip("the GGUF writer of the tests writes Llama only")
    # GenAI converts F16 GGUFs (not F32): compare with the checkpoint's weights rounded to f16.
    gguf_path = write_gguf_from_checkpoint(tiny.checkpoint, tmp_path / "tiny.gguf", dtype="F16")
    openvino_genai.LLMPipeline(str(gguf_path), "CPU", enable_save_ov_model=True)
    assert (tmp_path / MODEL_FILE).is_file()
    boundaries = find_layer_boundaries(make_paged_model(ov.Core().read_model(tmp_path / MODEL_FILE)))
    assert len(boundaries) == NUM_LAYERS + 1

    runner = PagedModelRunner(tmp_path, properties=F32, num_blocks=2, hidden_state_layers=ALL_BOUNDARIES)
    tokens = random_tokens(20, seed=6, vocab_size=runner.vocab_size)
    runner.forward([SequenceChunk(tokens, 0, blocks(runner, 0, 20), 1)])
    expected = reference_boundaries(tiny.checkpoint, tokens, round_to_f16=True)
    np.testing.assert_allclose(
        as_boundaries(runner.hidden_states(), ALL_BOUNDARIES), expected, atol=REFERENCE_ATOL
    )
