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

Stop strings are text, not tokens: the caller that detokenizes (``xpuspec.request_text``) finds
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
  advance and rollback (``xpuspec.structured.speculation`` catches per request), and a mask that
  allows no token.
* May fail the step: an exception out of the target's or a drafter's batched inference, or a bug in
  the engine's own bookkeeping. :meth:`LLMEngine.recover` then ends every request in flight with
  "error", rebuilds the scheduler and the block table, and the engine goes on serving new requests.
  Those requests' clients get a generic message naming their own request id: the failure's detail
  (which may quote any request's data) goes to the log only. Failures are counted in
  ``num_engine_failures`` / ``num_requests_failed``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from xpuspec.core.block_manager import BlockManager
from xpuspec.core.chunks import SequenceChunk
from xpuspec.core.prefix_cache import PrefixCachingBlockManager
from xpuspec.core.request_stats import RequestStats
from xpuspec.core.scheduler import ScheduledChunk, Scheduler, SchedulerConfig
from xpuspec.core.sequence import Sequence, SequenceStatus
from xpuspec.core.step_shape import StepShape, decode_sequences, step_tokens
from xpuspec.engine.draft_choice import DraftChoice
from xpuspec.sample.sampler import (
    finite_argmax,
    make_generator,
    position_exponentials,
    probabilities,
    race,
    sample,
)
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.spec_decode.prompt_lookup import PromptLookup
from xpuspec.spec_decode.proposal import DraftProposer, Proposal
from xpuspec.spec_decode.rejection_sampler import RejectionSampler
from xpuspec.spec_decode.speculation_length import AcceptanceRates, CostModel, SpeculationLengthPolicy
from xpuspec.spec_decode.tree import DraftTree
from xpuspec.spec_decode.tree_acceptance import TreeAcceptance, TreeVerification
from xpuspec.spec_decode.tree_build import TreeDrafting
from xpuspec.spec_decode.tree_policy import TreeShapePolicy
from xpuspec.spec_decode.tree_proposer import TreeDrafter
from xpuspec.structured import speculation as structured
from xpuspec.structured.matcher import GrammarCompiler, GuidedRequest

logger = logging.getLogger(__name__)


class TargetModel(Protocol):
    """What the engine needs of the target executor (``PagedModelRunner`` and
    ``StatefulModelRunner`` satisfy it; a runner with ``release(sequence_id)`` is told when a
    sequence's KV is no longer needed)."""

    block_size: int
    num_blocks: int
    vocab_size: int

    def forward(self, chunks: list[SequenceChunk]) -> np.ndarray: ...  # [sum num_logits, vocab]

    def start(self, chunks: list[SequenceChunk]) -> None: ...

    def wait(self) -> np.ndarray: ...  # [sum num_logits, vocab]


CALIBRATION_CONTEXT = 256  # tokens of context at which calibration times the target

FINISH_REASONS = {
    SequenceStatus.FINISHED_STOPPED: "stop",
    SequenceStatus.FINISHED_LENGTH: "length",
    SequenceStatus.FINISHED_ABORTED: "abort",
    SequenceStatus.FINISHED_ERROR: "error",
}
_STATUS_OF_REASON = {reason: status for status, reason in FINISH_REASONS.items()}


@dataclass
class EngineConfig:
    """Batching and speculation limits of one engine."""

    max_num_batched_tokens: int = 256
    max_num_seqs: int = 16
    max_model_len: int = 2048
    max_draft_tokens: int = 8
    # Reuse the KV of full blocks of earlier requests (xpuspec.core.prefix_cache); paged targets only.
    enable_prefix_caching: bool = True
    # Target-only decode bursts (LLMEngine._burst): up to this many decode passes per step() while
    # they fit in decode_burst_seconds. 1 turns bursts off.
    decode_burst_steps: int = 16
    decode_burst_seconds: float = 0.02
    # Beside a draft model, adaptive γ also drafts by prompt lookup where the sequence repeats
    # itself and that predicts more tokens per second (xpuspec.spec_decode.prompt_lookup).
    prompt_lookup: bool = True

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1 + self.max_draft_tokens:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must leave room for one decoding "
                f"sequence with max_draft_tokens ({self.max_draft_tokens}) drafts"
            )
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if not 0 <= self.max_draft_tokens <= 16:
            raise ValueError(f"max_draft_tokens must be in [0, 16], got {self.max_draft_tokens}")
        if self.decode_burst_steps < 1:
            raise ValueError(f"decode_burst_steps must be >= 1 (1: no bursts), got {self.decode_burst_steps}")
        if not self.decode_burst_seconds >= 0:
            raise ValueError(f"decode_burst_seconds must be >= 0, got {self.decode_burst_seconds}")


@dataclass
class StepOutput:
    """What one step did to one request: the tokens it appended and whether it finished.

    ``finish_reason`` "error" comes with ``error``, the message of what ended the request, and
    ``failed_constraint`` says whether that was the request's own output constraint (a client's
    mistake, such as a grammar that can never be completed, rather than a failure of the engine).
    """

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    stats: RequestStats
    error: str | None = None
    failed_constraint: bool = False


@dataclass
class _RequestState:
    """Engine-side state of a request beside its ``Sequence``."""

    rng: np.random.Generator
    stats: RequestStats
    eos_token_ids: frozenset[int]
    seed: int | None
    guide: GuidedRequest | None = None  # the output constraint's matcher (xpuspec.structured)


