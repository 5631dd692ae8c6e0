"""Distillation data for the SmolLM2 draft: the target's own greedy answers to chat instructions.

The target runs in OpenVINO GenAI's continuous-batching pipeline at f32 (exact greedy labels), a fixed
number of requests in flight. Answers are appended to a JSON-lines file one batch at a time, so a run that
is stopped keeps what it made, and a restarted run skips the instructions already answered.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
EXACT_PROPERTIES = {
    "INFERENCE_PRECISION_HINT": "f32",
    "KV_CACHE_PRECISION": "f32",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
}
FAST_PROPERTIES = {"INFERENCE_PRECISION_HINT": "f32"}


def chat_prompt(instruction: str) -> str:
    """SmolLM2's chat template rendered for one user message (what its GGUF's template produces)."""
    return (
        f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n"
        f"<|im_start|>user\n{instruction}<|im_end|>\n<|im_start|>assistant\n"
    )


def answered(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    return {json.loads(line)["instruction"] for line in path.read_text(encoding="utf-8").splitlines() if line}


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def generate_answers(
    target_ir: Path,
    instructions: list[str],
    out_path: Path,
    *,
    max_new_tokens: int = 128,
    in_flight: int = 16,
    deadline: float | None = None,
    properties: dict | None = None,
    cache_gb: int = 1,
) -> int:
    """Append the target's greedy answers to ``out_path`` until done or ``deadline``; return the count.

    ``properties`` default to the exact preset (f32, f32 KV cache, no dynamic quantization): labels that are
    the target's true argmax. Training data need not be exact: ``FAST_PROPERTIES`` keep f32 compute but let
    the CPU quantise activations for its int4/int8 kernels, several times faster.
    """
    import openvino_genai as genai

    tokenizer = genai.Tokenizer(str(target_ir))
    scheduler = genai.SchedulerConfig()
    scheduler.cache_size = cache_gb
    scheduler.max_num_batched_tokens = 2048
    chosen = EXACT_PROPERTIES if properties is None else properties
    pipe = genai.ContinuousBatchingPipeline(str(target_ir), scheduler, "CPU", chosen)
    config = genai.GenerationConfig()
    config.max_new_tokens = max_new_tokens
    config.do_sample = False
    config.eos_token_id = 2
    done = answered(out_path)
    todo = [text for text in instructions if text not in done]
    written = 0
    started = time.monotonic()
    with open(out_path, "a", encoding="utf-8") as out:
        for first in range(0, len(todo), in_flight):
            if deadline is not None and time.monotonic() > deadline:
                logger.info("data deadline reached after %d new answers", written)
                break
            batch = todo[first : first + in_flight]
            prompts = [
                tokenizer.encode(chat_prompt(text), add_special_tokens=False).input_ids for text in batch
            ]
            results = pipe.generate(prompts, [config] * len(batch))
            for text, prompt, result in zip(batch, prompts, results, strict=True):
                record = {
                    "instruction": text,
                    "prompt_ids": [int(t) for t in prompt.data[0]],
                    "answer_ids": [int(t) for t in result.m_generation_ids[0]],
                }
                out.write(json.dumps(record) + "\n")
            out.flush()
            written += len(batch)
            logger.info(
                "answers: %d/%d (%.0f s)", written + len(done), len(instructions), time.monotonic() - started
            )
    return written
