"""`xpuspec devices` and `xpuspec plan` subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from xpuspec.cli import EXIT_FAILED, EXIT_USAGE
from xpuspec.devices.capabilities import CoreLike, DeviceCapabilities
from xpuspec.devices.plugin import PassthroughPlugin
from xpuspec.devices.registry import PluginRegistry


def register(subparsers: argparse._SubParsersAction) -> None:
    devices = subparsers.add_parser(
        "devices",
        help="list the devices xpuspec can run models on, and what each supports",
        description="List every known device plugin: present devices with their capabilities, then "
        "known devices that are absent here.",
    )
    devices.add_argument("--json", action="store_true", help="print the list as JSON")
    devices.set_defaults(func=run_devices)

    plan = subparsers.add_parser(
        "plan",
        help="measure device placements and draft lengths for a bundle, optionally record the best",
        description="Run a short greedy workload for each target device x draft device x draft length "
        "(0 = no draft, fixed lengths, adaptive) and print tokens/s. --write records the fastest in the "
        "bundle manifest, where Pipeline and `xpuspec generate` pick it up.",
    )
    plan.add_argument(
        "bundle", nargs="?", default=None, help="bundle folder, or demo (default: SmolLM2 + draft)"
    )
    plan.add_argument("--write", action="store_true", help="record the best placement in the manifest")
    plan.add_argument("--json", action="store_true", help="print the measurements as JSON")
    plan.add_argument("--prompts", type=int, default=4, help="prompts in the workload (default 4)")
    plan.add_argument("--max-tokens", type=int, default=32, help="tokens per prompt (default 32)")
    plan.add_argument(
        "--draft-lengths", default="2,4,6", help="fixed draft lengths to try, comma-separated (default 2,4,6)"
    )
    plan.add_argument("--repeats", type=int, default=2, help="runs per placement, fastest counts (default 2)")
    plan.add_argument("--no-adaptive", action="store_true", help="do not try the adaptive draft length")
    plan.add_argument(
        "--devices", default=None, help="comma-separated devices to try (default: every present device)"
    )
    plan.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an OpenVINO compile property for every candidate (repeatable)",
    )
    plan.set_defaults(func=run_plan)


def device_report(core: CoreLike, registry: PluginRegistry) -> list[DeviceCapabilities]:
    """Present devices first (one entry per OpenVINO device index), then absent known devices."""
    present: list[DeviceCapabilities] = []
    absent: list[DeviceCapabilities] = []
    claimed: set[str] = set()
    for plugin in registry.plugins:
        devices = [d for d in core.available_devices if plugin.matches(d)]
        claimed.update(devices)
        if devices:
            present += [plugin.capabilities(core, device) for device in devices]
        else:
            capabilities = plugin.capabilities(core)
            (present if capabilities.present else absent).append(capabilities)
    for device in core.available_devices:
        if device not in claimed:  # a device OpenVINO has and no plugin describes
            present.append(PassthroughPlugin(device).capabilities(core, device))
    return present + absent


def _format_memory(memory_bytes: int | None) -> str:
    return f"{memory_bytes / 2**30:.1f} GiB" if memory_bytes else "-"


def run_devices(args: argparse.Namespace) -> int:
    import openvino as ov

    from xpuspec.devices.placement import openvino_version
    from xpuspec.devices.registry import default_registry

    report = device_report(ov.Core(), default_registry())
    if args.json:
        print(
            json.dumps(
                {"openvino_version": openvino_version(), "devices": [c.as_dict() for c in report]}, indent=2
            )
        )
        return 0
    header = (
        "DEVICE",
        "PRESENT",
        "EXECUTOR",
        "PAGED",
        "SHAPES",
        "PRECISIONS",
        "MEMORY",
        "UNITS",
        "PRESET",
        "NAME",
    )
    rows = [
        (
            c.device,
            "yes" if c.present else "no",
            c.executor_kind,
            "yes" if c.paged_attention else "no",
            "static" if c.static_only else "dynamic",
            ",".join(c.precisions) or "-",
            _format_memory(c.memory_bytes),
            str(c.compute_units or "-"),
            c.compression_preset or "-",
            c.full_name or "-",
        )
        for c in report
    ]
    _print_table(header, rows)
    return 0


def _print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _parse_plan_config(args: argparse.Namespace) -> Any:
    from xpuspec.devices.planner import PlanConfig
    from xpuspec.generate_command import parse_properties

    try:
        lengths = tuple(int(item) for item in args.draft_lengths.split(",") if item.strip())
    except ValueError as error:
        raise ValueError(
            f"--draft-lengths takes comma-separated integers, got {args.draft_lengths!r}"
        ) from error
    devices = tuple(d.strip() for d in args.devices.split(",") if d.strip()) if args.devices else None
    return PlanConfig(
        num_prompts=args.prompts,
        max_tokens=args.max_tokens,
        draft_lengths=lengths,
        adaptive=not args.no_adaptive,
        repeats=args.repeats,
        devices=devices,
        properties=parse_properties(args.property),
    )


def run_plan(args: argparse.Namespace) -> int:
    import openvino as ov

    from xpuspec.devices.placement import resolve_device, write_placement
    from xpuspec.devices.planner import (
        best_measurement,
        candidate_placements,
        measure_placements,
        placement_record,
        plannable_devices,
    )
    from xpuspec.devices.registry import default_registry
    from xpuspec.model_bundle import BundleError, ModelBundle

    core = ov.Core()
    registry = default_registry()
    try:
        config = _parse_plan_config(args)
        bundle = ModelBundle.open(args.bundle)
        devices = list(config.devices) if config.devices else plannable_devices(core, registry)
        for device in devices:
            resolve_device(device, core, registry)
    except (ValueError, BundleError) as error:
        print(f"xpuspec plan: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    candidates = candidate_placements(bundle, devices, config)
    print(
        f"measuring {len(candidates)} placements on {', '.join(devices)}: {config.num_prompts} prompts x "
        f"{config.max_tokens} tokens, greedy",
        file=sys.stderr,
    )

    def show(measurement: Any) -> None:
        if not args.json:
            print(_measurement_line(measurement), file=sys.stderr, flush=True)

    measurements = measure_placements(bundle.root, candidates, config, progress=show)
    try:
        best = best_measurement(measurements)
    except ValueError as error:
        print(f"xpuspec plan: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    record = placement_record(best, measurements, config, list(core.available_devices))
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        header = ("TARGET", "DRAFT", "DRAFTER", "GAMMA", "TOKENS/S", "ACCEPTANCE", "NOTE")
        rows = [
            (
                m.placement.target_device,
                m.placement.draft_device if m.placement.drafter == "draft" else "-",
                m.placement.drafter,
                "adaptive" if m.placement.num_draft_tokens is None else str(m.placement.num_draft_tokens),
                f"{m.tokens_per_s:.1f}",
                "-" if m.acceptance_rate is None else f"{m.acceptance_rate:.0%}",
                "best" if m is best else (m.error or ""),
            )
            for m in measurements
        ]
        _print_table(header, rows)
    if args.write:
        write_placement(bundle.root, record)
        print(f"recorded the best placement in {bundle.root}", file=sys.stderr)
    return 0


def _measurement_line(measurement: Any) -> str:
    placement = measurement.placement
    length = "adaptive" if placement.num_draft_tokens is None else placement.num_draft_tokens
    outcome = measurement.error or f"{measurement.tokens_per_s:.1f} tokens/s"
    devices = f"{placement.target_device} / {placement.draft_device}"
    return f"  {devices} / {placement.drafter} / gamma={length}: {outcome}"
