"""The NPU plugin: static-shape models through OpenVINO's NPUW LLM pipeline.

The NPU compiler needs static shapes, so the NPU runs neither PagedAttention nor continuous
batching: models go to the stateful executor (one KV state per request), compiled with NPUW's LLM
mode, which splits the model into a prefill graph of ``NPUW_LLM_MAX_PROMPT_LEN`` tokens and a
generate graph over a KV cache of ``MAX_PROMPT_LEN + MIN_RESPONSE_LEN`` positions.

Property names from OpenVINO's documentation and sources:
- docs/articles_en/learn-openvino/llm_inference_guide/genai-guide-npu.rst ("OpenVINO GenAI on NPU":
  ``MAX_PROMPT_LEN`` default 1024, ``MIN_RESPONSE_LEN`` default 150, which GenAI forwards to NPUW as
  ``NPUW_LLM_MAX_PROMPT_LEN`` / ``NPUW_LLM_MIN_RESPONSE_LEN``);
- openvino.genai's static LLM pipeline sets ``NPU_USE_NPUW=YES``, ``NPUW_LLM=YES``,
  ``NPUW_LLM_BATCH_DIM=0``, ``NPUW_LLM_SEQ_LEN_DIM=2`` for optimum-intel's [batch, heads, seq, dim] KV;
- openvino.genai's StatefulSpeculativeLLMPipeline sets ``NPUW_LLM_MAX_GENERATION_TOKEN_LEN`` to
  (max candidates + 1) on an NPU main model so one generate call verifies all drafts.
NPUW aligns both lengths up to a multiple of 64.
"""

from __future__ import annotations

from typing import Any

from xpuspec.devices.plugin import ExecutorKind, OpenVINODevicePlugin, Role

DEFAULT_MAX_PROMPT_LEN = 1024
DEFAULT_MIN_RESPONSE_LEN = 128


class NpuPlugin(OpenVINODevicePlugin):
    name = "NPU"
    executor_kind: ExecutorKind = "stateful"
    compression_preset: str | None = "npu"
    paged_attention = False
    dynamic_shapes = False
    memory_property = "NPU_DEVICE_TOTAL_MEM_SIZE"
    compute_units_property = "NPU_MAX_TILES"

    def __init__(
        self, max_prompt_len: int = DEFAULT_MAX_PROMPT_LEN, min_response_len: int = DEFAULT_MIN_RESPONSE_LEN
    ):
        if max_prompt_len < 1 or min_response_len < 1:
            raise ValueError(
                f"max_prompt_len and min_response_len must be >= 1, got {max_prompt_len}, {min_response_len}"
            )
        self.max_prompt_len = max_prompt_len
        self.min_response_len = min_response_len

    def default_properties(self, role: Role, max_draft_tokens: int) -> dict[str, Any]:
        properties: dict[str, Any] = {
            "NPU_USE_NPUW": "YES",
            "NPUW_LLM": "YES",
            "NPUW_LLM_BATCH_DIM": "0",
            "NPUW_LLM_SEQ_LEN_DIM": "2",
            "NPUW_LLM_MAX_PROMPT_LEN": str(self.max_prompt_len),
            "NPUW_LLM_MIN_RESPONSE_LEN": str(self.min_response_len),
        }
        if role == "target":
            # The target verifies the last token plus up to max_draft_tokens drafts in one call;
            # the draft model generates one token per call (NPUW's default window).
            properties["NPUW_LLM_MAX_GENERATION_TOKEN_LEN"] = str(max_draft_tokens + 1)
        return properties
