"""`xpuspec prepare`: checkpoints (or a GGUF file) to a verified OpenVINO bundle."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from xpuspec.api.errors import EXIT_FAILED, EXIT_USAGE, one_line, report_error, warn_if_draft_is_target
from xpuspec.prepare.config import (
    BUILTIN_CALIBRATION_PROMPTS,
    GROUP_SIZE_FALLBACKS,
    PrepareConfig,
    PrepareError,
)
from xpuspec.prepare.presets import DEVICE_PRESETS, TARGET_DEVICES, WEIGHT_FORMATS
from xpuspec.prepare.progress import interrupt_requested
from xpuspec.prepare.quiet import StageLines, conversion_log_path, third_party_output_to


def register(subparsers: argparse._SubParsersAction) -> None:
    prepare = subparsers.add_parser(
        "prepare",
        help="export a target (and draft) checkpoint to an OpenVINO bundle",
        description="Export Hugging Face checkpoints to stateful OpenVINO IR, compress the weights with "
        "NNCF, check that the draft pairs with the target, and write a verified bundle folder.",
        epilog=_preset_help(),
    )
    prepare.add_argument("target", metavar="TARGET", help="checkpoint folder, IR folder, GGUF file or hub id")
    prepare.add_argument(
        "--draft", metavar="DRAFT", help="draft model: checkpoint folder, IR folder, GGUF file or hub id"
    )
    prepare.add_argument(
        "--eagle3",
        metavar="HEAD_DIR",
        help="an EAGLE-3 head folder in the published Hugging Face layout (config.json + model.safetensors "
        "or pytorch_model.bin), checked against the target and stored in the bundle",
    )
    prepare.add_argument("-o", "--output", metavar="BUNDLE", required=True, type=Path, help="bundle folder")
    prepare.add_argument("--for", dest="device", choices=TARGET_DEVICES, default="cpu", help="device preset")
    _add_compression_arguments(prepare)
    prepare.add_argument(
        "--force-pair",
        action="store_true",
        help="pair by token id even if the tokenizers differ, instead of translating the draft's "
        "drafts through text (never when the draft's vocabulary is larger: the engine could not run it)",
    )
    prepare.add_argument(
        "--log",
        metavar="FILE",
        type=Path,
        default=None,
        help="where conversion libraries' output goes (default: ~/.cache/xpuspec/logs/prepare-*.log; "
        "with --verbose it stays on the terminal)",
    )
    prepare.add_argument(
        "--draft-vocab",
        metavar="N",
        type=int,
        default=None,
        help="the draft proposes only token ids below N (its LM head is cut to them at load time: a "
        "cheaper draft pass; output stays exact)",
    )
    prepare.add_argument("--overwrite", action="store_true", help="replace an existing bundle")
    prepare.add_argument(
        "--no-pair-check",
        dest="pair_check",
        action="store_false",
        help="skip the pair check (the draft's acceptance on a few prompts, once the bundle is written)",
    )
    prepare.add_argument(
        "--quality",
        action="store_true",
        help="then measure the target's deviation from its weights in exact mode (`xpuspec quality`: KL "
        "divergence, top-1, perplexity; llama.cpp beside where a llama-server is at hand), print it and "
        "record it in the manifest. Off by default: it takes minutes (llama.cpp's row most of them)",
    )
    prepare.set_defaults(func=run_prepare)


def _add_compression_arguments(parser: argparse.ArgumentParser) -> None:
    """How the weights are compressed (NNCF): formats, int4 groups and ratio, data-aware methods."""
    parser.add_argument(
        "--weights", choices=WEIGHT_FORMATS, help="target weights (default: from --for, int8 on cpu)"
    )
    parser.add_argument("--draft-weights", choices=WEIGHT_FORMATS, help="draft weights (default: as target)")
    parser.add_argument(
        "--group-size", type=int, help="int4 group size; -1 = channel-wise (default: from --for, 128 on cpu)"
    )
    parser.add_argument(
        "--group-size-fallback",
        choices=GROUP_SIZE_FALLBACKS,
        default="error",
        help="int4 layers the group size does not divide: refuse before any work (error), leave them "
        "out of int4 (ignore), or give them the largest power-of-two group that fits (adjust; NNCF)",
    )
    symmetry = parser.add_mutually_exclusive_group()
    symmetry.add_argument(
        "--sym",
        dest="sym",
        action="store_const",
        const=True,
        help="symmetric quantization (default: from --for)",
    )
    symmetry.add_argument(
        "--asym", dest="sym", action="store_const", const=False, help="asymmetric (default: from --for)"
    )
    parser.add_argument(
        "--weight-format",
        metavar="FORMAT",
        help="GGUF targets: re-compress the converted weights with NNCF: the layers' format "
        "(int4_sym_g32/64/128, int4_asym_g32/64/128, int8_sym, int8_asym, or gguf: as converted), then "
        "optionally +head_FORMAT for the embedding / LM head, e.g. int4_sym_g64+head_int8_asym "
        "(default: as converted; docs/benchmarks.md, Target weight formats)",
    )
    parser.add_argument("--ratio", type=float, help="share of int4 layers, rest int8 (default: from --for)")
    parser.add_argument("--awq", action="store_true", help="data-aware AWQ (int4)")
    parser.add_argument("--scale-estimation", action="store_true", help="data-aware scale estimation (int4)")
    parser.add_argument(
        "--calibration-prompts",
        metavar="FILE",
        type=Path,
        help="prompts for --awq/--scale-estimation: one per line, or a JSON list (default: a built-in list)",
    )


def _preset_help() -> str:
    lines = ["device presets (--for; explicit flags override):"]
    for device, preset in DEVICE_PRESETS.items():
        int4 = preset.int4
        group = "channel-wise" if int4.group_size == -1 else f"g{int4.group_size}"
        lines.append(
            f"  {device}: default {preset.default_weights}; int8 {'sym' if preset.int8.sym else 'asym'}; "
            f"int4 {'sym' if int4.sym else 'asym'} {group} ratio {int4.ratio}"
        )
    return "\n".join(lines)


def read_calibration_prompts(path: Path) -> tuple[str, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"--calibration-prompts {path}: {error.strerror}") from error
    if path.suffix == ".json":
        prompts = json.loads(text)
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise ValueError(f"--calibration-prompts {path}: expected a JSON list of strings")
    else:
        prompts = [line for line in text.splitlines() if line.strip()]
    return tuple(prompts)


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C, so a killed prepare also cleans up its temp folder; both also set
    ``interrupt_requested``, which the next step boundary honours if a library swallowed the interrupt."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        interrupt_requested.set()
        raise KeyboardInterrupt

    interrupt_requested.clear()
    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _config(args: argparse.Namespace) -> PrepareConfig:
    """The command line as a PrepareConfig; ``ValueError`` for options that do not fit together."""
    prompts = (
        read_calibration_prompts(args.calibration_prompts)
        if args.calibration_prompts
        else BUILTIN_CALIBRATION_PROMPTS
    )
    return PrepareConfig(
        target=args.target,
        output=args.output,
        draft=args.draft,
        device=args.device,
        weights=args.weights,
        draft_weights=args.draft_weights,
        group_size=args.group_size,
        sym=args.sym,
        ratio=args.ratio,
        awq=args.awq,
        scale_estimation=args.scale_estimation,
        calibration_prompts=prompts,
        force_pair=args.force_pair,
        overwrite=args.overwrite,
        group_size_fallback=args.group_size_fallback,
        eagle3=args.eagle3,
        draft_vocab=args.draft_vocab,
        gguf_weight_format=args.weight_format,
        gguf_weight_reason="asked for (xpuspec prepare --weight-format)" if args.weight_format else None,
    )


def run_prepare(args: argparse.Namespace) -> int:
    try:
        config = _config(args)
    except ValueError as error:
        report_error(str(error))
        return EXIT_USAGE
    from xpuspec.prepare.gguf import is_gguf_source, prepare_gguf_bundle

    gguf_source = is_gguf_source(config.target)  # the GGUF path reads and checks its own metadata first
    try:  # mistakes in the command line's paths are usage errors, found before anything is imported
        if gguf_source:
            _check_gguf_options(config)
        else:
            if config.gguf_weight_format is not None:
                raise PrepareError("--weight-format applies to GGUF targets; use --weights for checkpoints")
            _check_paths(config)
    except PrepareError as error:
        report_error(one_line(str(error)))
        return EXIT_USAGE
    try:  # the options do not fit the models: a usage error, found before any work
        if not gguf_source:
            _check_local_configs(config)
        if config.eagle3 is not None:
            _check_eagle3_head(config, config.eagle3, gguf_source)
    except PrepareError as error:
        report_error(one_line(str(error)))
        return EXIT_USAGE
    from xpuspec.prepare.pipeline import prepare_bundle  # pulls in OpenVINO; only when preparing

    prepare = prepare_gguf_bundle if gguf_source else prepare_bundle
    if args.verbose:
        try:
            with _sigterm_as_interrupt():
                output = prepare(config, progress=StageLines(sys.stderr))
        except PrepareError as error:
            report_error(one_line(str(error)))
            return EXIT_FAILED
        _warn_if_draft_is_target(output)
        print(f"bundle written to {output}; check it with `xpuspec inspect {output}`")
        return _after_writing(config, output, args)
    log_path = args.log or conversion_log_path()
    try:
        with third_party_output_to(log_path) as terminal, _sigterm_as_interrupt():
            stages = StageLines(terminal)
            try:
                output = prepare(config, progress=stages)
            finally:
                stages.abandon()
    except PrepareError as error:
        report_error(f"{one_line(str(error))} (conversion log: {log_path})")
        return EXIT_FAILED
    _warn_if_draft_is_target(output)
    print(
        f"bundle written to {output}; check it with `xpuspec inspect {output}` (conversion log: {log_path})"
    )
    return _after_writing(config, output, args)


def _after_writing(config: PrepareConfig, output: Path, args: argparse.Namespace) -> int:
    """What follows a written bundle: the pair check (unless ``--no-pair-check``), then the quality
    figures (with ``--quality``)."""
    status = _check_the_pair(config, output, args.pair_check)
    if status or not args.quality:
        return status
    return _quality(output)


def _check_the_pair(config: PrepareConfig, output: Path, pair_check: bool) -> int:
    """Say how the pair drafts (translating between tokenizers or not) and, with ``pair_check``, measure
    the draft's acceptance on a few prompts and record it in the manifest."""
    if config.draft is None:
        return 0
    from xpuspec.models.bundle import ModelBundle

    bundle = ModelBundle.open(output, verify=False)
    if bundle.translates_tokens:
        print(
            "pairing: the tokenizers differ, so the draft's drafts will be translated into the target's "
            f"tokens through text ({bundle.manifest['pairing'].get('difference')})"
        )
    if not pair_check:
        return 0
    from xpuspec.planning.pair_check import measure_pair, record_pair_check

    try:
        check = measure_pair(output)
    except Exception as error:  # the bundle is written; the check of its pair failed
        report_error(f"pair check failed: {one_line(str(error))}")
        return EXIT_FAILED
    record_pair_check(output, check)
    print(f"pair check: {check.describe()}")
    return 0


