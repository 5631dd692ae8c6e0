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

:func:`build_greedy_rollout_model` unrolls the same layer γ times into one graph for a greedy chain (each
pass's argmax, mapped to its target id, is the next pass's token): the latency case in one call.

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
    caches: at int8 its matrices are a quarter of their f32 size, and a round of head passes ran
    clearly faster than at f32 weights (measured: docs/experiments/2026-12-03-eagle3-against-genai.md).
    """

    def __init__(self, weights: Eagle3HeadWeights, weight_type: str):
        if weight_type not in _WEIGHT_TYPES:
            raise ValueError(f"weight_type must be one of {_WEIGHT_TYPES}, got {weight_type!r}")
        self.tensors = weights.tensors
        self.weight_type = weight_type
        self._made: dict[str, ov.Output] = {}  # one constant per weight, however many passes read it

    def __call__(self, name: str) -> ov.Output:
        if name not in self._made:
            self._made[name] = self._constant(name)
        return self._made[name]

    def _constant(self, name: str) -> ov.Output:
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


def _embedding_function(embedding: ov.Model) -> Callable[[ov.Output], ov.Output]:
    """``ids [b, n]`` i64 -> ``[b, n, hidden]`` f32 through a clone of ``embedding`` per call (clones share
    the table's constant, so each call adds only the lookup's few nodes)."""

    def embed(ids: ov.Output) -> ov.Output:
        model = embedding.clone()
        (table_ids,) = model.get_parameters()
        # The target's own ids may be [b, n] or flat [n]: feed them flat, read them back as [b, n, hidden].
        flat_shape = [-1] if table_ids.get_partial_shape().rank.get_length() == 1 else [1, -1]
        table_ids.output(0).replace(opset.reshape(ids, _shape(flat_shape), False).output(0))
        embedded = model.get_results()[0].input_value(0)
        if embedded.get_element_type() != ov.Type.f32:
            embedded = opset.convert(embedded, ov.Type.f32).output(0)
        batch_first = opset.concat([opset.shape_of(ids), _shape([-1])], axis=0)
        return opset.reshape(embedded, batch_first, False).output(0)

    return embed


def _decoder_layer(
    w: _Weights,
    config: Eagle3HeadConfig,
    embeds: ov.Output,
    hidden_in: ov.Output,
    position_ids: ov.Output,
    past_key: ov.Output,
    past_value: ov.Output,
    attention_mask: ov.Output,
) -> tuple[ov.Output, ov.Output, ov.Output]:
    """The decoder layer (module docstring) -> ``hidden_out [b, n, hidden]`` and the new positions' rotated
    keys and values ``[b, kv_heads, n, head_dim]``; attends to ``past`` then the new positions."""
    head_dim, eps = config.head_dim, config.rms_norm_eps
    kv_heads, groups = config.num_key_value_heads, config.num_groups
    f32 = ov.Type.f32

    embeds_normed = _rms_norm(embeds, w("midlayer.input_layernorm.weight"), eps)
    hidden_normed = _rms_norm(hidden_in, w("midlayer.hidden_norm.weight"), eps)
    residual = hidden_normed if config.norm_before_residual else hidden_in
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
    return hidden_out, key, value


def _logits(w: _Weights, config: Eagle3HeadConfig, rows: ov.Output) -> ov.Output:
    """``[b, k, hidden]`` states -> ``[b, k, draft_vocab]``: the final norm and the LM head."""
    return _linear(_rms_norm(rows, w("norm.weight"), config.rms_norm_eps), w("lm_head.weight"))


def _head_parameters(config: Eagle3HeadConfig, embedding: ov.Model | None) -> dict[str, ov.Node]:
    hidden, kv_heads, head_dim = config.hidden_size, config.num_key_value_heads, config.head_dim
    f32 = ov.Type.f32
    first = (
        {INPUT_IDS: _parameter(INPUT_IDS, [-1, -1], ov.Type.i64)}
        if embedding is not None
        else {INPUTS_EMBEDS: _parameter(INPUTS_EMBEDS, [-1, -1, hidden], f32)}
    )
    return {
        **first,
        HIDDEN_IN: _parameter(HIDDEN_IN, [-1, -1, hidden], f32),
        POSITION_IDS: _parameter(POSITION_IDS, [-1, -1], ov.Type.i64),
        PAST_KEY: _parameter(PAST_KEY, [-1, kv_heads, -1, head_dim], f32),
        PAST_VALUE: _parameter(PAST_VALUE, [-1, kv_heads, -1, head_dim], f32),
        ATTENTION_MASK: _parameter(ATTENTION_MASK, [-1, -1, -1], ov.Type.boolean),
        LOGITS_INDICES: _parameter(LOGITS_INDICES, [-1, -1], ov.Type.i64),
    }


def build_head_model(
    config: Eagle3HeadConfig,
    weights: Eagle3HeadWeights,
    weight_type: str = "f32",
    embedding: ov.Model | None = None,
) -> ov.Model:
    """The head's decoder layer, final norm and LM head over an explicit KV cache (module docstring).

    With ``embedding`` (a model ``input_ids -> embeddings``, e.g.
    :func:`xpuspec.executor.eagle3_embedding.target_embedding_model`) the head reads token ids
    ``input_ids [b, n]`` i64 instead of ``inputs_embeds`` and embeds them itself: one call a draft
    instead of two (the separate lookup cost a sizeable share of the head's own Python a draft).
    """
    w = _Weights(weights, weight_type)
    inputs = _head_parameters(config, embedding)
    first = next(iter(inputs.values())).output(0)
    embeds = _embedding_function(embedding)(first) if embedding is not None else first
    hidden_out, key, value = _decoder_layer(
        w,
        config,
        embeds,
        inputs[HIDDEN_IN].output(0),
        inputs[POSITION_IDS].output(0),
        inputs[PAST_KEY].output(0),
        inputs[PAST_VALUE].output(0),
        inputs[ATTENTION_MASK].output(0),
    )
    # [b, k, hidden]: only the rows that get logits go through the final norm and the LM head.
    rows = opset.gather(hidden_out, inputs[LOGITS_INDICES], opset.constant(np.array(1, np.int64)), 1)
    results = [
        _result(_logits(w, config, rows.output(0)), LOGITS),
        _result(hidden_out, HIDDEN_OUT),
        _result(key, PRESENT_KEY),
        _result(value, PRESENT_VALUE),
    ]
    return ov.Model(results, list(inputs.values()), "eagle3_head")


DRAFT_IDS, LOGIT_SUMS = "draft_ids", "logit_sums"


def build_greedy_rollout_model(
    config: Eagle3HeadConfig,
    weights: Eagle3HeadWeights,
    target_ids: np.ndarray,
    steps: int,
    weight_type: str = "f32",
    embedding: ov.Model | None = None,
) -> ov.Model:
    """A greedy chain of ``steps`` drafts for one sequence in one call: the head's pass over the new
    positions, then ``steps - 1`` rollout passes, each feeding the previous pass's last ``hidden_out`` and
    its argmax token (mapped to its target id through ``target_ids [draft_vocab]``).

    Inputs as :func:`build_head_model`'s at batch 1, with ``input_ids`` (``embedding`` is required) and
    ``logits_indices [1, 1]`` naming the last new position. Outputs: ``draft_ids [1, steps]`` i64 (target
    ids), ``logit_sums [1, steps]`` (a NaN or infinity in a pass's logits shows there), and the new
    positions' ``present_key`` / ``present_value``; the rollout passes' keys stay inside the graph, as the
    step-by-step caller cuts them off its cache after drafting anyway. Ties go to the lowest draft id,
    as ``numpy.argmax``'s do.
    """
    if embedding is None:
        raise ValueError("a rollout embeds the ids it drafts: give the target's embedding model")
    if steps < 1:
        raise ValueError(f"a rollout drafts at least one token, got steps={steps}")
    w = _Weights(weights, weight_type)
    embed = _embedding_function(embedding)
    inputs = _head_parameters(config, embedding)
    last = inputs[LOGITS_INDICES]  # [1, 1]
    axis_1 = opset.constant(np.array(1, np.int64))
    table = opset.constant(np.asarray(target_ids, np.int64))  # [draft_vocab]

    def last_row(x: ov.Output) -> ov.Output:  # [1, n, ...] -> [1, 1, ...] at the last new position
        return opset.gather(x, last, axis_1, 1).output(0)

    hidden_out, key, value = _decoder_layer(
        w,
        config,
        embed(inputs[INPUT_IDS].output(0)),
        inputs[HIDDEN_IN].output(0),
        inputs[POSITION_IDS].output(0),
        inputs[PAST_KEY].output(0),
        inputs[PAST_VALUE].output(0),
        inputs[ATTENTION_MASK].output(0),
    )
    carried = last_row(hidden_out)  # [1, 1, hidden]
    position = last_row(inputs[POSITION_IDS].output(0))  # [1, 1]
    mask = last_row(inputs[ATTENTION_MASK].output(0))  # [1, 1, P + n]
    keys, values = [inputs[PAST_KEY].output(0), key], [inputs[PAST_VALUE].output(0), value]
    drafted, sums = [], []
    for step in range(steps):
        logits = _logits(w, config, carried)  # [1, 1, draft_vocab]
        sums.append(opset.reduce_sum(logits, _shape([2]), keep_dims=False).output(0))  # [1, 1]
        best = opset.topk(logits, 1, -1, "max", "value", "i64", stable=True).output(1)  # [1, 1, 1]
        token = opset.gather(table, opset.squeeze(best, _shape([2])), opset.constant(np.array(0, np.int64)))
        drafted.append(token.output(0))  # [1, 1]
        if step == steps - 1:
            break
        position = opset.add(position, opset.constant(np.array([[1]], np.int64))).output(0)
        # The new pass attends to the valid past, the new positions and every earlier rollout pass.
        step_mask = opset.concat([mask, opset.constant(np.ones((1, 1, step + 1), np.bool_))], axis=2)
        carried, step_key, step_value = _decoder_layer(
            w,
            config,
            embed(token.output(0)),
            carried,
            position,
            opset.concat(keys, axis=2).output(0),
            opset.concat(values, axis=2).output(0),
            step_mask.output(0),
        )
        keys.append(step_key)
        values.append(step_value)
    results = [
        _result(opset.concat(drafted, axis=1).output(0), DRAFT_IDS),
        _result(opset.concat(sums, axis=1).output(0), LOGIT_SUMS),
        _result(key, PRESENT_KEY),
        _result(value, PRESENT_VALUE),
    ]
    return ov.Model(results, list(inputs.values()), f"eagle3_greedy_rollout_{steps}")