class LLMEngine:
    """Continuous-batched speculative decoding. Not thread-safe: one thread calls ``step``."""

    def __init__(
        self,
        target: TargetModel,
        proposer: DraftProposer | None,
        config: EngineConfig,
        eos_token_ids: list[int],
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.target = target
        self.proposer = proposer
        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.clock = clock
        max_sequences = getattr(target, "max_sequences", None)
        if max_sequences is not None and config.max_num_seqs > max_sequences:
            raise ValueError(
                f"max_num_seqs ({config.max_num_seqs}) exceeds the {max_sequences} sequences the target "
                "executor holds state for; lower max_num_seqs or raise the executor's max_sequences"
            )
        self._build_scheduler()
        self.rejection_sampler = RejectionSampler()
        self.cost_model = CostModel()
        self.acceptance = AcceptanceRates()
        # Padding tokens only where the target runs them, and not for a drafter that reads the
        # target's states of every token (EAGLE-3), which would get the padding's too.
        can_pad = bool(getattr(target, "supports_padding", False)) and not hasattr(proposer, "observe_target")
        self.step_shape = StepShape(can_pad, config.max_model_len)
        self._drafting_seconds = 0.0  # wall time of the last drafting phase
        self.length_policy = SpeculationLengthPolicy(config.max_draft_tokens, self.cost_model)
        self._init_trees()
        self.draft_choice: DraftChoice | None = None  # None: no drafter, no drafts
        if proposer is not None:
            self.draft_choice = DraftChoice(
                max_draft_tokens=config.max_draft_tokens,
                acceptance=self.acceptance,
                length_policy=self.length_policy,
                tree_policy=self.tree_policy,
                # Free drafts beside a draft model (not beside the n-gram drafter, which is one, nor
                # an EAGLE-3 head, which must see every target state in order).
                prompt_lookup=(
                    PromptLookup()
                    if config.prompt_lookup
                    and getattr(proposer, "runner", None) is not None
                    and not hasattr(proposer, "observe_target")
                    else None
                ),
                drafts_trees=self.tree_drafter is not None,
                num_running=lambda: self.scheduler.num_running,
                is_guided=lambda request_id: self._states[request_id].guide is not None,
                last_target_shape=lambda: self.step_shape.last,
            )
        self._sequences: dict[str, Sequence] = {}
        self._states: dict[str, _RequestState] = {}
        # Outputs of the step in progress: kept here so a step that fails still reports them.
        self._step_outputs: list[StepOutput] = []
        # Requests whose output constraint failed while the target ran (ended at acceptance).
        self._constraint_failures: dict[str, str] = {}
        # Requests whose grammar failed while the drafter masked their rows (this step's drafting).
        self._draft_mask_failures: set[str] = set()
        self.num_engine_failures = 0  # steps that failed as a whole (model execution)
        self.num_requests_failed = 0  # requests ended by those failures
        # Compiles output constraints (response_format, guided_regex, guided_grammar); set by the
        # pipeline from the bundle's tokenizer.json. None: constrained requests are refused.
        self.grammar: GrammarCompiler | None = None
        if proposer is not None and hasattr(proposer, "constrain_logits"):
            proposer.constrain_logits = self._constrain_draft_logits
        # Asked between the passes of a decode burst: True ends it, so that work waiting outside the
        # engine (a server's new requests and aborts) is not held back for the rest of the burst.
        self.burst_interrupt: Callable[[], bool] | None = None

    @property
    def prompt_lookup(self) -> PromptLookup | None:
        """The prompt-lookup drafter beside the draft model, if any (``DraftChoice.prompt_lookup``)."""
        return self.draft_choice.prompt_lookup if self.draft_choice is not None else None

    @property
    def prefix_caching(self) -> bool:
        """Whether prefixes are cached: asked for, and the target keeps its KV in the shared blocks
        (a stateful executor, one with ``release``, keeps each sequence's KV to itself)."""
        return (
            self.config.enable_prefix_caching
            and not hasattr(self.target, "release")
            # A drafter reading the target's states of every token (EAGLE-3) finds none in a cached prefix.
            and not getattr(self.proposer, "needs_every_target_state", False)
        )

    def _init_trees(self) -> None:
        """Tree speculation (``SamplingParams.draft_tree``) needs a tree-capable target runner and a
        drafter of trees: a draft model whose runner runs tree chunks, or a proposer that makes its
        own (``tree_drafter()``, the EAGLE-3 head's). The overlapped engine verifies drafts a step
        later and keeps chains."""
        draft_runner = getattr(self.proposer, "runner", None)
        make_tree_drafter = getattr(self.proposer, "tree_drafter", None)
        self.tree_drafter: TreeDrafting | None = None
        if getattr(self.target, "supports_trees", False) and type(self)._step is LLMEngine._step:
            if getattr(draft_runner, "supports_tree_masks", False):
                self.tree_drafter = TreeDrafter(draft_runner, self.target.vocab_size)
            elif callable(make_tree_drafter):
                self.tree_drafter = make_tree_drafter()
        self.tree_acceptance = TreeAcceptance()
        self.tree_policy = TreeShapePolicy(self.cost_model, self.config.max_draft_tokens)
        # The accepted path (node indices) of each tree verified this step: a drafter reading the
        # target's states (EAGLE-3) keeps those of the path's rows only.
        self._tree_paths: dict[str, list[int]] = {}
        self._draft_timings: list[tuple[int, float]] = []  # the drafting passes of this step

    def _build_scheduler(self) -> None:
        if self.prefix_caching:
            draft_runner = getattr(self.proposer, "runner", None)
            self.block_manager: BlockManager | PrefixCachingBlockManager = PrefixCachingBlockManager(
                self.target.num_blocks,
                self.target.block_size,
                cache_draft=draft_runner is not None and not hasattr(draft_runner, "release"),
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

    def calibrate(self, repeats: int = 5) -> None:
        """Time the target and the drafter on dummy steps so the cost model starts from measurements.

        Runs before any request holds blocks: the dummy tokens are written into the first blocks
        and overwritten by the first real sequences.
        """
        if self.num_requests:
            raise RuntimeError("calibrate() runs only while no request is in flight")
        # Verification by tokens per sequence, 1 .. 1 + γ_max: its cost is far from linear on
        # small models, and adaptive γ reads it per γ (spec_decode.verify_costs). Sizes are
        # interleaved, so a busy moment of the machine does not land on one size alone.
        sizes = range(1, 2 + self.config.max_draft_tokens if self.proposer is not None else 2)
        # At a typical context: verifying several tokens runs the plugin's multi-query attention,
        # whose cost grows with the context (at an empty context, 3 tokens timed at half their
        # cost at ~300 tokens on the 2-layer test pair). Every position maps to block 0: the
        # timing needs no cache of that size, and block 0 is rewritten by the first request.
        past = max(0, min(CALIBRATION_CONTEXT, self.config.max_model_len) - len(sizes))
        chunks = {
            n: SequenceChunk(
                token_ids=[0] * n,
                past_length=past,
                block_table=[0] * self.block_manager.blocks_needed(past + n),
                num_logits=n,
            )
            for n in sizes
        }
        for runner in (self.target, getattr(self.proposer, "runner", None)):
            if hasattr(runner, "warm_up"):
                runner.warm_up(self.config.max_model_len)
        for chunk in chunks.values():
            self.target.forward([chunk])  # the first inference of a shape compiles kernels: not timed
        if self.proposer is not None:
            for tokens in (1, 2):
                self.proposer.measure_step_seconds(past + 1, tokens=tokens)  # warm-up, not timed
        # Each size twice in a row: the first pass after another size pays the plugin's change of
        # shapes (cost_model.shape_change), the second is the steady cost a fixed γ pays. As in a
        # real step, a pass over 1 + γ tokens follows the drafting that proposed them (a model
        # that just ran left the other's weights out of cache and its threads asleep).
        for _ in range(repeats):
            for n, chunk in chunks.items():
                started = self.clock()
                self.target.forward([chunk])
                changed = self.clock() - started
                if n > 1:  # the drafting of γ = n - 1: a catch-up of 2 tokens, then one-token passes
                    drafting = self.proposer.measure_step_seconds(past + 1, tokens=2)  # type: ignore[union-attr]
                    for _pass in range(n - 2):
                        seconds = self.proposer.measure_step_seconds(past + 1)  # type: ignore[union-attr]
                        self.cost_model.calibrate_draft(seconds)
                        drafting += seconds
                    self.cost_model.calibrate_drafting(1, n - 1, drafting)
                started = self.clock()
                self.target.forward([chunk])
                steady = self.clock() - started
                self.cost_model.calibrate_target(1, n, steady)
                if len(chunks) > 1:
                    self.cost_model.calibrate_shape_change(changed - steady)
        self.step_shape.last = None
        self.reset_prefix_cache()  # the dummy tokens overwrote blocks a cached prefix may name

    def reset_prefix_cache(self) -> int:
        """Forget the cached prefixes no request holds (after writing KV outside the block manager's
        view, e.g. timing a forward in block 0); return how many blocks were dropped."""
        reset = getattr(self.block_manager, "reset_cache", None)
        return reset() if reset is not None else 0

    # ----------------------------------------------------------------- requests
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Queue a request, or raise ValueError and change nothing.

        Everything is checked and built (parameters, token ids, context, random stream) before the
        request enters any engine structure, so a rejected request leaves no trace.
        """
        if not isinstance(request_id, str):
            raise ValueError(f"a request id is a string, got {request_id!r}")
        if request_id in self._sequences:
            raise ValueError(f"request id {request_id!r} is already in flight")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        params.validate()  # again: a dataclass can be changed after construction
        self._check_prompt(prompt_token_ids)
        if len(prompt_token_ids) + params.max_tokens > self.config.max_model_len:
            raise ValueError(
                f"the prompt has {len(prompt_token_ids)} tokens and max_tokens is {params.max_tokens}: "
                f"together more than the context of {self.config.max_model_len} tokens; "
                "shorten the prompt or lower max_tokens"
            )
        guide = self._compile_constraint(params)
        sequence = Sequence(request_id=request_id, prompt_token_ids=list(prompt_token_ids), params=params)
        state = _RequestState(
            rng=make_generator(params.seed),
            stats=RequestStats(arrival_time=self.clock(), max_draft_tokens=self.config.max_draft_tokens),
            eos_token_ids=frozenset() if params.ignore_eos else self.eos_token_ids,
            seed=params.seed if not params.greedy else None,
            guide=guide,
        )
        self.scheduler.add(sequence)  # the last check (the KV cache), and the first insertion
        self._sequences[request_id] = sequence
        self._states[request_id] = state

    def _compile_constraint(self, params: SamplingParams) -> GuidedRequest | None:
        constraint = params.constraint()
        if constraint is None:
            return None
        if self.grammar is None:
            raise ValueError(
                "this engine has no grammar support (no tokenizer.json in the model folder), so it "
                "cannot constrain output; drop response_format / guided_regex / guided_grammar"
            )
        try:
            return self.grammar.compile(constraint)
        except ValueError:
            raise
        except Exception as error:  # the grammar engine failing on this request's grammar is still its own
            logger.warning("compiling an output constraint failed", exc_info=error)
            raise ValueError(f"the output constraint could not be compiled: {error}") from error

    def _guides(self, chunks: list[ScheduledChunk]) -> dict[str, GuidedRequest]:
        """The matchers of the constrained requests among ``chunks``."""
        guides = {}
        for chunk in chunks:
            state = self._states.get(chunk.sequence.request_id)
            if state is not None and state.guide is not None:
                guides[chunk.sequence.request_id] = state.guide
        return guides

    def _forward(
        self, chunks: list[ScheduledChunk], runner_chunks: list[SequenceChunk], proposals: dict[str, Proposal]
    ) -> np.ndarray:
        """The target's logits of ``runner_chunks``; constrained requests' masks are computed meanwhile."""
        guides = self._guides(chunks)
        if not guides or not hasattr(self.target, "start"):
            return self.target.forward(runner_chunks)
        self.target.start(runner_chunks)
        self._prepare_masks(guides, proposals)
        return self.target.wait()

    def _prepare_masks(self, guides: dict[str, GuidedRequest], proposals: dict[str, Proposal]) -> None:
        """The verification masks, ahead; a request whose grammar fails is ended at acceptance."""
        failures = structured.prepare_masks(
            guides, {rid: proposals[rid].token_ids for rid in guides if rid in proposals}
        )
        self._constraint_failures.update(failures)

    def _check_prompt(self, prompt_token_ids: list[int]) -> None:
        if not isinstance(prompt_token_ids, (list, tuple, np.ndarray)) or len(prompt_token_ids) == 0:
            raise ValueError("the prompt is empty: at least one token is needed")
        ids = np.asarray(prompt_token_ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise ValueError("prompt token ids must be a flat list of integers")
        vocab = self.target.vocab_size
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ValueError(
                f"prompt token ids must lie in [0, {vocab}), got ids from {ids.min()} to {ids.max()}"
            )

    def abort(self, request_id: str, finish_reason: str = "abort", num_dropped_tokens: int = 0) -> bool:
        """Stop a request at any time; its KV blocks are freed at once. The caller reports the end.

        ``finish_reason`` is "abort", "stop" (a stop string; ``num_dropped_tokens`` output tokens
        after it are taken back) or "error".
        """
        sequence = self._sequences.get(request_id)
        if sequence is None:
            return False
        status = _STATUS_OF_REASON.get(finish_reason)
        if status not in (
            SequenceStatus.FINISHED_STOPPED,
            SequenceStatus.FINISHED_ABORTED,
            SequenceStatus.FINISHED_ERROR,
        ):
            raise ValueError(f"abort() takes finish_reason 'abort', 'stop' or 'error', got {finish_reason!r}")
        sequence.drop_last_tokens(num_dropped_tokens)
        self.scheduler.finish(sequence, status)
        self._retire(sequence)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    @property
    def num_requests(self) -> int:
        return len(self._sequences)

    # --------------------------------------------------------------------- step
    def step(self) -> list[StepOutput]:
        """Run one batched step; return what changed for each touched request.

        Never raises for a failure inside the step: a request's own failure ends it alone, any
        other ends every request in flight (see :meth:`recover`); both come back as outputs with
        finish_reason "error".
        """
        self._step_outputs = []
        try:
            self._step()
        except Exception as error:
            self.recover(error)
        outputs, self._step_outputs = self._step_outputs, []
        return outputs

    def _step(self) -> None:
        started = self.clock()
        chunks = self._schedule()
        if not chunks:
            return
        proposals = self._propose(chunks)
        drafting_seconds = self._drafting_seconds if proposals else 0.0
        chunks = self._drop_failed_proposals(chunks, proposals)
        if not chunks:
            return
        runner_chunks = [
            self._target_chunk(chunk, proposals.get(chunk.sequence.request_id)) for chunk in chunks
        ]
        if self.proposer is not None:  # without a drafter every decode step has the same shape
            self.step_shape.keep(runner_chunks, self.cost_model, self._holds_shape())
        logits = self._forward(chunks, runner_chunks, proposals)  # [sum num_logits, vocab]
        self._accept_all(chunks, runner_chunks, logits, proposals)
        observe = getattr(self.proposer, "observe_target", None)
        if observe is not None:  # a drafter that drafts from the target's hidden states (EAGLE-3)
            observe(chunks, runner_chunks, self._tree_paths)
        if self.proposer is not None:  # only the choice of γ reads the cost model
            # The whole step but the drafting: the engine's own work per step is paid once however
            # many tokens the step emits, and speculation amortises it as it does the target's pass.
            shape, changed = self.step_shape.record(runner_chunks)
            self.cost_model.record_target_step(
                shape[0],
                self.clock() - started - drafting_seconds,
                num_sequences=shape[1],
                shape_changed=changed,
            )
        if not proposals:
            self._burst(chunks, self.clock() - started)
        choice = self.draft_choice
        if choice is not None and choice.step_drafting_on is not None and decode_sequences(runner_chunks):
            emitted = sum(len(output.new_token_ids) for output in self._step_outputs)
            choice.payoff.record(len(chunks), choice.step_drafting_on, emitted, self.clock() - started)

    def _holds_shape(self) -> bool:
        """Whether this step pads up to the last step's shape: not while adaptive drafting is off at
        this batch (``DraftChoice.payoff``), whose steps would otherwise carry the padding of the
        drafting steps before them for a while."""
        return self.draft_choice is None or self.draft_choice.step_drafting_on is not False

    def _burst(self, chunks: list[ScheduledChunk], pass_seconds: float) -> None:
        """More target-only decode passes within this step, without scheduling between them.

        On a small model a pass takes well under a millisecond and the step around it (scheduling,
        building chunks, verification, outputs, the caller's text) adds ~15% to it; a burst pays
        that once for several tokens, as vLLM's multi-step scheduling does. Tokens are those of
        single steps: the same one-token decode inputs, accepted by ``_accept``. A burst runs only
        while no step would draft (no drafter; γ fixed at 0; adaptive γ or an automatic tree whose
        policy says 0 and no probe is due) and the scheduler would plan the same batch: every
        running sequence decodes, none waits, no output constraint, none gets its first token. It
        ends when a sequence finishes or fails, a block cannot be had without preempting, a request
        waits, ``burst_interrupt`` says so, a step would draft, or the next pass would end past
        ``decode_burst_seconds`` (so streaming stays smooth and new requests wait little).
        """
        config = self.config
        sequences = [chunk.sequence for chunk in chunks]
        if getattr(self.proposer, "needs_every_target_state", False):
            return  # a drafter that reads every target state (EAGLE-3) observes every pass
        if (
            config.decode_burst_steps < 2
            or self.scheduler.num_waiting
            or len(sequences) != self.scheduler.num_running
            or any(not (chunk.num_tokens == 1 and chunk.samples) for chunk in chunks)
            # A first token goes out at once (a one-token prompt's prefill looks like a decode).
            or any(sequence.num_output_tokens < 2 for sequence in sequences)
            or any(self._states[sequence.request_id].guide is not None for sequence in sequences)
        ):
            return
        passes: list[tuple[int, float]] = []  # (tokens run, seconds) of each pass
        try:
            self._burst_passes(sequences, pass_seconds, passes)
        finally:
            if self.proposer is not None:
                # Target-only tokens now cost a pass, not a step: the choice of γ weighs drafting
                # against that (recorded after the burst, so no pass recomputes the policy's costs).
                for num_tokens, seconds in passes:
                    self.cost_model.record_target_step(num_tokens, seconds, num_sequences=len(sequences))

    def _burst_passes(
        self, sequences: list[Sequence], pass_seconds: float, passes: list[tuple[int, float]]
    ) -> None:
        """The passes of :meth:`_burst`; appends each pass's tokens and seconds to ``passes``."""
        config = self.config
        outputs = {output.request_id: output for output in self._step_outputs}
        elapsed = pass_seconds
        for _ in range(config.decode_burst_steps - 1):
            if elapsed + pass_seconds > config.decode_burst_seconds:
                return
            if self.burst_interrupt is not None and self.burst_interrupt():
                return
            if any(sequence.is_finished for sequence in sequences):
                return  # a finished sequence is retired: nothing below may look it up
            if self.draft_choice is not None:
                if any(self.draft_choice.would_draft(sequence) for sequence in sequences):
                    return  # the next step drafts (or probes): a step of its own
                self.draft_choice.steps_without_drafting += 1  # as for a step without drafts
            for sequence in sequences:
                if sequence.num_tokens >= config.max_model_len or not self.block_manager.ensure_capacity(
                    sequence, sequence.num_tokens
                ):
                    return
            started = self.clock()
            runner_chunks = [
                SequenceChunk(
                    token_ids=[sequence.last_token_id],
                    past_length=sequence.num_computed_tokens,
                    block_table=sequence.block_table,
                    num_logits=1,
                    sequence_id=sequence.request_id,
                )
                for sequence in sequences
            ]
            if self.proposer is not None:
                self.step_shape.keep(runner_chunks, self.cost_model, self._holds_shape())
                self.step_shape.record(runner_chunks)
            logits = self.target.forward(runner_chunks)  # [num sequences, vocab]
            for row, sequence in enumerate(sequences):
                sequence.num_computed_tokens += 1
                try:
                    output = self._accept(sequence, logits[row : row + 1], None)
                except Exception as error:
                    self._fail_request(sequence, f"sampling failed: {error}")
                    continue
                earlier = outputs.get(sequence.request_id)
                if earlier is None:
                    outputs[sequence.request_id] = output
                    self._step_outputs.append(output)
                else:
                    earlier.new_token_ids.extend(output.new_token_ids)
                    earlier.finished, earlier.finish_reason = output.finished, output.finish_reason
            for sequence in sequences:
                if not sequence.is_finished:
                    self.block_manager.commit(sequence)
            pass_seconds = self.clock() - started
            elapsed += pass_seconds
            passes.append((step_tokens(runner_chunks), pass_seconds))

    def recover(self, error: BaseException) -> list[StepOutput]:
        """After a failure of the step as a whole: end every request in flight with "error".

        Frees every KV block by rebuilding the scheduler and its block manager (their state may be
        half-updated), releases executor state, and leaves the engine ready for new requests. The
        cost model keeps its measurements: they come from steps that completed. Returns the outputs
        of the step so far plus one "error" output per request that was in flight.
        """
        # The detail goes to the log only: it may quote any request's data (a grammar, its text).
        logger.error(
            "engine step failed; ending the %d requests in flight %s",
            len(self._sequences),
            sorted(self._sequences),
            exc_info=error,
        )
        self.num_engine_failures += 1
        self._settle_executors()
        sequences = list(self._sequences.values())
        self._build_scheduler()
        if self.draft_choice is not None:
            self.draft_choice.steps_without_drafting = 0
        for sequence in sequences:
            sequence.status = SequenceStatus.FINISHED_ERROR
            sequence.block_table.clear()
            state = self._states.get(sequence.request_id)
            stats = (
                state.stats if state is not None else RequestStats(self.clock(), self.config.max_draft_tokens)
            )
            message = f"engine failure, request id {sequence.request_id}: the step serving it failed"
            self._step_outputs.append(
                StepOutput(sequence.request_id, [], True, "error", stats, error=message)
            )
            self.num_requests_failed += 1
            try:
                self._retire(sequence)
            except Exception:
                logger.exception("releasing %s after the failure failed", sequence.request_id)
        return self._step_outputs

    def _settle_executors(self) -> None:
        """Leave no inference pending in the target or the drafter after a failed step."""
        wait = getattr(self.target, "wait", None)
        if wait is not None:
            try:
                wait()
            except Exception:
                logger.debug("no target inference was pending", exc_info=True)
        recover = getattr(self.proposer, "recover", None)
        if recover is not None:
            try:
                recover()
            except Exception:
                logger.exception("the drafter did not recover")

    def _fail_request(self, sequence: Sequence, message: str, failed_constraint: bool = False) -> None:
        """End one request with "error" (its own failure); the rest of the batch goes on."""
        logger.warning("request %s failed: %s", sequence.request_id, message)
        state = self._states[sequence.request_id]
        self.scheduler.finish(sequence, SequenceStatus.FINISHED_ERROR)
        self._retire(sequence)
        self._step_outputs.append(
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

    def _drop_failed_proposals(
        self, chunks: list[ScheduledChunk], proposals: dict[str, Proposal]
    ) -> list[ScheduledChunk]:
        """End the requests whose drafting failed; return the chunks that remain for the target."""
        failed = {rid: p for rid, p in proposals.items() if p.error is not None}
        if not failed:
            return chunks
        kept = []
        for chunk in chunks:
            proposal = failed.get(chunk.sequence.request_id)
            if proposal is None or proposal.error is None:
                kept.append(chunk)
            else:
                del proposals[chunk.sequence.request_id]
                self._fail_request(chunk.sequence, proposal.error, proposal.failed_constraint)
        return kept

    # ------------------------------------------------------- parts of a step
    # (shared with xpuspec.engine.overlap, which runs them in another order)
    def _schedule(self) -> list[ScheduledChunk]:
        """Plan the step; return its chunks (the requests the scheduler ended go to the outputs)."""
        if self.draft_choice is not None:
            self.draft_choice.new_step()
        self._tree_paths = {}
        self._constraint_failures = {}
        scheduled = self.scheduler.schedule(self._choose_num_draft_tokens)
        for sequence in scheduled.preempted:
            self._states[sequence.request_id].stats.num_preemptions += 1
            self._on_preempted(sequence)
        for sequence in scheduled.admitted:
            stats = self._states[sequence.request_id].stats
            if stats.cached_tokens is None:  # the first admission: what the prompt found cached
                stats.cached_tokens = sequence.num_computed_tokens
                stats.cached_draft_tokens = sequence.num_draft_computed_tokens
        for sequence in scheduled.finished:
            # Ended by the scheduler: it can grow no further in this KV cache or context.
            state = self._states[sequence.request_id]
            self._step_outputs.append(StepOutput(sequence.request_id, [], True, "length", state.stats))
            self._retire(sequence)
        return scheduled.chunks

    def _accept_all(
        self,
        chunks: list[ScheduledChunk],
        runner_chunks: list[SequenceChunk],
        logits: np.ndarray,  # [sum num_logits, vocab]
        proposals: dict[str, Proposal],
    ) -> None:
        """Advance each chunk's sequence past the computed tokens and verify the ones that sample.

        A failure while verifying one sequence (NaN rows, its sampling) ends that request alone.
        """
        row = 0
        for chunk, runner_chunk in zip(chunks, runner_chunks, strict=True):
            sequence = chunk.sequence
            sequence.num_computed_tokens += chunk.num_tokens
            if runner_chunk.num_logits == 0:
                continue
            rows = logits[row : row + runner_chunk.num_logits]  # [1 + γ, vocab]
            row += runner_chunk.num_logits
            failure = self._constraint_failures.get(sequence.request_id)
            if failure is not None:
                self._fail_request(sequence, failure, failed_constraint=True)
                continue
            try:
                output = self._accept(sequence, rows, proposals.get(sequence.request_id))
            except structured.ConstraintFailure as error:
                self._fail_request(sequence, str(error), failed_constraint=True)
                continue
            except Exception as error:
                self._fail_request(sequence, f"sampling failed: {error}")
                continue
            self._step_outputs.append(output)
        for chunk in chunks:
            if not chunk.sequence.is_finished:
                # Verified: blocks now full of accepted tokens become reusable prefixes.
                self.block_manager.commit(chunk.sequence)

    def _on_preempted(self, sequence: Sequence) -> None:
        """A preempted sequence restarts from position 0: executors may drop its KV now."""
        self._release_kv(sequence.request_id)

    def _release_kv(self, request_id: str) -> None:
        release = getattr(self.target, "release", None)
        if release is not None:
            release(request_id)
        if self.proposer is not None:
            self.proposer.release(request_id)

    # ----------------------------------------------------------------- internals
    def _choose_num_draft_tokens(self, sequence: Sequence) -> int:
        """Drafts wanted for ``sequence`` this step: a chain's γ, or a tree's node budget."""
        if self.draft_choice is None:
            return 0
        return self.draft_choice.num_draft_tokens(sequence)

    def _propose(self, chunks: list[ScheduledChunk]) -> dict[str, Proposal]:
        if self.proposer is None:
            return {}
        choice = self.draft_choice
        assert choice is not None  # there is a proposer
        wanted = [c for c in chunks if c.num_draft_tokens > 0]
        choice.record_step(wanted)
        if not wanted:
            return {}
        guides = self._guides(wanted)
        forced = structured.forced_proposals(
            guides, {c.sequence.request_id: c.num_draft_tokens for c in wanted}
        )
        # Prompt-lookup drafts chosen at scheduling (DraftChoice), cut to the γ the scheduler
        # left room for; for guided requests too (cut at the first token the grammar forbids, below).
        lookups = {c.sequence.request_id: c for c in wanted if c.sequence.request_id in choice.lookups}
        proposals: dict[str, Proposal] = {
            request_id: Proposal(
                choice.lookups[request_id].token_ids[: chunk.num_draft_tokens],
                None,
                lookup_ngram=choice.lookups[request_id].ngram,
            )
            for request_id, chunk in lookups.items()
        }
        taken = forced.keys() | proposals.keys()
        drafting = [c for c in wanted if c.sequence.request_id not in taken]
        # Constrained requests never draft trees (DraftChoice), so the grammar masks only chains.
        trees = [c for c in drafting if c.sequence.request_id in choice.trees]
        chains = [c for c in drafting if c.sequence.request_id not in choice.trees]
        self._draft_timings = []
        started = self.clock()
        failed_rollbacks: dict[str, Proposal] = {}
        self._draft_mask_failures = set()
        try:
            if chains:
                self.proposer.step_timings = []
                proposals.update(self.proposer.propose(chains, self._draw))
                self._draft_timings += self.proposer.step_timings
            if trees:
                rngs = {
                    c.sequence.request_id: self._states[c.sequence.request_id].rng
                    for c in trees
                    if not c.sequence.params.greedy
                }
                requests = [(c, choice.trees[c.sequence.request_id]) for c in trees]
                proposals.update(self.tree_drafter.propose(requests, rngs))
                self._draft_timings += self.tree_drafter.step_timings
        finally:
            self._drafting_seconds = self.clock() - started if drafting else 0.0
            # Back to the committed state, whatever the draft did.
            structured.end_drafting(guides, failed_rollbacks)
        for request_id in self._draft_mask_failures & proposals.keys():
            # The drafter ended it over its grammar's mask (_constrain_draft_logits).
            proposals[request_id] = dataclasses.replace(proposals[request_id], failed_constraint=True)
        if guides:
            structured.constrain_proposals(proposals, guides)  # n-gram drafts the grammar forbids
            proposals.update(forced)
            proposals.update(failed_rollbacks)
        if not drafting:  # lookups (or forced tokens) alone: no drafting phase to time
            return proposals
        # Per pass and by tokens computed: a catch-up pass after a stretch of γ = 0 computes many
        # tokens and must not read as an expensive single-token draft step. The wall time beyond
        # the passes is the draft loop's Python, which each drafted token also costs.
        lengths = {c.num_draft_tokens for c in chains}
        self.cost_model.record_drafting(
            self._draft_timings,
            self._drafting_seconds,
            len(drafting),
            gamma=lengths.pop() if len(lengths) == 1 and not trees else None,
        )
        return proposals

    def _constrain_draft_logits(self, request_id: str, drafted: list[int], logits: np.ndarray) -> np.ndarray:
        """A draft row ([1, draft vocab]) masked by the request's grammar after ``drafted`` drafts."""
        state = self._states.get(request_id)
        if state is None or state.guide is None:
            return logits
        try:
            return state.guide.mask_draft_logits(drafted, logits)
        except Exception as error:  # the drafter ends this request alone, with this message
            self._draft_mask_failures.add(request_id)
            raise structured.ConstraintFailure(structured.constraint_failure(error)) from error

    def _draw(self, request_id: str, position: int, probs_row: np.ndarray) -> int:
        """Sample a draft token at a sequence position: seeded requests race their position's noise."""
        state = self._states[request_id]
        if state.seed is None:
            return sample(probs_row, state.rng)
        return race(probs_row, position_exponentials(state.seed, position, probs_row.shape[0]))

    def _target_chunk(self, chunk: ScheduledChunk, proposal: Proposal | None) -> SequenceChunk:
        sequence = chunk.sequence
        start = sequence.num_computed_tokens
        token_ids = sequence.token_ids[start : start + chunk.num_tokens]
        num_logits = 1 if chunk.samples else 0
        tree_parents = None
        if proposal is not None and proposal.token_ids:
            token_ids = token_ids + proposal.token_ids
            num_logits += len(proposal.token_ids)
            if proposal.tree_parents is not None:
                # The root (the last token) and every node; each node attends to its ancestors.
                tree_parents = [-1] + [parent + 1 for parent in proposal.tree_parents]
        return SequenceChunk(
            token_ids=token_ids,
            past_length=start,
            block_table=sequence.block_table,
            num_logits=num_logits,
            sequence_id=sequence.request_id,
            tree_parents=tree_parents,
            padding=self.step_shape.fixed_padding(chunk, len(token_ids)),
        )

    def _accept(self, sequence: Sequence, rows: np.ndarray, proposal: Proposal | None) -> StepOutput:
        state = self._states[sequence.request_id]
        params = sequence.params
        if proposal is None and params.greedy and state.guide is None:
            # The commonest row (a greedy step without drafts, every pass of a decode burst) goes
            # straight to its token: right after an inference each extra call costs several µs.
            if self.proposer is not None:
                self._decay_acceptance(sequence.request_id)  # as below: decay toward the prior
            return self._emit(sequence, state, finite_argmax(rows, "target's logits for this request"))
        draft_ids = proposal.token_ids if proposal is not None else []
        is_tree = proposal is not None and proposal.tree_parents is not None and bool(draft_ids)
        # Greedy verification (chain or tree) refuses NaN rows in its own argmax pass; a grammar's
        # mask would hide NaN in the tokens it forbids, so guided rows are checked before it.
        if (not params.greedy or state.guide is not None) and not np.all(
            np.isfinite(rows.max(axis=-1))  # max propagates NaN
        ):
            raise ValueError("the target's logits for this request hold NaN or infinity")
        if state.guide is not None:
            rows = structured.mask_target_rows(rows, state.guide, draft_ids)
        num_drafted = len(draft_ids)
        if is_tree:
            result, num_drafted = self._verify_tree(sequence, rows, proposal, state)
        elif params.greedy:
            result = self.rejection_sampler.verify_greedy(draft_ids, rows)
        elif state.seed is not None:
            # Coupled verification: output independent of γ and of the batch (rejection_sampler).
            seed, first_position = state.seed, sequence.num_tokens
            vocab = rows.shape[1]
            result = self.rejection_sampler.verify_coupled(
                draft_ids,
                probabilities(rows, params),  # [1 + γ, vocab]
                lambda row: position_exponentials(seed, first_position + row, vocab),
            )
        else:
            target_probs = probabilities(rows, params)  # [1 + γ, vocab]
            draft_probs = proposal.probs if proposal is not None else None
            result = self.rejection_sampler.verify_sampled(draft_ids, draft_probs, target_probs, state.rng)
        sequence.num_computed_tokens += result.num_accepted
        sequence.num_draft_computed_tokens = min(
            sequence.num_draft_computed_tokens, sequence.num_computed_tokens
        )
        if draft_ids:
            assert proposal is not None
            if proposal.lookup_ngram and self.prompt_lookup is not None:
                self.prompt_lookup.update(
                    sequence.request_id, proposal.lookup_ngram, num_drafted, result.num_accepted
                )
                state.stats.record_lookup(num_drafted, result.num_accepted)
            else:
                self.acceptance.update(sequence.request_id, num_drafted, result.num_accepted)
            state.stats.record_verification(num_drafted, result.num_accepted)
        elif self.proposer is not None:
            # A step without drafts still decays the acceptance counts, so a sequence whose γ fell
            # to 0 drifts back to the prior and drafts again (deterministically for seeded ones).
            self._decay_acceptance(sequence.request_id)

        return self._emit(sequence, state, result.token_ids)

    def _decay_acceptance(self, request_id: str) -> None:
        """A step without drafts for ``request_id``: its acceptance counts decay (see _accept)."""
        self.acceptance.update(request_id, 0, 0)
        if self.prompt_lookup is not None:
            self.prompt_lookup.update(request_id, 0, 0, 0)

    def _emit(self, sequence: Sequence, state: _RequestState, token_ids: list[int]) -> StepOutput:
        """Append the verified ``token_ids`` (cut at end-of-sequence or max_tokens) and report them."""
        new_tokens, status = self._truncate(sequence, token_ids, state)
        if state.guide is not None:
            completed = structured.advance(state.guide, new_tokens)
            if completed is not None:
                # Complete, and nothing but end-of-sequence may follow: the output is whole, so the
                # request stops here (with ignore_eos it would repeat that token until max_tokens).
                new_tokens, status = new_tokens[:completed], SequenceStatus.FINISHED_STOPPED
            if status is not None:  # whether the output satisfies its constraint (a cut one does not)
                state.stats.constraint_complete = state.guide.is_accepting()
        sequence.append_tokens(new_tokens)
        now = self.clock()
        state.stats.record_tokens(len(new_tokens), now)
        if status is not None:
            self.scheduler.finish(sequence, status)
            self._retire(sequence)
        return StepOutput(
            request_id=sequence.request_id,
            new_token_ids=new_tokens,
            finished=status is not None,
            finish_reason=FINISH_REASONS.get(status) if status is not None else None,
            stats=state.stats,
        )

    def _verify_tree(
        self, sequence: Sequence, rows: np.ndarray, proposal: Proposal, state: _RequestState
    ) -> tuple[TreeVerification, int]:
        """Verify a tree, move the accepted path's KV to consecutive positions; return the result
        and the tree's depth (what acceptance rates and stats count as drafted)."""
        tree = DraftTree(proposal.token_ids, proposal.tree_parents, proposal.probs)
        if sequence.params.greedy:
            result = self.tree_acceptance.verify_greedy(tree, rows)
            self.tree_policy.record(*result.path_ranks(tree))
        else:
            result = self.tree_acceptance.verify_sampled(
                tree, probabilities(rows, sequence.params), state.rng
            )
        # Node i's KV sits at num_computed_tokens + i (the root is computed); the path's goes to
        # num_computed_tokens + 0, 1, ... Rejected nodes stay beyond num_computed_tokens, unread.
        first = sequence.num_computed_tokens
        self.target.move_kv(
            sequence.block_table,
            [first + node for node in result.accepted_nodes],
            [first + index for index in range(result.num_accepted)],
        )
        state.stats.record_tree(len(tree), result.num_accepted)
        self._tree_paths[sequence.request_id] = result.accepted_nodes
        return result, tree.depth

    def _truncate(
        self, sequence: Sequence, token_ids: list[int], state: _RequestState
    ) -> tuple[list[int], SequenceStatus | None]:
        """Cut the verified tokens at end-of-sequence or at max_tokens."""
        room = sequence.params.max_tokens - len(sequence.output_token_ids)
        kept: list[int] = []
        for token in token_ids[:room]:
            kept.append(token)
            if token in state.eos_token_ids:
                return kept, SequenceStatus.FINISHED_STOPPED
        if len(kept) >= room:
            return kept, SequenceStatus.FINISHED_LENGTH
        return kept, None

    def _retire(self, sequence: Sequence) -> None:
        self._states.pop(sequence.request_id, None)
        self._sequences.pop(sequence.request_id, None)
        self.acceptance.forget(sequence.request_id)
        if self.prompt_lookup is not None:
            self.prompt_lookup.forget(sequence.request_id)
        self._release_kv(sequence.request_id)
