"""fuse_shared_input_projections: products that read one input become one product and a split, with
the same outputs; what cannot be stacked is left alone."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as opset
import pytest

from xpuspec.executor.fused_projections import fuse_shared_input_projections
from xpuspec.executor.paged_compile import compile_paged

EXACT = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}
HIDDEN = 64
GROUP = 32


def _u4_weight(rng: np.random.Generator, rows: int, zero_point: ov.Output | None = None) -> ov.Output:
    """An int4 weight ``[rows, HIDDEN]`` as optimum-intel exports one: u4 values in groups of GROUP,
    minus a u4 zero point, times an f16 scale, reshaped to rows and converted to f32."""
    groups = HIDDEN // GROUP
    values = rng.integers(0, 16, size=rows * HIDDEN).tolist()
    weight = opset.convert(ov.op.Constant(ov.Type.u4, ov.Shape([rows, groups, GROUP]), values), ov.Type.f16)
    if zero_point is None:
        points = rng.integers(0, 16, size=rows * groups).tolist()
        zero_point = opset.convert(
            ov.op.Constant(ov.Type.u4, ov.Shape([rows, groups, 1]), points), ov.Type.f16
        )
    scale = opset.constant(rng.uniform(0.01, 0.02, size=(rows, groups, 1)).astype(np.float16))
    scaled = opset.multiply(opset.subtract(weight, zero_point), scale)
    return opset.convert(
        opset.reshape(scaled, np.array([rows, HIDDEN], np.int64), False), ov.Type.f32
    ).output(0)


def _model(weights: list[ov.Output]) -> ov.Model:
    hidden = opset.parameter([-1, HIDDEN], ov.Type.f32, name="hidden")
    products = [opset.matmul(hidden, weight, False, True) for weight in weights]
    for index, product in enumerate(products):
        product.output(0).get_tensor().set_names({f"projection.{index}"})
    return ov.Model([opset.result(product) for product in products], [hidden])


def _matmuls(model: ov.Model) -> int:
    return sum(node.get_type_name() == "MatMul" for node in model.get_ops())


def _outputs(model: ov.Model, hidden: np.ndarray) -> list[np.ndarray]:
    compiled = ov.Core().compile_model(model, "CPU", EXACT)
    request = compiled.create_infer_request()
    request.infer({0: hidden})
    return [request.get_output_tensor(i).data.copy() for i in range(len(compiled.outputs))]


def test_a_u4_q_k_v_group_fuses_into_one_product_with_the_same_outputs() -> None:
    def build() -> ov.Model:
        rng = np.random.default_rng(7)
        return _model([_u4_weight(rng, rows) for rows in (64, 32, 32)])

    hidden = np.random.default_rng(1).standard_normal((5, HIDDEN)).astype(np.float32)
    before = _outputs(build(), hidden)
    fused = build()
    assert fuse_shared_input_projections(fused) == 3
    assert _matmuls(fused) == 1
    after = _outputs(fused, hidden)
    assert [a.shape for a in after] == [(5, 64), (5, 32), (5, 32)]
    assert [output.get_any_name() for output in fused.outputs] == [
        "projection.0",
        "projection.1",
        "projection.2",
    ]
    for a, b in zip(after, before, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("same_point", [True, False])
def test_a_broadcast_zero_point_is_shared_only_where_every_member_has_the_same(same_point: bool) -> None:
    def point(value: int) -> ov.Output:
        return opset.convert(ov.op.Constant(ov.Type.u4, ov.Shape([]), [value]), ov.Type.f16).output(0)

    rng = np.random.default_rng(3)
    model = _model([_u4_weight(rng, 48, point(8)), _u4_weight(rng, 48, point(8 if same_point else 7))])
    hidden = rng.standard_normal((3, HIDDEN)).astype(np.float32)
    before = _outputs(model, hidden)
    assert fuse_shared_input_projections(model) == (2 if same_point else 0)
    assert _matmuls(model) == (1 if same_point else 2)
    for a, b in zip(_outputs(model, hidden), before, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_weights_of_different_structure_are_left_alone() -> None:
    rng = np.random.default_rng(5)
    plain = opset.constant(rng.standard_normal((32, HIDDEN)).astype(np.float32)).output(0)
    model = _model([_u4_weight(rng, 32), plain])
    assert fuse_shared_input_projections(model) == 0
    assert _matmuls(model) == 2


def test_products_of_different_inputs_are_not_fused() -> None:
    rng = np.random.default_rng(9)
    first = opset.parameter([-1, HIDDEN], ov.Type.f32, name="first")
    second = opset.parameter([-1, HIDDEN], ov.Type.f32, name="second")
    products = [opset.matmul(source, _u4_weight(rng, 32), False, True) for source in (first, second)]
    model = ov.Model([opset.result(product) for product in products], [first, second])
    assert fuse_shared_input_projections(model) == 0
    assert _matmuls(model) == 2


def _runtime_products(compiled: ov.CompiledModel) -> int:
    kinds = [node.get_rt_info()["layerType"].astype(str) for node in compiled.get_runtime_model().get_ops()]
    return sum(kind.startswith("FullyConnected") for kind in kinds)


def test_the_cpu_compile_of_a_llama_runs_four_products_a_layer_and_the_head(
    tiny_ir_dir: Callable[[str], Path],
) -> None:
    ir_dir = tiny_ir_dir("llama")
    layers = json.loads((ir_dir / "config.json").read_text())["num_hidden_layers"]
    compiled = compile_paged(ir_dir, properties=EXACT)
    # q/k/v as one, o, gate/up as one, down; unfused it would be six a layer
    assert _runtime_products(compiled.main) == 4 * layers + 1
