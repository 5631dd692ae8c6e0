"""Bundles of every tiny architecture in fp16, int8 and int4: what the IR holds, and that it runs."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import openvino as ov
import pytest

from tests.prepare.conftest import TINY_GROUP_SIZE, BundleFactory
from tests.support.tiny_checkpoints import ARCHITECTURES
from xpuspec.models.bundle import MANIFEST_NAME, ModelBundle

NUM_LAYERS = 2
# Linear layers per decoder layer: q, k, v, o, gate, up, down; Phi-3 fuses qkv and gate_up.
LINEARS_PER_LAYER = {"llama": 7, "qwen2": 7, "mistral": 7, "phi3": 4}
_DEQUANTIZE_OPS = {"Convert", "Subtract", "Multiply", "Reshape"}


def weight_element_types(model: ov.Model) -> Counter[str]:
    """Element type of the stored weight behind every MatMul/Gather weight input.

    Walks back from the op through the dequantization chain (Convert, Subtract, Multiply, Reshape),
    always along the first input, which is the weight (zero points and scales are second inputs).
    """
    found: Counter[str] = Counter()
    for op in model.get_ops():
        weight_port = {"MatMul": 1, "Gather": 0}.get(op.get_type_name())
        if weight_port is None:
            continue
        node = op.input_value(weight_port).get_node()
        while node.get_type_name() in _DEQUANTIZE_OPS:
            node = node.input_value(0).get_node()
        if node.get_type_name() == "Constant" and len(node.get_output_shape(0)) >= 2:
            found[node.get_element_type().get_type_name()] += 1
    return found


def expected_linear_count(arch: str) -> int:
    return NUM_LAYERS * LINEARS_PER_LAYER[arch]


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["fp16", "int8", "int4"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_bundle_weights_match_the_request(bundle_factory: BundleFactory, arch: str, weights: str) -> None:
    bundle = ModelBundle.open(bundle_factory(arch, weights), verify=True)
    core = ov.Core()
    for info in (bundle.target, bundle.draft):
        assert info is not None
        model = core.read_model(info.path / "openvino_model.xml")
        stored = weight_element_types(model)
        compression = info.facts["compression"]
        layer_linears = expected_linear_count(str(info.facts["model_type"]))
        # the embedding table and the LM head
        embedding_and_head = 2
        if weights == "fp16":
            assert stored == Counter({"f16": layer_linears + embedding_and_head})
            assert (compression["int8_constants"], compression["int4_constants"]) == (0, 0)
        elif weights == "int8":
            assert stored == Counter({"u8": layer_linears + embedding_and_head})  # cpu preset: asym
            assert (compression["int8_constants"], compression["int4_constants"]) == (
                layer_linears + embedding_and_head,
                0,
            )
        else:
            # int4 for the decoder layers; NNCF keeps the embedding and the head at int8
            assert stored == Counter({"u4": layer_linears, "u8": embedding_and_head})
            assert (compression["int8_constants"], compression["int4_constants"]) == (
                embedding_and_head,
                layer_linears,
            )
            assert compression["group_size"] == TINY_GROUP_SIZE
        assert compression["mode"] == {"fp16": "fp16", "int8": "int8_asym", "int4": "int4_asym"}[weights]


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["fp16", "int8", "int4"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_target_compiles_and_infers_on_cpu(bundle_factory: BundleFactory, arch: str, weights: str) -> None:
    bundle = ModelBundle.open(bundle_factory(arch, weights))
    compiled = ov.Core().compile_model(bundle.target.path / "openvino_model.xml", "CPU")
    request = compiled.create_infer_request()
    token_ids = np.array([[1, 40, 41, 42, 43]], dtype=np.int64)  # [batch, num_tokens]
    request.infer(
        {
            "input_ids": token_ids,
            "attention_mask": np.ones_like(token_ids),
            "position_ids": np.arange(token_ids.shape[1], dtype=np.int64)[None],
            "beam_idx": np.zeros(1, dtype=np.int32),
        }
    )
    logits = request.get_tensor("logits").data  # [batch, num_tokens, vocab]
    assert logits.shape == (1, token_ids.shape[1], bundle.target.vocab_size)
    assert np.isfinite(logits).all()
    assert logits.std() > 0


@pytest.mark.slow
def test_manifest_records_model_and_tokenizer_facts(bundle_factory: BundleFactory) -> None:
    root = bundle_factory("qwen2", "int4")
    manifest = json.loads((root / MANIFEST_NAME).read_text())
    target = manifest["models"]["target"]
    assert target["architecture"] == "Qwen2ForCausalLM"
    assert target["path"] == "target"
    assert (target["num_layers"], target["hidden_size"], target["num_kv_heads"], target["head_dim"]) == (
        2,
        64,
        2,
        16,
    )
    assert target["max_position_embeddings"] == 512
    assert manifest["models"]["draft"]["hidden_size"] == 32
    assert manifest["pairing"] == {"checked": True, "forced": False, "mismatch": None}
    assert manifest["placement"] is None
    # What the models compile with by default on the CPU: int4 weights, so f32 compute with int8
    # activations and a u8 cache whose keys carry per-token scales (lower precision than f32).
    cpu = manifest["default_properties"]["CPU"]
    assert cpu["target"] == {
        "INFERENCE_PRECISION_HINT": "f32",
        "KV_CACHE_PRECISION": "u8",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 128,
        "KEY_CACHE_QUANT_MODE": "BY_TOKEN",
    }
    assert cpu["speculation"].startswith("lower precision than f32")
    tokenizer = manifest["tokenizer"]
    assert tokenizer["eos_token_ids"] == [0]
    assert (tokenizer["bos_token_id"], tokenizer["pad_token_id"]) == (1, 2)
    assert tokenizer["special_tokens"]["eos"] == {"token": "<|endoftext|>", "id": 0}
    assert "<|assistant|>" in tokenizer["chat_template"]
    files = manifest["files"]
    for role in ("target", "draft"):
        for name in (
            "openvino_model.xml",
            "openvino_model.bin",
            "openvino_tokenizer.xml",
            "openvino_detokenizer.xml",
        ):
            assert f"{role}/{name}" in files
    assert not any(name.startswith(".export") for name in files)


@pytest.mark.slow
def test_genai_llm_pipeline_loads_the_target_folder(bundle_factory: BundleFactory) -> None:
    openvino_genai = pytest.importorskip("openvino_genai")
    pipeline = openvino_genai.LLMPipeline(
        str(ModelBundle.open(bundle_factory("llama", "int4")).target.path), "CPU"
    )
    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = 6
    config.ignore_eos = True
    result = pipeline.generate(["def add(a, b):"], config)
    assert len(result.texts) == 1
    assert len(pipeline.get_tokenizer().encode(result.texts[0]).input_ids.data[0]) > 0
