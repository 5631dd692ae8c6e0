"""`xpuspec plan`: measure compile properties and placements, and pick the fastest that is clearly so.

Two stages:

1. **Compile properties** per model and device (:mod:`xpuspec.planning.tuning`): the step cost, the
   greedy agreement with exact mode and whether verified tokens equal decoded ones, for candidate
   precisions, KV caches and dynamic-quantisation group sizes; the plugin's default stays unless a
   candidate is clearly faster and as faithful, or speculation changes the default's answers.
2. **Placement**: a candidate is (target device, draft device, drafter, γ); the drafters are the
   bundle's draft model (else n-grams), none, and its EAGLE-3 head when it has one. Each (target, draft,
   drafter) triple is loaded once, with the properties of stage 1, and runs a short greedy workload
   for every γ: 0 (the target alone), a few fixed lengths and adaptive (``None``). Candidates run in
   interleaved rounds (order reversed every other round); a round of one candidate repeats the
   workload until it has lasted ``min_round_seconds``, so no figure comes from a measurement shorter
   than that floor. Rounds go on (``min_rounds`` to ``max_rounds``) until the fastest candidate is
   clearly faster than the default placement (adaptive γ with the bundle's drafter), or clearly not.
   Each drafting candidate's greedy text of its first round is compared with the target-only text on
   the same target (:mod:`xpuspec.planning.agreement`): at the default properties they are the same.

The default placement is replaced only by a candidate whose every round beat every round of the
default (n >= 3 rounds each: a chance of at most 1 / C(2n, n) <= 5% when they are equal) and whose
median is ``margin`` faster; turning drafting off needs the larger ``none_margin``. Otherwise the
record keeps the default and says that the candidates were within noise, so repeated runs record the
same placement.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpuspec.devices.capabilities import CoreLike
from xpuspec.devices.placement import Placement, resolve_device
from xpuspec.devices.plugin import OpenVINODevicePlugin, Role
from xpuspec.devices.registry import PluginRegistry
from xpuspec.executor.properties import TUNED_KEYS, readable
from xpuspec.models.bundle import ModelBundle
from xpuspec.planning.agreement import Agreement, compare
from xpuspec.planning.trial import essence
from xpuspec.planning.tuning import TuneConfig, TuneResult, tune_role
from xpuspec.sample.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

WORKLOAD_PROMPTS = (
    "def fibonacci(n):\n",
    "The history of the printing press begins",
    "import numpy as np\n\ndef normalize(x):\n",
    "Here is a list of the planets of the solar system:",
)


@dataclass(frozen=True)
class PlanConfig:
    """The workload, candidates and measurement rules of one planning run."""

    num_prompts: int = 4
    max_tokens: int = 32
    draft_lengths: tuple[int, ...] = (2, 4, 6)
    adaptive: bool = True
    min_rounds: int = 3  # interleaved rounds per placement, at least
    max_rounds: int = 6  # ... and at most, while the ranking is unclear
    confirm_rounds: int = 5  # replacing the default needs at least this many rounds of both
    min_round_seconds: float = 0.5  # the floor: a round of one candidate lasts at least this long
    margin: float = 0.10  # a placement must be this much faster (median) than the default to replace it
    none_margin: float = 0.20  # ... and this much to turn drafting off
    tune: bool = True  # measure compile properties first (stage 1)
    tune_config: TuneConfig = field(default_factory=TuneConfig)
    eagle3: bool = True  # measure the bundle's EAGLE-3 head too (when it has one)
    devices: tuple[str, ...] | None = None  # None: every present device that can run the bundle
    properties: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {self.num_prompts}")
        if self.min_rounds < 1 or self.max_rounds < self.min_rounds:
            raise ValueError(
                f"rounds must satisfy 1 <= min_rounds <= max_rounds, got {self.min_rounds}, {self.max_rounds}"
            )
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if any(not 1 <= length <= 16 for length in self.draft_lengths):
            raise ValueError(f"draft lengths must be in [1, 16], got {self.draft_lengths}")
        if not self.min_rounds <= self.confirm_rounds <= self.max_rounds:
            raise ValueError(
                f"need min_rounds <= confirm_rounds <= max_rounds, got {self.min_rounds}, "
                f"{self.confirm_rounds}, {self.max_rounds}"
            )
        if self.min_round_seconds <= 0:
            raise ValueError(f"min_round_seconds must be > 0, got {self.min_round_seconds}")
        if not 0 <= self.margin <= self.none_margin < 1:
            raise ValueError(f"need 0 <= margin <= none_margin < 1, got {self.margin}, {self.none_margin}")

    @property
    def prompts(self) -> list[str]:
        return [WORKLOAD_PROMPTS[i % len(WORKLOAD_PROMPTS)] for i in range(self.num_prompts)]

    @property
    def user_sets_precision(self) -> bool:
        return any(key in self.properties for key in TUNED_KEYS)


@dataclass
class Measurement:
    placement: Placement
    round_rates: list[float] = field(default_factory=list)  # tokens/s of each round
    num_tokens: int = 0  # over all rounds
    seconds: float = 0.0  # over all rounds
    acceptance_rate: float | None = None
    error: str | None = None
    drafted: int = 0
    accepted: int = 0
    token_ids: list[list[int]] | None = None  # the first round's greedy tokens, prompt by prompt
    agreement: Agreement | None = None  # those against the target-only candidate's on the same target

    @property
    def tokens_per_s(self) -> float:
        """The median round's tokens/s."""
        return statistics.median(self.round_rates) if self.round_rates else 0.0

    @property
    def spread(self) -> float | None:
        """(fastest - slowest round) / median."""
        if len(self.round_rates) < 2 or not self.tokens_per_s:
            return None
        return (max(self.round_rates) - min(self.round_rates)) / self.tokens_per_s

    def add_round(self, num_tokens: int, seconds: float, drafted: int, accepted: int) -> None:
        self.round_rates.append(num_tokens / seconds if seconds > 0 else 0.0)
        self.num_tokens += num_tokens
        self.seconds += seconds
        self.drafted += drafted
        self.accepted += accepted
        self.acceptance_rate = self.accepted / self.drafted if self.drafted else None

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.placement.as_dict(),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "spread": None if self.spread is None else round(self.spread, 3),
            "rounds": [round(rate, 2) for rate in self.round_rates],
            "num_tokens": self.num_tokens,
            "seconds": round(self.seconds, 4),
            "acceptance_rate": None if self.acceptance_rate is None else round(self.acceptance_rate, 4),
            "same_as_target_only": None if self.agreement is None else self.agreement.as_dict(),
            "error": self.error,
        }


