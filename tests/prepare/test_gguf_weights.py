"""Re-compressing a GGUF reader's IR with NNCF: the formats asked for, and a model that still computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from tests.support.tiny_gguf import tiny_llama_gguf
from xpuspec import Pipeline, SamplingParams
from xpuspec.devices.executors import model_weights
from xpuspec.models.bundle import ModelBundle
from xpuspec.prepare.compress import count_low_precision_weights
from xpuspec.prepare.config import PrepareConfig, PrepareError
from xpuspec.prepare.gguf import convert_gguf, prepare_gguf_bundle
from xpuspec.prepare.gguf_formats import GgufWeightFormat
from xpuspec.prepare.gguf_model import GgufModel
from xpuspec.prepare.gguf_weights import embedding_and_head, recompress_ir, weight_outputs
from xpuspec_plugins.cpu import CpuPlugin


def test_labels_parse_and_print_back():
    assert GgufWeightFormat.parse("gguf").as_converted
    assert GgufWeightFormat.parse("int4_sym_g64") == GgufWeightFormat(layers="int4_sym_g64")
    both = GgufWeightFormat.parse("int4_asym_g32+head_int8_asym")
    assert (both.layers, both.head) == ("int4_asym_g32", "int8_asym")
    assert GgufWeightFormat.parse("gguf+head_int4_sym_g128").label == "gguf+head_int4_sym_g128"
    assert both.label == "int4_asym_g32+head_int8_asym"


@pytest.mark.parametrize("label", ["int4", "int4_sym_g48", "int8_asym+head_fp16", "q4_1"])
def test_unknown_labels_are_refused_with_the_choices(label):
    with pytest.raises(PrepareError, match="int4_sym_g64"):
        GgufWeightFormat.parse(label)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama (untied embedding and LM head) written as an F16 GGUF."""
    return tiny_llama_gguf(tmp_path_factory.mktemp("gguf_weights"))


@pytest.fixture(scope="module")
def converted(tiny_gguf: Path) -> Path:
    """The tiny GGUF converted by GenAI's reader."""
    convert_gguf(GgufModel.read(tiny_gguf, "target"), tiny_gguf.parent / "ir")
    return tiny_gguf.parent / "ir" / "openvino_model.xml"


def _logits(xml: Path, token_ids: np.ndarray) -> np.ndarray:
    model = ov.Core().read_model(str(xml))
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    inputs = {
        "input_ids": token_ids[None],
        "attention_mask": np.ones_like(token_ids)[None],
        "position_ids": np.arange(len(token_ids), dtype=np.int64)[None],
        "beam_idx": np.zeros(1, dtype=np.int32),
    }
    return request.infer(inputs)[compiled.outputs[0]][0]


def test_layers_and_head_get_their_own_formats_and_the_model_still_computes(converted, tmp_path):
    model = ov.Core().read_model(str(converted))
    matrices = len(weight_outputs(model))
    head = embedding_and_head(model) & set(weight_outputs(model))
    assert len(head) == 2  # untied: the embedding's and the LM head's
    out = tmp_path / "openvino_model.xml"
    done = recompress_ir(converted, out, GgufWeightFormat.parse("int4_sym_g32+head_int8_asym"))
    assert done["layer_matrices"] == matrices - 2 and done["head_matrices"] == 2
    int8, int4 = count_low_precision_weights(ov.Core().read_model(str(out)))
    assert (int8, int4) == (2, matrices - 2)
    token_ids = np.arange(3, 19, dtype=np.int64)
    before, after = _logits(converted, token_ids), _logits(out, token_ids)
    # Rounded again (random weights lose more to int4 than trained ones), not broken: a swapped axis or a
    # wrong scale would leave the logits uncorrelated.
    assert np.corrcoef(before.ravel(), after.ravel())[0, 1] > 0.95


def test_the_head_alone_is_recompressed_and_the_layers_are_left_as_converted(converted, tmp_path):
    out = tmp_path / "openvino_model.xml"
    recompress_ir(converted, out, GgufWeightFormat.parse("gguf+head_int4_sym_g32"))
    int8, int4 = count_low_precision_weights(ov.Core().read_model(str(out)))
    assert (int8, int4) == (0, 2)


def test_prepare_records_the_weight_format_and_why_and_the_bundle_runs(tiny_gguf, tmp_path):
    config = PrepareConfig(
        target=str(tiny_gguf),
        output=tmp_path / "bundle",
        gguf_weight_format="int4_sym_g32+head_int8_asym",
        gguf_weight_reason="faster here",
    )
    bundle = ModelBundle.open(prepare_gguf_bundle(config), verify=True)
    compression = bundle.target.facts["compression"]
    assert compression["weights"] == "int4_sym_g32+head_int8_asym" and compression["gguf_weights"] == "F16"
    assert compression["recompressed"]["reason"] == "faster here"
    assert compression["int4_constants"] > 0 and compression["int8_constants"] == 2
    # The label is no bare "int4"/"int8": the CPU's defaults stay the ones the format was measured at.
    plugin = CpuPlugin()
    assert plugin.compile_properties("target", weights=model_weights(bundle.target)) == (
        plugin.compile_properties("target", weights="F16")
    )
    pipe = Pipeline(bundle, drafter="none", properties="exact", use_placement=False)
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    assert len(pipe.generate("def add(a, b):", greedy)[0].token_ids) == 8


def test_a_weight_format_beside_weights_or_an_unknown_one_is_refused(tiny_gguf, tmp_path):
    with pytest.raises(ValueError, match="give one"):
        PrepareConfig(
            target=str(tiny_gguf), output=tmp_path / "b", weights="int8", gguf_weight_format="int8_sym"
        )
    with pytest.raises(ValueError, match="int4_sym_g64"):
        PrepareConfig(target=str(tiny_gguf), output=tmp_path / "b", gguf_weight_format="int3")
