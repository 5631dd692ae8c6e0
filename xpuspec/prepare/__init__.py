"""Stage 1: Hugging Face checkpoints -> an OpenVINO model bundle (`xpuspec prepare` / `inspect`).

Importing this package is light: torch, transformers, optimum and nncf load only when a
bundle is being prepared.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xpuspec.prepare.config import PrepareConfig, PrepareError, WeightCompression
from xpuspec.prepare.pairing import PairingError
from xpuspec.prepare.presets import DEVICE_PRESETS, DevicePreset, QuantizationScheme

__all__ = [
    "DEVICE_PRESETS",
    "DevicePreset",
    "PairingError",
    "PrepareConfig",
    "PrepareError",
    "QuantizationScheme",
    "WeightCompression",
    "prepare_bundle",
]

if TYPE_CHECKING:
    from xpuspec.prepare.pipeline import prepare_bundle


def __getattr__(name: str) -> Any:
    # pipeline imports the OpenVINO runtime; keep `import xpuspec.prepare` (and the CLI) fast.
    if name == "prepare_bundle":
        from xpuspec.prepare.pipeline import prepare_bundle

        return prepare_bundle
    if name == "PairingError":
        return PairingError
    raise AttributeError(name)