@dataclass(frozen=True)
class Decision:
    """The placement to record, and why."""

    chosen: Measurement
    default: Measurement | None
    fastest: Measurement
    reason: str
    clear: bool  # False: the candidates were within noise and the default was kept


def plannable_devices(core: CoreLike, registry: PluginRegistry) -> list[str]:
    """Present devices whose executor runs an OpenVINO bundle (the reference TORCH executor does not
    compete: it needs the source checkpoint and is not meant to be fast)."""
    devices = []
    for device in core.available_devices:
        plugin = registry.plugin_for(device)
        if plugin is None or plugin.executor_kind != "reference":
            devices.append(device)
    return devices


def default_placement(bundle: ModelBundle, devices: Sequence[str]) -> Placement:
    """What Pipeline does with no plan: the first device for both models, the bundle's drafter, adaptive γ."""
    drafter = "draft" if bundle.draft is not None else "ngram"
    return Placement(devices[0], devices[0], drafter, None)


def candidate_placements(bundle: ModelBundle, devices: Sequence[str], config: PlanConfig) -> list[Placement]:
    drafter = "draft" if bundle.draft is not None else "ngram"
    lengths: list[int | None] = list(config.draft_lengths) + ([None] if config.adaptive else [])
    candidates = []
    for target in devices:
        candidates.append(Placement(target, target, "none", 0))
        # The n-gram drafter runs on the host: its "draft device" is just the target's.
        for draft in devices if drafter == "draft" else [target]:
            candidates += [Placement(target, draft, drafter, length) for length in lengths]
        if (
            bundle.eagle3 is not None and config.eagle3
        ):  # the head runs on a device of its own choosing, like a draft model
            for draft in devices:
                candidates += [Placement(target, draft, "eagle3", length) for length in lengths]
    default = default_placement(bundle, devices)
    if default not in candidates:  # the reference every other candidate is judged against
        candidates.append(default)
    return candidates


