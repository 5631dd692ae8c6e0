"""The embedded demo pair: a small trained Llama target and draft shipped inside the package, and the
held-out prompts the benchmarks read.

`research/training/train.py` is the recipe that makes the pair (needs the `convert` extra).
"""

from __future__ import annotations

from pathlib import Path

BUNDLE_DIR = Path(__file__).parent / "bundle"
#: Instructions SmolLM2's draft and head were never trained on (``xpuspec bench --workload PATH``).
SMOLLM2_HELDOUT = Path(__file__).parent / "smollm2_heldout.jsonl"


def demo_bundle_path() -> Path:
    return BUNDLE_DIR
