"""The widened GGUF computes what its source does: a tiny Llama and its double, both prepared by xpuspec
(GenAI's GGUF reader, the real OpenVINO runtime), give the same logits in exact mode."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from research.bench.widen_gguf import main, widen_gguf, widen_matrix
from tests.support.fixtures import F32
from tests.support.tiny_checkpoints import make_tiny_checkpoint
from tests.support.tiny_gguf import write_gguf_from_checkpoint
from xpuspec.core.chunks import SequenceChunk
from xpuspec.executor.paged_runner import PagedModelRunner
from xpuspec.prepare.config import PrepareConfig
from xpuspec.prepare.gguf import prepare_gguf_bundle


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("widen")
    checkpoint = make_tiny_checkpoint(work / "checkpoint", "llama", hidden_size=64, num_layers=2, seed=3)
    return write_gguf_from_checkpoint(checkpoint, work / "tiny.gguf", dtype="F16")


def _logits(gguf_path: Path, tokens: list[int]) -> np.ndarray:
    bundle = prepare_gguf_bundle(
        PrepareConfig(target=str(gguf_path), output=gguf_path.with_suffix(".bundle"))
    )
    runner = PagedModelRunner(bundle / "target", properties=F32, num_blocks=4)
    return runner.forward([SequenceChunk(tokens, 0, [0, 1], num_logits=len(tokens))])


def test_the_double_gives_the_same_logits(tiny_gguf: Path) -> None:
    wide = widen_gguf(tiny_gguf, tiny_gguf.with_name("wide.gguf"), factor=2, weight_type="F16")
    assert (wide.hidden, wide.feed_forward, wide.heads, wide.kv_heads) == (128, 256, 8, 4)
    fields = gguf.GGUFReader(str(wide.path)).fields
    assert fields["llama.embedding_length"].contents() == 128
    tokens = np.random.default_rng(0).integers(3, 300, size=40).tolist()
    narrow_logits, wide_logits = _logits(tiny_gguf, tokens), _logits(wide.path, tokens)
    assert wide_logits.shape == narrow_logits.shape == (40, narrow_logits.shape[1])
    np.testing.assert_allclose(wide_logits, narrow_logits, atol=1e-4)
    assert not np.allclose(narrow_logits[0], narrow_logits[1])  # positions differ: the check can fail


def test_a_product_that_reads_the_stream_reads_what_it_read() -> None:
    weights = np.arange(12, dtype=np.float32).reshape(3, 4)
    stream = np.array([1.0, -2.0, 0.5, 3.0], dtype=np.float32)
    wide = widen_matrix("blk.0.ffn_down.weight", weights, 3)
    assert wide.shape == (9, 12)
    np.testing.assert_allclose(wide @ np.tile(stream, 3), np.tile(weights @ stream, 3), rtol=1e-6)
    head = widen_matrix("output.weight", weights, 2)
    np.testing.assert_allclose(head @ np.tile(stream, 2), weights @ stream, rtol=1e-6)
    with pytest.raises(ValueError, match="no rule"):
        widen_matrix("blk.0.attn_q_norm.weight", weights, 2)


def test_the_command_names_the_widths(tiny_gguf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tiny_gguf.with_name("wide-q8.gguf")
    assert main([str(tiny_gguf), str(out), "--factor", "2", "--type", "Q8_0"]) == 0
    assert "hidden 128, FFN 256, heads 8 (4 key/value)" in capsys.readouterr().out
    types = {tensor.name: tensor.tensor_type for tensor in gguf.GGUFReader(str(out)).tensors}
    assert types["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert types["output_norm.weight"] == gguf.GGMLQuantizationType.F32
