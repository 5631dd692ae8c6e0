"""The demo pair's held-out evaluation files (torch-free: benchmarks read it without the conversion stack)."""

from __future__ import annotations

# Ordinary, mid-sized modules of the standard library, relative to its root. Evaluation only.
HELDOUT_FILES: tuple[str, ...] = (
    "textwrap.py",
    "json/encoder.py",
    "json/decoder.py",
    "shlex.py",
    "fractions.py",
    "heapq.py",
    "bisect.py",
    "csv.py",
    "glob.py",
    "fnmatch.py",
    "queue.py",
    "sched.py",
    "graphlib.py",
    "pprint.py",
    "colorsys.py",
    "html/__init__.py",
)