def _quality(bundle: Path) -> int:
    """`prepare --quality`: the new bundle's quality figures, printed and recorded in its manifest."""
    from xpuspec.bench.quality import QualityConfig
    from xpuspec.bench.quality_report import write_quality
    from xpuspec.cli.quality import measure, show

    report = measure(str(bundle), QualityConfig(speed_rounds=0))
    show(report)
    write_quality(report)
    print(f"recorded the quality figures in {bundle}", file=sys.stderr)
    return 0


def _warn_if_draft_is_target(output: Path) -> None:
    from xpuspec.models.bundle import ModelBundle

    warn_if_draft_is_target(ModelBundle.open(output, verify=False))


def _check_paths(config: PrepareConfig) -> None:
    from xpuspec.prepare.export import ModelSource
    from xpuspec.prepare.writer import check_output_path

    ModelSource.resolve(config.target, "target")
    if config.draft is not None:
        ModelSource.resolve(config.draft, "draft")
    check_output_path(config.output.resolve(), config.overwrite)


def _check_gguf_options(config: PrepareConfig) -> None:
    """An existing output, and --weights on an already quantised GGUF: usage errors, like the
    checkpoint path's, found from the GGUF's metadata before any conversion."""
    from xpuspec.prepare.gguf import GgufModel, check_recompression
    from xpuspec.prepare.writer import check_output_path

    check_output_path(config.output.resolve(), config.overwrite)
    if config.weights is not None:
        check_recompression(config.weights, GgufModel.read(Path(config.target).expanduser(), "target"))


