"""The engine: one step of continuous-batched speculative decoding over paged KV caches.

A step is

1. **schedule**: the scheduler picks prefill chunks and decoding sequences within the token budget,
   and the speculation length γ of each decoding sequence (fixed per request, or chosen by the cost
   model from that sequence's running acceptance rate);
2. **propose**: the drafter proposes γ tokens for every decoding sequence (draft model or n-gram);
3. **verify**: the target runs every chunk — prefills, and for each decoding sequence its last
   token plus its drafts — in one batched inference;
4. **accept**: the rejection sampler keeps the accepted drafts and adds one recovered or bonus
   token; rollback of rejected drafts is only a change of ``num_computed_tokens``.

The step's phases live in modules of their own, composed here: drafting (``xpuspec.engine.drafting``),
verification and acceptance (``xpuspec.engine.verification``), target-only decode bursts
(``xpuspec.engine.bursts``), recovery (``xpuspec.engine.recovery``) and calibration
(``xpuspec.engine.calibration``). The order they run in is the engine's step strategy
(``xpuspec.engine.strategy``): sequential, or overlapped (``xpuspec.engine.overlap``). The engine
reads what its executor and drafter can do from their ``caps`` (``xpuspec.core.interfaces``). The
phases see the engine through ``xpuspec.engine.view.EngineView``, the Protocol of what they use, so
that none imports this module back.

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
from xpuspec.engine.admission import check_prompt, compile_constraint
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
from xpuspec.sample.sampler import make_generator
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.spec_decode.policy.acceptance import AcceptanceRates
from xpuspec.spec_decode.policy.cost_model import CostModel
from xpuspec.spec_decode.policy.draft_choice import DraftChoice
from xpuspec.spec_decode.policy.speculation_length import SpeculationLengthPolicy
from xpuspec.spec_decode.policy.step_shape import StepShape
from xpuspec.spec_decode.policy.tree_policy import TreeShapePolicy
from xpuspec.spec_decode.prompt_lookup import PromptLookup
from xpuspec.spec_decode.rejection_sampler import RejectionSampler
from xpuspec.spec_decode.suffix_index import SharedSuffixIndex
from xpuspec.spec_decode.tree_acceptance import TreeAcceptance
from xpuspec.structured.matcher import GrammarCompiler, GuidedRequest

__all__ = ["FINISH_REASONS", "EngineConfig", "LLMEngine", "StepOutput", "TargetModel"]

logger = logging.getLogger(__name__)

# What the engine needs of the target executor, under its earlier name.
TargetModel = TargetExecutor
# The caps of no drafter at all: nothing asked of the engine.
NO_DRAFTER = DrafterCaps()


class LLMEngine:
    """Continuous-batched speculative decoding. Not thread-safe: one thread calls ``step``.

    ``overlap``: overlap the drafter with the target (``xpuspec.engine.overlap``); it needs a drafter
    that does not read the target's states, and drafts chains only.
    """

    def __init__(
        self,
        target: TargetExecutor,
        proposer: Drafter | None,
        config: EngineConfig,
        eos_token_ids: list[int],
        clock: Callable[[], float] = time.perf_counter,
        overlap: bool = False,
    ):
        self.target = target
        self.proposer = proposer
        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.clock = clock
        max_sequences = target.caps.max_sequences
        if max_sequences is not None and config.max_num_seqs > max_sequences:
            raise ValueError(
                f"max_num_seqs ({config.max_num_seqs}) exceeds the {max_sequences} sequences the target "
                "executor holds state for; lower max_num_seqs or raise the executor's max_sequences"
            )
        # The order of the step's phases; it decides whether trees may be drafted.
        self.strategy: StepStrategy = OverlappedSteps(self) if overlap else SequentialSteps(self)
        self.build_scheduler()
        self.rejection_sampler = RejectionSampler()
        self.cost_model = CostModel()
        self.acceptance = AcceptanceRates()
        # Padding tokens only where the target runs them, and not for a drafter that reads the
        # target's states of every token (EAGLE-3), which would get the padding's too.
        can_pad = target.caps.padding and not self.drafter_caps.needs_every_target_state
        self.step_shape = StepShape(can_pad, config.max_model_len)
        self.length_policy = SpeculationLengthPolicy(config.max_draft_tokens, self.cost_model)
        self.tree_drafter = self._make_tree_drafter()
        self.tree_acceptance = TreeAcceptance()
        self.tree_policy = TreeShapePolicy(self.cost_model, config.max_draft_tokens)
        self.draft_choice = self._make_draft_choice()  # None: no drafter, no drafts
        # The engine's modules read and change these (they are the package's, not the callers').
        self.sequences: dict[str, Sequence] = {}
        self.states: dict[str, RequestState] = {}
        # Outputs of the step in progress: kept here so a step that fails still reports them.
        self.step_outputs: list[StepOutput] = []
        self.drafting = Drafting(self)
        self.verifier = Verifier(self)
        self.num_engine_failures = 0  # steps that failed as a whole (model execution)
        self.num_requests_failed = 0  # requests ended by those failures
        # Compiles output constraints (response_format, guided_regex, guided_grammar); set by the
        # pipeline from the bundle's tokenizer.json. None: constrained requests are refused.
        self.grammar: GrammarCompiler | None = None
        # The interrupt of the step in progress (step's argument), asked between a burst's passes.
        self.burst_interrupt: Callable[[], bool] | None = None
        # Told the seconds of each phase of a step (xpuspec.engine.strategy.PhaseHooks); None: untimed.
        self.phase_hooks: PhaseHooks | None = None

    # ------------------------------------------------------------ composition
    @property
    def drafter_caps(self) -> DrafterCaps:
        """What the drafter asks of the engine and offers (read afresh: caps are the drafter's)."""
        return self.proposer.caps if self.proposer is not None else NO_DRAFTER

    @property
    def prompt_lookup(self) -> PromptLookup | None:
        """The prompt-lookup drafter beside the draft model, if any (``DraftChoice.prompt_lookup``)."""
        return self.draft_choice.prompt_lookup if self.draft_choice is not None else None

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

    def _make_tree_drafter(self) -> TreeDrafting | None:
        """Tree speculation (``SamplingParams.draft_tree``) needs a target that runs tree chunks and
        moves KV, a drafter of trees (it builds its own: a draft model over a tree-capable runner,
        or the EAGLE-3 head), and a step strategy that verifies drafts in the step that drafts them
        (the overlapped one verifies a step later and keeps chains)."""
        target_caps = self.target.caps
        if not (target_caps.trees and target_caps.kv_moves and self.strategy.allows_trees):
            return None
        if self.proposer is None or not self.proposer.caps.drafts_trees:
            return None
        return cast(TreeDrafterSource, self.proposer).tree_drafter()

    def _make_draft_choice(self) -> DraftChoice | None:
        if self.proposer is None:
            return None
        caps = self.proposer.caps
        return DraftChoice(
            max_draft_tokens=self.config.max_draft_tokens,
            acceptance=self.acceptance,
            length_policy=self.length_policy,
            tree_policy=self.tree_policy,
            # Free drafts beside a draft model (not beside the n-gram drafter, which is one, nor an
            # EAGLE-3 head, which must see every target state in order).
            prompt_lookup=(
                PromptLookup(shared=self._shared_index())
                if self.config.prompt_lookup and caps.is_draft_model and not caps.needs_every_target_state
                else None
            ),
            drafts_trees=self.tree_drafter is not None,
            num_running=lambda: self.scheduler.num_running,
            is_guided=lambda request_id: self.states[request_id].guide is not None,
            last_target_shape=lambda: self.step_shape.last,
        )

    def _shared_index(self) -> SharedSuffixIndex | None:
        tokens = self.config.shared_lookup_tokens
        return SharedSuffixIndex(tokens) if tokens else None

    def build_scheduler(self) -> None:
        """A new scheduler and block manager (at construction, and after a failed step)."""
        if self.prefix_caching:
            self.block_manager: BlockManager | PrefixCachingBlockManager = PrefixCachingBlockManager(
                self.target.num_blocks,
                self.target.block_size,
                cache_draft=self.drafter_caps.shares_block_tables,
            )
        else:
            self.block_manager = BlockManager(self.target.num_blocks, self.target.block_size)
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_batched_tokens=self.config.max_num_batched_tokens,
                max_num_seqs=self.config.max_num_seqs,
                max_model_len=self.config.max_model_len,
            ),
            self.block_manager,
        )

    def holds_shape(self) -> bool:
        """Whether this step pads up to the last step's shape: not while adaptive drafting is off at
        this batch (``DraftChoice.payoff``), whose steps would otherwise carry the padding of the
        drafting steps before them for a while."""
        return self.draft_choice is None or self.draft_choice.step_drafting_on is not False

    def calibrate(
        self, repeats: int = 5, stored: calibration.CalibrationTimings | None = None
    ) -> calibration.CalibrationTimings:
        """Time the target and the drafter on dummy steps so the cost model starts from measurements
        (``xpuspec.engine.calibration``), or replay ``stored`` timings of an earlier start; only while
        no request is in flight."""
        return calibration.calibrate(self, repeats, stored)

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
        if len(prompt_token_ids) + params.max_tokens > self.config.max_model_len:
            raise ValueError(
                f"the prompt has {len(prompt_token_ids)} tokens and max_tokens is {params.max_tokens}: "
                f"together more than the context of {self.config.max_model_len} tokens; "
                "shorten the prompt or lower max_tokens"
            )
        guide = compile_constraint(self.grammar, params)
        sequence = Sequence(request_id=request_id, prompt_token_ids=list(prompt_token_ids), params=params)
        state = RequestState(
            rng=make_generator(params.seed),
            stats=RequestStats(arrival_time=self.clock(), max_draft_tokens=self.config.max_draft_tokens),
            eos_token_ids=frozenset() if params.ignore_eos else self.eos_token_ids,
            seed=params.seed if not params.greedy else None,
            guide=guide,
        )
        self.scheduler.add(sequence)  # the last check (the KV cache), and the first insertion
        self.sequences[request_id] = sequence
        self.states[request_id] = state
        if self.prompt_lookup is not None:
            self.prompt_lookup.admit(request_id, tenant)

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
        self.scheduler.finish(sequence, status)
        self.retire(sequence)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    @property
    def num_requests(self) -> int:
        return len(self.sequences)

    # --------------------------------------------------------------------- step
    def step(self, interrupt: Callable[[], bool] | None = None) -> list[StepOutput]:
        """Run one batched step; return what changed for each touched request.

        ``interrupt`` is asked between the passes of a decode burst: True ends the burst, so that
        work waiting outside the engine (a server's new requests and aborts) is not held back.

        Never raises for a failure inside the step: a request's own failure ends it alone, any
        other ends every request in flight (see :meth:`recover`); both come back as outputs with
        finish_reason "error".
        """
        started = self.phase_started()
        self.step_outputs = []
        self.burst_interrupt = interrupt
        try:
            self._step()
        except Exception as error:
            self.recover(error)
        finally:
            self.burst_interrupt = None
        outputs, self.step_outputs = self.step_outputs, []
        self.phase_ended("step", started)
        return outputs

    def _step(self) -> None:
        """schedule → propose → verify → accept, in the order of the engine's strategy."""
        self.strategy.run()

    def recover(self, error: BaseException) -> list[StepOutput]:
        """After a failure of the step as a whole: end every request in flight with "error"
        (``xpuspec.engine.recovery``); returns the outputs of the step so far plus one per request."""
        return recovery.recover(self, error)

    # ------------------------------------------- the phases' shared bookkeeping
    def phase_started(self) -> float:
        """The start of a timed phase (0.0, and no clock read, while no hooks are set)."""
        return self.clock() if self.phase_hooks is not None else 0.0

    def phase_ended(self, name: str, started: float) -> None:
        """Tell the hooks, if any, the seconds of phase ``name`` begun at ``started``."""
        hooks = self.phase_hooks
        if hooks is not None:
            hooks.on_phase(name, self.clock() - started)

    def schedule(self) -> list[ScheduledChunk]:
        """Plan the step; return its chunks (the requests the scheduler ended go to the outputs)."""
        if self.draft_choice is not None:
            self.draft_choice.new_step()
        self.verifier.new_step()
        scheduled = self.scheduler.schedule(self.num_draft_tokens)
        for sequence in scheduled.preempted:
            self.states[sequence.request_id].stats.num_preemptions += 1
            self._on_preempted(sequence)
        for sequence in scheduled.admitted:
            stats = self.states[sequence.request_id].stats
            if stats.cached_tokens is None:  # the first admission: what the prompt found cached
                stats.cached_tokens = sequence.num_computed_tokens
                stats.cached_draft_tokens = sequence.num_draft_computed_tokens
        for sequence in scheduled.finished:
            # Ended by the scheduler: it can grow no further in this KV cache or context.
            state = self.states[sequence.request_id]
            self.step_outputs.append(StepOutput(sequence.request_id, [], True, "length", state.stats))
            self.retire(sequence)
        return scheduled.chunks

    def num_draft_tokens(self, sequence: Sequence) -> int:
        """Drafts wanted for ``sequence`` this step: a pending proposal's length (overlap), else a
        chain's γ or a tree's node budget."""
        pending = self.strategy.pending_draft_tokens(sequence)
        if pending is not None:
            return pending
        if self.draft_choice is None:
            return 0
        return self.draft_choice.num_draft_tokens(sequence)

    def guides(self, chunks: list[ScheduledChunk]) -> dict[str, GuidedRequest]:
        """The matchers of the constrained requests among ``chunks``."""
        guides = {}
        for chunk in chunks:
            state = self.states.get(chunk.sequence.request_id)
            if state is not None and state.guide is not None:
                guides[chunk.sequence.request_id] = state.guide
        return guides

    def fail_request(self, sequence: Sequence, message: str, failed_constraint: bool = False) -> None:
        """End one request with "error" (its own failure); the rest of the batch goes on."""
        logger.warning("request %s failed: %s", sequence.request_id, message)
        state = self.states[sequence.request_id]
        self.scheduler.finish(sequence, SequenceStatus.FINISHED_ERROR)
        self.retire(sequence)
        self.step_outputs.append(
            StepOutput(
                sequence.request_id,
                [],
                True,
                "error",
                state.stats,
                message,
                failed_constraint=failed_constraint,
            )
        )

    def retire(self, sequence: Sequence) -> None:
        """Forget a finished request everywhere and release its executors' state."""
        self.strategy.forget(sequence.request_id)
        self.states.pop(sequence.request_id, None)
        self.sequences.pop(sequence.request_id, None)
        self.acceptance.forget(sequence.request_id)
        if self.prompt_lookup is not None:
            self.prompt_lookup.retire(sequence.request_id, sequence.token_ids)
        self._release_kv(sequence.request_id)

    def _on_preempted(self, sequence: Sequence) -> None:
        """A preempted sequence restarts from position 0: executors may drop its KV now."""
        self.strategy.forget(sequence.request_id)
        self._release_kv(sequence.request_id)

    def _release_kv(self, request_id: str) -> None:
        self.target.release(request_id)  # a no-op for an executor without KV of its own
        if self.proposer is not None:
            self.proposer.release(request_id)
