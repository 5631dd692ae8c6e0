"""`xpuspec prepare` from GGUF files: a tiny Llama written by the `gguf` package, and SmolLM2's GGUF."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import F32
from tests.support.tiny_checkpoints import make_perturbed_draft, make_tiny_checkpoint
from tests.support.tiny_gguf import write_gguf_from_checkpoint
from xpuspec import Pipeline, SamplingParams
from xpuspec.cli import main
from xpuspec.models.bundle import ModelBundle
from xpuspec.prepare.config import PrepareConfig, PrepareError
from xpuspec.prepare.gguf import prepare_gguf_bundle
from xpuspec.prepare.gguf_model import GgufModel

EXACT = {**F32, "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}
# What the tiny target's GGUF recommends (llama.cpp's general.sampling.* keys): its bundle's defaults.
SAMPLING = {"general.sampling.temp": 0.5, "general.sampling.top_k": 20, "general.sampling.top_p": 0.75}
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny random Llama checkpoint, a perturbed draft of it, and both written as F16 GGUF files."""
    work = tmp_path_factory.mktemp("gguf")
    target = make_tiny_checkpoint(work / "target", "llama", hidden_size=64, num_layers=2, seed=0)
    draft = make_perturbed_draft(target, work / "draft", noise=0.15)
    return {
        "checkpoint": target,
        "draft_checkpoint": draft,
        "gguf": write_gguf_from_checkpoint(target, work / "tiny.gguf", dtype="F16", sampling=SAMPLING),
        "draft_gguf": write_gguf_from_checkpoint(draft, work / "draft.gguf", dtype="F16"),
        "work": work,
    }


@pytest.fixture(scope="module")
def tiny_pair_bundle(tiny) -> Path:
    return prepare_gguf_bundle(
        PrepareConfig(target=str(tiny["gguf"]), draft=str(tiny["draft_gguf"]), output=tiny["work"] / "bundle")
    )


def test_metadata_is_read_from_the_gguf(tiny):
    model = GgufModel.read(tiny["gguf"], "target")
    tokenizer = json.loads((tiny["checkpoint"] / "tokenizer.json").read_text())
    assert model.architecture == "llama" and model.file_type == "MOSTLY_F16"
    assert model.tensor_types == ("F16",) and not model.quantized
    assert len(model.tokens) == len(tokenizer["model"]["vocab"])
    assert (
        model.hyperparameters["num_layers"] == 2 and model.hyperparameters["max_position_embeddings"] == 512
    )
    assert model.chat_template == (tiny["checkpoint"] / "chat_template.jinja").read_text()
    assert model.sampling == {"temperature": 0.5, "top_k": 20.0, "top_p": 0.75}


def test_cli_prepares_a_bundle_that_inspect_verifies_and_generate_runs(tiny, tmp_path, capfd):
    output = tmp_path / "bundle"
    assert main(["prepare", str(tiny["gguf"]), "-o", str(output)]) == 0
    # prepare's stage lines go to the terminal's file descriptor (library output goes to its log)
    assert "no NNCF recompression" in capfd.readouterr().err
    assert main(["inspect", str(output)]) == 0
    bundle = ModelBundle.open(output, verify=True)
    assert bundle.target.facts["compression"]["weights"] == "F16"
    assert bundle.tokenizer_facts["chat_template"] and bundle.max_context == 512
    # The GGUF's recommended sampling became the bundle's defaults; what it left out is llama.cpp's.
    defaults = bundle.sampling_defaults
    assert (defaults.temperature, defaults.top_k, defaults.top_p, defaults.min_p) == (0.5, 20, 0.75, 0.05)
    assert defaults.source("top_k") == "generation_config.json" and defaults.source("min_p") == "llama.cpp"
    capfd.readouterr()
    assert main(["generate", "--bundle", str(output), "def add(a, b):", "--raw", "--max-tokens", "8"]) == 0
    out, err = capfd.readouterr()
    assert out.startswith("def add(a, b):") and len(out) > len("def add(a, b):") and "tokens/s" in err


