"""The engine: one step of continuous-batched speculative decoding over paged KV caches.

A step (:meth:`LLMEngine.step`) is

1. **schedule**: the speculation policy (``xpuspec.spec_decode.policy.SpeculationPolicy``) decides
   the speculation length γ of each decoding sequence (fixed per request, or chosen by the cost
   model from that sequence's running acceptance rate), and the scheduler, given those lengths,
   picks prefill chunks and decoding sequences within the token budget;
2. **propose**: the drafter proposes γ tokens for every decoding sequence (draft model or n-gram);
3. **verify**: the target runs every chunk — prefills, and for each decoding sequence its last
   token plus its drafts — in one batched inference;
4. **accept**: the rejection sampler keeps the accepted drafts and adds one recovered or bonus
   token; rollback of rejected drafts is only a change of ``num_computed_tokens``.

The step's phases live in modules of their own, composed here: drafting (``xpuspec.engine.drafting``),
verification and acceptance (``xpuspec.engine.verification``), target-only decode bursts
(``xpuspec.engine.bursts``), recovery (``xpuspec.engine.recovery``) and calibration
(``xpuspec.engine.calibration``). After scheduling, the order they run in is the engine's step
strategy (``xpuspec.engine.strategy``): sequential, or overlapped (``xpuspec.engine.overlap``). Each
phase returns what it produced (proposals, a verification, a list of ``StepOutput``) and the step
composes them; the outputs of a step live in that step alone. The engine reads what its executor
and drafter can do from their ``caps`` (``xpuspec.core.interfaces``). The phases get what they use
as arguments, and see the rest of the engine through ``xpuspec.engine.view.EngineView``, so that
none imports this module back.

Stop strings are text, not tokens: the caller that detokenizes (``xpuspec.api.request_text``) finds
them and calls :meth:`LLMEngine.abort` with ``finish_reason="stop"``, dropping the tokens after the
one that completed the stop string.

Failures are contained, by one rule: **what is computed from one request's own data may fail only
that request; only the shared model execution may fail a step.**

* A request is validated whole before any structure holds it: its parameters, its prompt and its
  output constraint, whose grammar is compiled (and refused, with a ValueError) at admission.
* May fail only its request, which ends with finish_reason "error" and a message about that request
  alone, its KV freed, the batch going on: its sampling and verification; NaN or infinity in its
  logits rows or its draft rows; its drafting; and everything its output constraint computes —
  forced tokens, the masks of drafted and verified rows, the cut of its proposals, the matcher's
  advance and rollback (``xpuspec.engine.constraints`` catches per request), and a mask that
  allows no token.
* May fail the step: an exception out of the target's or a drafter's batched inference, or a bug in
  the engine's own bookkeeping. :meth:`LLMEngine.recover` (``xpuspec.engine.recovery``) then ends
  every request in flight with "error", rebuilds the scheduler and the block table, and the engine
  goes on serving new requests.
  Those requests' clients get a generic message naming their own request id: the failure's detail
  (which may quote any request's data) goes to the log only. Failures are counted in
  ``num_engine_failures`` / ``num_requests_failed``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import cast

from xpuspec.core.block_manager import BlockManager
from xpuspec.core.interfaces import (
    Drafter,
    DrafterCaps,
    TargetExecutor,
    TreeDrafterSource,
    TreeDrafting,
)
from xpuspec.core.prefix_cache import PrefixCachingBlockManager
from xpuspec.core.request_stats import RequestStats
from xpuspec.core.scheduler import ScheduledChunk, Scheduler, SchedulerConfig
from xpuspec.core.sequence import Sequence, SequenceStatus
from xpuspec.engine import calibration, recovery
from xpuspec.engine.admission import breaker_token_ids, check_prompt, compile_constraint
from xpuspec.engine.bursts import Interrupt
from xpuspec.engine.drafting import Drafting
from xpuspec.engine.outputs import (
    FINISH_REASONS,
    STATUS_OF_REASON,
    EngineConfig,
    RequestState,
    StepOutput,
)
from xpuspec.engine.overlap import OverlappedSteps
from xpuspec.engine.strategy import PhaseHooks, SequentialSteps, StepStrategy
from xpuspec.engine.verification import Verifier
from xpuspec.sample.dry import SequenceBreakers
from xpuspec.sample.sampler import make_generator
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.spec_decode.policy import (
    CostModel,
    PromptLookup,
    SpeculationLengthPolicy,
    SpeculationPolicy,
    TreeShapePolicy,
)
from xpuspec.structured.matcher import GrammarCompiler

__all__ = ["FINISH_REASONS", "EngineConfig", "LLMEngine", "StepOutput", "TargetModel"]

logger = logging.getLogger(__name__)

# What the engine needs of the target executor, under its earlier name.
TargetModel = TargetExecutor
# The caps of no drafter at all: nothing asked of the engine.
NO_DRAFTER = DrafterCaps()


class LLMEngine:
    """Continuous-batched speculative decoding. Not thread-safe: one thread calls ``step``.

    ``overlap``: overlap the drafter with the target (``xpuspec.engine.overlap``); it needs a drafter
    that does not read the target's states, and drafts chains only. ``grammar``: compiles output
    constraints (response_format, guided_regex, guided_grammar); None: constrained requests are
    refused. ``sequence_breakers``: the token ids of DRY's sequence breakers (built from the
    tokenizer's token texts); None: requests with DRY on and breakers are refused.
    """

    def __init__(
        self,
        target: TargetExecutor,
        proposer: Drafter | None,
        config: EngineConfig,
        eos_token_ids: list[int],
        clock: Callable[[], float] = time.perf_counter,
        overlap: bool = False,
        grammar: GrammarCompiler | None = None,
        phase_hooks: PhaseHooks | None = None,
        sequence_breakers: SequenceBreakers | None = None,
    ):
        self.target = target
        self.proposer = proposer
        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.clock = clock
        self.grammar = grammar
        self.sequence_breakers = sequence_breakers
        max_sequences = target.caps.max_sequences
        if max_sequences is not None and config.max_num_seqs > max_sequences:
            raise ValueError(
                f"max_num_seqs ({config.max_num_seqs}) exceeds the {max_sequences} sequences the target "
                "executor holds state for; lower max_num_seqs or raise the executor's max_sequences"
            )
        self.build_scheduler()
        # The step strategy decides whether trees may be drafted: a tree is verified in the step
        # that drafts it, which the overlapped strategy does not do.
        self.tree_drafter = self._make_tree_drafter(allows_trees=not overlap)
        self.policy = self._make_policy()
        self.sequences: dict[str, Sequence] = {}
        self.states: dict[str, RequestState] = {}
        self.drafting = Drafting(self, self.tree_drafter)
        self.verifier = Verifier(self)
        self.strategy: StepStrategy = (
            OverlappedSteps(self, self.drafting, self.verifier)
            if overlap
            else SequentialSteps(self, self.drafting, self.verifier)
        )
        self.num_engine_failures = 0  # steps that failed as a whole (model execution)
        self.num_requests_failed = 0  # requests ended by those failures
        # Told the seconds of each phase of a step (xpuspec.engine.strategy.PhaseHooks); None: untimed.
        self.phase_hooks = phase_hooks

    # ------------------------------------------------------------ composition
    @property
    def drafter_caps(self) -> DrafterCaps:
        """What the drafter asks of the engine and offers (read afresh: caps are the drafter's)."""
        return self.proposer.caps if self.proposer is not None else NO_DRAFTER

    @property
    def cost_model(self) -> CostModel:
        """The measured step costs the choice of γ reads (the speculation policy's)."""
        return self.policy.cost_model

    @property
    def length_policy(self) -> SpeculationLengthPolicy:
        """The choice of a chain's γ (the speculation policy's)."""
        return self.policy.length_policy

    @property
    def tree_policy(self) -> TreeShapePolicy:
        """The choice of an "auto" tree's shape (the speculation policy's)."""
        return self.policy.tree_policy

    @property
    def prompt_lookup(self) -> PromptLookup | None:
        """The prompt-lookup drafter beside the draft model, if any (the speculation policy's)."""
        return self.policy.prompt_lookup

    @property
    def prefix_caching(self) -> bool:
        """Whether prefixes are cached: asked for, and the target keeps its KV in the shared blocks
        (a stateful executor keeps each sequence's KV to itself)."""
        return (
            self.config.enable_prefix_caching
            and not self.target.caps.owns_sequence_kv
            # A drafter reading the target's states of every token (EAGLE-3) finds none in a cached prefix.
            and not self.drafter_caps.needs_every_target_state
        )

    def _make_tree_drafter(self, allows_trees: bool) -> TreeDrafting | None:
        """Tree speculation (``SamplingParams.draft_tree``) needs a target that runs tree chunks and
        moves KV, a drafter of trees (it builds its own: a draft model over a tree-capable runner,
        or the EAGLE-3 head), and a step strategy that verifies drafts in the step that drafts them
        (the overlapped one verifies a step later and keeps chains)."""
        target_caps = self.target.caps
        if not (target_caps.trees and target_caps.kv_moves and allows_trees):
            return None
        if self.proposer is None or not self.proposer.caps.drafts_trees:
            return None
        return cast(TreeDrafterSource, self.proposer).tree_drafter()

    def _make_policy(self) -> SpeculationPolicy:
        caps = self.drafter_caps
        config = self.config
        return SpeculationPolicy(
            max_draft_tokens=config.max_draft_tokens,
            max_model_len=config.max_model_len,
            has_drafter=self.proposer is not None,
            drafts_trees=self.tree_drafter is not None,
            # Padding tokens only where the target runs them, and not for a drafter that reads the
            # target's states of every token (EAGLE-3), which would get the padding's too.
            can_pad=self.target.caps.padding and not caps.needs_every_target_state,
            decode_lane=self.target.caps.decode_lane,
            # Free drafts beside a draft model (not beside the n-gram drafter, which is one, nor an
            # EAGLE-3 head, which must see every target state in order).
            prompt_lookup=config.prompt_lookup and caps.is_draft_model and not caps.needs_every_target_state,
            shared_lookup_tokens=config.shared_lookup_tokens,
        )

    def build_scheduler(self) -> None:
        """A new scheduler and block manager (at construction, and after a failed step)."""
        num_blocks = self.target.num_blocks
        if self.config.max_kv_blocks is not None:
            num_blocks = min(num_blocks, self.config.max_kv_blocks)
        if self.prefix_caching:
            self.block_manager: BlockManager | PrefixCachingBlockManager = PrefixCachingBlockManager(
                num_blocks,
                self.target.block_size,
                cache_draft=self.drafter_caps.shares_block_tables,
            )
        else:
            self.block_manager = BlockManager(num_blocks, self.target.block_size)
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_batched_tokens=self.config.max_num_batched_tokens,
                max_num_seqs=self.config.max_num_seqs,
                max_model_len=self.config.max_model_len,
            ),
            self.block_manager,
        )

    def calibrate(
        self, repeats: int = 5, stored: calibration.CalibrationTimings | None = None
    ) -> calibration.CalibrationTimings:
        """Time the target and the drafter on dummy steps so the cost model starts from measurements
        (``xpuspec.engine.calibration``), or replay ``stored`` timings of an earlier start; only while
        no request is in flight."""
        if self.num_requests:
            raise RuntimeError("calibrate() runs only while no request is in flight")
        models = calibration.CalibratedModels(
            self.target, self.proposer, self.config, self.block_manager, self.clock, self.cost_model
        )
        timings = calibration.calibrate(models, repeats, stored)
        self.policy.forget_shape()
        self.reset_prefix_cache()  # the dummy tokens overwrote blocks a cached prefix may name
        return timings

    def reset_prefix_cache(self) -> int:
        """Forget the cached prefixes no request holds (after writing KV outside the block manager's
        view, e.g. timing a forward in block 0); return how many blocks were dropped."""
        if isinstance(self.block_manager, PrefixCachingBlockManager):
            return self.block_manager.reset_cache()
        return 0

    # ----------------------------------------------------------------- requests
    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, tenant: str | None = None
    ) -> None:
        """Queue a request, or raise ValueError and change nothing.

        ``tenant`` (a digest of the client's API key; None: the anonymous tenant) scopes the
        cross-request lookup: its drafts come from the same tenant's earlier requests only.

        Everything is checked and built (parameters, token ids, context, random stream) before the
        request enters any engine structure, so a rejected request leaves no trace.
        """
        if not isinstance(request_id, str):
            raise ValueError(f"a request id is a string, got {request_id!r}")
        if request_id in self.sequences:
            raise ValueError(f"request id {request_id!r} is already in flight")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        params.validate()  # again: a dataclass can be changed after construction
        check_prompt(prompt_token_ids, self.target.vocab_size)
        params = self.with_defaults(params, len(prompt_token_ids))
        if len(prompt_token_ids) + params.token_limit > self.config.max_model_len:
            raise ValueError(
                f"the prompt has {len(prompt_token_ids)} tokens and max_tokens is {params.max_tokens}: "
                f"together more than the context of {self.config.max_model_len} tokens; "
                "shorten the prompt or lower max_tokens"
            )
        guide = compile_constraint(self.grammar, params)
        breaker_ids = breaker_token_ids(self.sequence_breakers, params)
        sequence = Sequence(request_id=request_id, prompt_token_ids=list(prompt_token_ids), params=params)
        state = RequestState(
            rng=make_generator(params.seed),
            stats=RequestStats(arrival_time=self.clock(), max_draft_tokens=self.config.max_draft_tokens),
            eos_token_ids=frozenset() if params.ignore_eos else self.eos_token_ids,
            seed=params.seed if not params.greedy else None,
            guide=guide,
            breaker_ids=breaker_ids,
        )
        self.scheduler.add(sequence)  # the last check (the KV cache), and the first insertion
        self.sequences[request_id] = sequence
        self.states[request_id] = state
        self.policy.admit(request_id, tenant)

    def with_defaults(self, params: SamplingParams, num_prompt_tokens: int) -> SamplingParams:
        """``params`` with its unset fields at the engine's sampling defaults; with no max_tokens, the
        default reply cap or the room the context leaves, whichever is smaller."""
        defaults = self.config.sampling_defaults
        if params.max_tokens is None:
            room = max(1, self.config.max_model_len - num_prompt_tokens)  # no room: refused below
            params = dataclasses.replace(params, max_tokens=min(defaults.max_tokens, room))
        return params.with_defaults(defaults)

    def abort(self, request_id: str, finish_reason: str = "abort", num_dropped_tokens: int = 0) -> bool:
        """Stop a request at any time; its KV blocks are freed at once. The caller reports the end.

        ``finish_reason`` is "abort", "stop" (a stop string; ``num_dropped_tokens`` output tokens
        after it are taken back) or "error".
        """
        sequence = self.sequences.get(request_id)
        if sequence is None:
            return False
        status = STATUS_OF_REASON.get(finish_reason)
        if status not in (
            SequenceStatus.FINISHED_STOPPED,
            SequenceStatus.FINISHED_ABORTED,
            SequenceStatus.FINISHED_ERROR,
        ):
            raise ValueError(f"abort() takes finish_reason 'abort', 'stop' or 'error', got {finish_reason!r}")
        sequence.drop_last_tokens(num_dropped_tokens)
        self.finish(sequence, status)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    @property
    def num_requests(self) -> int:
        return len(self.sequences)

    # --------------------------------------------------------------------- step
    def step(self, interrupt: Interrupt | None = None) -> list[StepOutput]:
        """Run one batched step, schedule → propose → verify → update; return what changed for each
        touched request. ``interrupt``: asked between the passes of a decode burst, True ends it
        (work waiting outside the engine); None: bursts run their course.

        ``interrupt`` is asked between the passes of a decode burst: True ends the burst, so that
        work waiting outside the engine (a server's new requests and aborts) is not held back.

        Never raises for a failure inside the step: a request's own failure ends it alone, any
        other ends every request in flight (see :meth:`recover`); both come back as outputs with
        finish_reason "error", after the outputs the step produced before the failure.
        """
        started_step = self.phase_started()
        outputs: list[StepOutput] = []  # the step's, as its phases return them
        try:
            started = self.clock()
            phase = self.phase_started()
            chunks, finished = self.schedule(self._draft_lengths())
            outputs += finished
            self.phase_ended("schedule", phase)
            if chunks:  # propose → verify → update, in the order of the engine's strategy
                self.strategy.run(chunks, outputs, started, interrupt)
        except Exception as error:
            outputs += self.recover(error)
        self.phase_ended("step", started_step)
        return outputs

    def _draft_lengths(self) -> dict[str, int]:
        """The drafts wanted for each sequence that decodes this step, decided before it is planned:
        a pending proposal's length (overlap), else the speculation policy's γ or tree budget."""
        pending = self.strategy.pending_draft_lengths()
        running = self.scheduler.will_run()
        decoding = [seq for seq in running if not seq.is_prefilling and seq.request_id not in pending]
        guided = {seq.request_id for seq in decoding if self.states[seq.request_id].guide is not None}
        lengths = self.policy.draft_lengths(decoding, len(running), guided)
        for request_id, decision in self.policy.decisions.items():
            self.states[request_id].stats.record_decision(decision.value)
        lengths.update(pending)
        return lengths

    def schedule(self, draft_lengths: dict[str, int]) -> tuple[list[ScheduledChunk], list[StepOutput]]:
        """Plan the step with ``draft_lengths``; return its chunks and the outputs of the requests the
        scheduler ended (they can grow no further in this KV cache or context)."""
        scheduled = self.scheduler.schedule(draft_lengths)
        for sequence in scheduled.preempted:
            self.states[sequence.request_id].stats.num_preemptions += 1
            self._on_preempted(sequence)
        for sequence in scheduled.admitted:
            stats = self.states[sequence.request_id].stats
            if stats.cached_tokens is None:  # the first admission: what the prompt found cached
                stats.cached_tokens = sequence.num_computed_tokens
                stats.cached_draft_tokens = sequence.num_draft_computed_tokens
        finished = []
        for sequence in scheduled.finished:
            state = self.states[sequence.request_id]
            finished.append(StepOutput(sequence.request_id, [], True, "length", state.stats))
            self.retire(sequence)
        return scheduled.chunks, finished

    def recover(self, error: BaseException) -> list[StepOutput]:
        """After a failure of the step as a whole: end every request in flight with "error"
        (``xpuspec.engine.recovery``) and return their outputs.

        Frees every KV block by rebuilding the scheduler and its block manager (their state may be
        half-updated), releases executor state, and leaves the engine ready for new requests. The
        cost model keeps its measurements: they come from steps that completed.
        """
        recovery.log_failure(list(self.sequences), error)
        self.num_engine_failures += 1
        recovery.settle_executors(self.target, self.proposer)
        sequences = list(self.sequences.values())
        self.build_scheduler()
        self.policy.reset_after_failure()
        outputs = recovery.end_requests(
            sequences,
            self.states,
            self.retire,
            lambda: RequestStats(self.clock(), self.config.max_draft_tokens),
        )
        self.num_requests_failed += len(outputs)
        return outputs

    # ------------------------------------------- the phases' shared bookkeeping
    def phase_started(self) -> float:
        """The start of a timed phase (0.0, and no clock read, while no hooks are set)."""
        return self.clock() if self.phase_hooks is not None else 0.0

    def phase_ended(self, name: str, started: float) -> None:
        """Tell the hooks, if any, the seconds of phase ``name`` begun at ``started``."""
        hooks = self.phase_hooks
        if hooks is not None:
            hooks.on_phase(name, self.clock() - started)

    def finish(self, sequence: Sequence, status: SequenceStatus) -> None:
        """End a request with ``status``: the scheduler frees its KV, the engine forgets it."""
        self.scheduler.finish(sequence, status)
        self.retire(sequence)

    def fail(self, sequence: Sequence, message: str, failed_constraint: bool = False) -> StepOutput:
        """End one request with "error" (its own failure; the rest of the batch goes on) and return
        its output."""
        logger.warning("request %s failed: %s", sequence.request_id, message)
        state = self.states[sequence.request_id]
        self.finish(sequence, SequenceStatus.FINISHED_ERROR)
        return StepOutput(
            sequence.request_id, [], True, "error", state.stats, message, failed_constraint=failed_constraint
        )

    def retire(self, sequence: Sequence) -> None:
        """Forget a finished request everywhere and release its executors' state."""
        self.strategy.forget(sequence.request_id)
        self.states.pop(sequence.request_id, None)
        self.sequences.pop(sequence.request_id, None)
        self.policy.retire(sequence.request_id, sequence.token_ids)
        self._release_kv(sequence.request_id)

    def _on_preempted(self, sequence: Sequence) -> None:
        """A preempted sequence restarts from position 0: executors may drop its KV now."""
        self.strategy.forget(sequence.request_id)
        self._release_kv(sequence.request_id)

    def _release_kv(self, request_id: str) -> None:
        self.target.release(request_id)  # a no-op for an executor without KV of its own
        if self.proposer is not None:
            self.proposer.release(request_id)
