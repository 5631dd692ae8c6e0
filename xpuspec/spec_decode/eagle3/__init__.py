"""EAGLE-3 drafting (Li et al. 2025): a one-layer draft head over the target's fused hidden states.

``config`` and ``weights`` read a head in the published Hugging Face layout, ``head_model`` builds its
OpenVINO graphs (no torch), ``embedding`` cuts the target's token embedding out of its IR, and
``runtime.Eagle3Head`` runs it with per-sequence KV for a drafter: ``proposer`` drafts chains, ``tree``
EAGLE-2-style dynamic trees (requests with ``draft_tree``).
"""

from xpuspec.spec_decode.eagle3.config import Eagle3HeadConfig
from xpuspec.spec_decode.eagle3.embedding import target_embedding_model
from xpuspec.spec_decode.eagle3.runtime import Eagle3Head, HeadStep, HeadStepResult
from xpuspec.spec_decode.eagle3.weights import Eagle3HeadWeights, load_head_weights

__all__ = [
    "Eagle3Head",
    "Eagle3HeadConfig",
    "Eagle3HeadWeights",
    "HeadStep",
    "HeadStepResult",
    "load_head_weights",
    "target_embedding_model",
]