def _check_local_configs(config: PrepareConfig) -> None:
    """Group sizes and vocabularies from local config.json files, before torch and optimum load
    (seconds rather than the half minute their imports take); prepare_bundle checks again."""
    from xpuspec.prepare.export import ModelSource
    from xpuspec.prepare.validate import check_group_size, check_vocab_sizes, read_local_config

    models = [("target", config.target, config.target_compression())]
    if config.draft is not None:
        models.append(("draft", config.draft, config.draft_compression()))
    read = {}
    for role, spec, compression in models:
        source = ModelSource.resolve(spec, role)
        facts = read_local_config(source.local_path) if source.local_path is not None else None
        if facts is not None:
            check_group_size(role, facts, compression)
            read[role] = facts
    if "target" in read and "draft" in read and config.force_pair:
        # Paired by token id: the draft may not have more. Otherwise a larger draft translates.
        check_vocab_sizes(read["target"], read["draft"])


def _check_eagle3_head(config: PrepareConfig, head: str, gguf_source: bool) -> None:
    """The config of ``head`` (``config.eagle3``) against the target's sizes (from its config.json or
    GGUF metadata), before any export; the head's tensors are checked when it is written."""
    from xpuspec.prepare.eagle3 import check_head_fits, head_folder

    if gguf_source:
        from xpuspec.prepare.gguf import GgufModel

        check_head_fits(head, GgufModel.read(Path(config.target).expanduser(), "target").architecture_facts())
        return
    from xpuspec.prepare.export import ModelSource
    from xpuspec.prepare.validate import read_local_config

    source = ModelSource.resolve(config.target, "target")
    facts = read_local_config(source.local_path) if source.local_path is not None else None
    if facts is None or "num_hidden_layers" not in vars(facts):
        head_folder(head)  # a hub target: checked once its config is read
        return
    check_head_fits(
        head,
        {
            "hidden_size": facts.hidden_size,
            "vocab_size": facts.vocab_size,
            "num_layers": facts.num_hidden_layers,
        },
    )
