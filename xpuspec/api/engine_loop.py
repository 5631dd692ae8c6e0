"""The server's engine loop: one thread drives a Pipeline's engine; request threads talk to it by queue.

``LLMEngine`` is not thread-safe, so only the loop thread admits, aborts and steps, all through the
pipeline's :class:`~xpuspec.api.engine_driver.EngineDriver` (the one caller of ``step``, which the
Python API runs inline in the caller's thread). A request thread encodes its prompts (the tokenizer
is thread-safe), calls :meth:`EngineLoop.submit` and reads :class:`ChoiceEvent`\\ s from the returned
:class:`Generation`. The driver makes the text (detokenizing, stop strings) in the loop thread with
:func:`xpuspec.api.request_text.apply_output`, as for the Python API (exact stops, per-request
failures). Commands waiting in the loop's queue end a decode burst: the loop passes
:meth:`EngineLoop.has_waiting_commands` as the step's interrupt.

Failures: a request that fails alone (its sampling, its text) and every request ended by a failed
engine step get a final :class:`ChoiceEvent` with ``finish_reason == "error"`` and ``error`` set;
the engine recovers and the loop goes on. :attr:`EngineLoop.stepping` says whether the loop is
alive and iterating, for ``/health``.
"""

from __future__ import annotations

import collections
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xpuspec.core.prefix_cache import PrefixCachingBlockManager
from xpuspec.core.request_stats import RequestStats
from xpuspec.sample.sampling_params import SamplingParams

if TYPE_CHECKING:
    from xpuspec.api.engine_driver import RequestStep
    from xpuspec.api.pipeline import Pipeline
    from xpuspec.api.requests import RequestPreparer

logger = logging.getLogger(__name__)

# How long an idle loop sleeps on its command queue before looking at its stop flag again.
IDLE_WAIT_S = 0.1
# The loop counts as stepping while its last iteration is younger than this. An iteration is one
# engine step (tens of ms, a few seconds at most for a long prefill on a slow device) or one idle wait.
STEPPING_TIMEOUT_S = 10.0
# What wakes a Generation's reader: nothing (it is not waiting), any event, or only a final one.
_WAKE_NEVER, _WAKE_ANY, _WAKE_FINAL = 0, 1, 2


class QueueFullError(Exception):
    """More requests are in flight than ``max_queue`` allows."""


class NotAcceptingError(Exception):
    """The loop is loading, draining or has stopped."""


@dataclass
class ChoiceEvent:
    """New text of one choice; ``finish_reason`` set on its last event.

    A choice ended by an error has ``finish_reason == "error"`` and the message in ``error``.
    """

    index: int
    text: str
    num_new_tokens: int
    finish_reason: str | None = None
    stats: RequestStats | None = None
    error: str | None = None
    failed_constraint: bool = False  # the error is the request's own output constraint's (a 400)
    # With ChoiceRequest.provenance: of num_new_tokens, the accepted drafts (they come first), and
    # how many leading characters of text they released.
    num_accepted_drafts: int = 0
    draft_chars: int = 0

    @property
    def final(self) -> bool:
        return self.finish_reason is not None or self.error is not None


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


