"""The one driver of ``LLMEngine.step``: requests go in, the engine steps, outputs come out as text.

:class:`EngineDriver` is the only caller of ``step`` (as vLLM's ``EngineCore`` and llama.cpp's slot
loop are): it admits and aborts requests, steps the engine, and turns every output into its
request's text with :func:`xpuspec.api.request_text.apply_output` (exact stops, per-request
failures). ``LLMEngine`` is not thread-safe, so one thread drives a driver at a time:

* **inline**, in the caller's thread: :meth:`EngineDriver.run` steps until the caller's requests
  finish, yielding their :class:`RequestStep`\\ s (``Pipeline.generate``/``stream``/``steps``, the
  bench runners and research scripts, all through the Pipeline);
* **in a loop thread**, for the server and the cluster's replicas: :class:`EngineLoop` owns a
  Pipeline's driver in one background thread. A request thread encodes its prompts (the tokenizer
  is thread-safe), calls :meth:`EngineLoop.submit` and reads
  :class:`~xpuspec.api.generation.ChoiceEvent`\\ s from the returned
  :class:`~xpuspec.api.generation.Generation`; commands waiting in the loop's queue end a decode
  burst (the interrupt ``step`` asks between its passes).

Failures: a request that fails alone (its sampling, its text) and every request ended by a failed
engine step get a final output with ``finish_reason == "error"`` and ``error`` set; the engine
recovers and the loop goes on. :attr:`EngineLoop.stepping` says whether the loop is alive and
iterating, for ``/health``.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Collection, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xpuspec.api.generation import ChoiceEvent, Generation
from xpuspec.api.request_text import RequestText, apply_output
from xpuspec.core.prefix_cache import PrefixCachingBlockManager
from xpuspec.core.request_stats import RequestStats
from xpuspec.sample.sampling_params import SamplingParams

if TYPE_CHECKING:
    from xpuspec.api.pipeline import Pipeline
    from xpuspec.engine.engine import LLMEngine, StepOutput
    from xpuspec.text import Tokenizer

logger = logging.getLogger(__name__)

# How long an idle loop sleeps on its command queue before looking at its stop flag again.
IDLE_WAIT_S = 0.1
# The loop counts as stepping while its last iteration is younger than this. An iteration is one
# engine step (tens of ms, a few seconds at most for a long prefill on a slow device) or one idle wait.
STEPPING_TIMEOUT_S = 10.0


class QueueFullError(Exception):
    """More requests are in flight than ``max_queue`` allows."""


class NotAcceptingError(Exception):
    """The loop is loading, draining or has stopped."""


@dataclass
class ChoiceRequest:
    """One engine request: a choice of an HTTP request."""

    index: int
    prompt_token_ids: list[int]
    params: SamplingParams
    provenance: bool = False  # its events say which tokens and text were accepted drafts
    # Scopes the cross-request lookup (LLMEngine.add_request): a digest of the client's API key.
    tenant: str | None = None


@dataclass
class EngineSnapshot:
    """Engine figures copied by the loop thread after each step, for metrics and the admin view."""

    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    num_running: int = 0
    num_waiting: int = 0
    engine_failures: int = 0  # engine steps that failed as a whole (the engine recovered)
    requests_failed: int = 0  # choices ended with an error: their own or an engine failure
    prefix_cached_blocks: int = 0  # KV blocks holding a reusable prompt prefix


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
            self._texts[request_id] = RequestText(self._tokenizer, params) if self._tokenizer else None
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


@dataclass
class _Active:
    """Loop-side state of one engine request."""

    generation: Generation
    index: int
    num_prompt_tokens: int
    provenance: bool = False


class EngineLoop:
    """Owns a Pipeline's :class:`EngineDriver` in one background thread: admission, stepping,
    delivery, draining."""

    def __init__(
        self,
        pipeline_factory: Callable[[], Pipeline],
        max_in_flight: int,
        on_finish: Callable[[int, RequestStats, str], None] | None = None,
        on_cancel: Callable[[], None] | None = None,
    ) -> None:
        self._pipeline_factory = pipeline_factory
        self.max_in_flight = max_in_flight
        self._on_finish = on_finish
        self._on_cancel = on_cancel
        self.pipeline: Pipeline | None = None
        self.load_error: BaseException | None = None
        self.ready = threading.Event()
        self.snapshot = EngineSnapshot()
        self._commands: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self._admission = threading.Lock()
        self._num_in_flight = 0
        self._accepting = True
        self._stop = threading.Event()
        self._idle = threading.Condition(self._admission)
        self._active: dict[str, _Active] = {}
        # Events and finished counts of this iteration, published only after the snapshot is
        # refreshed: a client that saw its request end then sees the engine without it.
        self._outbox: list[tuple[Generation, ChoiceEvent]] = []
        self._num_ended = 0
        self._ids = itertools.count()
        # time.monotonic() of the loop's latest iteration (a step, or an idle wait of IDLE_WAIT_S).
        self.last_iteration = time.monotonic()
        self.stall_after_s = STEPPING_TIMEOUT_S
        self._requests_failed = 0  # choices ended with finish_reason "error", whatever the cause
        self._thread = threading.Thread(target=self._run, name="xpuspec-engine-loop", daemon=True)

    # ------------------------------------------------------------ any thread
    def start(self) -> None:
        self._thread.start()

    @property
    def num_in_flight(self) -> int:
        return self._num_in_flight

    @property
    def stepping(self) -> bool:
        """The loop thread is alive, the model loaded, and it iterated within ``stall_after_s``."""
        return (
            self._thread.is_alive()
            and self.ready.is_set()
            and self.load_error is None
            and self.pipeline is not None
            and time.monotonic() - self.last_iteration < self.stall_after_s
        )

    @property
    def draining(self) -> bool:
        return not self._accepting

    def submit(self, choices: list[ChoiceRequest]) -> Generation:
        """Queue all choices of one HTTP request, or none: raises QueueFullError / NotAcceptingError."""
        if not self.ready.is_set() or self.load_error is not None:
            raise NotAcceptingError("the model is still loading" if self.load_error is None else "failed")
        with self._admission:
            if not self._accepting:
                raise NotAcceptingError("the server is shutting down")
            if self._num_in_flight + len(choices) > self.max_in_flight:
                raise QueueFullError(
                    f"{self._num_in_flight} requests in flight, the limit is {self.max_in_flight}"
                )
            self._num_in_flight += len(choices)
        request_ids = [f"req-{next(self._ids)}" for _ in choices]
        generation = Generation(self, request_ids)
        for request_id, choice in zip(request_ids, choices, strict=True):
            self._commands.put(("add", (request_id, generation, choice)))
        return generation

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def stop_accepting(self) -> None:
        with self._admission:
            self._accepting = False

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no request is in flight; True if that happened within ``timeout``."""
        with self._idle:
            return self._idle.wait_for(lambda: self._num_in_flight == 0, timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread; requests still in flight end with an error event."""
        self.stop_accepting()
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ------------------------------------------------------------ loop thread
    def _run(self) -> None:
        try:
            self.pipeline = self._pipeline_factory()
        except BaseException as error:  # a bad bundle or device must surface, not hang /health
            # One line: the caller reports it; the traceback only with debug logging.
            logger.error("loading the model failed: %s", error, exc_info=logger.isEnabledFor(logging.DEBUG))
            self.load_error = error
            self.ready.set()
            return
        driver = self.pipeline.driver
        self.snapshot = EngineSnapshot(kv_blocks_total=self.pipeline.engine.block_manager.num_blocks)
        self.ready.set()
        logger.info("engine ready")
        while not self._stop.is_set():
            self.last_iteration = time.monotonic()
            self._take_commands(block=not driver.has_unfinished())
            if driver.has_unfinished():
                # Requests and aborts queued meanwhile end a decode burst: they wait a pass, not a burst.
                for step in driver.step(interrupt=self.has_waiting_commands):
                    try:
                        self._deliver(step)
                    except Exception as error:  # a bug in delivering one request must not stop the loop
                        logger.exception("delivering %s failed", step.output.request_id)
                        self._fail(step.output.request_id, f"delivering the output failed: {error}")
            self._publish()
        self._fail_all("the server stopped")
        self._publish()

    def has_waiting_commands(self) -> bool:
        """Requests or aborts wait for the loop to take them (the interrupt of a decode burst)."""
        return not self._commands.empty()

    def _take_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=IDLE_WAIT_S) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, payload = command
            if kind == "add":
                self._add(*payload)  # type: ignore[misc]
            else:
                self._abort(payload)  # type: ignore[arg-type]
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _add(self, request_id: str, generation: Generation, choice: ChoiceRequest) -> None:
        assert self.pipeline is not None
        try:
            # Atomic: a request the engine rejects leaves no trace in it.
            self.pipeline.driver.add(
                request_id,
                choice.prompt_token_ids,
                choice.params,
                tenant=choice.tenant,
                mark_drafts=choice.provenance,
            )
        except Exception as error:  # the request fails alone; anything else escaping would end the loop
            if not isinstance(error, ValueError):  # ValueError is the engine's refusal; the rest are bugs
                logger.exception("admitting %s failed", request_id)
            event = ChoiceEvent(choice.index, "", 0, finish_reason="error", error=str(error))
            self._outbox.append((generation, event))
            self._num_ended += 1
            return
        self._active[request_id] = _Active(
            generation, choice.index, len(choice.prompt_token_ids), provenance=choice.provenance
        )

    def _abort(self, request_id: str) -> None:
        assert self.pipeline is not None
        if self._active.pop(request_id, None) is None:
            return  # finished before the abort arrived
        self.pipeline.driver.abort(request_id)
        self._num_ended += 1
        if self._on_cancel is not None:
            self._on_cancel()

    def _deliver(self, step: RequestStep) -> None:
        output = step.output
        active = self._active.get(output.request_id)
        if active is None:
            return
        num_tokens = len(output.new_token_ids)
        drafts = output.num_accepted_drafts if active.provenance else 0
        draft_chars = step.draft_chars if drafts else 0
        if not output.finished:
            if step.text or num_tokens:
                event = ChoiceEvent(
                    active.index, step.text, num_tokens, num_accepted_drafts=drafts, draft_chars=draft_chars
                )
                self._outbox.append((active.generation, event))
            return
        del self._active[output.request_id]
        reason = output.finish_reason or "stop"
        final = ChoiceEvent(
            active.index,
            step.text,
            num_tokens,
            finish_reason=reason,
            stats=output.stats,
            error=output.error,
            failed_constraint=output.failed_constraint,
            num_accepted_drafts=drafts,
            draft_chars=draft_chars,
        )
        self._outbox.append((active.generation, final))
        if self._on_finish is not None:
            try:
                self._on_finish(active.num_prompt_tokens, output.stats, reason)
            except Exception:
                logger.exception("recording metrics failed")
        self._num_ended += 1

    def _fail_all(self, message: str) -> None:
        for request_id in list(self._active):
            self._fail(request_id, message)

    def _fail(self, request_id: str, message: str) -> None:
        """End one active request with an error event, aborting it in the engine if still there."""
        active = self._active.pop(request_id, None)
        if active is None:
            return
        try:
            if self.pipeline is not None:
                self.pipeline.driver.abort(request_id, finish_reason="error")
        except Exception:
            logger.exception("aborting %s failed", request_id)
        event = ChoiceEvent(active.index, "", 0, finish_reason="error", error=message)
        self._outbox.append((active.generation, event))
        self._num_ended += 1

    def _publish(self) -> None:
        self._requests_failed += sum(event.finish_reason == "error" for _, event in self._outbox)
        if self.pipeline is not None:
            self._update_snapshot()
        # One hand-over (one lock, at most one wakeup) per request per iteration, not per event.
        by_generation: dict[Generation, list[ChoiceEvent]] = {}
        for generation, event in self._outbox:
            by_generation.setdefault(generation, []).append(event)
        self._outbox.clear()
        for generation, events in by_generation.items():
            generation.deliver(events)
        if self._num_ended:
            with self._idle:
                self._num_in_flight -= self._num_ended
                if self._num_in_flight == 0:
                    self._idle.notify_all()
            self._num_ended = 0

    def _update_snapshot(self) -> None:
        assert self.pipeline is not None
        engine = self.pipeline.engine
        self.snapshot = EngineSnapshot(
            kv_blocks_used=engine.block_manager.num_used_blocks,
            kv_blocks_total=engine.block_manager.num_blocks,
            num_running=engine.scheduler.num_running,
            num_waiting=engine.scheduler.num_waiting,
            engine_failures=engine.num_engine_failures,
            requests_failed=self._requests_failed,
            prefix_cached_blocks=(
                block_manager.num_cached_blocks
                if isinstance(block_manager := engine.block_manager, PrefixCachingBlockManager)
                else 0
            ),
        )
