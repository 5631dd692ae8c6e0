"""The Python API: ``Pipeline`` loads a bundle onto devices and generates text.

from xpuspec import Pipeline, SamplingParams
pipe = Pipeline()                                   # the embedded demo pair on the CPU
result = pipe.generate(["def add(a, b):"], SamplingParams(max_tokens=64, temperature=0.0))[0]
result.text, result.token_ids, result.finish_reason, result.stats
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpuspec.engine.engine import EngineConfig, LLMEngine, StepOutput
from xpuspec.engine.model_runner import PagedModelRunner
from xpuspec.model_bundle import ModelBundle
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.spec_decode.proposal import DraftModelProposer, DraftProposer, NgramDraftProposer
from xpuspec.text import ChatTemplate, IncrementalDetokenizer, StopStringMatcher, Tokenizer

logger = logging.getLogger(__name__)

DRAFTERS = ("auto", "draft", "ngram", "none")
Messages = list[dict[str, str]]


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stats: dict[str, Any] = field(default_factory=dict)


def check_device(device: str) -> None:
    """Fail early, naming the devices that exist, when a plain device name is absent."""
    import openvino as ov

    plain = device.split(".")[0].upper()
    if plain in ("AUTO", "HETERO", "MULTI", "BATCH") or ":" in device:
        return  # OpenVINO resolves these itself
    available = ov.Core().available_devices
    if device.upper() not in [d.upper() for d in available] and plain not in [
        d.split(".")[0] for d in available
    ]:
        raise ValueError(f"device {device!r} is not present here; OpenVINO sees: {', '.join(available)}")


class RequestText:
    """Turns one request's tokens into text: incremental detokenizing and stop strings."""

    def __init__(self, tokenizer: Tokenizer, params: SamplingParams):
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.stops = StopStringMatcher(params.stop) if params.stop else None
        self.token_ids: list[int] = []
        self.text = ""
        self.stopped = False

    def push(self, token_ids: list[int], finished: bool) -> str:
        """Return the new text that may be shown; sets ``stopped`` when a stop string is hit."""
        self.token_ids.extend(token_ids)
        delta = self.detokenizer.push(token_ids) if token_ids else ""
        if finished:
            delta += self.detokenizer.flush()  # a character cut short by the end still shows
        if self.stops is not None:
            delta, self.stopped = self.stops.push(delta)
            if finished and not self.stopped:
                delta += self.stops.flush()
        self.text += delta
        return delta


