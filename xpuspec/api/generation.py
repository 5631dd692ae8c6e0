"""What a request thread holds while its choices run: a :class:`Generation` of :class:`ChoiceEvent`\\ s.

The engine loop (:mod:`xpuspec.api.engine_loop`, or the cluster's forwarding loop) hands each
Generation the events of one iteration at once (:meth:`Generation.deliver`); the request thread
takes what arrived (:meth:`Generation.take_events`), and cancels what it no longer wants.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from xpuspec.core.request_stats import RequestStats

# What wakes a Generation's reader: nothing (it is not waiting), any event, or only a final one.
_WAKE_NEVER, _WAKE_ANY, _WAKE_FINAL = 0, 1, 2


class AbortsRequests(Protocol):
    """The loop a Generation's choices run in, as far as cancelling them goes."""

    def abort(self, request_id: str) -> None: ...


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


class Generation:
    """The choices of one HTTP request in flight; their events arrive in order per choice.

    The loop thread hands over all events of one step at once (:meth:`deliver`); the request thread
    takes everything that has arrived in one call (:meth:`take_events`), so tokens that pile up while
    it writes become one frame. The reader is woken only when what it waits for arrived: any event,
    or (while it holds events back to coalesce them, or collects a whole response) a final one.
    """

    def __init__(self, loop: AbortsRequests, request_ids: list[str]) -> None:
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

    def deliver(self, events: list[ChoiceEvent]) -> None:
        """Called by the loop thread with the events of one iteration, in order."""
        num_final = sum(1 for event in events if event.final)
        now = time.monotonic()
        with self._ready:
            self._delivery_gap = now - self._last_delivery
            self._last_delivery = now
            self._pending.extend(events)
            self._num_final_pending += num_final
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

    def cancel(self) -> None:
        """Abort every unfinished choice (the client left); idempotent."""
        for index in sorted(self._unfinished):
            self._loop.abort(self._request_ids[index])
        self._unfinished.clear()