class Generation:
    """The choices of one HTTP request in flight; their events arrive in order per choice.

    The loop thread hands over all events of one step at once (:meth:`deliver`); the request thread
    takes everything that has arrived in one call (:meth:`take_events`), so tokens that pile up while
    it writes become one frame. The reader is woken only when what it waits for arrived: any event,
    or (while it holds events back to coalesce them, or collects a whole response) a final one.
    """

    def __init__(self, loop: EngineLoop, request_ids: list[str]) -> None:
        self._loop = loop
        self._request_ids = request_ids
        self._unfinished = set(range(len(request_ids)))
        self._ready = threading.Condition(threading.Lock())
        self._pending: list[ChoiceEvent] = []
        self._num_final_pending = 0
        self._waiting_for = _WAKE_NEVER  # what the reader sleeps on; read by deliver under the lock
        # When the loop last delivered, and the gap before that: from them a reader with nothing
        # pending predicts whether the next step's events arrive before its hold ends.
        self._last_delivery = 0.0
        self._delivery_gap = 0.0
        self._taken: collections.deque[ChoiceEvent] = collections.deque()  # for next_event
        self._num_tokens = 0  # delivered so far, taken or not: what an aborted request generated

    def deliver(self, events: list[ChoiceEvent]) -> None:
        """Called by the loop thread with the events of one iteration, in order."""
        num_final = sum(1 for event in events if event.final)
        now = time.monotonic()
        with self._ready:
            self._delivery_gap = now - self._last_delivery
            self._last_delivery = now
            self._pending.extend(events)
            self._num_final_pending += num_final
            self._num_tokens += sum(event.num_new_tokens for event in events)
            if self._waiting_for == _WAKE_ANY or (num_final and self._waiting_for == _WAKE_FINAL):
                self._ready.notify()

    def take_events(self, timeout: float, hold_until: float = 0.0) -> list[ChoiceEvent]:
        """Every event that arrived, in order; waits up to ``timeout`` s for one (then returns []).

        Until ``time.monotonic()`` reaches ``hold_until``, events that finish no choice are held back
        (unless a final event is among them): they arrive with later ones, in one batch.
        """
        deadline = time.monotonic() + timeout
        with self._ready:
            while True:
                now = time.monotonic()
                ready = bool(self._pending) and (self._num_final_pending > 0 or now >= hold_until)
                if ready or now >= deadline:
                    break
                if not self._pending and now < hold_until <= self._last_delivery + self._delivery_gap:
                    # Nothing to hold, and the next step's events are due after the hold ends anyway
                    # (steps slower than the stream interval, as with many streams at once): a timer
                    # at hold_until would wake this thread for nothing, so wait for the events. Any
                    # that still come early make it wait out the hold below.
                    self._waiting_for, wake_at = _WAKE_ANY, deadline
                elif self._pending or now < hold_until:
                    # Holding: only a final event ends the wait early.
                    self._waiting_for, wake_at = _WAKE_FINAL, min(deadline, hold_until)
                else:
                    self._waiting_for, wake_at = _WAKE_ANY, deadline
                self._ready.wait(None if wake_at == float("inf") else wake_at - now)
                self._waiting_for = _WAKE_NEVER
            if not ready:
                return []
            events, self._pending = self._pending, []
            self._num_final_pending = 0
        for event in events:
            if event.final:
                self._unfinished.discard(event.index)
        return events

    def take_final_events(self, timeout: float) -> list[ChoiceEvent]:
        """Like :meth:`take_events`, but woken only when a choice finished (a non-streamed response)."""
        return self.take_events(timeout, hold_until=float("inf"))

    def next_event(self, timeout: float | None = None) -> ChoiceEvent | None:
        """The next event, or None after ``timeout`` seconds without one."""
        if not self._taken:
            self._taken.extend(self.take_events(float("inf") if timeout is None else timeout))
        return self._taken.popleft() if self._taken else None

    @property
    def done(self) -> bool:
        return not self._unfinished and not self._taken

    @property
    def num_generated_tokens(self) -> int:
        """The tokens the engine generated for these choices so far, whether or not the reader took
        them: a request aborted mid-way counts what it produced."""
        with self._ready:
            return self._num_tokens

    def cancel(self) -> None:
        """Abort every unfinished choice (the client left); idempotent."""
        for index in sorted(self._unfinished):
            self._loop.abort(self._request_ids[index])
        self._unfinished.clear()


@dataclass
class _Active:
    """Loop-side state of one engine request."""

    generation: Generation
    index: int
    num_prompt_tokens: int
    provenance: bool = False


@dataclass(frozen=True)
class AddCommand:
    """A request thread's choice for the loop thread to add to the engine."""

    request_id: str
    generation: Generation
    choice: ChoiceRequest


@dataclass(frozen=True)
class AbortCommand:
    """A request thread's abort of one of its choices, for the loop thread."""

    request_id: str


class EngineLoop:
    """Drives a Pipeline's engine driver in one background thread: admission, stepping, delivery,
    draining."""

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
        self._commands: queue.SimpleQueue[AddCommand | AbortCommand] = queue.SimpleQueue()
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
    def requests(self) -> RequestPreparer | None:
        """How requests for this loop are prepared (tokenizer, template, limits); None until loaded."""
        return self.pipeline.requests if self.pipeline is not None else None

    @property
    def stepping(self) -> bool:
        """The loop thread is alive, the model loaded, and it iterated within ``stall_after_s``."""
        return (
            self._thread.is_alive()
            and self.ready.is_set()
            and self.load_error is None
            and self.requests is not None
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
            self._commands.put(AddCommand(request_id, generation, choice))
        return generation

    def abort(self, request_id: str) -> None:
        self._commands.put(AbortCommand(request_id))

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
            if isinstance(command, AddCommand):
                self._add(command.request_id, command.generation, command.choice)
            else:
                self._abort(command.request_id)
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
