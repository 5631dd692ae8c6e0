"""The PyTorch plugin ("TORCH"): runs the Hugging Face checkpoint a bundle was prepared from.

It is the reference and fallback executor: no OpenVINO involved, so it shows whether a wrong output
comes from the OpenVINO graph or from the engine, and it runs a model OpenVINO cannot convert.
It uses intel-extension-for-pytorch when that imports, plain PyTorch otherwise, and is present
only where torch imports (the runtime install has no torch).
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from xpuspec.devices.capabilities import CoreLike, DeviceCapabilities
from xpuspec.devices.plugin import (
    DEFAULT_MAX_DRAFT_TOKENS,
    ExecutorKind,
    Role,
    base_device_name,
    check_role,
    merge_properties,
)

logger = logging.getLogger(__name__)

TORCH_DTYPES = ("float32", "bfloat16")


@functools.lru_cache(maxsize=1)
def _import(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except Exception as error:  # ImportError, or a broken binary wheel (OSError, RuntimeError)
        logger.debug("%s does not import: %s", name, error)
        return None


def checkpoint_dir(model_dir: Path, facts: Mapping[str, Any]) -> Path:
    """The Hugging Face checkpoint of a bundle model: the source it was prepared from, if still on disk."""
    candidates = [Path(str(facts["source"])).expanduser()] if facts.get("source") else []
    candidates.append(Path(model_dir))
    for folder in candidates:
        if (folder / "config.json").is_file() and any(
            any(folder.glob(pattern)) for pattern in ("*.safetensors", "pytorch_model*.bin")
        ):
            return folder
    raise ValueError(
        f"the TORCH device runs the Hugging Face checkpoint a bundle was prepared from, but none of "
        f"{[str(c) for c in candidates]} holds config.json and weights; use an OpenVINO device"
    )


class TorchPlugin:
    name = "TORCH"
    executor_kind: ExecutorKind = "reference"
    compression_preset: str | None = None

    def matches(self, device: str) -> bool:
        return base_device_name(device) == self.name

    def is_present(self, core: CoreLike) -> bool:
        return _import("torch") is not None

    def cannot_run(self, model_dir: Path, facts: Mapping[str, Any]) -> str | None:
        """Why this executor cannot run a bundle model (``None`` if it can): `xpuspec devices` says it."""
        try:
            checkpoint_dir(model_dir, facts)
        except ValueError:
            return "needs the Hugging Face checkpoint the bundle was prepared from, which is not on disk"
        return None

    def capabilities(self, core: CoreLike, device: str | None = None) -> DeviceCapabilities:
        torch = _import("torch")
        ipex = _import("intel_extension_for_pytorch") if torch is not None else None
        full_name = ""
        if torch is not None:
            full_name = f"PyTorch {torch.__version__}" + (f" + IPEX {ipex.__version__}" if ipex else "")
        return DeviceCapabilities(
            device=device or self.name,
            full_name=full_name,
            present=torch is not None,
            paged_attention=False,
            dynamic_shapes=True,
            executor_kind=self.executor_kind,
            compression_preset=self.compression_preset,
            precisions=("FP32", "BF16") if torch is not None else (),
            compute_units=torch.get_num_threads() if torch is not None else None,
        )

    def compile_properties(
        self,
        role: Role,
        user_properties: Mapping[str, Any] | None = None,
        *,
        max_draft_tokens: int = DEFAULT_MAX_DRAFT_TOKENS,
    ) -> dict[str, Any]:
        check_role(role)
        properties = merge_properties({"dtype": "float32"}, user_properties)
        if properties["dtype"] not in TORCH_DTYPES:
            raise ValueError(f"TORCH dtype must be one of {TORCH_DTYPES}, got {properties['dtype']!r}")
        return properties

    def create_runner(
        self,
        model_dir: Path,
        facts: Mapping[str, Any],
        properties: Mapping[str, Any],
        num_blocks: int | None,
        block_size: int | None,
    ) -> Any:
        from .torch_runner import TorchModelRunner

        return TorchModelRunner(
            checkpoint_dir(model_dir, facts),
            dtype=str(properties.get("dtype", "float32")),
            num_blocks=num_blocks,
            block_size=block_size,
            use_ipex=_import("intel_extension_for_pytorch") is not None,
        )
