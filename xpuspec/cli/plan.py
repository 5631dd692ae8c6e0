"""`xpuspec plan`: measure compile properties, device placements and draft lengths; record the best."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from xpuspec.api.errors import EXIT_FAILED, EXIT_USAGE, report_error, warn_if_draft_is_target
from xpuspec.cli.tables import print_table


def register(subparsers: argparse._SubParsersAction) -> None:
    plan = subparsers.add_parser(
        "plan",
        help="measure compile properties, device placements and draft lengths; optionally record the best",
        description="First measure each model's step cost and greedy agreement with the exact reference "
        "under candidate compile properties (precision, KV cache, dynamic-quantisation group), then run a "
        "short greedy workload for each target device x draft device x draft length (0 = no draft, fixed "
        "lengths, adaptive) in interleaved rounds until the ranking is clear. The default placement and "
        "properties are kept unless a candidate is clearly faster. --write records the result in the "
        "bundle manifest, where Pipeline and `xpuspec generate` pick it up.",
    )
    plan.add_argument(
        "bundle", nargs="?", default=None, help="bundle folder, or demo (default: SmolLM2 + draft)"
    )
    plan.add_argument("--write", action="store_true", help="record the result in the manifest")
    plan.add_argument("--json", action="store_true", help="print the record as JSON")
    plan.add_argument(
        "--quick",
        action="store_true",
        help="a reduced workload: 2 prompts x 16 tokens, draft lengths 2,4, 0.25 s rounds, the target's "
        "properties only (fewer candidates), no EAGLE-3 placements",
    )
    plan.add_argument("--prompts", type=int, default=None, help="prompts in the workload (default 4)")
    plan.add_argument("--max-tokens", type=int, default=None, help="tokens per prompt (default 32)")
    plan.add_argument(
        "--draft-lengths", default=None, help="fixed draft lengths to try, comma-separated (default 2,4,6)"
    )
    plan.add_argument(
        "--repeats", type=int, default=3, help="interleaved rounds per placement, at least (default 3)"
    )
    plan.add_argument(
        "--max-rounds",
        type=int,
        default=6,
        help="rounds at most while the ranking is unclear (default 6); replacing the default placement "
        "needs 5 rounds (or all of them, when fewer)",
    )
    plan.add_argument(
        "--min-round-seconds",
        type=float,
        default=None,
        help="a round of one placement repeats the workload for at least this long (default 0.5)",
    )
    plan.add_argument("--no-adaptive", action="store_true", help="do not try the adaptive draft length")
    plan.add_argument(
        "--no-tune", action="store_true", help="keep the plugins' default compile properties (skip stage 1)"
    )
    plan.add_argument(
        "--devices", default=None, help="comma-separated devices to try (default: every present device)"
    )
    plan.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an OpenVINO compile property for every candidate (repeatable); a precision property "
        "turns off the tuning of compile properties",
    )
    plan.add_argument(
        "--quality",
        action="store_true",
        help="then measure the target's deviation from exact mode at the properties chosen for it "
        "(`xpuspec quality`: KL divergence, top-1, perplexity, the llama.cpp budget) and print it. Off by "
        "default: it takes minutes",
    )
    plan.set_defaults(func=run_plan)


def _parse_plan_config(args: argparse.Namespace) -> Any:
    from xpuspec.executor.properties import parse_properties
    from xpuspec.planning.planner import PlanConfig
    from xpuspec.planning.tuning import TuneConfig

    quick = args.quick
    draft_lengths = args.draft_lengths or ("2,4" if quick else "2,4,6")
    try:
        lengths = tuple(int(item) for item in draft_lengths.split(",") if item.strip())
    except ValueError as error:
        raise ValueError(f"--draft-lengths takes comma-separated integers, got {draft_lengths!r}") from error
    devices = tuple(d.strip() for d in args.devices.split(",") if d.strip()) if args.devices else None
    properties = parse_properties(args.property)
    tune = (
        TuneConfig(num_prompts=2, max_tokens=16, steps_per_round=8, max_rounds=5, quick=True)
        if quick
        else TuneConfig()
    )
    config = PlanConfig(
        num_prompts=args.prompts or (2 if quick else 4),
        max_tokens=args.max_tokens or (16 if quick else 32),
        draft_lengths=lengths,
        adaptive=not args.no_adaptive,
        min_rounds=args.repeats,
        max_rounds=max(args.max_rounds, args.repeats),
        confirm_rounds=min(max(5, args.repeats), max(args.max_rounds, args.repeats)),
        min_round_seconds=args.min_round_seconds or (0.25 if quick else 0.5),
        devices=devices,
        properties=properties,
        tune_config=tune,
        eagle3=not quick,
    )
    # A user who sets a precision property has chosen it; there is nothing to tune.
    return dataclasses.replace(config, tune=not args.no_tune and not config.user_sets_precision)


def run_plan(args: argparse.Namespace) -> int:
    import openvino as ov

    from xpuspec.devices.placement import resolve_device, write_placement
    from xpuspec.devices.registry import default_registry
    from xpuspec.models.bundle import BundleError
    from xpuspec.models.resolve import resolve_bundle
    from xpuspec.planning.planner import (
        candidate_placements,
        decide,
        default_placement,
        measure_placements,
        plannable_devices,
        tune_properties,
    )
    from xpuspec.planning.record import placement_record

    core = ov.Core()
    registry = default_registry()
    try:
        config = _parse_plan_config(args)
        bundle = resolve_bundle(args.bundle)
        warn_if_draft_is_target(bundle)
        devices = list(config.devices) if config.devices else plannable_devices(core, registry)
        for device in devices:
            resolve_device(device, core, registry)
    except (ValueError, BundleError) as error:
        report_error(str(error))
        return EXIT_USAGE

    def note(line: str) -> None:
        if not args.json:
            print(line, file=sys.stderr, flush=True)

    tuned = {}
    if config.tune:
        tune = config.tune_config
        note(
            f"stage 1: compile properties per model and device (step cost; on {tune.num_prompts} prompts x "
            f"{tune.max_tokens} greedy tokens, agreement with exact mode and whether tokens verified "
            f"{tune.verify_chunk} at a time equal those decoded one at a time)"
        )
        tuned = tune_properties(bundle, devices, core, registry, config, progress=note)
    candidates = candidate_placements(bundle, devices, config)
    default = default_placement(bundle, devices)
    note(
        f"stage 2: {len(candidates)} placements on {', '.join(devices)}: {config.num_prompts} prompts x "
        f"{config.max_tokens} tokens, greedy, {config.min_rounds}-{config.max_rounds} interleaved rounds of "
        f">= {config.min_round_seconds} s each"
    )
    measurements = measure_placements(
        bundle.root,
        candidates,
        config,
        tuned=tuned,
        default=default,
    )
    try:
        decision = decide(measurements, default, config)
    except ValueError as error:
        report_error(str(error))
        return EXIT_FAILED
    record = placement_record(decision, measurements, config, list(core.available_devices), tuned)
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        _print_plan(tuned, measurements, decision, written=args.write)
    if args.write:
        write_placement(bundle.root, record)
        print(f"recorded the placement and compile properties in {bundle.root}", file=sys.stderr)
    else:
        print("not recorded: run plan again with --write to record the chosen placement", file=sys.stderr)
    if args.quality:
        _print_quality(bundle, tuned, args.json)
    return 0


def _print_quality(bundle: Any, tuned: dict[tuple[str, str], Any], as_json: bool) -> None:
    """`plan --quality`: the target's quality at its defaults and at the properties stage 1 chose for
    it on the CPU (when it chose others)."""
    from xpuspec.bench.quality import Candidate, QualityConfig
    from xpuspec.bench.quality_run import LlamaChoice, run_quality
    from xpuspec.cli.quality import show
    from xpuspec.models.bundle import cache_dir

    candidates = [Candidate("default", bundle.target)]
    chosen = tuned.get(("target", "CPU"))
    if chosen is not None and chosen.chosen:
        candidates.append(Candidate("plan's choice", bundle.target, dict(chosen.chosen)))
    report = run_quality(
        bundle,
        candidates,
        QualityConfig(speed_rounds=0),
        llama=LlamaChoice(),
        logs=cache_dir() / "quality-logs",
    )
    if not as_json:
        print()
    show(report, as_json=as_json)


def _print_plan(
    tuned: dict[tuple[str, str], Any], measurements: list[Any], decision: Any, written: bool
) -> None:
    """The tuned properties (when tuned), every placement measured, and the decision, as tables."""
    if tuned:
        _print_properties_table(tuned)
        print()
    header = (
        "TARGET",
        "DRAFT",
        "DRAFTER",
        "GAMMA",
        "TOKENS/S",
        "SPREAD",
        "ROUNDS",
        "ACCEPTANCE",
        "SAME AS TARGET-ONLY",
        "NOTE",
    )
    rows = [
        (
            m.placement.target_device,
            m.placement.draft_device if m.placement.drafter in ("draft", "eagle3") else "-",
            m.placement.drafter,
            "adaptive" if m.placement.num_draft_tokens is None else str(m.placement.num_draft_tokens),
            f"{m.tokens_per_s:.1f}",
            "-" if m.spread is None else f"{m.spread:.0%}",
            str(len(m.round_rates)),
            "-" if m.acceptance_rate is None else f"{m.acceptance_rate:.0%}",
            "-" if m.agreement is None else f"{m.agreement.same}/{m.agreement.total}",
            _placement_note(m, decision, written),
        )
        for m in measurements
        if not m.error
    ]
    print_table(header, rows)
    for m in measurements:
        if m.error:
            print(f"{_describe(m.placement)}: {m.error}")
    print(
        "SAME AS TARGET-ONLY: prompts whose greedy text with this drafter equals the target-only text "
        "(same target, same properties); anything less means speculation changed an answer."
    )
    print(f"decision: {decision.reason}")


def _describe(placement: Any) -> str:
    length = "adaptive" if placement.num_draft_tokens is None else placement.num_draft_tokens
    return f"{placement.target_device} / {placement.draft_device} / {placement.drafter} / gamma={length}"


def _placement_note(measurement: Any, decision: Any, written: bool) -> str:
    notes = []
    if measurement is decision.chosen:
        notes.append("recorded" if written else "chosen")  # only --write records it
    if measurement is decision.default:
        notes.append("default")
    if measurement is decision.fastest and measurement is not decision.chosen:
        notes.append("fastest, within noise")
    return ", ".join(notes)


def _print_properties_table(tuned: dict[tuple[str, str], Any]) -> None:
    header = (
        "ROLE",
        "DEVICE",
        "PROPERTIES",
        "MS/STEP",
        "SPREAD",
        "ROUNDS",
        "SAME AS EXACT",
        "VERIFIED = DECODED",
        "NOTE",
    )
    rows = []
    for (role, device), result in tuned.items():
        for candidate in result.candidates:
            if candidate.error:  # refused: said once, when it was skipped
                continue
            chosen = (candidate.is_default and not result.chosen) or (
                result.chosen and candidate.properties == result.chosen
            )
            rows.append(
                (
                    role,
                    device,
                    candidate.label,
                    "-" if candidate.step_ms is None else f"{candidate.step_ms:.3f}",
                    "-" if candidate.spread is None else f"{candidate.spread:.0%}",
                    str(len(candidate.round_ms)),
                    "-" if candidate.agreement is None else f"{candidate.agreement}/{result.num_prompts}",
                    "-" if candidate.verified is None else f"{candidate.verified}/{result.num_prompts}",
                    "chosen" if chosen else "",
                )
            )
    print_table(header, rows)
    print(
        "SAME AS EXACT: prompts whose greedy tokens equal exact mode's (f32 compute, f32 cache); lower "
        "precision flips near-ties now and then. VERIFIED = DECODED: prompts whose tokens come out the same "
        "verified a few at a time (as speculation does) as decoded one at a time; anything less means "
        "drafting can change that setting's answers."
    )
    for (role, device), result in tuned.items():
        print(f"{role} on {device}: {result.summary()}")
