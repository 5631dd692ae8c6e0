"""The ingress's engine loop: the server's routes unchanged, each submission run by an engine replica.

:class:`ForwardingLoop` is an :class:`~xpuspec.api.engine_loop.EngineLoop` whose ``submit`` sends
the prepared choices through a Serve deployment handle (streaming) instead of queueing them for a
local engine. The app around it is ``xpuspec.server.create_app``'s, so validation, request
preparation (chat template, tokenizer, limits), response bodies and SSE frames are the server's own.
The loop still loads a pipeline, for that preparation: its engine never steps.

A pump thread per request reads the replica's stream (lists of
:class:`~xpuspec.api.engine_loop.ChoiceEvent`) and hands each list to the request's
:class:`~xpuspec.api.engine_loop.Generation`, as the local loop does. If the replica fails (it
died, or was killed), every unfinished choice ends with an error event: a stream already started
ends with the server's error frame, a whole response is a 500.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from xpuspec.api.engine_loop import (
    ChoiceEvent,
    ChoiceRequest,
    EngineLoop,
    Generation,
    NotAcceptingError,
    QueueFullError,
)
from xpuspec.core.request_stats import RequestStats

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

    from xpuspec.api.pipeline import Pipeline

logger = logging.getLogger(__name__)


class ForwardingLoop(EngineLoop):
    """An engine loop that forwards every submission to an engine replica through ``handle``."""

    def __init__(
        self,
        pipeline_factory: Callable[[], Pipeline],
        max_in_flight: int,
        on_finish: Callable[[int, RequestStats, str], None] | None = None,
        on_cancel: Callable[[], None] | None = None,
        *,
        handle: DeploymentHandle,
    ) -> None:
        super().__init__(pipeline_factory, max_in_flight, on_finish, on_cancel)
        self._handle = handle.options(stream=True)
        self._forward_lock = threading.Condition(threading.Lock())
        self._num_forwarded = 0  # choices sent and not yet finished
        self._responses: dict[str, Any] = {}  # request id -> its DeploymentResponseGenerator
        self._forward_ids = itertools.count()

    @property
    def num_in_flight(self) -> int:
        return self._num_forwarded

    def submit(self, choices: list[ChoiceRequest]) -> Generation:
        """Send all choices of one HTTP request to one replica; QueueFullError / NotAcceptingError as
        the local loop raises them (the ingress's own bound, ``max_queue``)."""
        if not self.ready.is_set() or self.load_error is not None:
            raise NotAcceptingError("the model is still loading" if self.load_error is None else "failed")
        with self._forward_lock:
            if self.draining:
                raise NotAcceptingError("the server is shutting down")
            if self._num_forwarded + len(choices) > self.max_in_flight:
                raise QueueFullError(
                    f"{self._num_forwarded} requests in flight, the limit is {self.max_in_flight}"
                )
            self._num_forwarded += len(choices)
        number = next(self._forward_ids)
        request_ids = [f"fwd-{number}-{index}" for index in range(len(choices))]
        generation = Generation(self, request_ids)
        response = self._handle.generate.remote(choices)
        with self._forward_lock:
            for request_id in request_ids:
                self._responses[request_id] = response
        pump = threading.Thread(
            target=self._pump, args=(response, generation, request_ids), name="xpuspec-forward", daemon=True
        )
        pump.start()
        return generation

    def abort(self, request_id: str) -> None:
        """The client left: cancel the replica's stream (it aborts the engine requests there)."""
        with self._forward_lock:
            response = self._responses.pop(request_id, None)
        if response is not None:
            response.cancel()

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self._forward_lock:
            return self._forward_lock.wait_for(lambda: self._num_forwarded == 0, timeout)

    def _pump(self, response: Any, generation: Generation, request_ids: list[str]) -> None:
        unfinished = set(range(len(request_ids)))
        try:
            for events in response:
                unfinished.difference_update(event.index for event in events if event.final)
                generation.deliver(events)
            if unfinished:
                raise RuntimeError("the replica's stream ended before every choice finished")
        except Exception as error:
            if unfinished and not _cancelled(error):
                logger.warning("forwarded request failed: %s", _first_line(error))
                message = f"the engine replica failed: {_first_line(error)}"
                generation.deliver(
                    [
                        ChoiceEvent(index, "", 0, finish_reason="error", error=message)
                        for index in sorted(unfinished)
                    ]
                )
        finally:
            with self._forward_lock:
                for request_id in request_ids:
                    self._responses.pop(request_id, None)
                self._num_forwarded -= len(request_ids)
                self._forward_lock.notify_all()


def _cancelled(error: BaseException) -> bool:
    from ray.serve.exceptions import RequestCancelledError

    return isinstance(error, RequestCancelledError)


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]
