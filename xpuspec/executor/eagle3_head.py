"""The EAGLE-3 head at run time: compiled OpenVINO models and per-sequence KV, at the numpy level.

What a drafter (a :class:`xpuspec.spec_decode.proposal.DraftProposer`) does with it, per step:

1. after verification, fuse the target's tapped states of the newly verified tokens (:meth:`fuse`; the
   engine's target does it inside its own pass, ``PagedModelRunner(hidden_state_projection=...)``),
   drop the head's KV past the accepted prefix (:meth:`truncate`), and run one catch-up pass over them
   (:meth:`run`, one :class:`HeadStep` per sequence: token ids shifted by one, see
   :mod:`xpuspec.executor.eagle3_graph`), which yields the first draft's logits;
2. roll out: each further pass feeds the drafted token with the previous pass's ``hidden`` (the
   layer output before the final norm), one position per chain, or several with a tree mask;
3. sample from :meth:`target_logits` (draft logits scattered into the target vocabulary, ``-inf``
   for ids the head cannot draft), so rejection sampling compares rows of one vocabulary;
4. :meth:`release` a finished sequence.

The KV cache lives here as numpy, per sequence id, appended by every pass (each sequence's rows may be
of different lengths: passes are padded and masked). It is small: one layer, ``kv_heads * head_dim``
values per position.

A pass of one sequence (batch 1, every chain step of a lone request) is the latency that matters, and
its Python cost was as large as the head's own nodes (0.92 ms a call against 0.48 ms of node time, SmolLM2's
head, one token): it rebuilt seven arrays, copied the sequence's past KV into them, handed them over by
name, and each new past length changed the graph's input shapes. Now the sequence's cache *is* the past
input, at a capacity that grows in :data:`CACHE_GRAIN` slots (masked beyond its length, so the shapes stay
put for that many tokens), and the other inputs are written into the request's own tensors.

Step 2 of a greedy chain need not leave the graph: :meth:`draft_greedy_chain` runs the catch-up and γ - 1
rollout passes in one call, in a graph compiled at static shapes per γ and cache capacity (in a
background thread; the caller drafts pass by pass until it is ready).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import openvino as ov

from xpuspec.executor import eagle3_graph as graph
from xpuspec.executor.eagle3_embedding import EMBEDDINGS, INPUT_IDS, target_embedding_model
from xpuspec.executor.properties import PropertiesArg, resolve_properties
from xpuspec.spec_decode.eagle3.config import Eagle3HeadConfig
from xpuspec.spec_decode.eagle3.weights import Eagle3HeadWeights, load_head_weights

logger = logging.getLogger(__name__)

# The weights the engine runs a head with (its matrices int8 per output row, see head_model._Weights):
# the same acceptance as f32 on held-out chat (0.172 against 0.173 of 4.7k drafts, SmolLM2-135M's head),
# 1.07x the decode speed at γ = 4.
HEAD_WEIGHT_TYPE = "int8"


class HeadFolder(NamedTuple):
    """A published-layout head folder, read and checked against its target (:func:`read_head`)."""

    config: Eagle3HeadConfig
    weights: Eagle3HeadWeights
    tap_layers: tuple[int, ...]  # the target's layer boundaries the head reads


def read_head(head_dir: str | Path, target_dir: str | Path) -> HeadFolder:
    """The head's config and weights, checked against the target's IR folder (hidden size, vocabulary,
    layer ids)."""
    config = Eagle3HeadConfig.from_folder(head_dir)
    tap_layers = tuple(config.check_target(target_dir))
    weights = load_head_weights(head_dir, config)
    if weights.embed_tokens is not None:
        logger.info("%s ships embed_tokens; embedding with the target's table instead", head_dir)
    return HeadFolder(config, weights, tap_layers)


@dataclass
class HeadStep:
    """One sequence's ``n`` new positions in a head pass.

    ``token_ids`` ``[n]``: the target ids whose embeddings the positions read (position ``j`` pairs the
    state at ``j`` with the token at ``j + 1``). ``hidden`` ``[n, hidden]``: fused target states
    (:meth:`Eagle3Head.fuse`) or a previous pass's ``hidden``. ``positions`` ``[n]``: default the next
    ``n`` slots of the sequence's cache. ``attention_mask`` ``[n, past + n]`` bool over the cached
    positions and the new ones: default all of the past and causal among the new (give a tree's mask
    here). ``logits_rows``: which of the ``n`` positions get logits; default the last only.
    """

    sequence_id: str
    token_ids: Sequence[int] | np.ndarray
    hidden: np.ndarray
    positions: Sequence[int] | np.ndarray | None = None
    attention_mask: np.ndarray | None = None
    logits_rows: Sequence[int] | None = None

    def __post_init__(self) -> None:
        self.token_ids = np.asarray(self.token_ids, dtype=np.int64).reshape(-1)
        self.hidden = np.asarray(self.hidden, dtype=np.float32)
        n = self.token_ids.shape[0]
        if n == 0:
            raise ValueError(f"head step for {self.sequence_id}: no positions")
        if self.hidden.ndim != 2 or self.hidden.shape[0] != n:
            raise ValueError(
                f"head step for {self.sequence_id}: hidden must be [{n}, hidden] for {n} token ids, "
                f"got {list(self.hidden.shape)}"
            )
        if self.positions is not None:
            self.positions = np.asarray(self.positions, dtype=np.int64).reshape(-1)
            if self.positions.shape[0] != n:
                raise ValueError(
                    f"head step for {self.sequence_id}: {self.positions.shape[0]} positions for {n} ids"
                )
        rows = [n - 1] if self.logits_rows is None else [int(row) for row in self.logits_rows]
        if not rows or any(not 0 <= row < n for row in rows):
            raise ValueError(
                f"head step for {self.sequence_id}: logits_rows must be in 0..{n - 1}, got {rows}"
            )
        self.logits_rows = rows


@dataclass
class HeadStepResult:
    logits: np.ndarray  # [len(logits_rows), draft_vocab]
    hidden: np.ndarray  # [n, hidden]: the next rollout step's input state (before the final norm)


# Slots a sequence's head cache grows by: its capacity is the past width of a batch-1 pass, so the
# head's input shapes change once per this many tokens instead of every pass.
CACHE_GRAIN = 256


class _SequenceCache:
    """One sequence's keys and values ``[1, kv_heads, capacity, head_dim]``, valid up to ``length``.

    The arrays are the head's ``past_key`` / ``past_value`` inputs of a pass of this sequence alone
    (``tensors``, sharing their memory): the slots past ``length`` are masked, and kept at zero so a
    masked slot's weight of exactly 0 never meets a NaN.
    """

    def __init__(self, kv_heads: int, head_dim: int):
        self.key = np.zeros((1, kv_heads, CACHE_GRAIN, head_dim), np.float32)
        self.value = np.zeros_like(self.key)
        self.length = 0
        self.tensors = self._share()

    def _share(self) -> tuple[ov.Tensor, ov.Tensor]:
        return ov.Tensor(self.key, shared_memory=True), ov.Tensor(self.value, shared_memory=True)

    @property
    def capacity(self) -> int:
        return self.key.shape[2]

    def append(self, key: np.ndarray, value: np.ndarray) -> None:
        """Add ``[kv_heads, n, head_dim]`` keys and values after the valid slots."""
        end = self.length + key.shape[1]
        if end > self.capacity:
            capacity = -(-end // CACHE_GRAIN) * CACHE_GRAIN
            for name in ("key", "value"):
                grown = np.zeros(self.key.shape[:2] + (capacity, self.key.shape[3]), np.float32)
                grown[:, :, : self.length] = getattr(self, name)[:, :, : self.length]
                setattr(self, name, grown)
            self.tensors = self._share()
        self.key[0, :, self.length : end] = key
        self.value[0, :, self.length : end] = value
        self.length = end

    def truncate(self, length: int) -> None:
        if length < self.length:
            self.key[:, :, length : self.length] = 0
            self.value[:, :, length : self.length] = 0
            self.length = length


def _chain_rows(count: int) -> int:
    """Positions of a chain's first pass (padded): the tokens a round of ``count`` drafts can accept."""
    return count + 1


