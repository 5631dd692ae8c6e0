"""The weight formats a GGUF target can be re-compressed to (`prepare --weight-format`): labels only."""

from __future__ import annotations

from dataclasses import dataclass

from xpuspec.prepare.errors import PrepareError

# Formats NNCF writes: int4 (symmetric or not) in groups along the input axis, or int8 per output channel.
INT4_GROUPS = (32, 64, 128)
FORMATS = tuple(f"int4_{kind}_g{group}" for kind in ("sym", "asym") for group in INT4_GROUPS) + (
    "int8_sym",
    "int8_asym",
)
AS_IS = "gguf"  # a part left as the GGUF reader made it
_HEAD_SEPARATOR = "+head_"


@dataclass(frozen=True)
class GgufWeightFormat:
    """What the layers and the embedding / LM head are re-compressed to (``None``: kept as converted)."""

    layers: str | None = None
    head: str | None = None

    def __post_init__(self) -> None:
        for part, value in (("layers", self.layers), ("head", self.head)):
            if value is not None and value not in FORMATS:
                raise ValueError(f"{part} format must be one of {FORMATS} or None, got {value!r}")

    @classmethod
    def parse(cls, label: str) -> GgufWeightFormat:
        """``gguf`` (as converted), ``int4_sym_g64`` (the layers; the head as converted),
        ``int4_sym_g64+head_int8_asym`` or ``gguf+head_int8_asym``."""
        layers, _, head = label.strip().partition(_HEAD_SEPARATOR)
        try:
            return cls(
                layers=None if layers in ("", AS_IS) else layers,
                head=None if head in ("", AS_IS) else head,
            )
        except ValueError as error:
            choices = ", ".join(FORMATS)
            raise PrepareError(
                f"weight format {label!r}: each part must be {AS_IS} or one of {choices} "
                f"(e.g. int4_sym_g64, int4_sym_g64{_HEAD_SEPARATOR}int8_asym)"
            ) from error

    @property
    def label(self) -> str:
        text = self.layers or AS_IS
        return text + (f"{_HEAD_SEPARATOR}{self.head}" if self.head else "")

    @property
    def as_converted(self) -> bool:
        return self.layers is None and self.head is None
