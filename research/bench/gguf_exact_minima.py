"""A copy of a Q4_1 GGUF bundle whose IR keeps each block's minimum exactly: for bundles prepared before
``prepare`` kept them (:mod:`xpuspec.prepare.gguf_minima`, which this calls).

    python -m research.bench.gguf_exact_minima --bundle B -o OUT

The copy's manifest is re-hashed; `xpuspec quality OUT` then measures against the file's own weights
(docs/benchmarks.md, "Quality against exact mode").
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from xpuspec.prepare.gguf_minima import keep_q4_1_minima


def exact_minima_copy(bundle_root: Path, gguf: Path, output: Path) -> int:
    """Copy the bundle to ``output`` with its target's Q4_1 zero points made exact; re-hash the manifest.
    Returns how many zero points were replaced."""
    from xpuspec.models.bundle import hash_tree, write_manifest_field

    shutil.copytree(bundle_root, output)
    fixed = keep_q4_1_minima(gguf, output / "target" / "openvino_model.xml")
    write_manifest_field(output, "files", hash_tree(output))
    return fixed


def main() -> None:
    from xpuspec.models.resolve import resolve_bundle

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default=None)
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    bundle = resolve_bundle(args.bundle)
    fixed = exact_minima_copy(bundle.root, Path(bundle.target.facts["source"]), args.output)
    print(f"{fixed} Q4_1 zero points made exact in {args.output}")


if __name__ == "__main__":
    main()