class _HeadRequest:
    """An infer request of a head graph with its input arrays (the request's own tensors) and the past
    KV tensors last set on it."""

    def __init__(self, request: ov.InferRequest):
        self.request = request
        self._inputs: dict[str, np.ndarray] = {}
        self._past: tuple[ov.Tensor, ov.Tensor] | None = None

    def input(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """The request's own input tensor ``name`` at ``shape``, as a writable array (zero-filled).

        Writing into the request's tensors skips the per-call wrapping of a dict of arrays (~0.1 ms a
        pass). The array is kept while the shape stays: asking the tensor for its shape and data costs
        ~30 µs an input.
        """
        held = self._inputs.get(name)
        if held is None or held.shape != shape:
            tensor = self.request.get_tensor(name)
            tensor.shape = list(shape)
            held = self._inputs[name] = tensor.data
        held.fill(0)
        return held

    def set_past(self, key: ov.Tensor, value: ov.Tensor) -> None:
        if self._past is None or self._past[0] is not key:  # a lone sequence's cache: set once
            self.request.set_tensor(graph.PAST_KEY, key)
            self.request.set_tensor(graph.PAST_VALUE, value)
            self._past = key, value

    def output(self, name: str) -> np.ndarray:
        return self.request.get_tensor(name).data


class Eagle3Head:
    """A compiled EAGLE-3 head: fusion, embedding and decoder-layer models, and per-sequence KV."""

    def __init__(
        self,
        config: Eagle3HeadConfig,
        weights: Eagle3HeadWeights,
        embedding: ov.Model,
        device: str = "CPU",
        properties: PropertiesArg = None,
        core: ov.Core | None = None,
        weight_type: str = "f32",
    ):
        core = core or ov.Core()
        compile_properties: dict[str, Any] = resolve_properties(properties) or {}
        self.config = config
        self.d2t = weights.d2t
        self.target_ids = weights.draft_to_target  # [draft_vocab]
        width = embedding.output(EMBEDDINGS).get_partial_shape()[-1]
        if width.is_static and width.get_length() != config.hidden_size:
            raise ValueError(
                f"the embedding gives {width.get_length()} features, the head expects {config.hidden_size}: "
                f"it is not this head's target"
            )
        # The head embeds its token ids itself (one call a draft); `embed` compiles the lookup alone
        # for callers that want embeddings.
        self._head = _HeadRequest(
            core.compile_model(
                graph.build_head_model(config, weights, weight_type, embedding), device, compile_properties
            ).create_infer_request()
        )
        self._weights, self._weight_type = weights, weight_type
        # Greedy chains in one call (draft_greedy_chain), by (drafts, cache capacity).
        self._chains: dict[tuple[int, int], Future[_HeadRequest]] = {}
        self._chain_errors: set[tuple[int, int]] = set()
        self._compiler: ThreadPoolExecutor | None = None
        self.compile_chains_inline = False
        # The engine folds the fusion into the target (head_model.fusion); `fuse` compiles it alone
        # for callers holding unfused states.
        self._fusion_model = graph.build_fusion_model(config, weights, weight_type)
        self._fusion: ov.InferRequest | None = None
        self._embedding_model = embedding
        self._embedding: ov.InferRequest | None = None
        self._core, self._device, self._compile_properties = core, device, compile_properties
        self._caches: dict[str, _SequenceCache] = {}

    @classmethod
    def from_folders(
        cls,
        head_dir: str | Path | HeadFolder,
        target_dir: str | Path,
        device: str = "CPU",
        properties: PropertiesArg = None,
        core: ov.Core | None = None,
        weight_type: str = "f32",
    ) -> Eagle3Head:
        """A published-layout head folder and its target's IR folder (checked against each other), or
        the folder as :func:`read_head` read it already."""
        head = head_dir if isinstance(head_dir, HeadFolder) else read_head(head_dir, target_dir)
        core = core or ov.Core()
        embedding = target_embedding_model(target_dir, core)
        return cls(head.config, head.weights, embedding, device, properties, core, weight_type)

    # --- per-sequence KV -------------------------------------------------------------------------

    def kv_length(self, sequence_id: str) -> int:
        cache = self._caches.get(sequence_id)
        return 0 if cache is None else cache.length

    def truncate(self, sequence_id: str, length: int) -> None:
        """Keep the first ``length`` cached positions (after rejection drops the rest)."""
        if length < 0:
            raise ValueError(f"cannot truncate {sequence_id} to {length} positions")
        cache = self._caches.get(sequence_id)
        if cache is not None:
            cache.truncate(length)

    def release(self, sequence_id: str) -> None:
        self._caches.pop(sequence_id, None)

    def _cache(self, sequence_id: str) -> _SequenceCache:
        cache = self._caches.get(sequence_id)
        if cache is None:
            config = self.config
            cache = self._caches[sequence_id] = _SequenceCache(config.num_key_value_heads, config.head_dim)
        return cache

    # --- model calls -----------------------------------------------------------------------------

    def fuse(self, target_hidden: np.ndarray) -> np.ndarray:
        """``[m, 3*hidden]`` target states (the runner's ``hidden_states()`` rows) -> ``[m, hidden]``."""
        target_hidden = np.asarray(target_hidden, dtype=np.float32)
        if target_hidden.ndim != 2 or target_hidden.shape[1] != 3 * self.config.hidden_size:
            raise ValueError(
                f"target states must be [m, {3 * self.config.hidden_size}] (three taps of "
                f"{self.config.hidden_size}), got {list(target_hidden.shape)}"
            )
        if self._fusion is None:
            self._fusion = self._compile(self._fusion_model)
        # share_inputs: the arrays are the request's inputs as they are, not copied in (synchronous
        # calls, and nothing writes the arrays meanwhile); copying cost ~0.4 ms per head pass.
        self._fusion.infer({graph.TARGET_HIDDEN: target_hidden}, share_inputs=True)
        return self._fusion.get_tensor(graph.FUSED).data.copy()

    def embed(self, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """``[m]`` target ids -> ``[m, hidden]`` embeddings from the target's table."""
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        if self._embedding is None:
            self._embedding = self._compile(self._embedding_model)
        rank = self._embedding_model.input(INPUT_IDS).get_partial_shape().rank.get_length()
        shaped = ids.reshape((1, -1) if rank == 2 else (-1,))
        self._embedding.infer({INPUT_IDS: shaped}, share_inputs=True)
        return self._embedding.get_tensor(EMBEDDINGS).data.reshape(ids.shape[0], -1).copy()

    def _compile(self, model: ov.Model) -> ov.InferRequest:
        return self._core.compile_model(model, self._device, self._compile_properties).create_infer_request()

    def run(self, steps: Sequence[HeadStep]) -> list[HeadStepResult]:
        """One padded pass over every step's positions; appends each sequence's new KV to its cache."""
        if not steps:
            return []
        if len({step.sequence_id for step in steps}) != len(steps):
            raise ValueError("one head pass takes each sequence once")
        caches = [self._cache(step.sequence_id) for step in steps]
        lengths = self._fill(self._head, steps, caches)
        self._head.request.infer()
        logits = self._head.output(graph.LOGITS)  # [b, rows, draft_vocab]
        hidden_out = self._head.output(graph.HIDDEN_OUT)  # [b, new, hidden]
        present_key = self._head.output(graph.PRESENT_KEY)  # [b, kv, new, head_dim]
        present_value = self._head.output(graph.PRESENT_VALUE)
        results = []
        for i, (step, length, cache) in enumerate(zip(steps, lengths, caches, strict=True)):
            cache.append(present_key[i, :, :length], present_value[i, :, :length])
            results.append(
                HeadStepResult(
                    logits=logits[i, : len(step.logits_rows)].copy(), hidden=hidden_out[i, :length].copy()
                )
            )
        return results

    def draft_greedy_chain(self, step: HeadStep, count: int) -> tuple[np.ndarray, np.ndarray] | None:
        """``count`` greedy drafts of one sequence in one call: :meth:`run` of ``step`` (default mask, last
        row's logits) then ``count - 1`` rollout passes, inside one graph
        (:func:`~xpuspec.executor.eagle3_graph.build_greedy_rollout_model`). Returns the drafted
        target ids ``[count]`` and each pass's sum of logits ``[count]`` (not finite: that pass's logits
        held NaN or infinity). Only ``step``'s own positions join the cache, as after a step-by-step
        chain cut back to them.

        The graph is compiled at static shapes, one per ``count`` and cache capacity, for a first pass of
        up to ``count + 1`` positions, padded to that many: the tokens a round of ``count`` drafts can
        accept (every round at a steady γ but the one after a prefill). Returns None, and
        the caller drafts pass by pass, while that graph is not compiled yet: its compilation starts in
        the background at the first such call (``compile_chains_inline`` compiles it there and then).
        """
        if step.attention_mask is not None or step.logits_rows != [len(step.token_ids) - 1]:
            raise ValueError("a greedy chain starts from the default mask and the last position's logits")
        if count < 1:
            raise ValueError(f"a greedy chain drafts at least one token, got count={count}")
        rows = _chain_rows(count)
        if len(step.token_ids) > rows:
            return None
        cache = self._cache(step.sequence_id)
        request = self._chain_request(count, cache.capacity)
        if request is None:
            return None
        (length,) = self._fill(request, [step], [cache], rows=rows)
        request.request.infer()
        cache.append(
            request.output(graph.PRESENT_KEY)[0, :, :length],
            request.output(graph.PRESENT_VALUE)[0, :, :length],
        )
        return request.output(graph.DRAFT_IDS)[0].copy(), request.output(graph.LOGIT_SUMS)[0].copy()

    def prepare_chains(self, count: int, context: int) -> None:
        """Compile now (or wait for) the chains of ``count`` drafts for a sequence of up to ``context``
        tokens, one per cache capacity it reaches: for a caller that times requests and wants no compile
        inside them (the benchmarks)."""
        if count < 1:
            return
        for capacity in range(CACHE_GRAIN, -(-max(context, 1) // CACHE_GRAIN) * CACHE_GRAIN + 1, CACHE_GRAIN):
            self._chain_request(count, capacity, inline=True)
            self._chains[count, capacity].exception()  # waits for a compile already under way

    def _chain_request(self, count: int, capacity: int, inline: bool = False) -> _HeadRequest | None:
        """The compiled chain of ``count`` drafts over a cache of ``capacity`` slots, if it is ready; a
        missing one compiles here when ``inline`` or ``compile_chains_inline``, else in the background."""
        key = count, capacity
        compiling = self._chains.get(key)
        if compiling is None:
            if inline or self.compile_chains_inline:
                compiling = Future()
                try:
                    compiling.set_result(self._compile_chain(count, capacity))
                except Exception as error:  # as a background compile's failure: drafted pass by pass
                    compiling.set_exception(error)
            else:
                if self._compiler is None:
                    self._compiler = ThreadPoolExecutor(1, thread_name_prefix="eagle3-chain-compile")
                compiling = self._compiler.submit(self._compile_chain, count, capacity)
            self._chains[key] = compiling
        if not compiling.done():
            return None
        error = compiling.exception()
        if error is not None:
            if key not in self._chain_errors:
                self._chain_errors.add(key)
                logger.warning(
                    "EAGLE-3: the chain of %d drafts did not compile, drafting pass by pass: %s", count, error
                )
            return None
        return compiling.result()

    def _compile_chain(self, count: int, capacity: int) -> _HeadRequest:
        started = time.perf_counter()
        model = graph.build_greedy_rollout_model(
            self.config, self._weights, self.target_ids, count, self._weight_type, self._embedding_model
        )
        rows = _chain_rows(count)
        hidden, kv_heads, head_dim = (
            self.config.hidden_size,
            self.config.num_key_value_heads,
            self.config.head_dim,
        )
        # Static shapes: a dynamic graph re-derived its shapes every call (~0.5 ms, SmolLM2's head, γ = 4).
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
        request = _HeadRequest(self._compile(model))
        logger.debug(
            "EAGLE-3 chain of %d drafts over %d slots compiled in %.2fs",
            count,
            capacity,
            time.perf_counter() - started,
        )
        return request

    def _fill(
        self, request: _HeadRequest, steps: Sequence[HeadStep], caches: list[_SequenceCache], rows: int = 1
    ) -> list[int]:
        """Write one pass of ``steps``, padded to at least ``rows`` positions, into ``request``'s inputs;
        returns each step's length."""
        config = self.config
        for step in steps:
            if step.hidden.shape[1] != config.hidden_size:
                raise ValueError(
                    f"head step for {step.sequence_id}: hidden has {step.hidden.shape[1]} features, the head "
                    f"{config.hidden_size} (fuse the target's states first)"
                )
        batch = len(steps)
        pasts = [cache.length for cache in caches]
        lengths = [step.token_ids.shape[0] for step in steps]
        new = max(max(lengths), rows)
        if batch == 1:
            # The cache is the past input as it is: no copy, and its width changes once per CACHE_GRAIN.
            past = caches[0].capacity
            past_key, past_value = caches[0].tensors
        else:
            past = max(pasts)
            key = np.zeros((batch, config.num_key_value_heads, past, config.head_dim), np.float32)
            value = np.zeros_like(key)
            for i, (cache, cached) in enumerate(zip(caches, pasts, strict=True)):
                key[i, :, :cached] = cache.key[0, :, :cached]
                value[i, :, :cached] = cache.value[0, :, :cached]
            past_key, past_value = ov.Tensor(key, shared_memory=True), ov.Tensor(value, shared_memory=True)
        request.set_past(past_key, past_value)

        input_ids = request.input(graph.INPUT_IDS, (batch, new))
        hidden = request.input(graph.HIDDEN_IN, (batch, new, config.hidden_size))
        positions = request.input(graph.POSITION_IDS, (batch, new))
        mask = request.input(graph.ATTENTION_MASK, (batch, new, past + new))
        logits_indices = request.input(graph.LOGITS_INDICES, (batch, max(len(s.logits_rows) for s in steps)))
        # Padded query rows attend to themselves only, so no row is fully masked.
        mask[:, np.arange(new), past + np.arange(new)] = True
        for i, (step, length, cached) in enumerate(zip(steps, lengths, pasts, strict=True)):
            input_ids[i, :length] = step.token_ids
            hidden[i, :length] = step.hidden
            positions[i, :length] = cached + np.arange(length) if step.positions is None else step.positions
            if step.attention_mask is None:
                mask[i, :length, :cached] = True
                if length > 1:  # one new position: the diagonal set above
                    mask[i, :length, past : past + length] = np.tri(length, dtype=np.bool_)
            else:
                given = np.asarray(step.attention_mask, dtype=np.bool_)
                if given.shape != (length, cached + length):
                    raise ValueError(
                        f"head step for {step.sequence_id}: attention_mask must be "
                        f"[{length}, {cached + length}] ({cached} cached + {length} new positions), "
                        f"got {list(given.shape)}"
                    )
                mask[i, :length, :cached] = given[:, :cached]
                mask[i, :length, past : past + length] = given[:, cached:]
            logits_indices[i, : len(step.logits_rows)] = step.logits_rows
        return lengths

    # --- vocabularies ----------------------------------------------------------------------------

    def draft_to_target(self, draft_ids: np.ndarray | Sequence[int] | int) -> np.ndarray:
        """Target ids of draft ids (``id + d2t[id]``), same shape."""
        return self.target_ids[np.asarray(draft_ids, dtype=np.int64)]

    def target_logits(self, draft_logits: np.ndarray, fill: float = -np.inf) -> np.ndarray:
        """``[..., draft_vocab]`` -> ``[..., vocab]``: each draft column at its target id, ``fill`` elsewhere.

        With the default ``-inf`` the softmax over the target vocabulary is the head's distribution with
        zero mass on ids it cannot draft; pass ``fill=0`` to scatter probabilities instead.
        """
        draft_logits = np.asarray(draft_logits)
        if draft_logits.shape[-1] != self.config.draft_vocab_size:
            raise ValueError(
                f"draft logits must end in the draft vocabulary ({self.config.draft_vocab_size}), "
                f"got {list(draft_logits.shape)}"
            )
        out = np.full(draft_logits.shape[:-1] + (self.config.vocab_size,), fill, dtype=np.float32)
        out[..., self.target_ids] = draft_logits
        return out

    @property
    def sequences(self) -> Mapping[str, int]:
        """Cached positions per sequence id (for checks and logging)."""
        return {sequence_id: cache.length for sequence_id, cache in self._caches.items()}
