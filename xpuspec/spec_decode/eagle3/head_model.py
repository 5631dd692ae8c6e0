"""The EAGLE-3 head as OpenVINO graphs built from numpy weights (no torch): the fusion and the layer.

The math, as the sources compute it (SafeAILab/EAGLE ``eagle/model/cnets.py``: ``Model``,
``LlamaDecoderLayeremb``; vLLM ``vllm/model_executor/models/llama_eagle3.py``; SGLang
``python/sglang/srt/models/llama_eagle3.py``), for ``g`` the fused or carried hidden state and ``e``
the target's token embedding of the *next* token:

- fusion: ``g = fc(concat(h_low, h_mid, h_high))``, ``fc`` ``[hidden, 3*hidden]`` without bias, on the
  target's tapped states only. The EAGLE reference applies ``fc`` exactly when the incoming state is
  wider than the embedding (``if hidden_states.shape[-1] != inputs_embeds.shape[-1]``); rollout steps
  feed the head's own output, which skips it (SGLang: the same test; vLLM: ``combine_hidden_states``
  called on target states only).
- residual: ``residual = g`` (the un-normed state; cnets ``residual = hidden_states`` before
  ``hidden_norm``; vLLM ``_norm_after_residual``, the default; vLLM's ``norm_before_residual`` config
  flag, used by some speculators-trained heads, takes the normed state instead, supported here).
- attention input: ``x = concat(input_layernorm(e), hidden_norm(g))`` ``[.., 2*hidden]``, embedding
  first (cnets ``torch.cat((input_emb, hidden_states), dim=-1)``; vLLM and SGLang the same order);
  ``q/k/v_proj`` read ``2*hidden`` features, ``o_proj`` writes ``hidden``.
- Llama attention: rotary embedding with ``rope_theta`` on q and k, half-split ``rotate_half`` layout
  (cnets ``LlamaRotaryEmbedding`` / ``apply_rotary_pos_emb``), grouped-query, scale ``1/sqrt(head_dim)``,
  f32 softmax; ``h = residual + o_proj(attn)``.
- MLP: ``out = h + down(silu(gate(post_attention_layernorm(h))) * up(...))``.
- outputs: ``logits = lm_head(norm(out))`` over the draft vocabulary; the state carried to the next
  rollout step is ``out``, *before* the final norm (cnets ``topK_genrate``: ``last_hidden =
  out_hidden[:, -1]``, fed back as ``input_hidden``, logits from ``lm_head(self.norm(last_hidden))``;
  vLLM and SGLang return ``(normed, prenorm)`` from the fused ``norm(hidden, residual)`` and carry the
  prenorm one).
- positions: the head's KV slot ``j`` holds the target's state at position ``j`` paired with the token
  at ``j + 1`` (cnets drops the first input id: ``input_ids = input_ids[:, 1:]``, with position ids
  ``arange(past, past + n)``; vLLM shifts ``input_ids`` left by one and keeps the target's positions).
  So a pass's position ids are the positions of the hidden states it reads; the caller passes them.

Graph interface of :func:`build_head_model` (``b`` sequences, ``n`` new positions, ``P`` past slots):

- inputs ``inputs_embeds [b, n, hidden]`` f32 (or ``input_ids [b, n]`` i64 when the head embeds them
  itself: ``embedding``), ``hidden_in [b, n, hidden]`` f32 (already fused, or
  carried), ``position_ids [b, n]`` i64, ``past_key`` / ``past_value [b, kv_heads, P, head_dim]`` f32,
  ``attention_mask [b, n, P + n]`` boolean (True: may attend; padded batches and tree masks are masks),
  ``logits_indices [b, k]`` i64 (which of the n positions get logits: the LM head over the draft
  vocabulary is the costliest matmul of a long first pass, and a chain step needs only the last);
- outputs ``logits [b, k, draft_vocab]``, ``hidden_out [b, n, hidden]``, ``present_key`` /
  ``present_value [b, kv_heads, n, head_dim]`` (rotated keys of the new positions only; the caller
  owns the cache).

The fusion is a second model (:func:`build_fusion_model`, ``target_hidden [m, 3*hidden] -> fused
[m, hidden]``) rather than a branch of this graph: the layer's input is then always ``[.., hidden]``, so
one pass can mix rows fused from the target (catch-up of verified tokens) with rows carried from the
head's own output (rollout), and the fusion runs once per verified token, not per draft step.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import openvino as ov
import openvino.opset13 as opset

from xpuspec.spec_decode.eagle3.config import Eagle3HeadConfig
from xpuspec.spec_decode.eagle3.weights import Eagle3HeadWeights

INPUTS_EMBEDS, HIDDEN_IN, POSITION_IDS = "inputs_embeds", "hidden_in", "position_ids"
INPUT_IDS = "input_ids"
PAST_KEY, PAST_VALUE, ATTENTION_MASK, LOGITS_INDICES = (
    "past_key",
    "past_value",
    "attention_mask",
    "logits_indices",
)
LOGITS, HIDDEN_OUT, PRESENT_KEY, PRESENT_VALUE = "logits", "hidden_out", "present_key", "present_value"
TARGET_HIDDEN, FUSED = "target_hidden", "fused"
_WEIGHT_TYPES = ("f32", "f16", "int8")


def _parameter(name: str, shape: list[int], element_type: ov.Type) -> ov.Node:
    node = opset.parameter(ov.PartialShape(shape), element_type, name=name)
    node.output(0).get_tensor().set_names({name})
    return node


def _result(output: ov.Output, name: str) -> ov.Node:
    output.get_tensor().set_names({name})
    node = opset.result(output)
    node.set_friendly_name(name)
    return node


def _shape(values: list[int]) -> ov.Node:
    return opset.constant(np.array(values, dtype=np.int64))


def quantise_int8_rows(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[out, in]`` -> (int8 ``[out, in]``, f32 scale ``[out, 1]``): symmetric, one scale per output row.

    Each row keeps its largest magnitude exact; a row of zeros stays zeros. ``q * scale`` is the weight
    the graph computes with (NNCF's data-free ``INT8_SYM``).
    """
    weight = np.asarray(weight, dtype=np.float32)
    if weight.ndim != 2:
        raise ValueError(f"int8 weights are matrices [out, in], got {list(weight.shape)}")
    scale = np.abs(weight).max(axis=1, keepdims=True) / 127.0
    scale[scale == 0] = 1.0
    return np.clip(np.rint(weight / scale), -127, 127).astype(np.int8), scale


