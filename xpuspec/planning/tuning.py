"""Compile properties chosen by measurement: the step cost and greedy agreement of candidate settings.

For one model (target or draft) on one device, `xpuspec plan` compiles candidate settings of
inference precision, KV-cache precision and dynamic-quantisation group size, and for each measures

- **agreement with exact mode**: how many of a few short greedy continuations (4 prompts x 32 tokens by
  default) are token-identical to the exact reference's (f32 compute, f32 KV cache, no dynamic
  quantisation). Lower precision flips a near-tie now and then, so this is rarely all of them;
- **verified = decoded**: how many of the same continuations come out the same when the target verifies
  them ``verify_chunk`` tokens at a time, with a rejected draft at the end of every chunk, as when it
  decodes them one at a time, under the candidate's own properties. Where all do, speculation does not
  change the candidate's answers (docs/exactness.md);
- **step cost**: the median time of a single-token decode step, in interleaved rounds (every candidate
  once per round, the order reversed every other round) until the ranking against the plugin's
  default is clear or a round limit is reached.

Speculation that changes answers is worse than a slightly slower step: when the default's verified text
differs from its decoded text on a prompt where another candidate's does not, the fastest of the
candidates with the most prompts verified = decoded replaces it, if its step costs at most
``stability_cost`` (10%) more; a dearer one is named in the reason and not chosen. Otherwise the fastest
candidate whose two agreements are at least the default's replaces the default only when it is clearly faster:
every one of its rounds faster than every round of the default over at least ``confirm_rounds`` rounds
each (5: a chance of 1 / C(10, 5) < 0.4% under no difference) and a median gain above a margin (5%).
Otherwise the plugin's default stays and the record says the candidates were within noise.

Candidates are pruned to keep planning fast:
1. compute x KV precision: the device's compute precisions (f32, and bf16 / f16 where the device
   lists them), each with a u8 cache, a cache of its own precision and an f32 cache; and the u8 cache
   with keys quantised per channel (the CPU plugin's own mode, faster on some CPUs, but it changes
   answers under speculation);
2. dynamic-quantisation group size (0 / 32 / 64 / 128 / 256), only at f32 compute with int8/int4
   weights (at bf16 the CPU does not quantise activations), with the fastest f32 cache of step 1.
``quick`` keeps step 1's f32 cache and own-precision caches and skips step 2.
A combination the device refuses (e.g. f32 compute with a bf16 cache on the CPU) is skipped with one
line saying why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from xpuspec.executor.properties import EXACT_PROPERTIES, KEY_QUANT_MODE, readable
from xpuspec.planning.trial import PropertyCandidate, Subject, Trial

logger = logging.getLogger(__name__)

GROUP_SIZES = (0, 32, 64, 128, 256)
DEFAULT_GROUP = 128
# OPTIMIZATION_CAPABILITIES names -> INFERENCE_PRECISION_HINT values.
COMPUTE_PRECISIONS = {"FP32": "f32", "BF16": "bf16", "FP16": "f16"}
COMPRESSED_WEIGHTS = ("int8", "int4")


@dataclass(frozen=True)
class TuneConfig:
    """How much to measure per candidate."""

    num_prompts: int = 4  # greedy-agreement prompts
    max_tokens: int = 32  # tokens per agreement prompt
    steps_per_round: int = 16  # single-token decode steps timed per candidate and round
    min_rounds: int = 3
    max_rounds: int = 8
    confirm_rounds: int = 5  # replacing the default needs at least this many rounds of both
    margin: float = 0.05  # a candidate must be this much faster (median) than the default to replace it
    verify_chunk: int = 4  # tokens per verification pass in the verified = decoded check
    # A default whose speculation changes answers gives way to a stabler candidate up to this much
    # slower (step time); a dearer one is reported, not chosen (exact mode stays one flag away).
    stability_cost: float = 0.10
    quick: bool = False  # fewer candidates (see the module doc)

    def __post_init__(self) -> None:
        for name in ("num_prompts", "max_tokens", "steps_per_round", "min_rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.min_rounds <= self.confirm_rounds <= self.max_rounds:
            raise ValueError(
                f"need min_rounds <= confirm_rounds <= max_rounds, got {self.min_rounds}, "
                f"{self.confirm_rounds}, {self.max_rounds}"
            )
        if not 0 <= self.margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {self.margin}")
        if self.verify_chunk < 2:
            raise ValueError(f"verify_chunk must be >= 2, got {self.verify_chunk}")


@dataclass
class TuneResult:
    """The choice for one role on one device, and why."""

    role: str
    device: str
    chosen: dict[str, Any]  # {} keeps the plugin default
    reason: str
    default_properties: dict[str, Any]  # the plugin default's tuned keys, as compiled
    candidates: list[PropertyCandidate]
    num_prompts: int
    max_tokens: int

    def summary(self) -> str:
        """One readable line: what was chosen and why."""
        chosen = (
            readable(self.chosen) if self.chosen else f"plugin default ({readable(self.default_properties)})"
        )
        return f"{chosen}: {self.reason}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "chosen": self.chosen or "plugin default",
            "plugin_default": readable(self.default_properties),
            "reason": self.reason,
            "agreement_check": f"{self.num_prompts} prompts x {self.max_tokens} greedy tokens vs exact",
            "verified_check": "the same prompts verified in chunks (a rejected draft last) vs decoded",
            "candidates": [c.as_dict() for c in self.candidates],
        }


def compute_precisions(device_precisions: Sequence[str]) -> list[str]:
    """f32 always, then bf16 / f16 where the device lists them."""
    found = ["f32"]
    for name, hint in COMPUTE_PRECISIONS.items():
        if name in device_precisions and hint not in found:
            found.append(hint)
    return found


def first_stage(
    device_precisions: Sequence[str], compressed: bool, quick: bool = False
) -> list[dict[str, Any]]:
    """Compute x KV candidates (step 1 of the pruning order); ``quick``: no u8 caches but the default."""
    candidates = []
    for compute in compute_precisions(device_precisions):
        caches = (compute, "f32") if quick else ("u8", compute, "f32")
        for kv in dict.fromkeys(caches):
            properties: dict[str, Any] = {"INFERENCE_PRECISION_HINT": compute, "KV_CACHE_PRECISION": kv}
            if compressed and compute == "f32":
                properties["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = DEFAULT_GROUP
            candidates.append(properties)
            if kv == "u8" and compute == "f32":  # the plugin's own key mode, for its speed
                candidates.append({**properties, KEY_QUANT_MODE: "BY_CHANNEL"})
    return candidates


def group_stage(kv: str) -> list[dict[str, Any]]:
    """Group-size candidates at f32 compute with the chosen cache (step 2)."""
    return [
        {
            "INFERENCE_PRECISION_HINT": "f32",
            "KV_CACHE_PRECISION": kv,
            "DYNAMIC_QUANTIZATION_GROUP_SIZE": group,
        }
        for group in GROUP_SIZES
        if group != DEFAULT_GROUP
    ]


def clearly_faster(
    candidate: PropertyCandidate, default: PropertyCandidate, margin: float, min_rounds: int = 3
) -> bool:
    """Every round of ``candidate`` beat every round of ``default``, by more than ``margin`` at the median."""
    if len(candidate.round_ms) < min_rounds or len(default.round_ms) < min_rounds:
        return False
    assert candidate.step_ms is not None and default.step_ms is not None
    return max(candidate.round_ms) < min(default.round_ms) and candidate.step_ms < default.step_ms * (
        1 - margin
    )


def tune_role(
    make_runner: Callable[[dict[str, Any]], Any],
    role: str,
    device: str,
    device_precisions: Sequence[str],
    weights: str | None,
    default_properties: dict[str, Any],
    prompts: Sequence[list[int]],
    timing_prompt: list[int],
    config: TuneConfig = TuneConfig(),
    progress: Callable[[str], None] = lambda line: None,
) -> TuneResult:
    """Measure the candidates for one model and choose; ``make_runner(properties)`` compiles a paged
    runner with the plugin's defaults overlaid by ``properties`` ({} for the plugin default).

    ``default_properties`` are the tuned keys of the plugin's default, for the record; ``prompts`` are
    token ids, each short enough for ``max_tokens`` more in the runner's blocks.
    """
    compressed = weights in COMPRESSED_WEIGHTS
    context = (
        max(len(p) for p in [*prompts, timing_prompt]) + max(config.max_tokens, config.steps_per_round) + 1
    )
    trial = Trial(make_runner, role, context, prompts, config.max_tokens, config.verify_chunk, progress)
    reference = PropertyCandidate(dict(EXACT_PROPERTIES))
    trial.compile(reference)
    if reference.error is not None:
        reason = f"not tuned: the exact reference failed ({reference.error})"
        return TuneResult(
            role, device, {}, reason, default_properties, [reference], len(prompts), config.max_tokens
        )
    trial.expected = [trial.subjects[id(reference)].greedy(p, config.max_tokens) for p in prompts]
    trial.agreement(reference)  # the reference agrees with itself; how it verifies is measured

    # The default stands for the candidate with the same settings (it is compiled once, as the default).
    default = PropertyCandidate({}, is_default=True)
    candidates = [default]
    for properties in first_stage(device_precisions, compressed, config.quick):
        if _same_as(properties, default_properties):
            continue
        candidates.append(reference if properties == reference.properties else PropertyCandidate(properties))
    if reference not in candidates:  # exact mode's step cost: the price of the stablest answers
        candidates.append(reference)
    for candidate in candidates:
        if id(candidate) not in trial.subjects and candidate.error is None:
            trial.compile(candidate)
        if candidate is not reference:
            trial.agreement(candidate)
    _time_rounds(trial.measured(candidates), trial.subjects, timing_prompt, default, config)
    if compressed and not config.quick:
        _group_stage(trial, candidates, reference, default, default_properties, timing_prompt, config)

    chosen, reason = choose_properties(
        candidates,
        default,
        config.margin,
        config.confirm_rounds,
        num_prompts=len(prompts),
        stability_cost=config.stability_cost,
    )
    return TuneResult(
        role, device, chosen, reason, default_properties, candidates, len(prompts), config.max_tokens
    )


def _group_stage(
    trial: Trial,
    candidates: list[PropertyCandidate],
    reference: PropertyCandidate,
    default: PropertyCandidate,
    default_properties: dict[str, Any],
    timing_prompt: list[int],
    config: TuneConfig,
) -> None:
    """Step 2 (compressed weights): group sizes at f32, with the f32-compute cache that was fastest in
    step 1; the new candidates join ``candidates`` and every candidate is timed again."""
    at_f32 = [
        c
        for c in candidates
        if c.step_ms is not None and c.properties.get("INFERENCE_PRECISION_HINT") == "f32"
    ]
    if not at_f32:
        return
    kv = min(at_f32, key=lambda c: c.step_ms or 0.0).properties["KV_CACHE_PRECISION"]
    for properties in group_stage(kv):
        if properties == reference.properties:
            if reference not in candidates:
                candidates.append(reference)
            continue
        if _same_as(properties, default_properties) or any(c.properties == properties for c in candidates):
            continue
        candidate = PropertyCandidate(properties)
        candidates.append(candidate)
        trial.compile(candidate)
        trial.agreement(candidate)
    _time_rounds(trial.measured(candidates), trial.subjects, timing_prompt, default, config, restart=True)


def _time_rounds(
    measured: list[PropertyCandidate],
    subjects: dict[int, Subject],
    prompt: list[int],
    default: PropertyCandidate,
    config: TuneConfig,
    restart: bool = False,
) -> None:
    """Interleaved rounds until the fastest eligible candidate vs the default is clear, or max_rounds."""
    if restart:
        for candidate in measured:
            candidate.round_ms = []
    for round_index in range(config.max_rounds):
        order = measured if round_index % 2 == 0 else measured[::-1]
        for candidate in order:
            candidate.round_ms.append(subjects[id(candidate)].step_ms(prompt, config.steps_per_round))
        if round_index + 1 < config.min_rounds:
            continue
        best = _fastest_eligible(measured, default)
        if (
            best is None
            or best is default
            or clearly_faster(best, default, config.margin, config.confirm_rounds)
        ):
            return
        if (
            best.step_ms is not None
            and default.step_ms is not None
            and best.step_ms > default.step_ms * (1 - config.margin)
        ):
            return  # the best is within the margin at the median: more rounds would not change the choice


def _same_as(properties: dict[str, Any], default_properties: dict[str, Any]) -> bool:
    """``properties`` overlaid on the default change none of its tuned keys."""
    return bool(default_properties) and {**default_properties, **properties} == default_properties


def _eligible(candidate: PropertyCandidate, default: PropertyCandidate) -> bool:
    """Timed, and as faithful as the default: agreeing with exact mode and verified = decoded as often."""
    return (
        candidate.error is None
        and candidate.step_ms is not None
        and (candidate.agreement or 0) >= (default.agreement or 0)
        and (candidate.verified or 0) >= (default.verified or 0)
    )


def _fastest_eligible(
    candidates: list[PropertyCandidate], default: PropertyCandidate
) -> PropertyCandidate | None:
    eligible = [c for c in candidates if _eligible(c, default)]
    return min(eligible, key=lambda c: c.step_ms or 0.0) if eligible else None


def _stable_replacement(
    candidates: list[PropertyCandidate], default: PropertyCandidate
) -> PropertyCandidate | None:
    """The fastest of the candidates verified = decoded on the most prompts, when the default is not
    among them (speculation would change its answers where theirs stay); else ``None``."""
    timed = [c for c in candidates if c.error is None and c.step_ms is not None and c.verified is not None]
    if default.verified is None or not timed:
        return None
    most = max(c.verified or 0 for c in timed)
    if default.verified >= most:
        return None
    return min((c for c in timed if c.verified == most), key=lambda c: c.step_ms or 0.0)


def faithfulness(candidate: PropertyCandidate, num_prompts: int | None = None) -> str:
    """``"same as exact 3/4, verified = decoded 4/4"``: the two agreements, self-explained."""
    total = "" if num_prompts is None else f"/{num_prompts}"
    return f"same as exact {candidate.agreement}{total}, verified = decoded {candidate.verified}{total}"


def choose_properties(
    candidates: list[PropertyCandidate],
    default: PropertyCandidate,
    margin: float,
    confirm_rounds: int = 3,
    num_prompts: int | None = None,
    stability_cost: float = 0.10,
) -> tuple[dict[str, Any], str]:
    if default.error is not None or default.step_ms is None:
        return {}, f"not tuned: the plugin default did not run ({default.error})"
    stable = _stable_replacement(candidates, default)
    if stable is not None:
        ratio = (stable.step_ms or 0.0) / default.step_ms
        found = (
            f"speculation changes the plugin default's greedy answers "
            f"({faithfulness(default, num_prompts)}); the fastest candidate that keeps more of them, "
            f"{stable.label} ({faithfulness(stable, num_prompts)}), takes {ratio:.2f}x its step time"
        )
        if ratio <= 1 + stability_cost:
            return dict(stable.properties), found
        return {}, f"kept the plugin default: {found}, above the {1 + stability_cost:.2f}x allowed"
    fastest = _fastest_eligible(candidates, default)
    faithful = f"as faithful as the default ({faithfulness(default, num_prompts)})"
    if fastest is None or fastest is default:
        return {}, f"kept the plugin default: no candidate {faithful} was faster"
    # Among the candidates the fastest is not clearly ahead of, the first in the pruning order that is
    # clearly faster than the default wins: noise in which of them came out on top changes nothing.
    contenders = [
        c
        for c in candidates
        if _eligible(c, default) and (c is fastest or not clearly_faster(fastest, c, margin))
    ]
    if default in contenders:
        contenders = []
    best = next((c for c in contenders if clearly_faster(c, default, margin, confirm_rounds)), fastest)
    ratio = (best.step_ms or 0.0) / default.step_ms
    if clearly_faster(best, default, margin, confirm_rounds):
        return dict(best.properties), (
            f"{ratio:.2f}x the default's step time ({best.step_ms:.3f} vs {default.step_ms:.3f} ms, every "
            f"one of {len(best.round_ms)} rounds faster), {faithfulness(best, num_prompts)} (the default: "
            f"{faithfulness(default, num_prompts)})"
        )
    return {}, (
        f"kept the plugin default: the fastest candidate {faithful}, {best.label} at {ratio:.2f}x its step "
        f"time, is within noise (spread {best.spread or 0:.0%} / {default.spread or 0:.0%} over "
        f"{len(best.round_ms)} rounds)"
    )
