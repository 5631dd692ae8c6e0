"""`xpuspec prepare TARGET --eagle3 HEAD_DIR`: the head checked against HF and GGUF targets, stored in the
bundle and verified with it, shown by `inspect`, and drafting through `generate --drafter eagle3`.

Targets are the tiny 2-layer pair's (its IR folders, so nothing is exported again); the random heads tap
boundaries (0, 1, 2) and draft over 96 of the target's ids.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from research.training.eagle3_torch import random_head, save_head  # noqa: E402
from tests.conftest import EAGLE3_DRAFT_VOCAB, EAGLE3_TAPS, EXACT_PRESET  # noqa: E402
from xpuspec import Pipeline, SamplingParams  # noqa: E402
from xpuspec.api.errors import EXIT_FAILED, EXIT_USAGE  # noqa: E402
from xpuspec.cli import main  # noqa: E402
from xpuspec.models.bundle import BundleError, ModelBundle  # noqa: E402
from xpuspec.prepare.config import PrepareError  # noqa: E402
from xpuspec.prepare.eagle3 import write_head, write_safetensors  # noqa: E402
from xpuspec.prepare.writer import STAGING_PREFIX  # noqa: E402
from xpuspec.spec_decode.eagle3.weights import read_head_tensors, read_safetensors  # noqa: E402

# A fixed γ: the adaptive policy rightly keeps a random head from drafting.
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, num_draft_tokens=3)


@pytest.fixture(scope="module")
def target_config(pair_bundle: Path) -> dict:
    return json.loads((pair_bundle / "target" / "config.json").read_text())


@pytest.fixture(scope="module")
def prepared(pair_bundle: Path, eagle3_head: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A target-only bundle with the head, through the CLI."""
    output = tmp_path_factory.mktemp("eagle3_cli") / "bundle"
    argv = ["prepare", str(pair_bundle / "target"), "--eagle3", str(eagle3_head), "-o", str(output)]
    assert main([*argv, "--weights", "fp16"]) == 0
    return output


def _head(target_config: dict, folder: Path, change: dict | None = None, **kwargs) -> Path:
    change = dict(change or {})
    layers = change.pop("aux_layer_ids", EAGLE3_TAPS)
    module, config = random_head({**target_config, **change}, 64, seed=1, aux_layer_ids=layers, **kwargs)
    return save_head(module, config, folder)


def _stderr_lines(capfd: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capfd.readouterr().err.splitlines() if line.strip()]


def test_the_manifest_records_the_head_and_its_files(prepared: Path, eagle3_head: Path) -> None:
    bundle = ModelBundle.open(prepared)
    head = bundle.eagle3
    assert head is not None and head.path == prepared / "eagle3"
    assert head.tap_layers == EAGLE3_TAPS and head.draft_vocab_size == EAGLE3_DRAFT_VOCAB
    assert head.facts["source"] == str(eagle3_head.resolve())
    assert head.config().hidden_size == bundle.target.facts["hidden_size"]
    assert {"eagle3/config.json", "eagle3/model.safetensors"} <= set(bundle.manifest["files"])
    assert sorted(p.name for p in head.path.iterdir()) == ["config.json", "model.safetensors"]


