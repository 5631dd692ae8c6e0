"""What `xpuspec prepare` is asked to do: typed, validated configuration."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from xpuspec.prepare.errors import PrepareError
from xpuspec.prepare.gguf_formats import GgufWeightFormat
from xpuspec.prepare.presets import (
    CHANNEL_WISE,
    DEVICE_PRESETS,
    TARGET_DEVICES,
    WEIGHT_FORMATS,
    TargetDevice,
    WeightFormat,
)

# A few short, varied prompts: enough for AWQ / scale estimation to see realistic activations
# without a data set download. Real deployments should pass their own with --calibration-prompts.
BUILTIN_CALIBRATION_PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Explain in simple words why the sky is blue.",
    "Once upon a time, in a small village by the sea, there lived",
    "Translate to German: The weather is nice today.",
    "import numpy as np\n\narray = np.zeros((3, 4))\n",
    "Q: What is 17 times 23?\nA:",
    "Write a short poem about autumn leaves.",
)


GROUP_SIZE_FALLBACKS = ("error", "ignore", "adjust")


@dataclass(frozen=True)
class WeightCompression:
    """The compression applied to one model, after presets and flags are resolved."""

    weights: WeightFormat
    sym: bool | None = None  # None for fp16
    group_size: int | None = None  # int4 only; -1 = channel-wise
    ratio: float = 1.0  # share of int4 layers, the rest int8 (int4 only)
    awq: bool = False
    scale_estimation: bool = False
    # What NNCF does with a layer the group size does not divide (int4 only): refuse ("error"),
    # leave it at the backup precision ("ignore"), or use a smaller power-of-two group ("adjust").
    group_size_fallback: str = "error"

    def __post_init__(self) -> None:
        if self.group_size_fallback not in GROUP_SIZE_FALLBACKS:
            raise ValueError(
                f"group_size_fallback must be one of {GROUP_SIZE_FALLBACKS}, got {self.group_size_fallback!r}"
            )
        if self.weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights must be one of {WEIGHT_FORMATS}, got {self.weights!r}")
        if self.weights == "fp16":
            if self.sym is not None or self.group_size is not None or self.awq or self.scale_estimation:
                raise ValueError("fp16 weights take no sym/group_size/awq/scale_estimation options")
        elif self.sym is None:
            raise ValueError(f"{self.weights} weights need sym=True or sym=False")
        if self.weights != "int4":
            if self.group_size is not None or self.ratio != 1.0:
                raise ValueError("group_size and ratio apply to int4 weights only")
            if self.awq or self.scale_estimation:
                raise ValueError("AWQ and scale estimation apply to int4 weights only")
        elif self.group_size is None or (self.group_size != CHANNEL_WISE and self.group_size <= 0):
            raise ValueError(f"int4 group_size must be a positive integer or -1, got {self.group_size!r}")
        if not 0.0 < self.ratio <= 1.0:
            raise ValueError(f"ratio must be in (0, 1], got {self.ratio}")

    @property
    def mode(self) -> str:
        """NNCF-style mode name: fp16, int8_sym, int8_asym, int4_sym, int4_asym."""
        if self.weights == "fp16":
            return "fp16"
        return f"{self.weights}_{'sym' if self.sym else 'asym'}"

    @property
    def data_aware(self) -> bool:
        return self.awq or self.scale_estimation

    def describe(self) -> str:
        """Short human form, e.g. ``int4 sym g128`` or ``int4 asym channel-wise r0.8 awq``."""
        if self.weights == "fp16":
            return "fp16"
        parts = [self.weights, "sym" if self.sym else "asym"]
        if self.weights == "int4":
            parts.append("channel-wise" if self.group_size == CHANNEL_WISE else f"g{self.group_size}")
            if self.ratio != 1.0:
                parts.append(f"r{self.ratio:g}")
            parts += [
                name for name, on in (("awq", self.awq), ("scale-estimation", self.scale_estimation)) if on
            ]
            if self.group_size_fallback != "error":
                parts.append(f"fallback {self.group_size_fallback}")
        return " ".join(parts)


@dataclass(frozen=True)
class PrepareConfig:
    """Inputs of :func:`xpuspec.prepare.prepare_bundle`.

    ``target`` / ``draft`` are local Hugging Face checkpoint folders, folders already exported to
    OpenVINO IR (``openvino_model.xml`` + config and tokenizer files; the export is then skipped),
    or hub ids passed through to optimum. Options left ``None`` come from the ``device`` preset.
    ``eagle3`` is a local EAGLE-3 head folder in the published layout, checked against the target and
    written to the bundle's ``eagle3/`` (:mod:`xpuspec.prepare.eagle3`).
    """

    target: str
    output: Path
    draft: str | None = None
    device: TargetDevice = "cpu"
    weights: WeightFormat | None = None
    draft_weights: WeightFormat | None = None  # None: same as the target
    group_size: int | None = None
    sym: bool | None = None
    ratio: float | None = None
    awq: bool = False
    scale_estimation: bool = False
    calibration_prompts: tuple[str, ...] = BUILTIN_CALIBRATION_PROMPTS
    force_pair: bool = False
    overwrite: bool = False
    group_size_fallback: str = "error"
    eagle3: str | None = None
    # The draft proposes only the first draft_vocab ids (recorded in the manifest; the runtime cuts the
    # draft's LM head to them, xpuspec.executor.graph_edits.cut_logits_vocab).
    draft_vocab: int | None = None
    # A GGUF target's converted weights re-compressed with NNCF (xpuspec.prepare.gguf_weights label, e.g.
    # int4_sym_g64); None or "gguf": as GenAI's reader converts them. The reason is recorded with it.
    gguf_weight_format: str | None = None
    gguf_weight_reason: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "output", Path(self.output).expanduser())
        if self.eagle3 is not None:
            object.__setattr__(self, "eagle3", str(self.eagle3))
        object.__setattr__(self, "target", str(self.target))
        if self.draft is not None:
            object.__setattr__(self, "draft", str(self.draft))
        object.__setattr__(self, "calibration_prompts", tuple(self.calibration_prompts))
        if not self.target:
            raise ValueError("target must name a checkpoint folder or hub id")
        if self.device not in TARGET_DEVICES:
            raise ValueError(f"device must be one of {TARGET_DEVICES}, got {self.device!r}")
        for name in ("weights", "draft_weights"):
            value = getattr(self, name)
            if value is not None and value not in WEIGHT_FORMATS:
                raise ValueError(f"{name} must be one of {WEIGHT_FORMATS}, got {value!r}")
        if self.draft_weights is not None and self.draft is None:
            raise ValueError("draft_weights given without a draft model")
        if self.draft_vocab is not None:
            if self.draft is None:
                raise ValueError("draft_vocab given without a draft model")
            if not isinstance(self.draft_vocab, int) or self.draft_vocab < 1:
                raise ValueError(f"draft_vocab must be a positive number of ids, got {self.draft_vocab!r}")
        if self.gguf_weight_format is not None:
            try:
                as_converted = GgufWeightFormat.parse(self.gguf_weight_format).as_converted
            except PrepareError as error:
                raise ValueError(str(error)) from error
            if self.weights is not None and not as_converted:
                raise ValueError("--weights and --weight-format both re-compress the target: give one")
        if self.force_pair and self.draft is None:
            raise ValueError("force_pair given without a draft model")
        if self.group_size_fallback not in GROUP_SIZE_FALLBACKS:
            raise ValueError(
                f"--group-size-fallback takes one of {GROUP_SIZE_FALLBACKS}, got {self.group_size_fallback!r}"
            )
        compressions = [self.target_compression()]
        if self.draft is not None:
            compressions.append(self.draft_compression())
        if not any(c.weights == "int4" for c in compressions):
            if self.group_size is not None or self.ratio is not None:
                raise ValueError("--group-size and --ratio apply to int4 weights; no model is int4")
            if self.awq or self.scale_estimation:
                raise ValueError("--awq and --scale-estimation apply to int4 weights; no model is int4")
            if self.group_size_fallback != "error":
                raise ValueError("--group-size-fallback applies to int4 weights; no model is int4")
        if self.sym is not None and all(c.weights == "fp16" for c in compressions):
            raise ValueError("--sym/--asym apply to int8/int4 weights; all models are fp16")
        if any(c.data_aware for c in compressions) and not self.calibration_prompts:
            raise ValueError("AWQ / scale estimation need at least one calibration prompt")

    @property
    def resolved_weights(self) -> WeightFormat:
        return self.weights or DEVICE_PRESETS[self.device].default_weights

    def target_compression(self) -> WeightCompression:
        return self._compression_for(self.resolved_weights)

    def draft_compression(self) -> WeightCompression:
        return self._compression_for(self.draft_weights or self.resolved_weights)

    def _compression_for(self, weights: WeightFormat) -> WeightCompression:
        scheme = DEVICE_PRESETS[self.device].scheme(weights)
        if scheme is None:
            return WeightCompression(weights="fp16")
        sym = scheme.sym if self.sym is None else self.sym
        if weights == "int8":
            return WeightCompression(weights="int8", sym=sym)
        return WeightCompression(
            weights="int4",
            sym=sym,
            group_size=scheme.group_size if self.group_size is None else self.group_size,
            ratio=scheme.ratio if self.ratio is None else self.ratio,
            awq=self.awq,
            scale_estimation=self.scale_estimation,
            group_size_fallback=self.group_size_fallback,
        )


def record_draft_vocab(draft_facts: dict, draft_vocab: int | None) -> dict:
    """The draft's manifest facts with ``draft_vocab`` (checked against its vocabulary) when given."""
    if draft_vocab is None:
        return draft_facts
    vocab_size = int(draft_facts.get("vocab_size") or 0)
    if vocab_size and draft_vocab > vocab_size:
        raise PrepareError(f"--draft-vocab {draft_vocab} exceeds the draft's vocabulary ({vocab_size} ids)")
    return {**draft_facts, "draft_vocab": draft_vocab}
