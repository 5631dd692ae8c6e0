"""A Q4_1 GGUF's block minima survive the conversion: OpenVINO GenAI's reader rounds each to a u4 zero
point, and prepare puts the file's own -m/d back (``xpuspec.prepare.gguf_minima``). That the IR then
computes the file's weights is shown against a numpy reference in
research/tests/bench/test_gguf_exact_minima.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from tests.support.tiny_checkpoints import make_tiny_checkpoint
from tests.support.tiny_gguf import write_gguf_from_checkpoint
from xpuspec.prepare.gguf import convert_gguf
from xpuspec.prepare.gguf_minima import exact_zero_points, q4_1_zero_points
from xpuspec.prepare.gguf_model import GgufModel


def _zero_points(xml: Path) -> list[tuple[str, np.ndarray]]:
    """Each Subtract of a weight subgraph: its zero point's element type and values."""
    found = []
    for op in ov.Core().read_model(str(xml)).get_ops():
        if op.get_type_name() != "Subtract":
            continue
        node = op.input(1).get_source_output().get_node()
        if node.get_type_name() == "Convert":
            node = node.input(0).get_source_output().get_node()
        if node.get_type_name() == "Constant":
            found.append((node.get_element_type().get_type_name(), np.asarray(node.get_data(), np.float32)))
    return found


def test_a_q4_1_gguf_keeps_its_block_minima(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    checkpoint = make_tiny_checkpoint(tmp_path / "target", "llama", hidden_size=64, num_layers=2, seed=0)
    gguf = write_gguf_from_checkpoint(checkpoint, tmp_path / "tiny.gguf", dtype="Q4_1")
    convert_gguf(GgufModel.read(gguf, "target"), tmp_path / "ir")
    zero_points = _zero_points(tmp_path / "ir" / "openvino_model.xml")
    assert [kind for kind, _ in zero_points].count("u4") == 0
    exact = np.concatenate([row.ravel() for row in q4_1_zero_points(gguf).values()])
    kept = np.concatenate([values.ravel() for kind, values in zero_points if kind == "f16"])
    assert kept.size == exact.size  # one per block of 32 weights, every block of the file's
    # Every zero point is one of the file's -m/d (to f16), and most are not integers: none was rounded.
    assert np.isin(kept, exact.astype(np.float16).astype(np.float32)).all()
    assert np.mean(kept != np.round(kept)) > 0.5
    # Nothing is left to replace in the IR prepare wrote.
    assert (
        exact_zero_points(
            ov.Core().read_model(str(tmp_path / "ir" / "openvino_model.xml")), q4_1_zero_points(gguf)
        )
        == 0
    )
