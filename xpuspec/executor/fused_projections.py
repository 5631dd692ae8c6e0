"""Fuse the matrix products that read the same input into one product and a split, for the CPU.

A llama layer's q, k and v projections all read the normalized hidden state, and so do the MLP's gate
and up projections. At the one to a few tokens of a decode or verification pass, the CPU plugin's
compressed-weight kernel pays a fixed cost per call besides reading the weights, so one product over
the stacked weights followed by a ``VariadicSplit`` is cheaper than three (or two) products. GPU
plugins fuse these themselves; the CPU plugin does not, hence this edit before a CPU compile.

A weight is a Constant or a short decompression chain of them (``Convert``, ``Subtract``,
``Multiply``, ``Reshape``: int4 values, zero points, scales, the reshape of groups to rows), stored
``[out, in]`` and read with ``transpose_b``. Stacking works on the chain itself, so the compressed
format the plugin recognises stays as it was: every constant whose first axis is the weight's rows is
concatenated on that axis, a broadcast constant is shared when it is the same for every member, and a
group whose members differ in anything else is left alone. Each output column of the fused product is
computed exactly as the member's own, so exact mode's logits do not change.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import openvino as ov
import openvino.opset13 as opset

logger = logging.getLogger(__name__)

_UNARY = {"Convert"}
_BINARY = {"Subtract", "Multiply"}
_MAX_CHAIN_DEPTH = 6


class _NotStackable(Exception):
    """The members' weight chains differ in a way stacking cannot express."""


def fuse_shared_input_projections(model: ov.Model) -> int:
    """Replace each set of MatMuls that read one input with one MatMul and a split; the number fused.

    Only products of a 2-D constant-like weight ``[out, in]`` read with ``transpose_b`` and without
    ``transpose_a`` take part; the rest of the graph is untouched.
    """
    groups: dict[tuple[str, int], list[ov.Node]] = defaultdict(list)
    for node in model.get_ordered_ops():
        if _is_projection(node):
            source = node.input_value(0)
            groups[(source.get_node().get_friendly_name(), source.get_index())].append(node)
    fused = 0
    for members in groups.values():
        if len(members) > 1 and _same_source(members):
            fused += _fuse(members)
    if fused:
        model.validate_nodes_and_infer_types()
        logger.debug("fused %d projections that share an input", fused)
    return fused


def _is_projection(node: ov.Node) -> bool:
    if node.get_type_name() != "MatMul":
        return False
    attributes = node.get_attributes()
    if attributes["transpose_a"] or not attributes["transpose_b"]:
        return False
    weight = node.input_value(1)
    shape = weight.get_partial_shape()
    return shape.is_static and len(shape) == 2 and _is_constant_chain(weight, 0)


def _is_constant_chain(output: ov.Output, depth: int) -> bool:
    node = output.get_node()
    kind = node.get_type_name()
    if kind == "Constant":
        return True
    if depth >= _MAX_CHAIN_DEPTH or kind not in _UNARY | _BINARY | {"Reshape"}:
        return False
    return all(_is_constant_chain(value, depth + 1) for value in node.input_values())


def _same_source(members: Sequence[ov.Node]) -> bool:
    # Friendly names key the groups; the outputs themselves must be one and the same.
    first = members[0].input_value(0)
    return all(member.input_value(0) == first for member in members[1:])


def _fuse(members: Sequence[ov.Node]) -> int:
    weights = [member.input_value(1) for member in members]
    rows = [int(weight.get_shape()[0]) for weight in weights]
    try:
        stacked = _stack(weights, rows)
    except _NotStackable as why:
        logger.debug("left %s alone: %s", [m.get_friendly_name() for m in members], why)
        return 0
    product = opset.matmul(members[0].input_value(0), stacked, transpose_a=False, transpose_b=True)
    product.set_friendly_name(members[0].get_friendly_name() + "/fused")
    split = opset.variadic_split(product, np.int64(-1), np.array(rows, dtype=np.int64))
    for index, member in enumerate(members):
        # The split's output takes the product's tensor names too: a model output found by name stays.
        split.output(index).get_tensor().set_names(member.output(0).get_names())
        for target in member.output(0).get_target_inputs():
            target.replace_source_output(split.output(index))
    return len(members)