def tune_properties(
    bundle: ModelBundle,
    devices: Sequence[str],
    core: CoreLike,
    registry: PluginRegistry,
    config: PlanConfig,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[tuple[str, str], TuneResult]:
    """Stage 1: the compile properties of each model on each device with a paged executor."""
    from xpuspec.devices.executors import model_weights, quantized_weights
    from xpuspec.executor.paged_runner import PagedModelRunner
    from xpuspec.text import Tokenizer

    tokenizer = Tokenizer(bundle.target.path)
    tune = config.tune_config
    room = bundle.max_context - max(tune.max_tokens, tune.steps_per_round) - 1
    prompts = [tokenizer.encode(text)[:room] for text in config.prompts[: tune.num_prompts]]
    # Step costs at a realistic context: a few hundred tokens of prompt text.
    timing_prompt = tokenizer.encode(" ".join(WORKLOAD_PROMPTS) * 8)[: min(256, room)]
    results: dict[tuple[str, str], TuneResult] = {}
    roles: list[tuple[Role, Any]] = [("target", bundle.target)]
    if bundle.draft is not None and not tune.quick:  # the draft's properties change speed, never answers
        roles.append(("draft", bundle.draft))
    for device in devices:
        resolved = resolve_device(device, core, registry)
        plugin = resolved.plugin
        if not isinstance(plugin, OpenVINODevicePlugin) or plugin.executor_kind != "paged":
            progress(f"{device}: compile properties not tuned ({plugin.executor_kind} executor)")
            continue
        capabilities = plugin.capabilities(core, device)
        for role, model in roles:
            assert model is not None
            weights = model_weights(model)

            def make_runner(
                properties: dict[str, Any],
                role: Role = role,
                model: Any = model,
                plugin: OpenVINODevicePlugin = plugin,
                device: str = device,
            ) -> Any:
                merged = plugin.compile_properties(
                    role,
                    properties or None,
                    weights=model_weights(model),
                )
                return PagedModelRunner(
                    model.path, device=device, properties=merged, num_blocks=16, core=core
                )

            defaults = plugin.compile_properties(role, None, weights=weights)
            default_tuned = {key: defaults[key] for key in TUNED_KEYS if key in defaults}
            progress(f"{device} / {role}: measuring compile properties (default: {readable(default_tuned)})")
            results[(role, device)] = tune_role(
                make_runner,
                role,
                device,
                capabilities.precisions,
                # Group-size candidates wherever the weights are quantised, whatever the format's name
                # (a GGUF's Q4_1 is int4): the plugin's defaults keep going by the recorded format.
                quantized_weights(model) or weights,
                default_tuned or {"INFERENCE_PRECISION_HINT": "plugin's choice"},
                prompts,
                timing_prompt,
                tune,
                progress,
            )
    return results


def properties_for(
    tuned: dict[tuple[str, str], TuneResult], role: str, device: str, user: dict[str, Any]
) -> dict[str, Any] | None:
    """The properties a candidate pipeline gets for ``role`` on ``device``: tuned, then the user's."""
    result = tuned.get((role, device))
    chosen = dict(result.chosen) if result is not None else {}
    merged = {**chosen, **user}
    return merged or None


def measure_placements(
    bundle_path: str | Path | None,
    candidates: Sequence[Placement],
    config: PlanConfig,
    progress: Callable[[Measurement], None] = lambda measurement: None,
    tuned: dict[tuple[str, str], TuneResult] | None = None,
    default: Placement | None = None,
) -> list[Measurement]:
    """Interleaved rounds over the candidates until the ranking against ``default`` is clear.

    A placement that fails to load is recorded with its error. ``progress`` gets each candidate's
    measurement after the last round.
    """
    from xpuspec.api.pipeline import Pipeline

    tuned = tuned or {}
    groups: dict[tuple[str, str, str], list[Placement]] = {}
    for candidate in candidates:
        groups.setdefault((candidate.target_device, candidate.draft_device, candidate.drafter), []).append(
            candidate
        )
    prompts = config.prompts
    measurements = {candidate: Measurement(candidate) for candidate in candidates}
    pipes: dict[tuple[str, str, str], Any] = {}
    for (target, draft, drafter), placements in groups.items():
        try:
            pipe = Pipeline(
                bundle_path,
                target_device=target,
                draft_device=draft,
                drafter=drafter,
                properties=properties_for(tuned, "target", target, config.properties),
                draft_properties=properties_for(tuned, "draft", draft, config.properties),
                use_placement=False,
            )
            # Warm-up: first inferences allocate and compile kernels for new shapes.
            pipe.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        except (ValueError, RuntimeError) as error:
            reason = f"not run: {essence(str(error))}"
            logger.debug("placement %s / %s / %s failed to load: %s", target, draft, drafter, error)
            for placement in placements:
                measurements[placement].error = reason
            continue
        pipes[(target, draft, drafter)] = pipe
    running = [c for c in candidates if measurements[c].error is None]
    for round_index in range(config.max_rounds):
        order = running if round_index % 2 == 0 else running[::-1]
        for placement in order:
            pipe = pipes[(placement.target_device, placement.draft_device, placement.drafter)]
            _run_round(pipe, placement, prompts, config, measurements[placement])
        if round_index + 1 >= config.min_rounds and _settled(list(measurements.values()), default, config):
            break
    _compare_with_target_only(list(measurements.values()))
    for candidate in candidates:
        progress(measurements[candidate])
    return [measurements[candidate] for candidate in candidates]


def _run_round(
    pipe: Any, placement: Placement, prompts: list[str], config: PlanConfig, measurement: Measurement
) -> None:
    """The workload, repeated until it has lasted ``min_round_seconds``: one round of one candidate."""
    params = SamplingParams(
        max_tokens=config.max_tokens,
        temperature=0.0,
        ignore_eos=True,
        num_draft_tokens=placement.num_draft_tokens,
    )
    num_tokens = drafted = accepted = 0
    started = time.perf_counter()
    while True:
        results = pipe.generate(prompts, params)
        if measurement.token_ids is None:
            measurement.token_ids = [list(result.token_ids) for result in results]
        num_tokens += sum(len(result.token_ids) for result in results)
        drafted += sum(result.stats.get("drafted", 0) for result in results)
        accepted += sum(result.stats.get("accepted", 0) for result in results)
        seconds = time.perf_counter() - started
        if seconds >= config.min_round_seconds:
            break
    measurement.add_round(num_tokens, seconds, drafted, accepted)


def _compare_with_target_only(measurements: list[Measurement]) -> None:
    """Each drafting candidate's greedy tokens against the target-only candidate's on its target device
    (the same compile properties: both come from that device's tuned target properties)."""
    references = {
        m.placement.target_device: m.token_ids
        for m in measurements
        if m.placement.drafter == "none" and m.token_ids is not None
    }
    for measurement in measurements:
        reference = references.get(measurement.placement.target_device)
        if measurement.placement.drafter != "none" and reference and measurement.token_ids is not None:
            measurement.agreement = compare(reference, measurement.token_ids)


def _settled(measurements: list[Measurement], default: Placement | None, config: PlanConfig) -> bool:
    """True when more rounds would not change the decision."""
    decision = decide(measurements, default, config)
    # Clear: the default is the fastest, or a change confirmed over confirm_rounds (decide checks that).
    if decision.clear or decision.default is None:
        return True
    reference = decision.default
    # Settled when no candidate is beyond its margin at the median: no number of rounds would make
    # one a clear win.
    for measurement in measurements:
        if measurement is reference or measurement.error is not None or not measurement.round_rates:
            continue
        margin = config.none_margin if measurement.placement.drafter == "none" else config.margin
        if measurement.tokens_per_s > reference.tokens_per_s * (1 + margin):
            return False
    return True


def clearly_faster(
    candidate: Measurement, reference: Measurement, margin: float, min_rounds: int = 3
) -> bool:
    """Every round of ``candidate`` beat every round of ``reference``, and its median by ``margin``."""
    if len(candidate.round_rates) < min_rounds or len(reference.round_rates) < min_rounds:
        return False
    return min(candidate.round_rates) > max(
        reference.round_rates
    ) and candidate.tokens_per_s > reference.tokens_per_s * (1 + margin)


def decide(measurements: Sequence[Measurement], default: Placement | None, config: PlanConfig) -> Decision:
    """The placement to record: the default unless another is clearly faster (see the module doc)."""
    usable = [m for m in measurements if m.error is None and m.num_tokens > 0]
    if not usable:
        raise ValueError(
            "no placement ran: " + "; ".join(sorted({m.error or "no tokens" for m in measurements}))
        )
    fastest = max(usable, key=lambda m: m.tokens_per_s)
    reference = next((m for m in usable if m.placement == default), None)
    floor = config.min_round_seconds * config.min_rounds
    if reference is None:
        return Decision(
            fastest, None, fastest, "the default placement did not run; the fastest that did", True
        )
    if fastest is reference:
        return Decision(reference, reference, fastest, "the default placement was the fastest", True)
    if fastest.seconds < floor:
        reason = (
            f"kept the default: the fastest was measured for {fastest.seconds:.2f} s, "
            f"below the {floor} s floor"
        )
        return Decision(reference, reference, fastest, reason, False)
    # Candidates the fastest is not clearly ahead of are as good as it: among those, a fixed order of
    # preference decides (the default; then drafting, shortest γ first; no drafting last), so that
    # noise in which of them came out on top does not change what is recorded.
    contenders = [m for m in usable if m is fastest or not clearly_faster(fastest, m, config.margin)]
    if reference not in contenders:
        for candidate in sorted(contenders, key=_preference):
            margin = config.none_margin if candidate.placement.drafter == "none" else config.margin
            if clearly_faster(candidate, reference, margin, config.confirm_rounds):
                ratio = candidate.tokens_per_s / reference.tokens_per_s
                reason = (
                    f"{ratio:.2f}x the default's tokens/s, every one of {len(candidate.round_rates)} rounds "
                    f"faster than every round of the default"
                )
                if candidate is not fastest:
                    reason += f" (preferred over the equally fast {_describe(fastest.placement)})"
                return Decision(candidate, reference, fastest, reason, True)
    margin = config.none_margin if fastest.placement.drafter == "none" else config.margin
    ratio = fastest.tokens_per_s / reference.tokens_per_s
    reason = (
        f"kept the default: the fastest ({_describe(fastest.placement)}, {ratio:.2f}x) is within noise "
        f"(spread {fastest.spread or 0:.0%} / {reference.spread or 0:.0%} "
        f"over {len(fastest.round_rates)} rounds; "
        f"a change needs every round faster and a {margin:.0%} median gain)"
    )
    return Decision(reference, reference, fastest, reason, False)


def _preference(measurement: Measurement) -> tuple[bool, bool, int]:
    placement = measurement.placement
    length = placement.num_draft_tokens
    return (placement.drafter == "none", length is not None, length or 0)


def best_measurement(measurements: Sequence[Measurement]) -> Measurement:
    """The fastest measurement by median tokens/s (see :func:`decide` for what gets recorded)."""
    usable = [m for m in measurements if m.error is None and m.num_tokens > 0]
    if not usable:
        raise ValueError(
            "no placement ran: " + "; ".join(sorted({m.error or "no tokens" for m in measurements}))
        )
    return max(usable, key=lambda m: m.tokens_per_s)


def _describe(placement: Placement) -> str:
    length = "adaptive" if placement.num_draft_tokens is None else placement.num_draft_tokens
    return f"{placement.target_device}/{placement.draft_device} {placement.drafter} gamma={length}"