def int8_weight(array: np.ndarray, name: str | None = None) -> ov.Output:
    """A torch-layout weight ``[out, in]`` as int8 rows (:func:`quantise_int8_rows`), dequantised in the
    graph: ``Constant(i8) -> Convert(f32) -> Multiply(scale)``, the decompression pattern the CPU and GPU
    plugins fold into a compressed-weight matmul."""
    quantised, scale = quantise_int8_rows(array)
    constant = opset.constant(quantised, name=name)
    return opset.multiply(opset.convert(constant, ov.Type.f32), opset.constant(scale)).output(0)


class _Weights:
    """Weight constants in f32, or matrices stored f16 or int8 behind their decompression.

    The head is small but runs γ times a round right after the target's pass has pushed it out of the
    caches: at int8 its matrices are a quarter of their f32 size, and a round of four head passes ran
    ~30% faster than at f32 weights (bf16 compute, SmolLM2-135M's head, caches flushed between rounds).
    """

    def __init__(self, weights: Eagle3HeadWeights, weight_type: str):
        if weight_type not in _WEIGHT_TYPES:
            raise ValueError(f"weight_type must be one of {_WEIGHT_TYPES}, got {weight_type!r}")
        self.tensors = weights.tensors
        self.weight_type = weight_type

    def __call__(self, name: str) -> ov.Output:
        array = self.tensors[name]
        if self.weight_type == "int8" and array.ndim == 2:
            return int8_weight(array, name)
        if self.weight_type == "f16" and array.ndim == 2:
            constant = opset.constant(array.astype(np.float16), name=name)
            return opset.convert(constant, ov.Type.f32).output(0)
        return opset.constant(array.astype(np.float32), name=name).output(0)


def _linear(x: ov.Output, weight: ov.Output) -> ov.Output:
    """``x @ weight.T`` for a torch-layout weight ``[out, in]``."""
    return opset.matmul(x, weight, transpose_a=False, transpose_b=True).output(0)


def _rms_norm(x: ov.Output, weight: ov.Output, eps: float) -> ov.Output:
    # x * (1 / sqrt(mean(x^2) + eps)) * weight: the form the CPU plugin fuses into one RMS node.
    two = opset.constant(np.array(2.0, np.float32))
    mean = opset.reduce_mean(opset.power(x, two), _shape([-1]), keep_dims=True)
    rms = opset.sqrt(opset.add(mean, opset.constant(np.array(eps, np.float32))))
    inverse = opset.divide(opset.constant(np.array(1.0, np.float32)), rms)
    return opset.multiply(opset.multiply(x, inverse), weight).output(0)


