"""The one driver of ``LLMEngine.step``: requests go in, the engine steps, outputs come out as text.

:class:`EngineDriver` is the only caller of ``step`` (as vLLM's ``EngineCore`` loop and llama.cpp's
slot loop are): it admits and aborts requests, steps the engine, and turns every output into its
request's text with :func:`xpuspec.api.request_text.apply_output` (exact stops, per-request
failures). ``LLMEngine`` is not thread-safe, so one thread drives a driver at a time:

* **inline**, in the caller's thread: :meth:`EngineDriver.run` steps until the caller's requests
  finish, yielding their :class:`RequestStep`\\ s (``Pipeline.generate``/``stream``/``steps``, and
  through them the bench runners and research scripts);
* **in a loop thread**: the server's and the cluster replicas' :class:`~xpuspec.api.engine_loop.EngineLoop`
  calls :meth:`EngineDriver.step` itself, with an interrupt that ends a decode burst when new work waits.

A request that fails alone (its text included) and every request ended by a failed engine step
get a final output with ``finish_reason == "error"`` and ``error`` set; the engine recovers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xpuspec.api.request_text import RequestText, apply_output
from xpuspec.sample.sampling_params import SamplingParams

if TYPE_CHECKING:
    from xpuspec.engine.engine import LLMEngine, StepOutput
    from xpuspec.text import Tokenizer

logger = logging.getLogger(__name__)


@dataclass
class RequestStep:
    """One request's part of one engine step: the engine's output (cut after a stop string), the text
    it released, and when the step returned (``time.perf_counter()``)."""

    output: StepOutput
    text: str
    time: float
    # With mark_drafts (EngineDriver.add): how many leading characters of text the accepted drafts released.
    draft_chars: int = 0


class EngineDriver:
    """Admits, aborts and steps one engine, turning each output into its request's text.

    Requests of several callers may share the engine: :meth:`run` yields the steps of its own
    requests and keeps the others' for the run that asks for them. ``tokenizer`` None: outputs
    carry no text (an engine of synthetic models, as research's policy replay drives).
    """

    def __init__(self, engine: LLMEngine, tokenizer: Tokenizer | None) -> None:
        self._engine = engine
        self._tokenizer = tokenizer
        self._texts: dict[str, RequestText | None] = {}  # requests in the engine
        self._marks: set[str] = set()  # requests whose accepted drafts are marked in their text
        self._kept: dict[str, list[RequestStep]] = {}  # steps no run has taken yet

    def add(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        tenant: str | None = None,
        mark_drafts: bool = False,
    ) -> None:
        """Queue a request; raises ValueError (and the engine holds nothing of it) when it is refused."""
        self._engine.add_request(request_id, prompt_token_ids, params, tenant=tenant)
        try:
            self._texts[request_id] = (
                RequestText(self._tokenizer, params) if self._tokenizer is not None else None
            )
        except BaseException:
            self._engine.abort(request_id)
            raise
        if mark_drafts:
            self._marks.add(request_id)

    def abort(self, request_id: str, finish_reason: str = "abort") -> None:
        """End a request now ("abort" or "error"), freeing its KV; its end is the caller's to report."""
        self._forget(request_id)
        self._kept.pop(request_id, None)
        self._engine.abort(request_id, finish_reason=finish_reason)

    def has_unfinished(self) -> bool:
        return self._engine.has_unfinished()

    def step(self, interrupt: Callable[[], bool] | None = None) -> list[RequestStep]:
        """Run one engine step; ``interrupt`` is asked between the passes of a decode burst (True ends it)."""
        try:
            outputs = self._engine.step(interrupt=interrupt)
        except Exception as error:  # step() recovers by itself; this is a last resort
            outputs = self._engine.recover(error)
        now = time.perf_counter()
        steps = []
        for output in outputs:
            if output.request_id not in self._texts:
                continue  # aborted meanwhile: its end was reported then
            steps.append(self._request_step(output, now))
        return steps

    def run(self, request_ids: Collection[str]) -> Generator[RequestStep, None, None]:
        """Step in the caller's thread until these requests finish, yielding their steps in order.

        Requests still unfinished when the iterator is closed early are aborted.
        """
        pending = set(request_ids)
        try:
            for request_id in request_ids:
                for step in self._kept.pop(request_id, []):
                    if step.output.finished:
                        pending.discard(request_id)
                    yield step
            while pending:
                if not self._engine.has_unfinished():
                    raise RuntimeError("the engine stopped with requests unfinished")
                for step in self.step():
                    request_id = step.output.request_id
                    if request_id not in pending:
                        self._kept.setdefault(request_id, []).append(step)
                        continue
                    if step.output.finished:
                        pending.discard(request_id)
                    yield step
        finally:
            for request_id in pending:
                self.abort(request_id)

    def _request_step(self, output: StepOutput, now: float) -> RequestStep:
        """The text of one output (a failure making it ends that request alone, with "error")."""
        request_id = output.request_id
        text = self._texts[request_id]
        delta, draft_chars = "", 0
        if text is not None:
            mark = request_id in self._marks
            try:
                delta = apply_output(self._engine, text, output, mark_drafts=mark)
            except Exception as error:  # a bug outside the text's own guard must not stop the loop
                logger.exception("making the text of %s failed", request_id)
                if not output.finished:
                    self._engine.abort(request_id, finish_reason="error")
                output.finished, output.finish_reason = True, "error"
                output.error = f"making the text failed: {type(error).__name__}: {error}"
            draft_chars = text.marked_chars if mark and output.num_accepted_drafts else 0
        if output.finished:
            self._forget(request_id)
        return RequestStep(output, delta, now, draft_chars)

    def _forget(self, request_id: str) -> None:
        self._texts.pop(request_id, None)
        self._marks.discard(request_id)
