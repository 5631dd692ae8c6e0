"""`xpuspec inspect`: summarize a bundle and verify every file's hash."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from xpuspec.api.errors import EXIT_FAILED, EXIT_USAGE, one_line, report_error
from xpuspec.models.bundle import BundleError
from xpuspec.models.resolve import resolve_bundle


def register(subparsers: argparse._SubParsersAction) -> None:
    inspect = subparsers.add_parser(
        "inspect", help="summarize a bundle and verify every file's hash", description="Summarize and verify."
    )
    inspect.add_argument(
        "bundle",
        metavar="BUNDLE",
        type=Path,
        nargs="?",
        default=None,
        help="bundle folder, or demo (default: SmolLM2 + draft)",
    )
    inspect.add_argument("--json", action="store_true", help="print the manifest as JSON")
    inspect.set_defaults(func=run_inspect)


def run_inspect(args: argparse.Namespace) -> int:
    from xpuspec.prepare.summary import summarize_bundle

    try:
        bundle = resolve_bundle(args.bundle, verify=False)  # the report below names every file
    except BundleError as error:
        report_error(one_line(str(error)))
        return EXIT_USAGE
    if args.json:
        print(json.dumps(bundle.manifest, indent=2))
    else:
        print(summarize_bundle(bundle))
    report = bundle.verify()
    files = len(bundle.manifest.get("files", {}))
    if not report.ok:
        print(f"verification FAILED ({bundle.root}):\n{report.describe()}", file=sys.stderr)
        return EXIT_FAILED
    print(f"verified: all {files} files match their SHA-256", file=sys.stderr if args.json else sys.stdout)
    return 0