def test_inspect_shows_the_head_and_verifies_it(
    prepared: Path, target_config: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", str(prepared)]) == 0
    out = capsys.readouterr().out
    assert "eagle3: LlamaForCausalLMEagle3 in eagle3/" in out
    vocab = target_config["vocab_size"]
    assert f"reads target layers [0, 1, 2], hidden 64, draft vocab {EAGLE3_DRAFT_VOCAB} of {vocab}" in out
    assert "verified: all" in out


def test_generate_drafts_with_the_bundles_head(prepared: Path, capfd: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "The quick brown fox", "--raw", "--bundle", str(prepared), "--drafter", "eagle3"]
    assert main([*argv, "--max-tokens", "12", "--ignore-eos", "--num-draft-tokens", "3", "--exact"]) == 0
    summary = capfd.readouterr().err
    assert "[eagle3 drafter, γ = 3] 12 tokens" in summary
    assert "drafted 0," not in summary


def test_the_head_drafts_exactly(prepared: Path) -> None:
    """The bundle's head (no eagle3_head argument) keeps greedy output equal to the target's."""
    alone = Pipeline(prepared, drafter="none", properties=EXACT_PRESET)
    eagle3 = Pipeline(prepared, drafter="eagle3", properties=EXACT_PRESET)
    assert eagle3.drafter == "eagle3" and eagle3.target_runner.hidden_state_layers == EAGLE3_TAPS
    prompts = ["The quick brown fox", "def add(a, b):"]
    expected = [r.token_ids for r in alone.generate(prompts, GREEDY)]
    results = eagle3.generate(prompts, GREEDY)
    assert [r.token_ids for r in results] == expected
    assert sum(r.stats["drafted"] for r in results) > 0
    assert Pipeline(prepared, properties=EXACT_PRESET).drafter == "ngram"  # auto: today's choice


def test_drafter_eagle3_without_a_head_says_how_to_add_one(
    pair_bundle: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", "hi", "--bundle", str(pair_bundle), "--drafter", "eagle3"]) == EXIT_USAGE
    loading, *errors = _stderr_lines(capfd)
    assert loading.startswith("xpuspec generate: loading "), loading
    assert len(errors) == 1, errors
    assert errors[0].startswith("xpuspec: error: ") and "has no EAGLE-3 head" in errors[0]
    assert "xpuspec prepare TARGET --eagle3 HEAD_DIR -o BUNDLE" in errors[0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": 32, "intermediate_size": 64}, "its hidden_size is 64"),
        ({"vocab_size": 512}, "its vocab_size is"),
        ({"aux_layer_ids": (0, 1, 7)}, "past the target's 2"),
        ({"aux_layer_ids": None}, "6 layers"),
    ],
    ids=["hidden", "vocab", "layers", "default_layers"],
)
def test_a_head_that_does_not_fit_is_refused_before_any_work(
    pair_bundle, target_config, tmp_path, capfd, change, message
) -> None:
    head = _head(target_config, tmp_path / "head", change)
    output = tmp_path / "bundle"
    code = main(["prepare", str(pair_bundle / "target"), "--eagle3", str(head), "-o", str(output)])
    lines = _stderr_lines(capfd)
    assert code == EXIT_USAGE and len(lines) == 1, lines
    assert lines[0].startswith(f"xpuspec: error: --eagle3 {head}: ") and message in lines[0], lines
    assert not output.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(STAGING_PREFIX)]


def test_weights_that_do_not_fit_the_heads_config_leave_no_bundle(
    pair_bundle, eagle3_head, tmp_path, capfd
) -> None:
    head = Path(shutil.copytree(eagle3_head, tmp_path / "head"))
    tensors = read_safetensors(head / "model.safetensors")
    del tensors["midlayer.mlp.up_proj.weight"]
    raw = {
        name: ("F32" if a.dtype == np.float32 else "I64", list(a.shape), a.tobytes())
        for name, a in tensors.items()
        if a.dtype != np.bool_
    }
    write_safetensors(head / "model.safetensors", raw)
    output = tmp_path / "bundle"
    argv = ["prepare", str(pair_bundle / "target"), "--eagle3", str(head), "-o", str(output)]
    code = main([*argv, "--weights", "fp16", "--log", str(tmp_path / "prepare.log")])
    lines = _stderr_lines(capfd)  # the stage lines, then the error
    errors = [line for line in lines if line.startswith("xpuspec: error: ")]
    assert code == EXIT_FAILED and len(errors) == 1 and lines[-1] == errors[0], lines
    assert "Traceback" not in "\n".join(lines)
    assert f"--eagle3 {head}: the weights do not fit" in errors[0]
    assert "missing midlayer.mlp.up_proj.weight" in errors[0]
    assert not output.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(STAGING_PREFIX)]


def test_a_changed_head_file_fails_verification(prepared: Path, tmp_path: Path, capsys) -> None:
    copy = Path(shutil.copytree(prepared, tmp_path / "bundle"))
    weights = copy / "eagle3" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="changed: eagle3/model.safetensors"):
        ModelBundle.open(copy)
    assert main(["inspect", str(copy)]) == EXIT_FAILED
    assert "changed: eagle3/model.safetensors" in capsys.readouterr().err


# ------------------------------------------------------------------ canonical form of other layouts


def _target_facts(pair_bundle: Path) -> dict:
    return ModelBundle.open(pair_bundle).target.facts