def _rotate(x: ov.Output, cos: ov.Output, sin: ov.Output) -> ov.Output:
    """``x * cos + rotate_half(x) * sin``; ``rotate_half`` is ``concat(-x2, x1)`` of the halves."""
    halves = opset.split(x, opset.constant(np.array(-1, np.int64)), 2)
    rotated = opset.concat([opset.negative(halves.output(1)), halves.output(0)], axis=-1)
    return opset.add(opset.multiply(x, cos), opset.multiply(rotated, sin)).output(0)


def fusion(weights: Eagle3HeadWeights, weight_type: str = "f32") -> Callable[[ov.Output], ov.Output]:
    """The head's ``fc`` as a graph function, ``[.., 3*hidden] -> [.., hidden]``: for a fusion model of
    its own, or folded into the target's taps (``PagedModelRunner(hidden_state_projection=...)``)."""
    weight = _Weights(weights, weight_type)("fc.weight")
    return lambda states: _linear(states, weight)


def build_fusion_model(
    config: Eagle3HeadConfig, weights: Eagle3HeadWeights, weight_type: str = "f32"
) -> ov.Model:
    """``fused [m, hidden] = fc(target_hidden [m, 3*hidden])``: the target's tapped states, fused."""
    target_hidden = _parameter(TARGET_HIDDEN, [-1, 3 * config.hidden_size], ov.Type.f32)
    fused = fusion(weights, weight_type)(target_hidden.output(0))
    return ov.Model([_result(fused, FUSED)], [target_hidden], "eagle3_fusion")


def _embed_ids_into(inputs_embeds: ov.Node, embedding: ov.Model) -> ov.Node:
    """Feed ``inputs_embeds``'s consumers from ``embedding`` (cloned) and return its ``input_ids [b, n]``
    Parameter, which replaces ``inputs_embeds`` among the model's inputs."""
    embedding = embedding.clone()
    (table_ids,) = embedding.get_parameters()
    input_ids = _parameter(INPUT_IDS, [-1, -1], ov.Type.i64)
    # The target's own ids may be [b, n] or flat [n]: feed them flat, read them back as [b, n, hidden].
    flat = opset.reshape(
        input_ids, _shape([-1] if table_ids.get_partial_shape().rank.get_length() == 1 else [1, -1]), False
    )
    table_ids.output(0).replace(flat.output(0))
    embedded = embedding.get_results()[0].input_value(0)
    if embedded.get_element_type() != ov.Type.f32:
        embedded = opset.convert(embedded, ov.Type.f32).output(0)
    batch_first = opset.concat([opset.shape_of(input_ids), _shape([-1])], axis=0)
    inputs_embeds.output(0).replace(opset.reshape(embedded, batch_first, False).output(0))
    return input_ids


