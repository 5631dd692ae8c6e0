"""Graph transformations that turn a stateful optimum-intel export into a paged-attention model.

Two edits, applied in order by :func:`make_paged_model`:

1. OpenVINO's ``paged_attention_transformation`` replaces the stateful KV cache (``attention_mask``,
   ``beam_idx`` and the internal ReadValue/Assign pairs) with explicit per-layer ``key_cache.N`` /
   ``value_cache.N`` inputs and the flat batch description ``past_lens``, ``subsequence_begins``,
   ``block_indices``, ``block_indices_begins`` and ``max_context_len``. Tokens of all sequences are
   laid out along one axis: ``input_ids`` / ``position_ids`` become ``[num_tokens]``.
2. :func:`add_sampled_token_gather` puts a Gather on the LM head's input, indexed by a new i64
   Parameter ``sampled_token_indices`` ``[num_sampled]``, so the vocabulary projection (the largest
   matmul of a small model, and of every prefill) is computed only for the rows we sample from.
"""

from __future__ import annotations

import logging

import numpy as np
import openvino as ov
import openvino.opset13 as opset
from openvino._offline_transformations import paged_attention_transformation

logger = logging.getLogger(__name__)

SAMPLED_TOKEN_INDICES = "sampled_token_indices"
LOGITS_OUTPUT = "logits"

# Between the LM head's MatMul and the logits result a model may scale, soft-cap or convert the
# values (Gemma's tanh soft-capping, Cohere's logit scale); these act per element, so walking
# back through them still reaches the one MatMul that produces every logits row.
_ELEMENTWISE_AFTER_LM_HEAD = {"Convert", "Multiply", "Divide", "Tanh", "Add", "Subtract"}
_MAX_WALK = 16
_MAX_DECOMPRESSION_DEPTH = 6


def is_constant_like(output: ov.Output, depth: int = 0) -> bool:
    """True when ``output`` is a weight: a Constant, possibly behind a short decompression chain.

    The depth bound keeps the search off the activation path, which leads back through every layer.
    """
    node = output.get_node()
    if node.get_type_name() == "Constant":
        return True
    if node.get_type_name() == "Parameter" or depth >= _MAX_DECOMPRESSION_DEPTH:
        return False
    return all(is_constant_like(value, depth + 1) for value in node.input_values())


def find_logits_matmul(model: ov.Model) -> ov.Node:
    """The MatMul of the LM head: the one whose output becomes the ``logits`` result."""
    results = [result for result in model.get_results() if LOGITS_OUTPUT in result.output(0).get_names()]
    if not results:
        results = model.get_results()
    if len(results) != 1:
        raise ValueError(
            f"expected one '{LOGITS_OUTPUT}' output, found outputs "
            f"{[sorted(r.output(0).get_names()) for r in model.get_results()]}"
        )
    node = results[0].input_value(0).get_node()
    for _ in range(_MAX_WALK):
        if node.get_type_name() == "MatMul":
            return node
        if node.get_type_name() not in _ELEMENTWISE_AFTER_LM_HEAD:
            break
        activations = [value for value in node.input_values() if not is_constant_like(value)]
        if len(activations) != 1:
            break
        node = activations[0].get_node()
    raise ValueError(
        f"could not find the LM head MatMul behind the '{LOGITS_OUTPUT}' output "
        f"(stopped at {node.get_type_name()} '{node.get_friendly_name()}')"
    )


def add_sampled_token_gather(model: ov.Model) -> None:
    """Gather the LM head's input rows by a new ``sampled_token_indices`` Parameter ``[?]`` (i64).

    Must run after the paged-attention transformation, which lays tokens out on axis 0 of the
    hidden states (``[num_tokens, 1, hidden]``); the logits output becomes ``[num_sampled, 1, vocab]``.
    """
    if any(SAMPLED_TOKEN_INDICES in parameter.output(0).get_names() for parameter in model.get_parameters()):
        raise ValueError(f"the model already has a '{SAMPLED_TOKEN_INDICES}' input")
    matmul = find_logits_matmul(model)
    hidden_states = matmul.input_value(0)
    shape = hidden_states.get_partial_shape()
    if shape.rank.is_dynamic or shape.rank.get_length() != 3 or shape[1] != 1:
        raise ValueError(
            f"expected the LM head input as [num_tokens, 1, hidden] after the paged-attention "
            f"transformation, got {shape}; apply paged_attention_transformation first"
        )
    indices = opset.parameter(ov.PartialShape([-1]), ov.Type.i64, name=SAMPLED_TOKEN_INDICES)
    indices.output(0).get_tensor().set_names({SAMPLED_TOKEN_INDICES})
    axis = opset.constant(np.array(0, dtype=np.int64))
    gathered = opset.gather(hidden_states, indices, axis)
    matmul.input(0).replace_source_output(gathered.output(0))
    model.add_parameters([indices])
    model.validate_nodes_and_infer_types()
    logger.debug("gather on LM head input '%s' added", matmul.get_friendly_name())


