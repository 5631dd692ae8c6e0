"""Re-compress the weights of a GGUF model's IR with NNCF, torch-free: another weight format, same weights.

OpenVINO GenAI's GGUF reader keeps each GGUF tensor's quantisation as a small constant subgraph
(``u4/u8 -> Convert -> Subtract(zero point) -> Multiply(scale) -> Reshape -> Convert f32``) in front of
each MatMul, and the tied token embedding feeds both the embedding Gather and the LM head MatMul. Here
those subgraphs are evaluated once to f32 (one CPU inference of a model made of them alone), put back
as plain f32 constants, and compressed again with ``nncf.compress_weights``:

- the transformer layers' matrices (every weight but the token embedding and the LM head) to ``layers``;
- the token embedding and the LM head (one tensor when tied, as in SmolLM2) to ``head``;

each left as the reader made it when its format is ``None``. The numbers are the GGUF's own weights
(already quantised once), so a format here can only round them again, never recover precision.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from xpuspec.prepare.errors import PrepareError
from xpuspec.prepare.gguf_formats import AS_IS, GgufWeightFormat

logger = logging.getLogger(__name__)


def recompress_ir(xml_in: Path, xml_out: Path, weight_format: GgufWeightFormat) -> dict[str, Any]:
    """Write ``weight_format``'s IR of the GGUF reader's ``xml_in`` to ``xml_out``; return what was done."""
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(xml_in))
    weights = weight_outputs(model)
    head = embedding_and_head(model) & set(weights)
    layers = [name for name in weights if name not in head]
    if not layers or not head:
        raise PrepareError(f"{xml_in}: no weight subgraphs of the GGUF reader's kind to re-compress")
    done: dict[str, Any] = {"layers": weight_format.layers or AS_IS, "head": weight_format.head or AS_IS}
    if weight_format.layers is not None:
        users = _replace_with_f32(model, {name: weights[name] for name in layers}, core)
        model = _compress(model, weight_format.layers, users)
        done["layer_matrices"] = len(layers)
    if weight_format.head is not None:
        weights = weight_outputs(model)
        users = _replace_with_f32(model, {name: weights[name] for name in head}, core)
        model = _compress(model, weight_format.head, users)
        done["head_matrices"] = len(head)
    ov.save_model(model, str(xml_out), compress_to_fp16=False)
    return done


def weight_outputs(model: Any) -> dict[str, Any]:
    """The output node of each weight subgraph (made of constants alone) feeding a MatMul's weight input or
    a Gather's data input, by friendly name."""
    found: dict[str, Any] = {}
    memo: dict[str, bool] = {}
    for op in model.get_ops():
        kind = op.get_type_name()
        if kind not in ("MatMul", "Gather"):
            continue
        source = op.input(1 if kind == "MatMul" else 0).get_source_output().get_node()
        if source.get_type_name() != "Constant" and _constants_only(source, memo):
            found[source.get_friendly_name()] = source
    return found


def embedding_and_head(model: Any) -> set[str]:
    """Friendly names of the nodes giving the LM head's weight (the MatMul the logits come from) and the
    token embedding (a Gather's data): one node when they are tied."""
    node = model.get_results()[0]
    while node.get_type_name() != "MatMul":
        if node.get_input_size() == 0:
            raise PrepareError("no MatMul in front of the model's logits")
        node = node.input(0).get_source_output().get_node()
    names = {node.input(1).get_source_output().get_node().get_friendly_name()}
    for op in model.get_ops():
        if op.get_type_name() == "Gather":
            data = op.input(0).get_source_output().get_node()
            if data.get_output_partial_shape(0).rank.get_length() == 2 and data.get_type_name() != "ShapeOf":
                names.add(data.get_friendly_name())
    return names


def _constants_only(node: Any, memo: dict[str, bool]) -> bool:
    name = node.get_friendly_name()
    if name not in memo:
        kind = node.get_type_name()
        if kind == "Constant":
            memo[name] = True
        elif kind in ("Parameter", "ReadValue", "ShapeOf") or node.get_input_size() == 0:
            memo[name] = False
        else:
            memo[name] = all(
                _constants_only(value.get_source_output().get_node(), memo) for value in node.inputs()
            )
    return memo[name]


def _replace_with_f32(model: Any, nodes: dict[str, Any], core: Any) -> set[str]:
    """Evaluate the weight subgraphs ending at ``nodes`` in f32 and put f32 constants in their place;
    return the names of the ops that use them."""
    import openvino as ov

    evaluator = ov.Model([ov.opset13.result(node.output(0)) for node in nodes.values()], [], "weights")
    compiled = core.compile_model(evaluator, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    values = compiled.create_infer_request().infer({})
    users = set()
    for index, node in enumerate(nodes.values()):
        users |= {target.get_node().get_friendly_name() for target in node.output(0).get_target_inputs()}
        constant = ov.opset13.constant(values[compiled.outputs[index]].astype("float32", copy=False))
        node.output(0).replace(constant.output(0))
    del compiled, values
    return users


def _compress(model: Any, weight_format: str, users: set[str]) -> Any:
    """NNCF data-free compression of the weights of the ops named in ``users``; other MatMuls and Gathers
    are left alone (an F16 GGUF's f16 weights would otherwise be compressed too)."""
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedCompressionParameters, GroupSizeFallbackMode

    kind, symmetry, *group = weight_format.split("_")
    mode = nncf.CompressWeightsMode(f"{kind}_{symmetry}")
    others = [
        op.get_friendly_name()
        for op in model.get_ops()
        if op.get_type_name() in ("MatMul", "Gather") and op.get_friendly_name() not in users
    ]
    options: dict[str, Any] = {"mode": mode, "ignored_scope": nncf.IgnoredScope(names=others, validate=False)}
    if kind == "int4":
        # all_layers: the embedding and LM head too when they are f32 here (else NNCF keeps the last
        # MatMul it finds at int8); a group the input size does not divide (576 by 128) falls back to
        # the largest power of two that does.
        options.update(
            group_size=int(group[0].lstrip("g")),
            ratio=1.0,
            all_layers=True,
            advanced_parameters=AdvancedCompressionParameters(
                group_size_fallback_mode=GroupSizeFallbackMode.ADJUST
            ),
        )
    return nncf.compress_weights(model, **options)
