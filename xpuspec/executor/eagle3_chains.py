"""An EAGLE-3 head's greedy chains in one call: their graphs, compiled per γ and cache capacity.

A greedy chain (the catch-up and γ - 1 rollout passes, :meth:`Eagle3Head.draft_greedy_chain
<xpuspec.executor.eagle3_head.Eagle3Head.draft_greedy_chain>`) runs inside one graph
(:func:`~xpuspec.executor.eagle3_graph.build_greedy_rollout_model`) compiled at static shapes, one per
number of drafts and cache capacity. :class:`GreedyChains` holds them: compiled in a background thread
at first use (the caller drafts pass by pass until one is ready), inline on request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import openvino as ov

from xpuspec.executor import eagle3_graph as graph
from xpuspec.executor.eagle3_pass import CACHE_GRAIN, HeadRequest
from xpuspec.spec_decode.eagle3.config import Eagle3HeadConfig
from xpuspec.spec_decode.eagle3.weights import Eagle3HeadWeights

logger = logging.getLogger(__name__)


def chain_rows(count: int) -> int:
    """Positions of a chain's first pass (padded): the tokens a round of ``count`` drafts can accept."""
    return count + 1


class GreedyChains:
    """The compiled greedy chains of one head, by (drafts, cache capacity)."""

    def __init__(
        self,
        config: Eagle3HeadConfig,
        weights: Eagle3HeadWeights,
        weight_type: str,
        embedding: ov.Model,
        compile_model: Callable[[ov.Model], ov.InferRequest],
    ) -> None:
        self.config = config
        self._weights, self._weight_type, self._embedding = weights, weight_type, embedding
        self._compile_model = compile_model
        self._chains: dict[tuple[int, int], Future[HeadRequest]] = {}
        self._errors: set[tuple[int, int]] = set()
        self._compiler: ThreadPoolExecutor | None = None
        # Compile a missing chain at its first use, there and then, instead of in the background.
        self.compile_inline = False

    def prepare(self, count: int, context: int) -> None:
        """Compile now (or wait for) the chains of ``count`` drafts for a sequence of up to ``context``
        tokens, one per cache capacity it reaches."""
        if count < 1:
            return
        for capacity in range(CACHE_GRAIN, -(-max(context, 1) // CACHE_GRAIN) * CACHE_GRAIN + 1, CACHE_GRAIN):
            self.request(count, capacity, inline=True)
            self._chains[count, capacity].exception()  # waits for a compile already under way

    def keys(self) -> list[tuple[int, int]]:
        """(drafts, cache capacity) of every chain asked for: compiled, compiling or failed."""
        return list(self._chains)

    def wait(self, timeout: float | None = None) -> None:
        """Wait for every compile under way (a failed one stays failed: drafted pass by pass)."""
        for compiling in list(self._chains.values()):
            compiling.exception(timeout=timeout)

    def clear(self) -> None:
        """Forget every chain and every failure said (the next use compiles again)."""
        self.wait()
        self._chains.clear()
        self._errors.clear()

    def request(self, count: int, capacity: int, inline: bool = False) -> HeadRequest | None:
        """The compiled chain of ``count`` drafts over a cache of ``capacity`` slots, if it is ready; a
        missing one compiles here when ``inline`` or ``compile_inline``, else in the background."""
        key = count, capacity
        compiling = self._chains.get(key)
        if compiling is None:
            if inline or self.compile_inline:
                compiling = Future()
                try:
                    compiling.set_result(self._compile(count, capacity))
                except Exception as error:  # as a background compile's failure: drafted pass by pass
                    compiling.set_exception(error)
            else:
                if self._compiler is None:
                    self._compiler = ThreadPoolExecutor(1, thread_name_prefix="eagle3-chain-compile")
                compiling = self._compiler.submit(self._compile, count, capacity)
            self._chains[key] = compiling
        if not compiling.done():
            return None
        failure = compiling.exception()
        if failure is not None:
            if key not in self._errors:
                self._errors.add(key)
                logger.warning(
                    "EAGLE-3: the chain of %d drafts did not compile, drafting pass by pass: %s",
                    count,
                    failure,
                )
            return None
        return compiling.result()

    def _compile(self, count: int, capacity: int) -> HeadRequest:
        started = time.perf_counter()
        config = self.config
        model = graph.build_greedy_rollout_model(
            config, self._weights, self._weights.draft_to_target, count, self._weight_type, self._embedding
        )
        rows = chain_rows(count)
        hidden, kv_heads, head_dim = config.hidden_size, config.num_key_value_heads, config.head_dim
        # Static shapes: a dynamic graph re-derived its shapes at every call.
        model.reshape(
            {
                graph.INPUT_IDS: [1, rows],
                graph.HIDDEN_IN: [1, rows, hidden],
                graph.POSITION_IDS: [1, rows],
                graph.PAST_KEY: [1, kv_heads, capacity, head_dim],
                graph.PAST_VALUE: [1, kv_heads, capacity, head_dim],
                graph.ATTENTION_MASK: [1, rows, capacity + rows],
                graph.LOGITS_INDICES: [1, 1],
            }
        )
        request = HeadRequest(self._compile_model(model))
        logger.debug(
            "EAGLE-3 chain of %d drafts over %d slots compiled in %.2fs",
            count,
            capacity,
            time.perf_counter() - started,
        )
        return request