def build_head_model(
    config: Eagle3HeadConfig,
    weights: Eagle3HeadWeights,
    weight_type: str = "f32",
    embedding: ov.Model | None = None,
) -> ov.Model:
    """The head's decoder layer, final norm and LM head over an explicit KV cache (module docstring).

    With ``embedding`` (a model ``input_ids -> embeddings``, e.g.
    :func:`xpuspec.spec_decode.eagle3.embedding.target_embedding_model`) the head reads token ids
    ``input_ids [b, n]`` i64 instead of ``inputs_embeds`` and embeds them itself: one call a draft
    instead of two (the separate lookup cost ~0.3 ms a draft in the engine, as much as a third of the
    head's own Python).
    """
    w = _Weights(weights, weight_type)
    hidden, head_dim, eps = config.hidden_size, config.head_dim, config.rms_norm_eps
    kv_heads, groups = config.num_key_value_heads, config.num_groups
    f32 = ov.Type.f32

    inputs_embeds = _parameter(INPUTS_EMBEDS, [-1, -1, hidden], f32)
    hidden_in = _parameter(HIDDEN_IN, [-1, -1, hidden], f32)
    position_ids = _parameter(POSITION_IDS, [-1, -1], ov.Type.i64)
    past_key = _parameter(PAST_KEY, [-1, kv_heads, -1, head_dim], f32)
    past_value = _parameter(PAST_VALUE, [-1, kv_heads, -1, head_dim], f32)
    attention_mask = _parameter(ATTENTION_MASK, [-1, -1, -1], ov.Type.boolean)
    logits_indices = _parameter(LOGITS_INDICES, [-1, -1], ov.Type.i64)

    embeds_normed = _rms_norm(inputs_embeds.output(0), w("midlayer.input_layernorm.weight"), eps)
    hidden_normed = _rms_norm(hidden_in.output(0), w("midlayer.hidden_norm.weight"), eps)
    residual = hidden_normed if config.norm_before_residual else hidden_in.output(0)
    x = opset.concat([embeds_normed, hidden_normed], axis=-1).output(0)  # [b, n, 2*hidden]

    # Rotary angles from the position ids: [b, n, head_dim], the two halves repeating the frequencies.
    inv_freq = opset.constant(config.rope_inverse_frequencies())  # [head_dim / 2]
    angles = opset.multiply(opset.unsqueeze(opset.convert(position_ids, f32), _shape([-1])), inv_freq)
    angles = opset.concat([angles, angles], axis=-1)
    cos, sin = opset.cos(angles), opset.sin(angles)

    # Queries grouped by their key/value head: [b, kv_heads, groups, n, head_dim], so the attention
    # broadcasts keys over the groups instead of repeating them.
    query = opset.reshape(
        _linear(x, w("midlayer.self_attn.q_proj.weight")), _shape([0, 0, kv_heads, groups, head_dim]), True
    )
    query = opset.transpose(query, _shape([0, 2, 3, 1, 4]))
    query = _rotate(query, opset.unsqueeze(cos, _shape([1, 2])), opset.unsqueeze(sin, _shape([1, 2])))
    query = opset.multiply(query, opset.constant(np.array(1.0 / np.sqrt(head_dim), np.float32)))

    def kv_heads_first(name: str) -> ov.Output:  # [b, n, kv*hd] -> [b, kv_heads, n, head_dim]
        projected = opset.reshape(_linear(x, w(name)), _shape([0, 0, kv_heads, head_dim]), True)
        return opset.transpose(projected, _shape([0, 2, 1, 3])).output(0)

    key = _rotate(
        kv_heads_first("midlayer.self_attn.k_proj.weight"),
        opset.unsqueeze(cos, _shape([1])),
        opset.unsqueeze(sin, _shape([1])),
    )
    value = kv_heads_first("midlayer.self_attn.v_proj.weight")
    keys = opset.unsqueeze(opset.concat([past_key, key], axis=2), _shape([2]))  # [b, kv, 1, P+n, hd]
    values = opset.unsqueeze(opset.concat([past_value, value], axis=2), _shape([2]))

    scores = opset.matmul(query, keys, transpose_a=False, transpose_b=True)  # [b, kv, groups, n, P+n]
    # finfo.min rather than -inf: a fully masked row (batch padding) softmaxes to uniform, not NaN.
    additive = opset.select(
        attention_mask,
        opset.constant(np.array(0.0, np.float32)),
        opset.constant(np.array(np.finfo(np.float32).min, np.float32)),
    )
    scores = opset.add(scores, opset.unsqueeze(additive, _shape([1, 2])))
    attended = opset.matmul(opset.softmax(scores, -1), values, False, False)  # [b, kv, groups, n, hd]
    attended = opset.reshape(attended, _shape([0, config.num_attention_heads, -1, head_dim]), True)
    attended = opset.reshape(
        opset.transpose(attended, _shape([0, 2, 1, 3])),
        _shape([0, 0, config.num_attention_heads * head_dim]),
        True,
    )
    after_attention = opset.add(residual, _linear(attended, w("midlayer.self_attn.o_proj.weight")))

    post = _rms_norm(after_attention.output(0), w("midlayer.post_attention_layernorm.weight"), eps)
    gate = opset.swish(_linear(post, w("midlayer.mlp.gate_proj.weight")))
    mlp = _linear(
        opset.multiply(gate, _linear(post, w("midlayer.mlp.up_proj.weight"))).output(0),
        w("midlayer.mlp.down_proj.weight"),
    )
    hidden_out = opset.add(after_attention, mlp).output(0)  # [b, n, hidden]

    # [b, k, hidden]: only the rows that get logits go through the final norm and the LM head.
    rows = opset.gather(hidden_out, logits_indices, opset.constant(np.array(1, np.int64)), 1)
    logits = _linear(_rms_norm(rows.output(0), w("norm.weight"), eps), w("lm_head.weight"))

    results = [
        _result(logits, LOGITS),
        _result(hidden_out, HIDDEN_OUT),
        _result(key, PRESENT_KEY),
        _result(value, PRESENT_VALUE),
    ]
    if embedding is not None:
        inputs_embeds = _embed_ids_into(inputs_embeds, embedding)
    parameters = [
        inputs_embeds,
        hidden_in,
        position_ids,
        past_key,
        past_value,
        attention_mask,
        logits_indices,
    ]
    return ov.Model(results, parameters, "eagle3_head")
