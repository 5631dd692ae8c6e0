"""The embedded demo pair: a small trained Llama target and draft shipped inside the package.

`xpuspec.demo.train` is the recipe that makes it (needs the `convert` extra).
"""

from __future__ import annotations

from pathlib import Path

BUNDLE_DIR = Path(__file__).parent / "bundle"


def demo_bundle_path() -> Path:
    return BUNDLE_DIR
