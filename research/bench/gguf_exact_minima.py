"""A copy of a Q4_1 GGUF bundle whose IR keeps each block's minimum exactly (an experiment, not prepare).

    python -m research.bench.gguf_exact_minima --bundle B -o OUT

OpenVINO GenAI's GGUF reader writes a Q4_1 weight as ``u4 q -> Convert -> Subtract(u4 zero point) ->
Multiply(f16 scale d)``: the zero point is the block's -m/d rounded to an integer, where Q4_1's value is
d * q + m with an f16 minimum m. The q values and scales are the GGUF's exactly. Here each u4 zero point
is replaced by an f16 constant holding -m/d, read from the GGUF block whose q values the IR's equal, so
that the IR computes the file's weights (to f16's precision of -m/d). The copy's manifest is re-hashed;
`xpuspec quality OUT` then measures against the file's own weights (docs/benchmarks.md, "Quality against
exact mode").
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

import numpy as np


def q4_1_rows(path: Path) -> dict[bytes, np.ndarray]:
    """Each row of every Q4_1 tensor of the GGUF by its q values (natural order, as bytes): -m/d per block,
    f32. By row, not by tensor: the reader reorders the rows of Q and K (for the rotary embedding)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    found = {}
    for tensor in reader.tensors:
        if tensor.tensor_type.name != "Q4_1":
            continue
        rows = int(tensor.shape[1])
        raw = np.asarray(tensor.data).reshape(rows, -1, 20)
        scale = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        minimum = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        nibbles = raw[..., 4:]
        values = np.concatenate([nibbles & 15, nibbles >> 4], axis=-1).astype(np.uint8)
        zero_points = -minimum / scale
        for row in range(rows):
            found[values[row].tobytes()] = zero_points[row]
    return found


def _u4(constant: Any) -> np.ndarray:
    packed = constant.get_data()
    return np.stack([packed & 15, packed >> 4], axis=-1).reshape(-1)


def fix_zero_points(model: Any, blocks: dict[bytes, np.ndarray]) -> int:
    """Replace every matched u4 zero point with the exact f16 one; return how many were replaced."""
    import openvino as ov

    fixed = 0
    for op in model.get_ops():
        if op.get_type_name() != "Subtract":
            continue
        sources = [value.get_source_output().get_node() for value in op.inputs()]
        if any(node.get_type_name() != "Convert" for node in sources):
            continue
        constants = [node.input(0).get_source_output().get_node() for node in sources]
        if any(c.get_type_name() != "Constant" or c.get_element_type() != ov.Type.u4 for c in constants):
            continue
        values, zero_point = constants
        shape = list(zero_point.get_output_partial_shape(0).to_shape())
        rows = _u4(values)[: int(np.prod(shape)) * 32].reshape(shape[0], -1)
        found = [blocks.get(row.tobytes()) for row in rows]
        if any(row is None for row in found):
            continue
        exact = np.stack([row for row in found if row is not None])
        replacement = ov.opset13.constant(exact.reshape(shape).astype(np.float16))
        op.input(1).replace_source_output(replacement.output(0))
        fixed += 1
    return fixed


def exact_minima_copy(bundle_root: Path, gguf: Path, output: Path) -> int:
    """Copy the bundle to ``output`` with its target's Q4_1 zero points made exact; re-hash the manifest.
    Returns how many zero points were replaced."""
    import openvino as ov

    from xpuspec.models.bundle import hash_tree, write_manifest_field

    shutil.copytree(bundle_root, output)
    xml = output / "target" / "openvino_model.xml"
    model = ov.Core().read_model(str(xml))
    fixed = fix_zero_points(model, q4_1_rows(gguf))
    ov.save_model(model, str(xml.with_suffix(".tmp.xml")), compress_to_fp16=False)
    xml.with_suffix(".tmp.xml").replace(xml)
    xml.with_suffix(".tmp.bin").replace(xml.with_suffix(".bin"))
    write_manifest_field(output, "files", hash_tree(output))
    return fixed


def main() -> None:
    from xpuspec.models.resolve import resolve_bundle

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default=None)
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    bundle = resolve_bundle(args.bundle)
    fixed = exact_minima_copy(bundle.root, Path(bundle.target.facts["source"]), args.output)
    print(f"{fixed} Q4_1 zero points made exact in {args.output}")


if __name__ == "__main__":
    main()
