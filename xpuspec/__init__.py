"""xpuspec: exact, continuous-batched speculative decoding on OpenVINO."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.version import __version__

__all__ = ["Pipeline", "SamplingParams", "__version__"]

if TYPE_CHECKING:
    from xpuspec.api.pipeline import Pipeline


def __getattr__(name: str) -> Any:
    # The pipeline pulls in the OpenVINO runtime; keep `import xpuspec` light.
    if name == "Pipeline":
        from xpuspec.api.pipeline import Pipeline

        return Pipeline
    raise AttributeError(name)
