"""The compile properties a bundle's models get when nobody chooses any, recorded in its manifest.

`xpuspec prepare` writes what the CPU plugin would compile each model with (the plan-tuned keys only:
compute precision, KV cache, activation quantisation, key quantisation mode), so a bundle says what its
default answers are computed at and whether speculation can change them. The agreement itself is
measured where it can be: `xpuspec plan --write` records, for the machine it ran on, each candidate's
"verified = decoded" count and each drafter's greedy text against target-only; docs/exactness.md gives
the figures measured on the default model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xpuspec.executor.properties import SPECULATION_STABLE, TUNED_KEYS

DEVICE = "CPU"
STABLE_NOTE = (
    "keys quantised per token: a verification pass writes the KV cache as one-token decoding does, so "
    "greedy speculative text equals greedy target-only text at these properties (docs/exactness.md)"
)
UNSTABLE_NOTE = (
    "a quantised KV cache whose keys are scaled per block: speculation, batch mates and the prefix cache "
    "can change greedy text at near-ties (docs/exactness.md)"
)


def speculation_stable(properties: dict[str, Any]) -> bool:
    """True when ``properties`` keep the KV cache's bytes independent of how a block was filled."""
    if str(properties.get("KV_CACHE_PRECISION", "u8")).lower() not in ("u8", "i8", "u4", "i4"):
        return True  # a float cache stores each token as it is
    return all(str(properties.get(key, "")).upper() == value for key, value in SPECULATION_STABLE.items())


def default_properties_record(models: dict[str, Any]) -> dict[str, Any] | None:
    """``{"CPU": {"target": {...}, "draft": {...}, "speculation": note}}`` for the models' manifest facts;
    ``None`` when no CPU plugin is registered."""
    from xpuspec.devices.executors import model_weights
    from xpuspec.devices.plugin import OpenVINODevicePlugin
    from xpuspec.devices.registry import default_registry
    from xpuspec.model_bundle import ModelInfo

    plugin = default_registry().plugin_for(DEVICE)
    if not isinstance(plugin, OpenVINODevicePlugin):
        return None
    own = _device_defaults()
    record: dict[str, Any] = {}
    for role, facts in models.items():
        weights = model_weights(ModelInfo(role, Path("."), dict(facts)))
        compiled = {**own, **plugin.compile_properties(role, None, weights=weights)}
        record[role] = {key: compiled[key] for key in TUNED_KEYS if key in compiled}
    target = record.get("target", {})
    record["speculation"] = STABLE_NOTE if speculation_stable(target) else UNSTABLE_NOTE
    return {DEVICE: record}


def _device_defaults() -> dict[str, Any]:
    """The CPU's own values of the tuned keys the plugin leaves to it (e.g. bf16 compute where the CPU
    has bf16); keys the device does not report are left out."""
    import openvino as ov

    core, found = ov.Core(), {}
    for key in TUNED_KEYS:
        try:
            value = core.get_property(DEVICE, key)
        except RuntimeError:
            continue
        found[key] = value.to_string() if isinstance(value, ov.Type) else value
    return found
