"""Hugging Face checkpoint -> uncompressed stateful OpenVINO IR (via optimum-intel).

torch, transformers and optimum are imported here lazily: `import xpuspec` and the runtime never
need them, and a missing or broken conversion stack becomes one actionable error.
"""

from __future__ import annotations

import importlib
import logging
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from xpuspec.models.bundle import MANIFEST_NAME
from xpuspec.prepare.config import PrepareError

logger = logging.getLogger(__name__)

IR_MODEL_NAME = "openvino_model.xml"
EXPORT_TASK = "text-generation-with-past"
_INSTALL_HINT = "run `scripts/install.sh --dev` to install the conversion tools"
# HF files that travel with the IR so the folder loads on its own (tokenizer, chat template, config).
SUPPORT_FILE_PATTERNS = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)


def import_conversion_module(name: str) -> ModuleType:
    """Import one module of the conversion stack, or explain how to install it."""
    try:
        return importlib.import_module(name)
    except Exception as error:  # noqa: BLE001 - broken installs raise anything (the torchvision trap)
        raise PrepareError(
            f"the conversion stack does not import ({name}: {type(error).__name__}: {error}); {_INSTALL_HINT}"
        ) from error


def check_conversion_stack() -> None:
    """Fail early, before any work, when torch/transformers/optimum-intel/nncf cannot be used."""
    for name in ("torch", "transformers", "optimum.exporters.openvino", "nncf", "openvino_tokenizers"):
        import_conversion_module(name)


@dataclass(frozen=True)
class ModelSource:
    """Where one model comes from: a local HF folder, a local OpenVINO IR folder, or a hub id."""

    spec: str  # as given by the user
    local_path: Path | None

    @classmethod
    def resolve(cls, spec: str, role: str) -> ModelSource:
        path = Path(spec).expanduser()
        if path.is_dir():
            if not (path / "config.json").is_file():
                if (path / MANIFEST_NAME).is_file():
                    raise PrepareError(
                        f"{role} {spec}: already an xpuspec bundle; run it as it is "
                        f"(e.g. `xpuspec generate --bundle {spec} ...`)"
                    )
                raise PrepareError(
                    f"{role} {spec}: folder has no config.json; is it a Hugging Face checkpoint?"
                )
            return cls(spec=spec, local_path=path.resolve())
        if path.exists():
            raise PrepareError(f"{role} {spec}: not a folder (give a checkpoint folder or a hub id)")
        if _looks_like_local_path(spec):
            raise PrepareError(f"{role} {spec}: no such folder")
        return cls(spec=spec, local_path=None)

    @property
    def is_openvino_ir(self) -> bool:
        return self.local_path is not None and (self.local_path / IR_MODEL_NAME).is_file()

    @property
    def recorded_source(self) -> str:
        return str(self.local_path) if self.local_path is not None else self.spec

    @property
    def loadable(self) -> str:
        """What to hand to `from_pretrained`: the folder, or the hub id."""
        return str(self.local_path) if self.local_path is not None else self.spec


def _looks_like_local_path(spec: str) -> bool:
    # A hub id is "name" or "org/name"; anything else that is not on disk is a missing folder.
    return spec.startswith((".", "/", "~")) or spec.count("/") > 1 or "\\" in spec


def _hub_failure(source: ModelSource, role: str, error: Exception) -> PrepareError:
    return PrepareError(
        f"{role} {source.spec!r} is not a local folder and could not be loaded from the Hugging Face hub "
        f"({type(error).__name__}: {error}); check the path, or the id and network access"
    )


def load_hf_config(source: ModelSource, role: str) -> Any:
    transformers = import_conversion_module("transformers")
    try:
        return transformers.AutoConfig.from_pretrained(source.loadable)
    except Exception as error:  # noqa: BLE001 - hub/network/format errors all end here
        if source.local_path is None:
            raise _hub_failure(source, role, error) from error
        raise PrepareError(f"{role} {source.spec}: cannot read config.json ({error})") from error


def load_hf_tokenizer(source: ModelSource, role: str) -> Any:
    transformers = import_conversion_module("transformers")
    try:
        return transformers.AutoTokenizer.from_pretrained(source.loadable)
    except Exception as error:  # noqa: BLE001
        if source.local_path is None:
            raise _hub_failure(source, role, error) from error
        raise PrepareError(f"{role} {source.spec}: cannot load its tokenizer ({error})") from error


@contextmanager
def quiet_tracing() -> Iterator[None]:
    """An optimum export without torch tracing's warnings (tests exporting with optimum use it too).

    Tracing warns that values become constants of the trace: true of every export, and nothing the
    caller can act on (the pair check and `inspect` test the result). optimum traces with torch.jit,
    which torch now calls deprecated: optimum's to change. An exported model's temporary folder,
    cleaned when the model is collected, warns as well.
    """
    tracing = import_conversion_module("torch.jit")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tracing.TracerWarning)
        warnings.filterwarnings("ignore", r"`torch\.jit\.trace", DeprecationWarning)
        warnings.filterwarnings("ignore", "Implicitly cleaning up", ResourceWarning)
        yield


def export_to_openvino(source: ModelSource, out_dir: Path, role: str) -> Path:
    """Export ``source`` to uncompressed (fp32) stateful IR in ``out_dir``; return the .xml path.

    Compression happens afterwards in :mod:`xpuspec.prepare.compress`, so the export must not
    apply optimum's size-based int8 default: ``OVConfig(dtype="fp32")`` turns it off.
    """
    optimum_export = import_conversion_module("optimum.exporters.openvino")
    intel_openvino = import_conversion_module("optimum.intel.openvino")
    try:
        with quiet_tracing():
            optimum_export.main_export(
                source.loadable,
                output=out_dir,
                task=EXPORT_TASK,
                stateful=True,
                convert_tokenizer=False,
                ov_config=intel_openvino.OVConfig(dtype="fp32"),
            )
    except Exception as error:  # noqa: BLE001
        if source.local_path is None:
            raise _hub_failure(source, role, error) from error
        raise PrepareError(
            f"{role} {source.spec}: export to OpenVINO failed ({type(error).__name__}: {error})"
        ) from error
    xml_path = out_dir / IR_MODEL_NAME
    if not xml_path.is_file():
        raise PrepareError(f"{role} {source.spec}: optimum produced no {IR_MODEL_NAME}")
    return xml_path


def copy_support_files(source_dir: Path, model_dir: Path) -> list[str]:
    """Copy the HF config/tokenizer files present in ``source_dir``; return their names."""
    copied = []
    for name in SUPPORT_FILE_PATTERNS:
        path = source_dir / name
        if path.is_file():
            shutil.copy2(path, model_dir / name)
            copied.append(name)
    return copied


def architecture_facts(config: Any) -> dict[str, Any]:
    """The manifest's per-model shape facts, read from a transformers config."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    num_heads = int(text_config.num_attention_heads)
    hidden_size = int(text_config.hidden_size)
    head_dim = getattr(text_config, "head_dim", None) or hidden_size // num_heads
    architectures = getattr(config, "architectures", None) or ["unknown"]
    return {
        "architecture": architectures[0],
        "model_type": config.model_type,
        "vocab_size": int(text_config.vocab_size),
        "num_layers": int(text_config.num_hidden_layers),
        "num_attention_heads": num_heads,
        "num_kv_heads": int(getattr(text_config, "num_key_value_heads", None) or num_heads),
        "head_dim": int(head_dim),
        "hidden_size": hidden_size,
        "max_position_embeddings": int(getattr(text_config, "max_position_embeddings", 2048)),
    }
