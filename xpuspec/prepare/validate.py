"""Checks that need only the models' config.json, run before any export or compression starts."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from xpuspec.prepare.config import PrepareError, WeightCompression
from xpuspec.prepare.presets import CHANNEL_WISE


def layer_input_sizes(config: Any) -> dict[str, int]:
    """Input sizes of the decoder's linear layers (what an int4 group must divide), by config field.

    q/k/v and gate/up read ``hidden_size`` inputs, down_proj reads ``intermediate_size``, o_proj
    reads ``num_attention_heads * head_dim``. The embedding and LM head stay at the int8 backup
    precision in NNCF's int4 modes, so their sizes do not matter.
    """
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = int(text_config.hidden_size)
    heads = int(text_config.num_attention_heads)
    head_dim = int(getattr(text_config, "head_dim", None) or hidden // heads)
    sizes = {"hidden_size": hidden, "num_attention_heads x head_dim": heads * head_dim}
    intermediate = getattr(text_config, "intermediate_size", None)
    if intermediate:
        sizes["intermediate_size"] = int(intermediate)
    return sizes


def largest_fitting_group(group_size: int, sizes: list[int]) -> int | None:
    """The largest power of two up to ``group_size`` dividing every size (None below 8)."""
    divisor = math.gcd(*sizes)
    candidate = 1 << (group_size.bit_length() - 1)
    while candidate >= 8:
        if divisor % candidate == 0:
            return candidate
        candidate //= 2
    return None


def check_group_size(role: str, config: Any, compression: WeightCompression) -> None:
    """Refuse an int4 group size that does not divide this model's layers (unless a fallback is set)."""
    if (
        compression.weights != "int4"
        or compression.group_size in (None, CHANNEL_WISE)
        or compression.group_size_fallback != "error"
    ):
        return
    group = int(compression.group_size)
    sizes = layer_input_sizes(config)
    misfits = {name: size for name, size in sizes.items() if size % group}
    if not misfits:
        return
    fitting = largest_fitting_group(group, list(sizes.values()))
    advice = f"--group-size {fitting}" if fitting else "--group-size -1 (channel-wise)"
    described = ", ".join(f"{name} {size}" for name, size in misfits.items())
    raise PrepareError(
        f"int4 group size {group} does not divide the {role}'s layer inputs ({described}); use {advice}, "
        "-1 (channel-wise), or --group-size-fallback adjust|ignore to let NNCF handle those layers"
    )


def model_vocab_size(config: Any) -> int:
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text_config.vocab_size)


def check_vocab_sizes(target_config: Any, draft_config: Any) -> None:
    """The engine verifies a draft token with the target's logits: the draft may not have more ids."""
    target_vocab, draft_vocab = model_vocab_size(target_config), model_vocab_size(draft_config)
    if draft_vocab > target_vocab:
        raise PrepareError(
            f"the draft's vocabulary ({draft_vocab}) is larger than the target's ({target_vocab}), so the "
            "engine cannot use it (not even with --force-pair); choose a draft that shares the target's "
            "tokenizer"
        )


def read_local_config(folder: Path) -> Any | None:
    """A checkpoint's config.json as attributes (its text_config for multimodal models), without
    importing transformers; ``None`` when there is none to read."""
    try:
        facts = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(facts, dict):
        return None
    nested = facts.get("text_config")
    text = nested if isinstance(nested, dict) else facts
    if not all(key in text for key in ("hidden_size", "num_attention_heads", "vocab_size")):
        return None
    return SimpleNamespace(**text)