def test_the_converted_model_computes_what_the_checkpoint_does(tiny, tiny_pair_bundle):
    """Same tokens from the tokenizer built from the GGUF as from the HF one, same greedy tokens as
    transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    pipe = Pipeline(tiny_pair_bundle, drafter="none", properties=EXACT, use_placement=False)
    hf_tokenizer = AutoTokenizer.from_pretrained(tiny["checkpoint"])
    model = AutoModelForCausalLM.from_pretrained(tiny["checkpoint"]).eval()
    for prompt in ["def add(a, b):", "import os\nprint(os.path)"]:
        ids = pipe.tokenizer.encode(prompt, add_special_tokens=False)
        assert ids == hf_tokenizer(prompt, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            expected = model.generate(
                torch.tensor([ids]), max_new_tokens=GREEDY.max_tokens, do_sample=False, min_new_tokens=16
            )[0, len(ids) :].tolist()
        got = pipe.generate(prompt, GREEDY)[0].token_ids
        assert got == expected


def test_gguf_draft_pairs_and_speculation_is_exact(tiny_pair_bundle):
    bundle = ModelBundle.open(tiny_pair_bundle, verify=True)
    assert bundle.draft is not None and bundle.manifest["pairing"]["checked"]
    prompts = ["def add(a, b):", "class Point:"]
    alone = Pipeline(tiny_pair_bundle, drafter="none", properties=EXACT, use_placement=False)
    spec = Pipeline(tiny_pair_bundle, drafter="draft", properties=EXACT, use_placement=False)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, num_draft_tokens=3)
    expected = [r.token_ids for r in alone.generate(prompts, params)]
    results = spec.generate(prompts, params)
    assert [r.token_ids for r in results] == expected
    assert sum(r.stats["drafted"] for r in results) > 0


def test_a_draft_with_another_vocabulary_translates_and_needs_its_own_tokenizer(tiny, tmp_path):
    other = make_tiny_checkpoint(tmp_path / "other", "llama", hidden_size=32, seed=2, corpus_suffix="xyz")
    # An IR folder without its own tokenizer IRs cannot translate: refused, nothing written.
    ir_only = tmp_path / "ir_only"
    ir_only.mkdir()
    for name in ("openvino_model.xml", "openvino_model.bin"):
        (ir_only / name).write_bytes(b"")
    for name in ("config.json", "tokenizer.json"):
        (ir_only / name).write_text((other / name).read_text())
    with pytest.raises(PrepareError, match="lacks openvino_tokenizer.xml, openvino_detokenizer.xml"):
        prepare_gguf_bundle(
            PrepareConfig(target=str(tiny["gguf"]), draft=str(ir_only), output=tmp_path / "b")
        )
    assert not (tmp_path / "b").exists()
    # Its Hugging Face checkpoint brings its tokenizer: a pair that translates.
    bundle = ModelBundle.open(
        prepare_gguf_bundle(PrepareConfig(target=str(tiny["gguf"]), draft=str(other), output=tmp_path / "b"))
    )
    assert bundle.translates_tokens and bundle.manifest["pairing"]["translate"]
    assert (bundle.draft.path / "openvino_tokenizer.xml").is_file()


def test_unsupported_architecture_is_one_line_and_leaves_no_folder(tiny, tmp_path, capsys):
    gguf_path = write_gguf_from_checkpoint(
        tiny["checkpoint"], tmp_path / "gpt2.gguf", dtype="F16", architecture="gpt2"
    )
    output = tmp_path / "bundle"
    assert main(["prepare", str(gguf_path), "-o", str(output)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "architecture gpt2" in err and "MOSTLY_F16" in err
    assert not output.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["gpt2.gguf"]


def test_unsupported_weight_type_is_one_line_and_leaves_no_folder(tiny, tmp_path, capsys):
    gguf_path = write_gguf_from_checkpoint(tiny["checkpoint"], tmp_path / "f32.gguf", dtype="F32")
    output = tmp_path / "bundle"
    assert main(["prepare", str(gguf_path), "-o", str(output)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ALL_F32" in err and "F32" in err
    assert not output.exists()


def test_weights_flag_recompresses_an_unquantised_gguf_with_nncf(tiny, tmp_path):
    output = prepare_gguf_bundle(
        PrepareConfig(target=str(tiny["gguf"]), output=tmp_path / "int8", weights="int8")
    )
    compression = ModelBundle.open(output, verify=True).target.facts["compression"]
    assert compression["weights"] == "int8" and compression["int8_constants"] > 0
    pipe = Pipeline(output, drafter="none", properties=EXACT, use_placement=False)
    assert len(pipe.generate("def add(a, b):", GREEDY)[0].token_ids) == GREEDY.max_tokens


def test_not_a_gguf_file_is_a_clear_error(tmp_path):
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"not a gguf at all")
    with pytest.raises(PrepareError, match="not a readable GGUF file"):
        prepare_gguf_bundle(PrepareConfig(target=str(fake), output=tmp_path / "b"))
    assert not (tmp_path / "b").exists()


@pytest.mark.smollm2
def test_smollm2_gguf_prepares_and_answers(smollm2_gguf, tmp_path, capsys):
    """The real GGUF (Q4_1 + Q8_0): kept quantised, the chat template applied, a correct answer."""
    output = tmp_path / "smollm2"
    assert main(["prepare", str(smollm2_gguf), "-o", str(output)]) == 0
    with pytest.raises(PrepareError, match="already quantised as Q4_1"):
        prepare_gguf_bundle(PrepareConfig(target=str(smollm2_gguf), output=tmp_path / "x", weights="int8"))
    assert main(["inspect", str(output)]) == 0
    bundle = ModelBundle.open(output)
    assert bundle.target.facts["compression"]["int4_constants"] > 0
    assert bundle.max_context == 8192 and "<|im_start|>" in (bundle.chat_template or "")
    pipe = Pipeline(output, drafter="none", properties=EXACT, use_placement=False)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    result = pipe.generate([messages], SamplingParams(max_tokens=24, temperature=0.0))[0]
    assert "Paris" in result.text and result.finish_reason == "stop"
    assert np.isfinite(result.stats["tokens_per_s"])
