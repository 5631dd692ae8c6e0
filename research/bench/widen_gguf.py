"""A wider Llama GGUF that computes what the trained one does: a larger model to measure both engines on.

Issue 54 asks for the target's pass at llama.cpp's speed on a model of several hundred million
parameters built here, where no hub can be reached. This widens a trained Llama GGUF (the default
SmolLM2-135M) by an integer ``factor`` and keeps its function, in the manner of Net2Net:

- the residual stream is the old one repeated: hidden ``h`` becomes ``[h, h, ...]`` (``factor`` copies),
  so the token embedding repeats its columns and each norm its weights (RMSNorm's mean of squares over
  repeated channels is the old one);
- every product that reads the stream divides its columns by ``factor`` and repeats them, so it reads
  what it read before; every product that writes the stream repeats its rows;
- attention heads, key/value heads and FFN units are repeated the same way, copy after copy, which keeps
  grouped-query attention's head ``i`` reading key/value head ``i // group``: the copies of head ``h``
  read the copies of its key/value head;
- the LM head is untied: it reads the repeated stream, so its columns are divided too.

Every weight matrix is written in one ggml type (``Q8_0`` by default, as llama.cpp's converter writes
``--outtype q8_0``); norms stay F32. With F16 or F32 weights the wider model's logits equal the source's up to
float rounding (research/tests/bench/test_widen_gguf.py); with a quantised type they differ as that
quantisation of the source's weights does.

    python -m research.bench.widen_gguf SOURCE.gguf OUT.gguf --factor 2 --type Q8_0
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# The products: each reads a widened input (the stream, the attention heads or the FFN units), so its
# columns repeat divided by the factor; each but the LM head ("output") writes a widened output.
_PRODUCTS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "output")


@dataclass(frozen=True)
class Widened:
    """What was written: the new widths and the parameter count."""

    path: Path
    hidden: int
    feed_forward: int
    heads: int
    kv_heads: int
    parameters: int


def widen_matrix(name: str, weights: np.ndarray, factor: int) -> np.ndarray:
    """``weights`` (rows = outputs, columns = inputs, as ggml lays them out) of the tensor named ``name``
    (``blk.N.attn_q.weight``, ``token_embd.weight``, ...), widened by ``factor``."""
    kind = name.split(".")[-2]
    if kind == "token_embd":  # rows are tokens; each token's vector repeats
        return np.tile(weights, (1, factor))
    if kind == "rope_freqs":  # per dimension of a head, whose width does not change
        return weights
    if kind.endswith("norm") and weights.ndim == 1:  # a norm's weights over the stream
        return np.tile(weights, factor)
    if kind in _PRODUCTS:
        columns = np.tile(weights, (1, factor)) / np.float32(factor)
        return columns if kind == "output" else np.tile(columns, (factor, 1))
    raise ValueError(f"{name}: no rule to widen a tensor of this kind")


def _field_values(reader: Any) -> dict[str, Any]:
    return {name: field.contents() for name, field in reader.fields.items()}


def _dequantized(tensor: Any) -> np.ndarray:
    import gguf

    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    return np.asarray(values, dtype=np.float32).reshape(tuple(reversed([int(n) for n in tensor.shape])))


def widen_gguf(source: Path, out: Path, factor: int = 2, weight_type: str = "Q8_0") -> Widened:
    """Write ``out``: ``source`` (a Llama GGUF) ``factor`` times as wide, its matrices in ``weight_type``."""
    import gguf

    if factor < 2:
        raise ValueError(f"factor must be 2 or more, got {factor}")
    ggml_type = gguf.GGMLQuantizationType[weight_type]
    reader = gguf.GGUFReader(str(source))
    values = _field_values(reader)
    arch = str(values[gguf.Keys.General.ARCHITECTURE])
    if arch != "llama":
        raise ValueError(f"{source}: widens Llama GGUFs, not {arch!r}")
    widths = {
        f"{arch}.embedding_length": int(values[f"{arch}.embedding_length"]) * factor,
        f"{arch}.feed_forward_length": int(values[f"{arch}.feed_forward_length"]) * factor,
        f"{arch}.attention.head_count": int(values[f"{arch}.attention.head_count"]) * factor,
        f"{arch}.attention.head_count_kv": int(values[f"{arch}.attention.head_count_kv"]) * factor,
    }
    writer = gguf.GGUFWriter(str(out), arch)
    _copy_fields(reader, writer, {**widths, gguf.Keys.General.FILE_TYPE: _file_type(weight_type)})
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    names = list(tensors)
    if "output.weight" not in tensors:  # tied: the widened head is no longer the embedding
        names.insert(names.index("output_norm.weight") + 1, "output.weight")
    parameters = 0
    for name in names:
        weights = _dequantized(tensors[name] if name in tensors else tensors["token_embd.weight"])
        wide = widen_matrix(name, weights, factor)
        parameters += wide.size
        _add(writer, name, wide, ggml_type, gguf)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()
    return Widened(
        path=out,
        hidden=widths[f"{arch}.embedding_length"],
        feed_forward=widths[f"{arch}.feed_forward_length"],
        heads=widths[f"{arch}.attention.head_count"],
        kv_heads=widths[f"{arch}.attention.head_count_kv"],
        parameters=parameters,
    )


def _file_type(weight_type: str) -> int:
    import gguf

    names = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16"}
    return int(gguf.LlamaFileType[names.get(weight_type, f"MOSTLY_{weight_type}")])


def _copy_fields(reader: Any, writer: Any, overrides: dict[str, Any]) -> None:
    import gguf

    for field in reader.fields.values():
        # The writer adds the architecture and the GGUF.* header fields itself.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = overrides.get(field.name, field.contents())
        if field.name == gguf.Keys.General.NAME:
            value = f"{value} (widened)"
        writer.add_key_value(field.name, value, kind, sub_type=sub_type)


def _add(writer: Any, name: str, weights: np.ndarray, ggml_type: Any, gguf: Any) -> None:
    if weights.ndim == 1 or ggml_type == gguf.GGMLQuantizationType.F32:
        writer.add_tensor(name, weights.astype(np.float32))
    elif ggml_type == gguf.GGMLQuantizationType.F16:
        writer.add_tensor(name, weights.astype(np.float16))
    else:
        writer.add_tensor(name, gguf.quants.quantize(weights, ggml_type), raw_dtype=ggml_type)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("source", type=Path, help="a Llama GGUF")
    parser.add_argument("out", type=Path, help="the widened GGUF to write")
    parser.add_argument("--factor", type=int, default=2, help="how many times as wide (default: 2)")
    parser.add_argument("--type", default="Q8_0", help="ggml type of the matrices (default: Q8_0)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    widened = widen_gguf(args.source, args.out, args.factor, args.type)
    print(
        f"{widened.path}: hidden {widened.hidden}, FFN {widened.feed_forward}, heads {widened.heads} "
        f"({widened.kv_heads} key/value), {widened.parameters / 1e6:.0f}M parameters, {args.type}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
