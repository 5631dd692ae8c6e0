"""Pairing check: same vocabulary over the draft's range and same special tokens, or --force-pair."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from xpuspec.models.bundle import ModelBundle
from xpuspec.prepare import PairingError, PrepareConfig, prepare_bundle
from xpuspec.prepare.config import PrepareError
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
    # The mismatched checkpoint has more token ids than the llama target: as its draft the engine could
    # not run it, so prepare refuses with or without --force-pair (and does not suggest forcing).
    for force_pair in (False, True):
        too_wide = PrepareConfig(
            target=str(target_irs["llama"]),
            draft=str(mismatched_draft_checkpoint),
            output=tmp_path / "bundle",
            weights="fp16",
            force_pair=force_pair,
        )
        with pytest.raises(PrepareError, match="is larger than the target's") as raised:
            prepare_bundle(too_wide)
        assert "not even with --force-pair" in str(raised.value)
        assert list(tmp_path.iterdir()) == []

    # The other way round the draft fits: a tokenizer mismatch, refused unless forced.
    config = PrepareConfig(
        target=str(mismatched_draft_checkpoint),
        draft=str(target_irs["llama"]),
        output=tmp_path / "bundle",
        weights="fp16",
    )
    with pytest.raises(PairingError, match="vocabularies differ at token id"):
        prepare_bundle(config)
    assert list(tmp_path.iterdir()) == []

    # Forced: the target is exported from its HF checkpoint in-process (the export path of prepare).
    forced = PrepareConfig(
        target=str(mismatched_draft_checkpoint),
        draft=str(target_irs["llama"]),
        output=tmp_path / "bundle",
        weights="fp16",
        force_pair=True,
    )
    bundle = ModelBundle.open(prepare_bundle(forced), verify=True)
    pairing = bundle.manifest["pairing"]
    assert pairing["checked"] and pairing["forced"]
    assert "vocabularies differ" in pairing["mismatch"]
    assert bundle.target.facts["source"] == str(mismatched_draft_checkpoint.resolve())
    # --force-pair writes only bundles that run: the draft drafts (its proposals are merely poor)
    from xpuspec import Pipeline, SamplingParams

    pipe = Pipeline(bundle.root, drafter="draft")
    result = pipe.generate(
        "def add(a, b):", SamplingParams(max_tokens=6, temperature=0.0, num_draft_tokens=2)
    )[0]
    assert len(result.token_ids) == 6 and result.stats["drafted"] > 0
