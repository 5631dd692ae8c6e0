"""The pair check of `xpuspec prepare` (xpuspec/planning/pair_check.py) on a pair whose tokenizers differ:
the draft's translated drafts are counted, and the figure lands in the manifest without unsealing it."""

from __future__ import annotations

import shutil
from pathlib import Path

from xpuspec.models.bundle import ModelBundle
from xpuspec.planning.pair_check import PAIR_CHECK_GAMMA, measure_pair, record_pair_check
from xpuspec.prepare.summary import summarize_bundle


def test_the_pair_check_measures_the_translated_drafts_and_records_them(
    translating_bundle: Path, tmp_path: Path
) -> None:
    bundle = Path(shutil.copytree(translating_bundle, tmp_path / "bundle"))
    check = measure_pair(bundle, prompts=("def add(a, b):", "The quick brown fox"))
    assert check.translates and check.prompts == 2 and check.num_draft_tokens == PAIR_CHECK_GAMMA
    assert 0 < check.accepted < check.drafted  # the tiny pair accepts some drafts, not all
    assert check.acceptance == check.accepted / check.drafted
    assert f"{check.accepted} of {check.drafted} drafted tokens" in check.describe()
    assert "translated through text" in check.describe()

    record_pair_check(bundle, check)
    reopened = ModelBundle.open(bundle, verify=True)  # the manifest is not hashed: still verified
    assert reopened.manifest["pairing"]["check"] == check.describe()
    assert reopened.manifest["pairing"]["check_figures"]["drafted"] == check.drafted
    assert reopened.translates_tokens
    assert f"pair check: {check.describe()}" in summarize_bundle(reopened)