# The ops of a weight-decompression chain (NNCF's int8/int4 layout: Constant -> Convert -> Subtract
# zero point -> Multiply scale -> Convert) that cut_logits_vocab rebuilds around sliced constants.
_DECOMPRESSION_OPS = {
    "Convert": lambda args, node: opset.convert(args[0], node.get_output_element_type(0)),
    "Subtract": lambda args, node: opset.subtract(*args),
    "Multiply": lambda args, node: opset.multiply(*args),
}


def cut_logits_vocab(model: ov.Model, vocab: int) -> ov.Model:
    """Keep the LM head's first ``vocab`` rows: the logits output becomes ``[..., vocab]``, in place.

    A draft that proposes only the first ``vocab`` ids of a vocabulary it shares with its target
    (byte-level BPE ids run roughly from frequent to rare) reads a fraction of its largest matrix in
    every pass: on SmolLM2's 3-layer draft the 49152 x 256 head is most of its int8 weights
    (docs/experiments/2026-12-01-default-draft.md), and the target's weights evict it from the caches
    between drafting passes. The weight is rebuilt from sliced constants, not sliced after
    decompression, so the plugin still sees the compressed-weight pattern it fuses; constants shared
    with the input embedding stay whole (every id still embeds). Exactness does not depend on it: ids
    the draft cannot propose get draft probability 0 and the target still emits them
    (xpuspec.spec_decode.proposal pads q with zeros).
    """
    matmul = find_logits_matmul(model)
    full = matmul.get_output_partial_shape(0)[-1]
    if full.is_dynamic:
        raise ValueError("the LM head's vocabulary is dynamic; cannot cut it")
    full_vocab = full.get_length()
    if not 0 < vocab <= full_vocab:
        raise ValueError(f"the draft vocabulary must be in 1..{full_vocab} (the model's), got {vocab}")
    if vocab == full_vocab:
        return model

    def sliced(output: ov.Output) -> ov.Output:
        node = output.get_node()
        kind = node.get_type_name()
        if kind == "Constant":
            data = node.get_data()
            if data.ndim >= 1 and data.shape[0] == full_vocab:  # per-row weights, zero points, scales
                return opset.constant(
                    np.ascontiguousarray(data[:vocab]), dtype=node.get_output_element_type(0)
                ).output(0)
            return output  # a scalar or broadcast constant
        rebuild = _DECOMPRESSION_OPS.get(kind)
        if rebuild is None:
            raise ValueError(
                f"cannot cut the LM head: its weight goes through a {kind} node "
                f"('{node.get_friendly_name()}'); known: Constant, {', '.join(_DECOMPRESSION_OPS)}"
            )
        # No rt_info is copied: the CPU plugin marks decompression chains itself when it compiles,
        # and the rebuilt head runs as a compressed FullyConnected (tests/executor/test_paged_runner.py).
        return rebuild([sliced(value) for value in node.input_values()], node).output(0)

    weight = matmul.input_value(1)
    if not is_constant_like(weight):
        raise ValueError("the LM head's weight is not a constant (a tied head computed at run time?)")
    if not matmul.get_attributes().get("transpose_b", False):
        raise ValueError("expected the LM head weight as [vocab, hidden] (MatMul transpose_b)")
    matmul.input(1).replace_source_output(sliced(weight))
    model.validate_nodes_and_infer_types()
    logger.debug("LM head '%s' cut to the first %d of %d ids", matmul.get_friendly_name(), vocab, full_vocab)
    return model


def make_paged_model(model: ov.Model, allow_qq_bias: bool = True) -> ov.Model:
    """Apply the paged-attention transformation and the sampled-row gather to ``model`` in place.

    ``allow_qq_bias`` exposes the paged-attention inputs ``qq_bias`` / ``qq_bias_begins`` (a
    per-sequence query-to-query mask: tree speculation, see :mod:`xpuspec.spec_decode.tree`);
    left empty they mean plain causal attention.
    """
    input_names = {name for port in model.inputs for name in port.get_names()}
    if "beam_idx" not in input_names:
        raise ValueError(
            f"expected a stateful optimum-intel export (with a 'beam_idx' input), got inputs "
            f"{sorted(input_names)}; export with stateful=True"
        )
    paged_attention_transformation(model, allow_qq_bias=allow_qq_bias)
    add_sampled_token_gather(model)
    return model
