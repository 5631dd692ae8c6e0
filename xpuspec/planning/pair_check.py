"""The pair check of `xpuspec prepare`: how often the target accepts the draft model's drafts, measured on a
few prompts, and recorded in the manifest's "pairing" (``check``), which `xpuspec inspect` shows.

Greedy requests at a fixed γ, the draft model alone (no prompt lookup beside it), so the figure is the
draft's: for a pair whose tokenizers differ, the acceptance of its drafts translated into target tokens.
Whether that acceptance pays on a machine is the cost model's call at run time (docs/speculation.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from xpuspec.api.pipeline import Pipeline
from xpuspec.engine.engine import EngineConfig
from xpuspec.models.bundle import ModelBundle, write_manifest_field
from xpuspec.planning.planner import WORKLOAD_PROMPTS
from xpuspec.sample.sampling_params import SamplingParams

PAIR_CHECK_TOKENS = 32
PAIR_CHECK_GAMMA = 3


@dataclass(frozen=True)
class PairCheck:
    """The draft's acceptance on ``prompts`` greedy requests of ``max_tokens`` at γ = ``num_draft_tokens``."""

    prompts: int
    max_tokens: int
    num_draft_tokens: int
    drafted: int
    accepted: int
    translates: bool

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def describe(self) -> str:
        """``"acceptance 41% (52 of 126 drafted tokens) on 4 prompts, greedy, γ = 3, ..."``."""
        share = "none drafted" if self.acceptance is None else f"acceptance {self.acceptance:.0%}"
        how = "translated through text" if self.translates else "same tokenizer"
        return (
            f"{share} ({self.accepted} of {self.drafted} drafted tokens) on {self.prompts} prompts, greedy, "
            f"γ = {self.num_draft_tokens}, {self.max_tokens} tokens each, the draft model alone ({how})"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "acceptance": self.acceptance, "summary": self.describe()}


def measure_pair(bundle_path: str | Path, prompts: tuple[str, ...] = WORKLOAD_PROMPTS) -> PairCheck:
    """Run the bundle's pair on ``prompts`` and count the draft model's drafts and acceptances."""
    bundle = ModelBundle.open(bundle_path)
    if bundle.draft is None:
        raise ValueError(f"{bundle.root} has no draft model to check")
    config = EngineConfig(max_model_len=bundle.max_context, prompt_lookup=False)
    pipe = Pipeline(bundle, drafter="draft", engine_config=config, use_placement=False, startup_cache=False)
    params = SamplingParams(
        max_tokens=PAIR_CHECK_TOKENS, temperature=0.0, ignore_eos=True, num_draft_tokens=PAIR_CHECK_GAMMA
    )
    results = pipe.generate(list(prompts), params)
    return PairCheck(
        prompts=len(prompts),
        max_tokens=PAIR_CHECK_TOKENS,
        num_draft_tokens=PAIR_CHECK_GAMMA,
        drafted=sum(r.stats["drafted"] for r in results),
        accepted=sum(r.stats["accepted"] for r in results),
        translates=bundle.translates_tokens,
    )


def record_pair_check(bundle_path: str | Path, check: PairCheck) -> None:
    """Add ``check`` to the manifest's "pairing" (the manifest is not hashed: the bundle stays verified)."""
    bundle = ModelBundle.open(bundle_path, verify=False)
    pairing = dict(bundle.manifest.get("pairing") or {})
    pairing["check"] = check.describe()
    pairing["check_figures"] = check.as_dict()
    write_manifest_field(bundle.root, "pairing", pairing)
