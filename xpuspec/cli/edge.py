"""`xpuspec bundle` (write an edge archive) and `xpuspec verify` (check one)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from xpuspec.api.errors import EXIT_FAILED, EXIT_USAGE, CommandError


def register(subparsers: argparse._SubParsersAction) -> None:
    bundle = subparsers.add_parser(
        "bundle",
        help="pack a model bundle, xpuspec and its pinned runtime into one edge archive (tar.gz)",
        description="Write one tar.gz with the model bundle, the xpuspec wheel, pinned runtime requirements, "
        "optionally a wheelhouse for an offline install, launchers (run.sh, run.ps1), an example systemd "
        "unit and edge.json with the SHA-256 of every file.",
    )
    bundle.add_argument(
        "bundle", nargs="?", default=None, help="a bundle folder, or demo (default: SmolLM2 + draft)"
    )
    bundle.add_argument("-o", "--output", type=Path, default=Path("edge.tar.gz"), help="the archive to write")
    bundle.add_argument(
        "--wheels",
        action="store_true",
        help="include a wheelhouse of every runtime requirement (offline install)",
    )
    bundle.add_argument(
        "--platform",
        action="append",
        default=[],
        metavar="PLAT",
        help="a target's wheel platform tag, e.g. manylinux_2_28_x86_64 or win_amd64 (repeatable; "
        "default: this machine); needs --wheels",
    )
    bundle.add_argument(
        "--python-version", default=None, help="the target's Python, e.g. 3.11 (default: this one)"
    )
    bundle.add_argument("--name", default="xpuspec-edge", help="the archive's top-level folder")
    bundle.add_argument(
        "--xpuspec-wheel",
        type=Path,
        default=None,
        help="a prebuilt xpuspec wheel to ship (default: build one from this installation)",
    )
    bundle.add_argument("--overwrite", action="store_true", help="replace an existing archive")
    bundle.set_defaults(func=run_bundle)

    verify = subparsers.add_parser(
        "verify",
        help="check an edge archive (or its unpacked folder) against its edge.json",
        description="Exit 0 when every file has its recorded SHA-256 and nothing is missing or extra; "
        "exit 1 naming each file that differs.",
    )
    verify.add_argument("archive", help="edge.tar.gz or an unpacked archive folder")
    verify.set_defaults(func=run_verify)


def run_bundle(args: argparse.Namespace) -> int:
    from xpuspec.edge.archive import EdgeConfig, build_edge_archive
    from xpuspec.edge.wheels import PackagingError
    from xpuspec.models.bundle import BundleError
    from xpuspec.prepare.quiet import StageLines

    try:
        config = EdgeConfig(
            output=args.output,
            bundle=Path(args.bundle) if args.bundle else None,
            include_wheels=args.wheels,
            platforms=list(args.platform),
            python_version=args.python_version,
            root_name=args.name,
            xpuspec_wheel=args.xpuspec_wheel,
            overwrite=args.overwrite,
        )
    except ValueError as error:
        raise CommandError(str(error), EXIT_USAGE) from error
    started = time.monotonic()
    try:
        stages = StageLines(sys.stderr)  # one line per stage: the wheelhouse alone takes a minute
        try:
            manifest = build_edge_archive(config, progress=stages)
        finally:
            stages.abandon()
    except BundleError:
        raise  # the bundle is the command's input: one line, exit 2
    except (PackagingError, ValueError) as error:
        raise CommandError(" ".join(str(error).split("\n")), EXIT_FAILED) from error
    size = config.output.stat().st_size
    wheelhouse = manifest.get("wheelhouse")
    print(
        f"wrote {config.output}: {size / 1e6:.1f} MB, {len(manifest['files'])} files, "
        + (
            f"wheelhouse of {wheelhouse['wheels']} wheels for {', '.join(wheelhouse['platforms'])}"
            if wheelhouse
            else "no wheelhouse"
        )
        + f" ({time.monotonic() - started:.0f} s)"
    )
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from xpuspec.edge.verify_edge import main

    if not Path(args.archive).exists():
        raise CommandError(
            f"{args.archive}: no such file or folder; give an edge archive (.tar.gz) or its unpacked folder"
        )
    return main([args.archive])
