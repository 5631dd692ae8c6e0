"""The compile properties a bundle's models get when nobody chooses any, recorded in its manifest.

`xpuspec prepare` writes what the CPU plugin would compile each model with on the machine that prepared
it (the plan-tuned keys only: compute precision, KV cache, activation quantisation, key quantisation
mode), so a bundle says what its default answers are computed at and whether speculation can change
them. The agreement itself is measured where it can be: `xpuspec plan --write` records, for the
machine it ran on, each candidate's "verified = decoded" count and each drafter's greedy text against
target-only; docs/exactness.md gives the figures measured on the default model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xpuspec.executor.properties import TUNED_KEYS

DEVICE = "CPU"
STABLE_NOTE = (
    "f32 compute and an f32 KV cache: drafting, batch mates and the prefix cache change no greedy text "
    "(docs/exactness.md)"
)
UNSTABLE_NOTE = (
    "lower precision than f32 (compute or KV cache): drafting and batch mates can flip near-ties in greedy "
    "text (docs/exactness.md gives how often; Pipeline(properties='stable') avoids it)"
)


def speculation_stable(properties: dict[str, Any]) -> bool:
    """True for f32 compute with an f32 KV cache: the setting, short of exact mode, whose greedy text
    was measured not to depend on drafting or batch mates (docs/exactness.md). A quantised cache, even
    with per-token key scales (``PER_TOKEN_KEYS``, which removes the dependence on how a block was
    filled), and bf16 compute were measured to flip near-ties."""
    return all(
        str(properties.get(key, "")).lower() == "f32"
        for key in ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION")
    )


def default_properties_record(models: dict[str, Any]) -> dict[str, Any] | None:
    """``{"CPU": {"target": {...}, "draft": {...}, "speculation": note}}`` for the models' manifest facts;
    ``None`` when no CPU plugin is registered."""
    from xpuspec.devices.executors import model_weights
    from xpuspec.devices.plugin import ROLES, OpenVINODevicePlugin
    from xpuspec.devices.registry import default_registry
    from xpuspec.models.bundle import ModelInfo

    plugin = default_registry().plugin_for(DEVICE)
    if not isinstance(plugin, OpenVINODevicePlugin):
        return None
    own = _device_defaults()
    record: dict[str, Any] = {}
    for role in (role for role in ROLES if role in models):
        weights = model_weights(ModelInfo(role, Path("."), dict(models[role])))
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
