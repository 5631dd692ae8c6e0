"""Compile-property presets, and how a plan's tuned properties meet the user's.

Three layers decide a model's OpenVINO compile properties, each overriding the one before key by key:

1. the device plugin's defaults (``plugin.compile_properties``), which may depend on the weight format;
2. the properties ``xpuspec plan --write`` measured and recorded for the model's role on that device
   (``tuned``), used only while the user sets none of the precision keys themselves;
3. the user's properties: a mapping, or the name of a preset (``"exact"``, ``"stable"``).

The ``exact`` preset turns off every approximation the CPU makes by default: bf16 compute, a quantised
KV cache and the dynamic int8 quantisation of activations (on by default for int8/int4 weights, even
at f32). With it, greedy speculative decoding gives the target's own f32 tokens exactly.

The ``stable`` preset keeps f32 compute and an f32 cache but the activations' quantisation: greedy text
that drafting, batch mates and the prefix cache do not change. The defaults approximate more: a quantised
cache (whose keys carry per-token scales, ``PER_TOKEN_KEYS``, so a block's bytes do not depend on how it
was filled, though other kernels still round differently by chunk shape) and, where the CPU has it,
bf16 compute (docs/exactness.md gives the three levels and their measured agreement and speed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

EXACT = "exact"
# f32 compute, f32 KV cache, no dynamic quantisation of activations.
EXACT_PROPERTIES: dict[str, Any] = {
    "INFERENCE_PRECISION_HINT": "f32",
    "KV_CACHE_PRECISION": "f32",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
}
STABLE = "stable"
# f32 compute and an f32 KV cache, activations still quantised on the fly (int8/int4 weights): greedy
# text that neither drafting nor batch mates nor the prefix cache changes, short of exact mode's.
STABLE_PROPERTIES: dict[str, Any] = {
    "INFERENCE_PRECISION_HINT": "f32",
    "KV_CACHE_PRECISION": "f32",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": 128,
}
PRESETS: dict[str, dict[str, Any]] = {EXACT: EXACT_PROPERTIES, STABLE: STABLE_PROPERTIES}
# A u8 key cache with one scale per token (and group of channels): a token's cached key depends on that
# token alone, so a block holds the same bytes however it was filled: k tokens at a time by a verification
# pass, one at a time by decoding, a shorter chunk after a prefix-cache hit. The CPU's own default
# quantises keys per channel over a block: each write re-scales the block's earlier tokens (dequantised
# and quantised again) with scales that saw every token written, rejected drafts included, so a
# speculative run's cache, and then its near-ties, differ from a target-only run's.
KEY_QUANT_MODE = "KEY_CACHE_QUANT_MODE"
PER_TOKEN_KEYS: dict[str, Any] = {KEY_QUANT_MODE: "BY_TOKEN"}
# The keys `xpuspec plan` tunes; a user who sets any of them takes precision into their own hands.
TUNED_KEYS = (
    "INFERENCE_PRECISION_HINT",
    "KV_CACHE_PRECISION",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE",
    KEY_QUANT_MODE,
)

PropertiesArg = Mapping[str, Any] | str | None


def resolve_properties(properties: PropertiesArg) -> dict[str, Any] | None:
    """A preset name or a mapping as a fresh dict (``None`` stays ``None``).

    Raises ``ValueError`` naming the presets for an unknown name, or for a value of another type.
    """
    if properties is None:
        return None
    if isinstance(properties, str):
        preset = PRESETS.get(properties.strip().lower())
        if preset is None:
            raise ValueError(
                f"unknown properties preset {properties!r}; presets: {', '.join(PRESETS)} "
                "(or pass a dict of OpenVINO compile properties)"
            )
        return dict(preset)
    if not isinstance(properties, Mapping):
        raise ValueError(
            f"properties must be a dict of OpenVINO compile properties or a preset name "
            f"({', '.join(PRESETS)}), got {type(properties).__name__}"
        )
    return dict(properties)


def with_preset(preset: str | None, properties: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A preset (e.g. the CLI's ``--exact``) with explicit properties (``--property``) on top."""
    base = resolve_properties(preset) if preset else None
    if base is None:
        return dict(properties) if properties else None
    base.update(properties or {})
    return base


def parse_properties(items: list[str]) -> dict[str, str]:
    """``--property KEY=VALUE`` arguments (repeatable) as a dict; ``ValueError`` for one without ``=``."""
    properties = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--property takes KEY=VALUE, got {item!r}; e.g. INFERENCE_PRECISION_HINT=f32")
        properties[key.strip()] = value.strip()
    return properties


def layer_tuned(tuned: Mapping[str, Any] | None, user: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The user's properties over the plan's tuned ones; none of the tuned ones when the user sets a
    precision key (compute, KV cache or activation quantisation) of their own."""
    if not tuned:
        return dict(user) if user is not None else None
    if user and any(key in user for key in TUNED_KEYS):
        return dict(user)
    return {**tuned, **(user or {})}


def is_exact(properties: Mapping[str, Any] | None) -> bool:
    """True when ``properties`` pin every setting of the ``exact`` preset."""
    if not properties:
        return False
    return all(
        str(properties.get(key, "")).lower() == str(value).lower() for key, value in EXACT_PROPERTIES.items()
    )


def readable(properties: Mapping[str, Any]) -> str:
    """``INFERENCE_PRECISION_HINT: f32`` ... as one short line (for tables and logs)."""
    short = {
        "INFERENCE_PRECISION_HINT": "compute",
        "KV_CACHE_PRECISION": "kv",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": "dq_group",
        KEY_QUANT_MODE: "keys",
    }
    return ", ".join(f"{short.get(key, key)}={value}" for key, value in properties.items()) or "-"
