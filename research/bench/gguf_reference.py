"""An independent f32 reference for a Llama GGUF: its tensors dequantised by gguf-py, run in numpy.

    python -m research.bench.gguf_reference [--bundle B] [--tokens 40] [--passage prose]

The quality measure's reference is the bundle's own IR in exact mode. For a bundle prepared from a GGUF
that is the GGUF's weights only if OpenVINO GenAI's GGUF reader kept them exactly. This script checks
that: it runs the GGUF's dequantised tensors through a plain numpy Llama (f32, causal attention, the
rotary embedding on adjacent pairs as llama.cpp's converter permutes Q and K for it) on the first
``--tokens`` tokens of a passage of the quality text, and prints the perplexity and the KL divergence and
top-1 agreement of the bundle's exact mode against it; and, per weight subgraph of the IR, how far the
reader's dequantised weights are from gguf-py's (docs/benchmarks.md, "Quality against exact mode").
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np


def load(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The GGUF's tensors dequantised to f32 (shaped as numpy reads them: [out, in]) and its llama.* keys."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(path))
    config: dict[str, Any] = {}
    for name, field in reader.fields.items():
        if name.startswith("llama.") and len(field.data) == 1:
            value = field.parts[field.data[0]]
            if len(value) == 1:
                config[name] = value.tolist()[0]
    tensors = {
        tensor.name: dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        for tensor in reader.tensors
    }
    return tensors, config


def _rms(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def _rope(x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
    """Rotary embedding on adjacent pairs (llama.cpp's LLAMA rope; its converter permutes Q and K)."""
    dim = x.shape[-1]
    angles = positions[:, None] * base ** (-np.arange(0, dim, 2) / dim)[None, :]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = even * cos - odd * sin, even * sin + odd * cos
    return out


def forward(tensors: dict[str, np.ndarray], config: dict[str, Any], tokens: list[int]) -> np.ndarray:
    """Logits at every position of ``tokens`` (f32 numpy, no cache)."""
    heads, kv_heads = int(config["llama.attention.head_count"]), int(config["llama.attention.head_count_kv"])
    dim = int(config["llama.embedding_length"]) // heads
    eps = float(config["llama.attention.layer_norm_rms_epsilon"])
    base = float(config.get("llama.rope.freq_base", 10000.0))
    count = len(tokens)
    x = tensors["token_embd.weight"][tokens]
    positions = np.arange(count, dtype=np.float64)
    mask = np.triu(np.full((count, count), -np.inf), 1)
    for layer in range(int(config["llama.block_count"])):
        p = f"blk.{layer}."
        h = _rms(x, tensors[p + "attn_norm.weight"], eps)
        q = _rope((h @ tensors[p + "attn_q.weight"].T).reshape(count, heads, dim), positions, base)
        k = _rope((h @ tensors[p + "attn_k.weight"].T).reshape(count, kv_heads, dim), positions, base)
        v = (h @ tensors[p + "attn_v.weight"].T).reshape(count, kv_heads, dim)
        k, v = np.repeat(k, heads // kv_heads, 1), np.repeat(v, heads // kv_heads, 1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(dim) + mask
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        x = (
            x
            + np.einsum("hqk,khd->qhd", scores, v).reshape(count, heads * dim)
            @ tensors[p + "attn_output.weight"].T
        )
        h = _rms(x, tensors[p + "ffn_norm.weight"], eps)
        gate, up = h @ tensors[p + "ffn_gate.weight"].T, h @ tensors[p + "ffn_up.weight"].T
        x = x + ((gate / (1 + np.exp(-gate))) * up) @ tensors[p + "ffn_down.weight"].T
    x = _rms(x, tensors["output_norm.weight"], eps)
    return np.asarray(x @ tensors.get("output.weight", tensors["token_embd.weight"]).T)


def weight_errors(
    xml: Path, tensors: dict[str, np.ndarray], limit: int = 4
) -> list[tuple[str, float, float]]:
    """For the IR's first ``limit`` weight subgraphs: the GGUF tensor closest to it (by max difference),
    the mean absolute difference and the mean absolute weight."""
    import openvino as ov

    from xpuspec.prepare.gguf_weights import weight_outputs

    core = ov.Core()
    nodes = list(weight_outputs(core.read_model(str(xml))).values())[:limit]
    evaluator = ov.Model([ov.opset13.result(node.output(0)) for node in nodes], [], "weights")
    compiled = core.compile_model(evaluator, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    values = compiled.create_infer_request().infer({})
    found = []
    for index in range(len(nodes)):
        value = values[compiled.outputs[index]]
        same = [(name, t.reshape(value.shape)) for name, t in tensors.items() if t.size == value.size]
        name, closest = min(same, key=lambda item: float(np.abs(item[1] - value).max()))
        found.append((name, float(np.abs(closest - value).mean()), float(np.abs(closest).mean())))
    return found


def main() -> None:
    import openvino as ov

    from xpuspec.bench.quality import Candidate, compile_candidate, heldout_text, paged_plugin
    from xpuspec.bench.quality_math import kl_divergence, log_softmax
    from xpuspec.executor.properties import EXACT_PROPERTIES
    from xpuspec.models.resolve import resolve_bundle
    from xpuspec.text import Tokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default=None)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--passage", default="prose")
    args = parser.parse_args()
    bundle = resolve_bundle(args.bundle)
    tensors, config = load(Path(bundle.target.facts["source"]))
    core = ov.Core()
    text = next(p.text for p in heldout_text() if p.kind == args.passage)
    tokens = Tokenizer(bundle.target.path, core).encode(text, add_special_tokens=False)[: args.tokens]
    actual = np.asarray(tokens[1:])
    numpy_rows = log_softmax(forward(tensors, config, tokens))[:-1]
    exact = Candidate("exact", bundle.target, dict(EXACT_PROPERTIES))
    runner = compile_candidate(exact, core, paged_plugin("CPU", core), "CPU", len(tokens) + 1)
    ir_rows = log_softmax(runner.logits(tokens))[:-1]
    for label, rows in (("numpy on the GGUF", numpy_rows), ("the IR in exact mode", ir_rows)):
        perplexity = float(np.exp(-rows[np.arange(len(actual)), actual].mean()))
        print(f"{label}: perplexity {perplexity:.2f} on {len(actual)} positions")
    same = float((numpy_rows.argmax(-1) == ir_rows.argmax(-1)).mean())
    kl = float(kl_divergence(numpy_rows, ir_rows).mean())
    print(f"the IR in exact mode against numpy: KL mean {kl:.4f}, top-1 {same:.3f}")
    for name, error, magnitude in weight_errors(bundle.target.path / "openvino_model.xml", tensors):
        print(f"IR weights closest to {name}: mean |difference| {error:.4f}, mean |weight| {magnitude:.4f}")


if __name__ == "__main__":
    main()