def test_a_torch_pickle_becomes_safetensors_with_its_dtypes(pair_bundle, target_config, tmp_path) -> None:
    module, config = random_head(target_config, 64, seed=2, aux_layer_ids=EAGLE3_TAPS)
    source = save_head(module, config, tmp_path / "saved", dtype=torch.bfloat16)
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copyfile(source / "config.json", pickled / "config.json")
    state = {
        k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in module.state_dict().items()
    }
    torch.save(state, pickled / "pytorch_model.bin")
    out = tmp_path / "bundle"
    out.mkdir()
    facts = write_head(pickled, out, _target_facts(pair_bundle))
    assert facts["source_format"] == "pytorch_model.bin" and facts["tap_layers"] == list(EAGLE3_TAPS)
    header_length = int.from_bytes((out / "eagle3" / "model.safetensors").read_bytes()[:8], "little")
    header = json.loads((out / "eagle3" / "model.safetensors").read_bytes()[8 : 8 + header_length])
    assert header["fc.weight"]["dtype"] == "BF16" and header["d2t"]["dtype"] == "I64"
    expected = read_head_tensors(source)  # the same bf16 values through the safetensors reader
    written = read_safetensors(out / "eagle3" / "model.safetensors")
    assert written.keys() == expected.keys()
    assert all(np.array_equal(written[name], expected[name]) for name in expected)


def test_shards_are_merged(pair_bundle, eagle3_head, tmp_path) -> None:
    tensors = read_safetensors(eagle3_head / "model.safetensors")
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copyfile(eagle3_head / "config.json", sharded / "config.json")
    names = sorted(tensors)
    weight_map = {}
    for index, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        shard = f"model-0000{index + 1}-of-00002.safetensors"
        dtypes = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64", np.dtype(np.bool_): "BOOL"}
        write_safetensors(
            sharded / shard,
            {n: (dtypes[tensors[n].dtype], list(tensors[n].shape), tensors[n].tobytes()) for n in part},
        )
        weight_map.update(dict.fromkeys(part, shard))
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    out = tmp_path / "bundle"
    out.mkdir()
    assert (
        write_head(sharded, out, _target_facts(pair_bundle))["source_format"]
        == "model.safetensors.index.json"
    )
    written = read_safetensors(out / "eagle3" / "model.safetensors")
    assert all(np.array_equal(written[name], tensors[name]) for name in tensors)


def test_a_head_folder_that_is_not_there(pair_bundle, tmp_path) -> None:
    with pytest.raises(PrepareError, match="no such folder"):
        write_head(tmp_path / "nothing", tmp_path, _target_facts(pair_bundle))


# ------------------------------------------------------------------------------------ GGUF targets


@pytest.fixture(scope="module")
def tiny_gguf(pair_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("gguf")
    from tests.support.tiny_gguf import write_gguf_from_checkpoint

    checkpoint = pair_bundle.parent / "target"  # the pair's Hugging Face checkpoint
    return write_gguf_from_checkpoint(checkpoint, tmp_path_factory.mktemp("gguf") / "tiny.gguf", dtype="F16")


def test_a_gguf_target_takes_a_head(tiny_gguf: Path, eagle3_head: Path, tmp_path: Path) -> None:
    output = tmp_path / "bundle"
    assert main(["prepare", str(tiny_gguf), "--eagle3", str(eagle3_head), "-o", str(output)]) == 0
    bundle = ModelBundle.open(output)
    assert bundle.eagle3 is not None and bundle.eagle3.tap_layers == EAGLE3_TAPS
    alone = Pipeline(output, drafter="none", properties=EXACT_PRESET).generate("The quick brown fox", GREEDY)
    eagle3 = Pipeline(output, drafter="eagle3", properties=EXACT_PRESET).generate(
        "The quick brown fox", GREEDY
    )
    assert eagle3[0].token_ids == alone[0].token_ids and eagle3[0].stats["drafted"] > 0


def test_a_gguf_target_refuses_a_head_for_another_target(
    tiny_gguf: Path, target_config: dict, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    head = _head(target_config, tmp_path / "head", {"aux_layer_ids": (0, 1, 7)})
    output = tmp_path / "bundle"
    assert main(["prepare", str(tiny_gguf), "--eagle3", str(head), "-o", str(output)]) == EXIT_USAGE
    lines = _stderr_lines(capfd)
    assert len(lines) == 1 and "past the target's 2" in lines[0], lines
    assert not output.exists()
