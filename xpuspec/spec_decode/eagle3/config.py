"""An EAGLE-3 head's ``config.json``: the typed, checked fields the loader, graph and runtime need.

Published heads (``yuhuili/EAGLE3-*``, ``AngelSlim/*_eagle3``, SpecForge outputs) ship a Llama-style
config with ``architectures: ["LlamaForCausalLMEagle3"]``, one decoder layer (``num_hidden_layers: 1``),
``vocab_size`` = the target's vocabulary, ``draft_vocab_size`` = the head's own (smaller) output
vocabulary, and optionally ``eagle_config.eagle_aux_hidden_state_layer_ids``: the target layers whose
hidden states the head fuses. Fields the EAGLE-3 implementations read but this head does not support
(a second decoder layer, biases, another activation, a draft narrower than the target) are rejected
here with the reason, rather than loading into a head that silently computes something else.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
ARCHITECTURE = "LlamaForCausalLMEagle3"
_REQUIRED = (
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "rms_norm_eps",
    "vocab_size",
)
_ROPE_TYPES = ("default", "linear", "llama3")


def eagle3_default_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's default low, middle and high boundaries: ``(2, num_layers // 2, num_layers - 3)``.

    The same triple as the EAGLE reference, vLLM and SGLang (:mod:`xpuspec.executor.hidden_taps` says
    what an id names). It needs at least 6 layers to give three distinct, increasing boundaries.
    """
    if num_layers < 6:
        raise ValueError(
            f"EAGLE-3's default layers (2, n // 2, n - 3) need a target of at least 6 layers, got "
            f"{num_layers}; name the layers explicitly (the head's eagle_aux_hidden_state_layer_ids)"
        )
    return (2, num_layers // 2, num_layers - 3)


@dataclass(frozen=True)
class Eagle3HeadConfig:
    """The shape and numerics of a one-layer EAGLE-3 head.

    ``aux_layer_ids`` are the head's ``eagle_aux_hidden_state_layer_ids`` as written, or None for
    EAGLE-3's defaults (:func:`eagle3_default_layers`); see
    :meth:`tap_layers` for how they are read.
    """

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    vocab_size: int
    draft_vocab_size: int
    rope_theta: float = 10000.0
    rope_scaling: Mapping[str, Any] | None = None
    aux_layer_ids: tuple[int, ...] | None = None
    # vLLM's option (speculators-trained heads): the residual is the hidden_norm'ed state, not the raw one.
    norm_before_residual: bool = False
    max_position_embeddings: int = 2048

    def __post_init__(self) -> None:
        sizes = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size")
        for name in (*sizes, "vocab_size", "draft_vocab_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"EAGLE-3 head config: {name} must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"EAGLE-3 head config: num_attention_heads ({self.num_attention_heads}) must be a multiple "
                f"of num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"EAGLE-3 head config: head_dim must be even for rotary embeddings, got {self.head_dim}"
            )
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(
                f"EAGLE-3 head config: draft_vocab_size ({self.draft_vocab_size}) is larger than "
                f"vocab_size ({self.vocab_size}), the target vocabulary it maps into"
            )
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError(
                f"EAGLE-3 head config: rms_norm_eps and rope_theta must be > 0, got "
                f"{self.rms_norm_eps} and {self.rope_theta}"
            )
        if self.aux_layer_ids is not None and (
            len(self.aux_layer_ids) != 3 or any(layer < 0 for layer in self.aux_layer_ids)
        ):
            raise ValueError(
                f"EAGLE-3 head config: eagle_aux_hidden_state_layer_ids must be three non-negative layer "
                f"ids (low, middle, high), got {list(self.aux_layer_ids)}"
            )
        self.rope_inverse_frequencies()  # raises for a rope_scaling this head cannot compute

    @property
    def num_groups(self) -> int:
        """Query heads per key/value head (grouped-query attention)."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "config") -> Eagle3HeadConfig:
        """Read the published layout; ``source`` names the file in error messages."""
        missing = [key for key in _REQUIRED if data.get(key) is None]
        if missing:
            raise ValueError(
                f"{source}: missing {', '.join(missing)}: not an EAGLE-3 head config "
                f"(expected a Llama-style config with architectures [{ARCHITECTURE!r}])"
            )
        architectures = [str(name) for name in data.get("architectures") or []]
        if architectures and not any("eagle3" in name.lower() for name in architectures):
            logger.warning(
                "%s: architectures %s do not name EAGLE-3; reading it as one", source, architectures
            )
        unsupported = []
        if int(data.get("num_hidden_layers", 1)) != 1:
            unsupported.append(f"num_hidden_layers={data['num_hidden_layers']} (only one decoder layer)")
        if str(data.get("hidden_act", "silu")) != "silu":
            unsupported.append(f"hidden_act={data['hidden_act']!r} (only silu)")
        for flag in ("attention_bias", "mlp_bias", "bias"):
            if data.get(flag):
                unsupported.append(f"{flag}=true (bias-free projections only)")
        target_hidden = data.get("target_hidden_size")
        if target_hidden is not None and int(target_hidden) != int(data["hidden_size"]):
            unsupported.append(
                f"target_hidden_size={target_hidden} != hidden_size={data['hidden_size']} "
                f"(a head narrower than its target needs its own embedding table)"
            )
        if unsupported:
            raise ValueError(f"{source}: unsupported EAGLE-3 head: {'; '.join(unsupported)}")

        eagle_config = data.get("eagle_config") or {}
        aux = eagle_config.get("eagle_aux_hidden_state_layer_ids")
        # transformers 5 moves rope_theta and rope_scaling into rope_parameters.
        rope_parameters = data.get("rope_parameters") or {}
        rope_theta = data.get("rope_theta", rope_parameters.get("rope_theta"))
        if rope_theta is None:
            logger.warning("%s: no rope_theta; using Llama's default 10000", source)
            rope_theta = 10000.0
        rope_scaling = data.get("rope_scaling")
        if rope_scaling is None and rope_parameters.get("rope_type", "default") != "default":
            rope_scaling = rope_parameters
        heads = int(data["num_attention_heads"])
        try:
            return cls(
                hidden_size=int(data["hidden_size"]),
                num_attention_heads=heads,
                num_key_value_heads=int(data["num_key_value_heads"]),
                head_dim=int(data.get("head_dim") or int(data["hidden_size"]) // heads),
                intermediate_size=int(data["intermediate_size"]),
                rms_norm_eps=float(data["rms_norm_eps"]),
                vocab_size=int(data["vocab_size"]),
                draft_vocab_size=int(data.get("draft_vocab_size") or data["vocab_size"]),
                rope_theta=float(rope_theta),
                rope_scaling=dict(rope_scaling) if rope_scaling else None,
                aux_layer_ids=tuple(int(layer) for layer in aux) if aux is not None else None,
                norm_before_residual=bool(data.get("norm_before_residual", False)),
                max_position_embeddings=int(data.get("max_position_embeddings") or 2048),
            )
        except ValueError as error:
            raise ValueError(f"{source}: {error}") from None

    @classmethod
    def from_folder(cls, folder: str | Path) -> Eagle3HeadConfig:
        path = Path(folder) / CONFIG_FILE
        if not path.is_file():
            raise ValueError(f"no {CONFIG_FILE} in {folder}: expected an EAGLE-3 head folder")
        return cls.from_dict(json.loads(path.read_text()), source=str(path))

    def to_dict(self) -> dict[str, Any]:
        """The published ``config.json`` layout (what EAGLE, vLLM and SGLang read)."""
        data: dict[str, Any] = {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "num_hidden_layers": 1,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": False,
        }
        if self.norm_before_residual:
            data["norm_before_residual"] = True
        if self.aux_layer_ids is not None:
            data["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids)}
        return data

    def tap_layers(self, num_target_layers: int) -> tuple[int, int, int]:
        """The target boundaries to tap (:func:`xpuspec.executor.hidden_taps.add_hidden_state_taps`).

        A config's ids are taken as boundaries as written, vLLM's reading (``get_eagle3_aux_layers_
        from_config``); SGLang adds 1 to them (see :mod:`xpuspec.executor.hidden_taps`). Without ids,
        EAGLE-3's defaults ``(2, n // 2, n - 3)``, on which every engine agrees.
        """
        if self.aux_layer_ids is None:
            return eagle3_default_layers(num_target_layers)
        if any(layer > num_target_layers for layer in self.aux_layer_ids):
            raise ValueError(
                f"the head's eagle_aux_hidden_state_layer_ids {list(self.aux_layer_ids)} name layers past "
                f"the target's {num_target_layers}: this head was trained for another target"
            )
        low, middle, high = self.aux_layer_ids
        return (low, middle, high)

    def check_target(self, target: Mapping[str, Any] | str | Path) -> tuple[int, int, int]:
        """Check the head fits a target (its ``config.json`` dict, or its folder); return its tap layers."""
        config: Mapping[str, Any]
        if isinstance(target, Mapping):
            config = target
        else:
            path = Path(target) / CONFIG_FILE if Path(target).is_dir() else Path(target)
            if not path.is_file():
                raise ValueError(f"no target config at {path}")
            config = json.loads(path.read_text())
        target = config.get("text_config") or config
        problems = []
        if int(target.get("hidden_size", -1)) != self.hidden_size:
            problems.append(
                f"its hidden_size is {target.get('hidden_size')}, the head's fc fuses 3 x {self.hidden_size}"
            )
        if int(target.get("vocab_size", -1)) != self.vocab_size:
            problems.append(
                f"its vocab_size is {target.get('vocab_size')}, the head maps draft ids into a vocabulary "
                f"of {self.vocab_size}"
            )
        if problems:
            raise ValueError(f"the EAGLE-3 head does not fit the target: {'; '.join(problems)}")
        if "num_hidden_layers" not in target:
            raise ValueError("the target config has no num_hidden_layers: cannot place the hidden-state taps")
        return self.tap_layers(int(target["num_hidden_layers"]))

    def rope_inverse_frequencies(self) -> np.ndarray:
        """The rotary inverse frequencies ``[head_dim // 2]`` f32, after the config's rope scaling.

        ``default`` (none), ``linear`` (positions divided by ``factor``, i.e. frequencies) and ``llama3``
        (Llama 3.1's band-wise rescale) are position-independent, so one constant vector serves the
        graph; ``dynamic`` NTK and YaRN's attention factor are not, and are rejected.
        """
        dim = self.head_dim
        inv_freq = 1.0 / (self.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
        scaling = dict(self.rope_scaling or {})
        kind = str(scaling.get("rope_type", scaling.get("type", "default")))
        if kind not in _ROPE_TYPES:
            raise ValueError(
                f"EAGLE-3 head config: rope scaling {kind!r} is not supported "
                f"(supported: {', '.join(_ROPE_TYPES)})"
            )
        if kind == "linear":
            inv_freq = inv_freq / float(scaling["factor"])
        elif kind == "llama3":
            factor = float(scaling["factor"])
            low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
            old_context = float(scaling["original_max_position_embeddings"])
            wavelength = 2 * math.pi / inv_freq
            scaled = np.where(wavelength > old_context / low, inv_freq / factor, inv_freq)
            smooth = (old_context / wavelength - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = (wavelength >= old_context / high) & (wavelength <= old_context / low)
            inv_freq = np.where(medium, smoothed, scaled)
        return inv_freq.astype(np.float32)
