"""Hidden-state taps on the paged target: the residual stream at chosen layer boundaries, for EAGLE-3.

An EAGLE-3 head (Li et al. 2025) drafts from a fusion (its ``fc`` layer) of three of the target's hidden
states, low, middle and high, concatenated along the feature axis, plus the token embedding.

Which states. A layer id ``i`` names the boundary *entering* decoder layer ``i``: the residual stream
before layer ``i``'s input norm, i.e. the output of layer ``i - 1`` (id 0 is the embedding output, id
``num_layers`` the last layer's output before the final norm). In Hugging Face terms it is
``output_hidden_states=True``'s ``hidden_states[i]`` for ``i < num_layers`` (index 0 the embeddings;
HF's last entry, ``hidden_states[num_layers]``, is after the final norm). It is the convention of:

- the EAGLE reference (SafeAILab/EAGLE ``eagle/model/modeling_llama_kv.py``): in the decoder loop,
  ``if idx == len(self.layers) - 3 or idx == len(self.layers) // 2 or idx == 2:
  all_hidden_states += (hidden_states,)`` runs before ``decoder_layer(hidden_states, ...)``;
- vLLM (``vllm/model_executor/models/llama.py``, ``LlamaModel.forward``): ``if idx in
  self.aux_hidden_state_layers: aux_hidden_states.append(hidden_states + residual)`` before
  ``layer(...)`` (its fused norm keeps the residual apart, so the sum is the stream entering layer
  ``idx``); ``get_eagle3_aux_hidden_state_layers`` defaults to ``(2, num_layers // 2, num_layers - 3)``,
  and a head's ``eagle_aux_hidden_state_layer_ids`` (``vllm/.../eagle3_utils.py``,
  ``get_eagle3_aux_layers_from_config``) are used as they are. Its later ``EagleModelMixin.
  _maybe_add_hidden_state`` pattern (vLLM PRs #36063, #46788) keeps these ids and also reaches id
  ``num_layers``, the last layer's output.

Two engines differ, which matters when a head's config names its layers:

- SGLang (``set_eagle3_layers_to_capture``) keeps the default ``[2, n // 2, n - 3]`` as boundaries but
  adds 1 to ids given by a config ("for the ith layer, it takes the output of the (i-1)th layer"), so it
  reads a config's ids as "output of layer id" = boundary ``id + 1``.
- OpenVINO GenAI (``src/cpp/src/speculative_decoding/eagle3_model_transforms.cpp``,
  ``transform_hidden_state``) taps the Add in ``layers.{id}/`` whose second input is a MatMul fed by a
  Multiply: the MLP residual Add, the *output* of layer ``id`` = boundary ``id + 1``, for its defaults
  ``{2, n / 2, n - 3}`` too (on an optimum-intel Llama export its rule picks
  ``layers.2/aten::add/Add_1``, the tensor :func:`find_layer_boundaries` returns as boundary 3).

This module takes boundary ids (the vLLM/EAGLE-reference reading); mapping a head's config to them is
the caller's decision.

Which rows. The output has one row per scheduled token (every row of the flat paged batch, in batch
order), not only the rows with logits: the head needs the features of every token whose KV it must
hold, which is every prefill token and every verified token, so a per-row gather would rarely drop
anything. The engine picks the rows it keeps.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np
import openvino as ov
import openvino.opset13 as opset

from xpuspec.executor.graph_edits import find_logits_matmul, is_constant_like

# EAGLE-3's default taps belong to the head's config (plain, below the executor); re-exported here.

logger = logging.getLogger(__name__)

HIDDEN_STATES_OUTPUT = "hidden_states"
# A graph function applied to the concatenated taps ``[num_tokens, len(layers) * hidden]`` inside the
# target, e.g. an EAGLE-3 head's ``fc``: the runner then returns its output instead.
Projection = Callable[[ov.Output], ov.Output]

_PAGED_ATTENTION = "PagedAttentionExtension"
_KEY_CACHE = re.compile(r"^key_cache\.(\d+)$")
# The query path from a layer's attention back to its input norm is ~10 nodes (projection, reshapes,
# rotary embedding); the bound stops a search on an unexpected graph from crossing the whole model.
_MAX_SEARCH_NODES = 256


def decoder_attention_layers(model: ov.Model) -> list[ov.Node]:
    """The paged-attention nodes of ``model`` in layer order (ordered by their ``key_cache.N`` input)."""
    by_layer: dict[int, ov.Node] = {}
    for node in model.get_ordered_ops():
        if node.get_type_name() != _PAGED_ATTENTION:
            continue
        layer = None
        for value in node.input_values():
            for name in value.get_names():
                match = _KEY_CACHE.match(name)
                if match:
                    layer = int(match.group(1))
        if layer is None or layer in by_layer:
            raise ValueError(
                f"paged attention '{node.get_friendly_name()}' has "
                f"{'no key_cache.N input' if layer is None else f'the key cache of layer {layer} again'}; "
                f"cannot order the decoder layers"
            )
        by_layer[layer] = node
    if not by_layer:
        raise ValueError(
            f"no {_PAGED_ATTENTION} node in the model: apply paged_attention_transformation first "
            f"(make_paged_model)"
        )
    if sorted(by_layer) != list(range(len(by_layer))):
        raise ValueError(f"the key caches of the paged-attention nodes are not 0..n-1: {sorted(by_layer)}")
    return [by_layer[layer] for layer in range(len(by_layer))]


def _stream_entering_norm(start: ov.Output, hidden_size: int) -> ov.Output | None:
    """The input of the first norm over ``hidden_size`` features found walking back from ``start``.

    Breadth-first, so the norm nearest ``start`` wins: from a layer's query that is the layer's input
    norm (a per-head query norm, as in Qwen3, works over head_size features and is passed by).
    """
    queue: deque[ov.Output] = deque([start])
    seen: set[int] = set()
    while queue and len(seen) < _MAX_SEARCH_NODES:
        output = queue.popleft()
        node = output.get_node()
        if node.get_instance_id() in seen:
            continue
        seen.add(node.get_instance_id())
        stream = _norm_input(node)
        if stream is not None and _last_dim(stream) == hidden_size:
            return stream
        for value in node.input_values():
            if value.get_node().get_type_name() != "Parameter" and not is_constant_like(value):
                queue.append(value)
    return None


def _norm_input(node: ov.Node) -> ov.Output | None:
    """The normalised tensor when ``node`` computes a norm's statistics, else None.

    RMSNorm reduces the square of the stream with ReduceMean, a decomposed LayerNorm the stream itself
    (then its centred square), a fused LayerNorm is one MVN.
    """
    if node.get_type_name() == "MVN":
        return node.input_value(0)
    if node.get_type_name() != "ReduceMean":
        return None
    data = node.input_value(0)
    source = data.get_node()
    if source.get_type_name() == "Power":
        exponent = _constant_data(source.input_value(1))
        is_square = exponent is not None and bool(np.all(exponent == 2))
        return source.input_value(0) if is_square else None
    if source.get_type_name() == "Multiply":
        return source.input_value(0) if source.input_value(0) == source.input_value(1) else None
    return data  # a LayerNorm's mean: of the stream itself


def _constant_data(output: ov.Output) -> np.ndarray | None:
    """The value of a Constant, also behind Converts (a compressed f16 constant decompressed to f32)."""
    node = output.get_node()
    while node.get_type_name() == "Convert":
        node = node.input_value(0).get_node()
    return node.get_data() if node.get_type_name() == "Constant" else None


def _last_dim(output: ov.Output) -> int | None:
    shape = output.get_partial_shape()
    if shape.rank.is_dynamic or shape.rank.get_length() == 0 or shape[-1].is_dynamic:
        return None
    return shape[-1].get_length()


def find_layer_boundaries(model: ov.Model) -> list[ov.Output]:
    """The residual stream at every boundary of the paged ``model``: ``num_layers + 1`` outputs.

    Entry ``i < num_layers`` is the input of layer ``i``'s input norm, found from the query of its
    paged attention; entry ``num_layers`` is the input of the final norm, found from the LM head.
    """
    attentions = decoder_attention_layers(model)
    lm_head = find_logits_matmul(model)
    hidden_size = _last_dim(lm_head.input_value(0))
    if hidden_size is None:
        raise ValueError(f"the LM head input has no static hidden size: {lm_head.input_value(0)}")
    starts = [(f"layer {i}'s query", attention.input_value(0)) for i, attention in enumerate(attentions)]
    starts.append(("the LM head", lm_head.input_value(0)))
    boundaries = []
    for what, start in starts:
        stream = _stream_entering_norm(start, hidden_size)
        if stream is None:
            raise ValueError(
                f"no norm over {hidden_size} features found behind {what} "
                f"('{start.get_node().get_friendly_name()}'): the graph does not have the pre-norm "
                f"decoder structure (residual stream -> RMSNorm/LayerNorm -> projection) the taps expect"
            )
        boundaries.append(stream)
    for index in range(1, len(boundaries)):
        if boundaries[index] == boundaries[index - 1]:
            raise ValueError(
                f"boundaries {index - 1} and {index} resolve to the same tensor "
                f"('{boundaries[index].get_node().get_friendly_name()}'): unexpected decoder structure"
            )
    return boundaries


def add_hidden_state_taps(
    model: ov.Model, layer_ids: Sequence[int], projection: Projection | None = None
) -> str:
    """Add an output with the residual stream entering each layer of ``layer_ids``; return its name.

    ``model`` is a paged model (after ``paged_attention_transformation``: tokens on axis 0). The new
    output ``hidden_states`` is ``[num_tokens, len(layer_ids) * hidden]`` f32: for every scheduled
    token, the states at the boundaries ``layer_ids`` (0..num_layers, see the module docstring)
    concatenated in the given order. With ``projection`` it is ``projection`` of those rows instead
    (GenAI likewise moves an EAGLE-3 head's ``fc`` into the target): a matmul inside the target's
    pass costs far less than a call of its own after every step.
    """
    layer_ids = [int(layer) for layer in layer_ids]
    if any(HIDDEN_STATES_OUTPUT in result.output(0).get_names() for result in model.get_results()):
        raise ValueError(f"the model already has a '{HIDDEN_STATES_OUTPUT}' output")
    boundaries = find_layer_boundaries(model)
    num_layers = len(boundaries) - 1
    if not layer_ids or any(not 0 <= layer <= num_layers for layer in layer_ids):
        raise ValueError(
            f"hidden-state layer ids must be boundaries 0..{num_layers} of this {num_layers}-layer "
            f"model (id i = the stream entering layer i, {num_layers} = after the last), got {layer_ids}"
        )
    hidden_size = _last_dim(boundaries[0])
    if hidden_size is None:
        raise ValueError("the model's hidden size is dynamic: its taps need a static last dimension")
    states = [boundaries[layer] for layer in layer_ids]
    concatenated = opset.concat(states, axis=-1) if len(states) > 1 else states[0]
    width = len(layer_ids) * hidden_size
    # Paged models keep a unit axis ([num_tokens, 1, hidden]); the taps drop it.
    tapped = opset.reshape(concatenated, opset.constant(np.array([-1, width], dtype=np.int64)), False)
    tapped_output = tapped.output(0)
    if tapped_output.get_element_type() != ov.Type.f32:
        tapped_output = opset.convert(tapped_output, ov.Type.f32).output(0)
    if projection is not None:
        tapped_output = projection(tapped_output)
    tapped_output.get_tensor().set_names({HIDDEN_STATES_OUTPUT})
    result = opset.result(tapped_output)
    result.set_friendly_name(HIDDEN_STATES_OUTPUT)
    model.add_results([result])
    model.validate_nodes_and_infer_types()
    logger.debug(
        "hidden-state taps at boundaries %s of %d layers: %s",
        layer_ids,
        num_layers,
        [state.get_node().get_friendly_name() for state in states],
    )
    return HIDDEN_STATES_OUTPUT
