"""The error `xpuspec prepare` stops with: its own module, so every prepare module can raise it."""

from __future__ import annotations


class PrepareError(Exception):
    """`xpuspec prepare` cannot go on; the message says what to change."""