class Pipeline:
    """A target (and optionally a draft) loaded on OpenVINO devices, behind one batching engine."""

    def __init__(
        self,
        bundle: str | Path | None = None,
        target_device: str = "CPU",
        draft_device: str = "CPU",
        drafter: str = "auto",
        properties: dict[str, Any] | None = None,
        *,
        draft_properties: dict[str, Any] | None = None,
        engine_config: EngineConfig | None = None,
        num_kv_blocks: int | None = None,
    ):
        if drafter not in DRAFTERS:
            raise ValueError(f"drafter must be one of {DRAFTERS}, got {drafter!r}")
        self.bundle = ModelBundle.open(bundle)
        if drafter == "draft" and self.bundle.draft is None:
            raise ValueError(f"{self.bundle.root} has no draft model; use drafter='ngram' or 'none'")
        if drafter == "auto":
            drafter = "draft" if self.bundle.draft is not None else "ngram"
        self.drafter = drafter
        check_device(target_device)
        self.tokenizer = Tokenizer(self.bundle.target.path)
        facts = self.bundle.tokenizer_facts
        template = self.bundle.chat_template
        self.chat_template = (
            ChatTemplate(template, facts.get("bos_token"), facts.get("eos_token")) if template else None
        )
        config = engine_config or EngineConfig(max_model_len=self.bundle.max_context)
        self.target_runner = PagedModelRunner(
            self.bundle.target.path, device=target_device, properties=properties, num_blocks=num_kv_blocks
        )
        proposer: DraftProposer | None = None
        if drafter == "draft":
            check_device(draft_device)
            draft_runner = PagedModelRunner(
                self.bundle.draft.path,  # type: ignore[union-attr]
                device=draft_device,
                properties=draft_properties if draft_properties is not None else properties,
                num_blocks=self.target_runner.num_blocks,
            )
            if draft_runner.block_size != self.target_runner.block_size:
                raise ValueError(
                    f"draft KV block size {draft_runner.block_size} differs from the target's "
                    f"{self.target_runner.block_size}: put both models on devices with the same block size"
                )
            proposer = DraftModelProposer(draft_runner, self.target_runner.vocab_size)
        elif drafter == "ngram":
            proposer = NgramDraftProposer()
        self.engine = LLMEngine(self.target_runner, proposer, config, self.bundle.eos_token_ids)
        self.engine.calibrate()
        self._request_counter = itertools.count()
        # The stats of the last request that finished through `stream` (for the CLI's summary).
        self.last_stats: dict[str, Any] | None = None

    # ------------------------------------------------------------------ prompts
    def apply_chat_template(self, messages: Messages) -> str:
        if self.chat_template is None:
            raise ValueError(f"{self.bundle.root} has no chat template; pass plain text prompts")
        return self.chat_template.render(messages, add_generation_prompt=True)

    def _encode(self, prompt: str | Messages) -> list[int]:
        if isinstance(prompt, list):
            # A rendered chat template carries its own special tokens.
            return self.tokenizer.encode(self.apply_chat_template(prompt), add_special_tokens=False)
        if not isinstance(prompt, str):
            raise ValueError(f"a prompt is a string or a list of chat messages, got {type(prompt).__name__}")
        return self.tokenizer.encode(prompt)

    # --------------------------------------------------------------- generation
    def generate(
        self,
        prompts: str | Messages | Sequence[str | Messages],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[GenerationResult]:
        """Generate for every prompt at once (continuous batching); results in prompt order.

        ``params`` is one ``SamplingParams`` for all prompts or a list with one per prompt.
        """
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], dict)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        if isinstance(params, list):
            if len(params) != len(prompts):
                raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
            per_prompt = params
        else:
            per_prompt = [params or SamplingParams()] * len(prompts)
        texts: dict[str, RequestText] = {}
        order = []
        try:
            for prompt, prompt_params in zip(prompts, per_prompt, strict=True):
                request_id = self._add(prompt, prompt_params)
                texts[request_id] = RequestText(self.tokenizer, prompt_params)
                order.append(request_id)
        except ValueError:
            for request_id in order:  # nothing half-submitted stays in the engine
                self.engine.abort(request_id)
            raise
        finished: dict[str, StepOutput] = {}
        try:
            for output, _ in self._run(texts):
                if output.finished:
                    finished[output.request_id] = output
        finally:
            for request_id in order:
                if request_id not in finished:
                    self.engine.abort(request_id)
        return [self._result(texts[rid], finished[rid]) for rid in order]

    def stream(self, prompt: str | Messages, params: SamplingParams | None = None) -> Iterator[str]:
        """Yield the text of one request piece by piece as it is generated."""
        params = params or SamplingParams()
        request_id = self._add(prompt, params)
        texts = {request_id: RequestText(self.tokenizer, params)}
        done = False
        try:
            for output, delta in self._run(texts):
                if delta:
                    yield delta
                done = output.finished
                if done:
                    self.last_stats = output.stats.as_dict()
        finally:
            if not done:
                self.engine.abort(request_id)

    def _add(self, prompt: str | Messages, params: SamplingParams) -> str:
        request_id = f"pipe-{next(self._request_counter)}"
        self.engine.add_request(request_id, self._encode(prompt), params)
        return request_id

    def _run(self, texts: dict[str, RequestText]) -> Iterator[tuple[StepOutput, str]]:
        """Step the engine until these requests finish, turning tokens into text on the way."""
        pending = set(texts)
        while pending:
            outputs = self.engine.step()
            if not outputs and not self.engine.has_unfinished():
                raise RuntimeError("the engine stopped with requests unfinished")
            for output in outputs:
                text = texts.get(output.request_id)
                if text is None:
                    continue
                delta = text.push(output.new_token_ids, output.finished)
                if text.stopped and not output.finished:
                    self.engine.abort(output.request_id, finish_reason="stop")
                    output.finished, output.finish_reason = True, "stop"
                if output.finished:
                    pending.discard(output.request_id)
                yield output, delta

    @staticmethod
    def _result(text: RequestText, output: StepOutput) -> GenerationResult:
        return GenerationResult(
            text=text.text,
            token_ids=list(text.token_ids),
            finish_reason=output.finish_reason,
            stats=output.stats.as_dict(),
        )
