"""Pairing check: same vocabulary over the draft's range and same special tokens; tokenizers that differ
make a pair that translates through text, or, with --force-pair, one paired by token id."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from xpuspec.models.bundle import ModelBundle
from xpuspec.prepare import PairingError, PrepareConfig, prepare_bundle
from xpuspec.prepare.config import PrepareError
from xpuspec.prepare.pairing import check_pair
from xpuspec.prepare.summary import summarize_bundle


def test_same_tokenizer_pairs(draft_checkpoint: Path, target_checkpoints: dict[str, Path]) -> None:
    check_pair(
        AutoTokenizer.from_pretrained(target_checkpoints["qwen2"]),
        AutoTokenizer.from_pretrained(draft_checkpoint),
    )


def test_target_vocabulary_may_be_larger(draft_checkpoint: Path) -> None:
    target = AutoTokenizer.from_pretrained(draft_checkpoint)
    target.add_tokens(["<|extra_target_token|>"])
    check_pair(target, AutoTokenizer.from_pretrained(draft_checkpoint))
    with pytest.raises(PairingError, match="target vocabulary ends"):
        check_pair(AutoTokenizer.from_pretrained(draft_checkpoint), target)  # the larger one as draft


def test_vocabulary_mismatch_names_the_first_differing_token(
    draft_checkpoint: Path, mismatched_draft_checkpoint: Path
) -> None:
    target = AutoTokenizer.from_pretrained(draft_checkpoint)
    draft = AutoTokenizer.from_pretrained(mismatched_draft_checkpoint)
    first_difference = next(
        i for i in range(len(draft)) if target.convert_ids_to_tokens(i) != draft.convert_ids_to_tokens(i)
    )
    with pytest.raises(PairingError) as raised:
        check_pair(target, draft)
    message = str(raised.value)
    assert f"token id {first_difference}:" in message
    assert repr(target.convert_ids_to_tokens(first_difference)) in message
    assert repr(draft.convert_ids_to_tokens(first_difference)) in message
    assert "--force-pair" in message


def test_special_token_mismatch_is_named(draft_checkpoint: Path) -> None:
    target = AutoTokenizer.from_pretrained(draft_checkpoint)
    draft = AutoTokenizer.from_pretrained(draft_checkpoint)
    draft.pad_token = draft.eos_token
    with pytest.raises(PairingError, match=r"special token pad differs: target '<\|pad\|>' \(id 2\)"):
        check_pair(target, draft)


@pytest.mark.slow
def test_prepare_translates_a_pair_whose_tokenizers_differ_unless_forced(
    target_irs: dict[str, Path], mismatched_draft_checkpoint: Path, tmp_path: Path
) -> None:
    # The mismatched checkpoint has more token ids than the llama target. Paired by id (--force-pair) the
    # engine could not run it: refused, and nothing written.
    too_wide = PrepareConfig(
        target=str(target_irs["llama"]),
        draft=str(mismatched_draft_checkpoint),
        output=tmp_path / "wide",
        weights="fp16",
        force_pair=True,
    )
    with pytest.raises(PrepareError, match="is larger than the target's") as raised:
        prepare_bundle(too_wide)
    assert "not even with --force-pair" in str(raised.value)
    assert list(tmp_path.iterdir()) == []

    # Without --force-pair the tokenizers' difference makes a translating pair, whatever the sizes.
    translating = ModelBundle.open(
        prepare_bundle(dataclasses.replace(too_wide, force_pair=False)), verify=True
    )
    pairing = translating.manifest["pairing"]
    assert pairing["translate"] and not pairing["forced"] and pairing["mismatch"] is None
    assert "vocabularies differ at token id" in pairing["difference"]
    assert translating.translates_tokens
    assert "drafts are translated into target tokens through text" in summarize_bundle(translating)

    from xpuspec import Pipeline, SamplingParams
    from xpuspec.spec_decode.cross_tokenizer import CrossTokenizerDrafter

    pipe = Pipeline(translating.root, drafter="auto")  # a larger draft vocabulary still drafts
    assert isinstance(pipe.proposer, CrossTokenizerDrafter)
    result = pipe.generate(
        "def add(a, b):", SamplingParams(max_tokens=6, temperature=0.0, num_draft_tokens=2)
    )[0]
    assert len(result.token_ids) == 6 and result.stats["drafted"] > 0

    # Forced the other way round (the draft fits): paired by id as before, the mismatch recorded.
    forced = PrepareConfig(
        target=str(mismatched_draft_checkpoint),
        draft=str(target_irs["llama"]),
        output=tmp_path / "forced",
        weights="fp16",
        force_pair=True,
    )
    bundle = ModelBundle.open(prepare_bundle(forced), verify=True)
    pairing = bundle.manifest["pairing"]
    assert pairing["checked"] and pairing["forced"] and not bundle.translates_tokens
    assert "vocabularies differ" in pairing["mismatch"]
    assert bundle.target.facts["source"] == str(mismatched_draft_checkpoint.resolve())
    pipe = Pipeline(bundle.root, drafter="draft")  # --force-pair writes only bundles that run
    result = pipe.generate(
        "def add(a, b):", SamplingParams(max_tokens=6, temperature=0.0, num_draft_tokens=2)
    )[0]
    assert len(result.token_ids) == 6 and result.stats["drafted"] > 0


@pytest.mark.slow
def test_the_command_says_it_translates_and_measures_the_pair(
    target_irs: dict[str, Path],
    mismatched_draft_checkpoint: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from xpuspec.cli import main

    output = tmp_path / "bundle"
    argv = [
        "prepare",
        str(target_irs["llama"]),
        "--draft",
        str(mismatched_draft_checkpoint),
        "-o",
        str(output),
    ]
    assert main([*argv, "--weights", "fp16", "--log", str(tmp_path / "log")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("bundle written to")
    assert lines[1].startswith("pairing: the tokenizers differ, so the draft's drafts will be translated")
    assert lines[2].startswith("pair check: acceptance ") and "translated through text" in lines[2]
    pairing = ModelBundle.open(output, verify=True).manifest["pairing"]
    assert pairing["translate"] and pairing["check"] == lines[2].removeprefix("pair check: ")