def _stack(outputs: Sequence[ov.Output], rows: Sequence[int]) -> ov.Output:
    """One output whose first axis is the members' outputs one after another (their first axes are
    ``rows``), built from the same ops as theirs."""
    nodes = [output.get_node() for output in outputs]
    kind = nodes[0].get_type_name()
    if any(node.get_type_name() != kind for node in nodes):
        raise _NotStackable(f"ops differ: {[node.get_type_name() for node in nodes]}")
    if kind == "Constant":
        return _stack_constants(nodes, rows)
    if kind in _UNARY:
        destination = {node.get_destination_type() for node in nodes}
        if len(destination) != 1:
            raise _NotStackable("conversions differ")
        return opset.convert(_stack([n.input_value(0) for n in nodes], rows), destination.pop()).output(0)
    if kind == "Reshape":
        return _stack_reshape(nodes, rows)
    inputs = [_operand([node.input_value(i) for node in nodes], nodes, rows) for i in range(2)]
    binary = opset.subtract if kind == "Subtract" else opset.multiply
    return binary(*inputs).output(0)


def _operand(values: list[ov.Output], nodes: Sequence[ov.Node], rows: Sequence[int]) -> ov.Output:
    """An input of an elementwise op: stacked where it carries the rows, else shared by every member."""
    rank = len(nodes[0].get_output_partial_shape(0))
    shapes = [value.get_partial_shape() for value in values]
    carries_rows = all(
        shape.is_static and len(shape) == rank and shape[0].get_length() == count
        for shape, count in zip(shapes, rows, strict=True)
    )
    if carries_rows:
        return _stack(values, rows)
    if not _same_subtree(values):
        raise _NotStackable("a broadcast operand differs between members")
    return values[0]


def _stack_reshape(nodes: Sequence[ov.Node], rows: Sequence[int]) -> ov.Output:
    targets = []
    for node, count in zip(nodes, rows, strict=True):
        shape = node.input_value(1).get_node()
        if shape.get_type_name() != "Constant":
            raise _NotStackable("a reshape to a computed shape")
        target = [int(x) for x in shape.get_data().reshape(-1)]
        if not target or target[0] != count:
            raise _NotStackable(f"a reshape to {target}, not to {count} rows")
        targets.append(target)
    if any(target[1:] != targets[0][1:] for target in targets):
        raise _NotStackable("reshapes differ past the rows")
    inputs = [node.input_value(0) for node in nodes]
    if any(
        not value.get_partial_shape().is_static or value.get_shape()[0] != count
        for value, count in zip(inputs, rows, strict=True)
    ):
        raise _NotStackable("a reshape whose input does not carry the rows on its first axis")
    data = _stack(inputs, rows)
    shape = np.array([sum(rows), *targets[0][1:]], dtype=np.int64)
    return opset.reshape(data, shape, special_zero=False).output(0)


def _stack_constants(nodes: Sequence[ov.Node], rows: Sequence[int]) -> ov.Output:
    element_type = nodes[0].get_output_element_type(0)
    shapes = [list(node.get_output_shape(0)) for node in nodes]
    if any(node.get_output_element_type(0) != element_type for node in nodes):
        raise _NotStackable("constant types differ")
    if any(
        not shape or shape[0] != count or shape[1:] != shapes[0][1:]
        for shape, count in zip(shapes, rows, strict=True)
    ):
        raise _NotStackable(f"constants of shapes {shapes} do not stack on {list(rows)} rows")
    stacked = ov.Tensor(element_type, ov.Shape([sum(rows), *shapes[0][1:]]))
    # Packed types (u4) are bytes here too: stacking on the first axis is concatenating bytes.
    destination = stacked.data.reshape(-1).view(np.uint8)
    offset = 0
    for node in nodes:
        source = _constant_bytes(node)
        destination[offset : offset + source.size] = source
        offset += source.size
    if offset != destination.size:
        raise _NotStackable("constant sizes do not add up")
    return ov.op.Constant(stacked, shared_memory=True).output(0)


def _constant_bytes(node: ov.Node) -> np.ndarray:
    return np.asarray(node.get_tensor_view().data).reshape(-1).view(np.uint8)


def _same_subtree(values: Sequence[ov.Output]) -> bool:
    first = values[0]
    return all(_equal_subtrees(first, value, 0) for value in values[1:])


def _equal_subtrees(a: ov.Output, b: ov.Output, depth: int) -> bool:
    if a == b:
        return True
    node_a, node_b = a.get_node(), b.get_node()
    if node_a.get_type_name() != node_b.get_type_name() or depth >= _MAX_CHAIN_DEPTH:
        return False
    if a.get_element_type() != b.get_element_type() or a.get_partial_shape() != b.get_partial_shape():
        return False
    if node_a.get_type_name() == "Constant":
        return bool(np.array_equal(_constant_bytes(node_a), _constant_bytes(node_b)))
    if node_a.get_attributes() != node_b.get_attributes():
        return False
    pairs = zip(node_a.input_values(), node_b.input_values(), strict=True)
    return all(_equal_subtrees(x, y, depth + 1) for x, y in pairs)
