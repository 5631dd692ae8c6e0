"""The constants the suites import (the shared fixtures live in tests/support/fixtures.py)."""

from tests.support.fixtures import EAGLE3_DRAFT_VOCAB, EAGLE3_TAPS, EXACT_PRESET, F32

__all__ = ["EAGLE3_DRAFT_VOCAB", "EAGLE3_TAPS", "EXACT_PRESET", "F32"]
