"""The EAGLE-3 head at run time: compiled OpenVINO models and per-sequence KV, at the numpy level.

What a drafter (:mod:`xpuspec.spec_decode.eagle3`, which sees it as a
:class:`~xpuspec.spec_decode.eagle3.head.HeadExecutor`) does with it, per step:

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

Each sequence's KV cache and how a pass's inputs are written: :mod:`xpuspec.executor.eagle3_pass`.
Step 2 of a greedy chain need not leave the graph: :meth:`Eagle3Head.draft_greedy_chain` runs the
catch-up and γ - 1 rollout passes in one call (:mod:`xpuspec.executor.eagle3_chains`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import openvino as ov

from xpuspec.executor import eagle3_graph as graph
from xpuspec.executor.eagle3_chains import GreedyChains, chain_rows
from xpuspec.executor.eagle3_embedding import EMBEDDINGS, INPUT_IDS, target_embedding_model
from xpuspec.executor.eagle3_pass import CACHE_GRAIN, HeadRequest, SequenceCache, fill_pass
from xpuspec.executor.properties import PropertiesArg, resolve_properties
from xpuspec.spec_decode.eagle3.config import Eagle3HeadConfig
from xpuspec.spec_decode.eagle3.head import HeadStep, HeadStepResult
from xpuspec.spec_decode.eagle3.weights import Eagle3HeadWeights, load_head_weights

# Re-exported: the head's inputs and outputs (plain types of spec_decode) and its cache grain.
__all__ = [
    "CACHE_GRAIN",
    "HEAD_WEIGHT_TYPE",
    "Eagle3Head",
    "HeadFolder",
    "read_head",
]

logger = logging.getLogger(__name__)

# The weights the engine runs a head with (its matrices int8 per output row, see eagle3_graph._Weights):
# measured with SmolLM2-135M's head, the same acceptance as f32 on held-out chat, and a faster decode.
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
        self._head = HeadRequest(
            core.compile_model(
                graph.build_head_model(config, weights, weight_type, embedding), device, compile_properties
            ).create_infer_request()
        )
        # Greedy chains in one call (draft_greedy_chain).
        self.chains = GreedyChains(config, weights, weight_type, embedding, self._compile)
        # The engine folds the fusion into the target (head_model.fusion); `fuse` compiles it alone
        # for callers holding unfused states.
        self._fusion_model = graph.build_fusion_model(config, weights, weight_type)
        self._fusion: ov.InferRequest | None = None
        self._embedding_model = embedding
        self._embedding: ov.InferRequest | None = None
        self._core, self._device, self._compile_properties = core, device, compile_properties
        self._caches: dict[str, SequenceCache] = {}

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

    def _cache(self, sequence_id: str) -> SequenceCache:
        cache = self._caches.get(sequence_id)
        if cache is None:
            config = self.config
            cache = self._caches[sequence_id] = SequenceCache(config.num_key_value_heads, config.head_dim)
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
        # calls, and nothing writes the arrays meanwhile); copying them cost time at every head pass.
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
        lengths = fill_pass(self.config, self._head, steps, caches)
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
                    logits=logits[i, : step.num_logits].copy(), hidden=hidden_out[i, :length].copy()
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
        rows = chain_rows(count)
        if len(step.token_ids) > rows:
            return None
        cache = self._cache(step.sequence_id)
        request = self.chains.request(count, cache.capacity)
        if request is None:
            return None
        (length,) = fill_pass(self.config, request, [step], [cache], rows=rows)
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
        self.chains.prepare(count, context)

    @property
    def compile_chains_inline(self) -> bool:
        """Compile a missing chain at its first use, there and then (default: in the background)."""
        return self.chains.compile_inline

    @compile_chains_inline.setter
    def compile_chains_inline(self, inline: bool) -> None:
        self.chains.compile_inline = inline

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
