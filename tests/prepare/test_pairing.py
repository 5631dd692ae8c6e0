"""Pairing check: same vocabulary over the draft's range and same special tokens, or --force-pair."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from xpuspec.model_bundle import ModelBundle
from xpuspec.prepare import PairingError, PrepareConfig, prepare_bundle
from xpuspec.prepare.pairing import check_pair


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
def test_prepare_refuses_a_mismatched_pair_unless_forced(
    target_irs: dict[str, Path], mismatched_draft_checkpoint: Path, tmp_path: Path
) -> None:
    config = PrepareConfig(
        target=str(target_irs["llama"]),
        draft=str(mismatched_draft_checkpoint),
        output=tmp_path / "bundle",
        weights="fp16",
    )
    with pytest.raises(PairingError, match="vocabularies differ at token id"):
        prepare_bundle(config)
    assert list(tmp_path.iterdir()) == []

    # Forced: the draft is exported from its HF checkpoint in-process (the export path of prepare).
    forced = PrepareConfig(
        target=str(target_irs["llama"]),
        draft=str(mismatched_draft_checkpoint),
        output=tmp_path / "bundle",
        weights="fp16",
        force_pair=True,
    )
    bundle = ModelBundle.open(prepare_bundle(forced), verify=True)
    pairing = bundle.manifest["pairing"]
    assert pairing["checked"] and pairing["forced"]
    assert "vocabularies differ" in pairing["mismatch"]
    assert bundle.draft is not None and bundle.draft.facts["source"] == str(
        mismatched_draft_checkpoint.resolve()
    )
