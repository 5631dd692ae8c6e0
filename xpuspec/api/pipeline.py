"""The Python API: ``Pipeline`` loads a bundle onto devices and generates text.

from xpuspec import Pipeline, SamplingParams
pipe = Pipeline()                                   # the default model (SmolLM2 + draft) on the CPU
result = pipe.generate(["def add(a, b):"], SamplingParams(max_tokens=64, temperature=0.0))[0]
result.text, result.token_ids, result.finish_reason, result.stats
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
from collections.abc import Callable, Collection, Generator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xpuspec.api import calibration_cache
from xpuspec.api.cross_tokenizer_drafter import cross_tokenizer_proposer, draft_blocks, draft_options
from xpuspec.api.eagle3_drafter import eagle3_proposer
from xpuspec.api.engine_driver import EngineDriver, RequestStep
from xpuspec.api.engine_settings import engine_settings
from xpuspec.api.memory_budget import KVCacheSize, kv_cache_sizes, target_share, usable_blocks
from xpuspec.api.requests import Messages, RequestLimits, RequestPreparer, auto_drafter, load_grammar
from xpuspec.api.results import GenerationError, GenerationResult
from xpuspec.api.target_build import build_target, target_decode_lane, target_properties
from xpuspec.core.interfaces import Drafter
from xpuspec.devices.executors import compile_ahead, create_runner
from xpuspec.devices.placement import (
    Placement,
    choose_placement,
    recorded_properties,
    requested_drafter,
    resolve_device,
)
from xpuspec.devices.registry import default_registry
from xpuspec.engine.engine import EngineConfig, LLMEngine, StepOutput
from xpuspec.engine.overlap import overlap_wanted
from xpuspec.engine.strategy import PhaseHooks
from xpuspec.executor.properties import PropertiesArg, resolve_properties
from xpuspec.models.bundle import ModelBundle
from xpuspec.models.resolve import resolve_bundle
from xpuspec.sample.draft_tree import parse_draft_tree
from xpuspec.sample.dry import SequenceBreakers
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.spec_decode.proposal import DraftModelProposer, NgramDraftProposer
from xpuspec.structured.matcher import GrammarLimits
from xpuspec.text import ChatTemplate, Tokenizer

if TYPE_CHECKING:
    from xpuspec.core.block_manager import BlockManager
    from xpuspec.core.prefix_cache import PrefixCachingBlockManager
    from xpuspec.executor.eagle3_head import HeadFolder
    from xpuspec.spec_decode.policy import CostModel, PromptLookup, SpeculationLengthPolicy, TreeShapePolicy

logger = logging.getLogger(__name__)


class Pipeline:
    """A target (and optionally a draft) loaded on OpenVINO devices, behind one batching engine."""

    def __init__(
        self,
        bundle: str | Path | ModelBundle | None = None,
        target_device: str = "CPU",
        draft_device: str = "CPU",
        drafter: str = "auto",
        properties: PropertiesArg = None,
        *,
        draft_properties: PropertiesArg = None,
        engine_config: EngineConfig | None = None,
        num_kv_blocks: int | None = None,
        kv_cache_bytes: int | None = None,
        use_placement: bool = True,
        overlap: bool | None = None,
        enable_prefix_caching: bool = True,
        draft_tree: object = None,
        eagle3_head: str | Path | None = None,
        draft_vocab: int | None = None,
        startup_cache: bool = True,
        shared_lookup_tokens: int | None = None,
        grammar_limits: GrammarLimits | None = None,
        phase_hooks: PhaseHooks | None = None,
        max_tokens_default: int | None = None,
        target_decode_lane: bool = True,
    ):
        """``startup_cache``: keep the cost model's calibration timings in the xpuspec cache for later
        starts of the same setup on this machine (:mod:`xpuspec.api.calibration_cache`). False: time them.
        ``draft_vocab``: the draft proposes only the first ``draft_vocab`` ids of the shared vocabulary
        (its LM head is cut to them, :func:`xpuspec.executor.graph_edits.cut_logits_vocab`); default: what
        the bundle's manifest records for its draft (``xpuspec prepare --draft-vocab``), else all.
        ``grammar_limits``: what compiling one request's output constraint may cost (``GrammarLimits``).
        ``phase_hooks``: told the seconds of each phase of every engine step (a profiler); None: untimed.
        ``max_tokens_default``: the reply cap of requests that set no ``max_tokens``
        (:func:`~xpuspec.api.engine_settings.engine_settings`).
        ``kv_cache_bytes``: without ``num_kv_blocks``, the KV cache of the target and of a draft model
        together take about this many bytes (:mod:`xpuspec.api.memory_budget`); default: the
        executor's own budget for the target. ``target_decode_lane``: False keeps the target to one
        compiled copy where it would get two (:func:`~xpuspec.api.target_build.target_decode_lane`)."""
        drafter = requested_drafter(drafter, eagle3_head)
        self._target_lane_wanted = target_decode_lane
        # "exact" (f32 compute, f32 KV cache, no activation quantisation) or a dict of OpenVINO properties.
        properties = resolve_properties(properties)
        # The tree shape of requests that leave SamplingParams.draft_tree unset (None: chains).
        self.default_draft_tree = parse_draft_tree(draft_tree)
        draft_properties = resolve_properties(draft_properties)
        import openvino as ov

        # None: the default model; "demo": the demo pair; an opened bundle is used as it is.
        self.bundle = bundle if isinstance(bundle, ModelBundle) else resolve_bundle(bundle)
        core = ov.Core()
        registry = default_registry()
        requested = Placement(target_device, draft_device, drafter)
        eagle3_head = self._place(requested, use_placement, eagle3_head, core, registry)
        self._choose_devices(use_placement, core, registry)
        config = engine_settings(
            self.bundle, engine_config, max_tokens_default, enable_prefix_caching, shared_lookup_tokens
        )
        runner_limits = {"max_draft_tokens": config.max_draft_tokens, "max_sequences": config.max_num_seqs}
        runner_limits |= {"max_context": config.max_model_len, "core": core}
        self.draft_runner: Any = None  # a draft model's runner, once built
        finish = self._start_drafter(eagle3_head, draft_properties, properties, draft_vocab, runner_limits)
        budget = kv_cache_bytes if num_kv_blocks is None else None  # a block count given wins
        head = self._build_target(
            properties, eagle3_head, num_kv_blocks, runner_limits, self._target_bytes(budget)
        )
        self.proposer = finish(head)  # the drafter the engine drafts with (None: target only)
        config = self._within_budget(config, budget)
        self._build_engine(self.proposer, config, overlap, grammar_limits, phase_hooks)
        # The one driver of the engine's steps: inline in generate/stream/steps, or in a server's loop thread.
        self.driver = EngineDriver(self.engine, self.tokenizer)
        # What the calibration's timings depend on, beside the machine (calibration_cache.machine_facts).
        engine = {k: v for k, v in dataclasses.asdict(config).items() if k != "sampling_defaults"}
        head_path = str(eagle3_head) if eagle3_head is not None else None
        setup = dict(properties=properties, draft_properties=draft_properties, eagle3_head=head_path)
        self._calibrate(
            setup | dict(draft_vocab=draft_vocab, engine=engine, num_kv_blocks=num_kv_blocks), startup_cache
        )
        self._request_counter = itertools.count()
        # The stats of the last request that finished through `stream` (for the CLI's summary).
        self.last_stats: dict[str, Any] | None = None

    def _place(
        self,
        requested: Placement,
        use_placement: bool,
        eagle3_head: str | Path | None,
        core: Any,
        registry: Any,
    ) -> str | Path | None:
        """Settle the placement and the drafter (``self.placement``, ``self.drafter``); return the
        EAGLE-3 head folder, if the drafter is EAGLE-3."""
        # Arguments left at their defaults take the placement `xpuspec plan --write` recorded.
        self.placement = (
            choose_placement(self.bundle, requested, core, registry) if use_placement else requested
        )
        drafter = self.placement.drafter
        if drafter == "eagle3" and eagle3_head is None:  # the bundle's own head
            if self.bundle.eagle3 is None:
                raise ValueError(
                    f"{self.bundle.root} has no EAGLE-3 head; add one with `xpuspec prepare TARGET "
                    "--eagle3 HEAD_DIR -o BUNDLE`, or pass eagle3_head=<a head folder>"
                )
            eagle3_head = self.bundle.eagle3.path
        if eagle3_head is not None and drafter != "eagle3":
            raise ValueError(f"eagle3_head is given but the drafter is {drafter!r}: pass drafter='eagle3'")
        # The speculation length of requests that leave num_draft_tokens unset (None: adaptive).
        self.default_num_draft_tokens = self.placement.num_draft_tokens
        if drafter == "draft" and self.bundle.draft is None:
            raise ValueError(f"{self.bundle.root} has no draft model; use drafter='ngram' or 'none'")
        self.drafter = auto_drafter(self.bundle) if drafter == "auto" else drafter
        return eagle3_head

    def _choose_devices(self, use_placement: bool, core: Any, registry: Any) -> None:
        """The target's and the draft's devices, and the compile properties recorded for them."""
        drafter = self.drafter
        self.draft_vocab: int | None = None  # the draft model's proposal vocabulary, when cut
        self.target_device = resolve_device(self.placement.target_device, core, registry)
        self.draft_device = (
            resolve_device(self.placement.draft_device, core, registry)
            if drafter in ("draft", "eagle3")
            else None
        )
        # Compile properties `xpuspec plan --write` measured for each role on its device (the user's
        # own properties go on top; see xpuspec.executor.properties).
        self.tuned_properties: dict[str, dict[str, Any] | None] = {
            "target": recorded_properties(self.bundle, "target", self.target_device.device)
            if use_placement
            else None,
            "draft": recorded_properties(self.bundle, "draft", self.draft_device.device)
            if use_placement and drafter == "draft" and self.draft_device is not None
            else None,
        }

    def _build_target(
        self,
        properties: dict[str, Any] | None,
        eagle3_head: str | Path | None,
        num_kv_blocks: int | None,
        runner_limits: dict[str, Any],
        kv_cache_bytes: int | None = None,
    ) -> HeadFolder | None:
        """The target's executor (``self.target_runner``); returns the EAGLE-3 head read for its taps."""
        device = self.target_device
        options = dict(tuned_properties=self.tuned_properties["target"], num_blocks=num_kv_blocks)
        lane = self._target_lane_wanted and target_decode_lane(self.drafter, device.device)
        options |= dict(cache_bytes=kv_cache_bytes, decode_lane=lane, **runner_limits)
        chosen = target_properties(properties, self.drafter, device.device)
        self.target_runner, head = build_target(self.bundle, device, chosen, eagle3_head, options)
        return head

    def _within_budget(self, config: EngineConfig, budget: int | None) -> EngineConfig:
        """``config`` using no more KV blocks than both caches as built hold in ``budget`` bytes."""
        blocks = self.target_runner.num_blocks
        usable = usable_blocks(budget, self.kv_cache_sizes(blocks), blocks) if budget is not None else None
        return dataclasses.replace(config, max_kv_blocks=usable) if usable is not None else config

    def _target_bytes(self, budget: int | None) -> int | None:
        """The target's part of a KV budget shared with a draft model (None: no budget)."""
        if budget is None:
            return None
        draft_facts = self.bundle.draft.facts if self._drafts_with_model() and self.bundle.draft else None
        return int(budget * target_share(self.bundle.target.facts, draft_facts))

    def _drafts_with_model(self) -> bool:
        """Whether the drafter is the bundle's draft model (whose KV cache shares the target's blocks)."""
        return self.drafter != "eagle3" and self.draft_device is not None

    def kv_cache_sizes(self, num_blocks: int | None = None) -> list[KVCacheSize]:
        """The KV caches the models hold, as the engine uses them: ``num_blocks`` each (default: the
        engine's; ``memory_budget.kv_cache_sizes``)."""
        blocks = num_blocks if num_blocks is not None else self.engine.block_manager.num_blocks
        return kv_cache_sizes((("target", self.target_runner), ("draft", self.draft_runner)), blocks)

    def _start_drafter(
        self,
        eagle3_head: str | Path | None,
        draft_properties: PropertiesArg,
        properties: PropertiesArg,
        draft_vocab: int | None,
        runner_limits: dict[str, Any],
    ) -> Callable[[HeadFolder | None], Drafter | None]:
        """The drafter the placement chose (an EAGLE-3 head, a draft model, n-grams, or none), finished once
        the target is built. A draft model compiles meanwhile, in a thread: it needs only the target's KV
        blocks, taken after (a draft with its own tokenizer: none), so the start waits for one compile."""
        user = draft_properties if draft_properties is not None else properties
        if self.drafter == "eagle3":
            assert self.draft_device is not None  # the placement gives a head its device
            device, core, target = self.draft_device.device, runner_limits["core"], self.bundle.target.path
            return lambda head: eagle3_proposer(
                eagle3_head, head, target, device, user, core, self.target_runner
            )
        if self.draft_device is None:
            drafter = NgramDraftProposer() if self.drafter == "ngram" else None
            return lambda head: drafter
        draft_device, draft_model = self.draft_device, self.bundle.draft
        assert draft_model is not None  # the placement gives a device only to a bundle's draft
        self.draft_vocab = draft_vocab if draft_vocab is not None else draft_model.facts.get("draft_vocab")
        tuned = self.tuned_properties["draft"]
        options = dict(tuned_properties=tuned, logits_vocab=self.draft_vocab, **runner_limits)
        options, translates = draft_options(self.bundle, options)  # translates: its own cache, positions
        ahead = compile_ahead(draft_device, draft_model, "draft", user, **options)

        def finish(head: HeadFolder | None) -> Drafter:
            target = self.target_runner
            draft_runner = create_runner(
                draft_device,
                draft_model,
                "draft",
                user,
                **draft_blocks(translates, target),
                precompiled=ahead.result() if ahead is not None else None,
                **options,
            )
            self.draft_runner = draft_runner
            if translates:
                return cross_tokenizer_proposer(self.bundle, draft_runner, options["max_context"])
            if draft_runner.block_size != target.block_size:
                raise ValueError(
                    f"draft KV block size {draft_runner.block_size} differs from the target's "
                    f"{target.block_size}: put both models on devices with the same block size"
                )
            return DraftModelProposer(draft_runner, target.vocab_size)

        return finish

    def _build_engine(
        self,
        proposer: Drafter | None,
        config: EngineConfig,
        overlap: bool | None,
        grammar_limits: GrammarLimits | None,
        phase_hooks: PhaseHooks | None,
    ) -> None:
        """The engine over the target and the drafter, with grammar support (calibrated next), and the
        request preparer with the engine's limits (``self.requests``)."""
        # Overlapped draft/verify (xpuspec.engine.overlap): by default when the draft has its own device.
        # A draft that translates between tokenizers does not overlap (CrossTokenizerDrafter.caps).
        overlappable = proposer is not None and proposer.caps.overlappable
        draft_device_name = self.draft_device.device if overlappable and self.draft_device else None
        if self.drafter == "eagle3" and overlap:
            raise ValueError(
                "overlap=True needs a draft model: EAGLE-3 drafts from the step the target verifies"
            )
        self.overlap = overlap_wanted(overlap, self.target_device.device, draft_device_name)
        tokenizer = Tokenizer(self.bundle.target.path)
        grammar = load_grammar(self.bundle, tokenizer, self.vocab_size, grammar_limits)
        # The engine compiles each request's constraint again in add_request, from the same cache.
        self.engine = LLMEngine(
            self.target_runner,
            proposer,
            config,
            self.bundle.eos_token_ids,
            overlap=self.overlap,
            grammar=grammar,
            phase_hooks=phase_hooks,
            # DRY's breakers are the tokens whose text holds one: the texts are read on first use.
            sequence_breakers=SequenceBreakers(
                lambda: [tokenizer.token_to_text(token) for token in range(self.vocab_size)]
            ),
        )
        limits = RequestLimits(
            config.max_model_len, self.vocab_size, self.engine.block_manager.num_token_slots
        )
        self.requests = RequestPreparer(
            self.bundle,
            tokenizer,
            grammar,
            limits,
            drafter=self.drafter,
            default_draft_tree=self.default_draft_tree,
            sampling_defaults=config.sampling_defaults,
        )

    def _calibrate(self, setup: dict[str, Any], cached: bool) -> None:
        """Calibrate the engine's cost model, or (``cached``) replay the timings an earlier start with
        the same ``setup`` on this machine measured (:mod:`xpuspec.api.calibration_cache`)."""
        if cached:
            setup = {
                **setup,
                "bundle": str(self.bundle.root.resolve()),
                "manifest": self.bundle.manifest,
                "devices": [self.target_device.device, self.draft_device and self.draft_device.device],
                "drafter": self.drafter,
                "overlap": self.overlap,
                "target_decode_lane": self.target_runner.caps.decode_lane,  # changes of shape differ
            }
        calibration_cache.calibrate(self.engine, setup if cached else None)

    # ------------------------------------------------------------------ prompts
    @property
    def tokenizer(self) -> Tokenizer:
        return self.requests.tokenizer

    @property
    def chat_template(self) -> ChatTemplate | None:
        return self.requests.chat_template

    def apply_chat_template(self, messages: Messages) -> str:
        return self.requests.apply_chat_template(messages)

    @property
    def max_model_len(self) -> int:
        """Tokens one sequence may hold: prompt plus output."""
        return self.engine.config.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.target_runner.vocab_size

    def encode(self, prompt: str | Messages) -> list[int]:
        """Token ids of a text prompt, or of chat messages rendered with the chat template."""
        return self.requests.encode(prompt)

    # ------------------------------------------------------- what the engine holds
    @property
    def engine_config(self) -> EngineConfig:
        return self.engine.config

    @property
    def cost_model(self) -> CostModel:
        """The step costs the speculation policy weighs: calibrated, then refreshed by every step."""
        return self.engine.cost_model

    @property
    def length_policy(self) -> SpeculationLengthPolicy:
        """Chooses γ for requests that leave num_draft_tokens unset."""
        return self.engine.length_policy

    @property
    def tree_policy(self) -> TreeShapePolicy:
        """Chooses the tree shape of requests with draft_tree "auto"."""
        return self.engine.tree_policy

    @property
    def prompt_lookup(self) -> PromptLookup | None:
        """Drafts looked up in the prompt and the output so far (None: off)."""
        return self.engine.prompt_lookup

    @property
    def block_manager(self) -> BlockManager | PrefixCachingBlockManager:
        """The target's KV blocks (and, with prefix caching, the cached prompt prefixes)."""
        return self.engine.block_manager

    @property
    def num_engine_failures(self) -> int:
        """Engine steps that failed as a whole (every request in flight ended with "error")."""
        return self.engine.num_engine_failures

    def reset_prefix_cache(self) -> int:
        """Forget the cached prefixes no request holds (after a forward outside the engine wrote KV,
        as in timing one); return how many blocks were dropped."""
        return self.engine.reset_prefix_cache()

    # --------------------------------------------------------------- generation
    # --------------------------------------------------------------- generation
    def generate(
        self,
        prompts: str | Messages | Sequence[str | Messages],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[GenerationResult]:
        """Generate for every prompt at once (continuous batching); results in prompt order.

        ``params`` is one ``SamplingParams`` for all prompts or a list with one per prompt. A
        request that fails comes back with finish_reason "error" (and ``error``); the others complete.
        """
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], dict)
        ):
            prompts = [prompts]
        if isinstance(params, list):
            if len(params) != len(prompts):
                raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
            per_prompt = params
        else:
            per_prompt = [params or SamplingParams()] * len(prompts)
        order: list[str] = []
        try:
            for prompt, prompt_params in zip(prompts, per_prompt, strict=True):
                order.append(self._add(prompt, prompt_params))
        except ValueError:
            for request_id in order:  # nothing half-submitted stays in the engine
                self.driver.abort(request_id)
            raise
        texts = {request_id: "" for request_id in order}
        token_ids: dict[str, list[int]] = {request_id: [] for request_id in order}
        finished: dict[str, StepOutput] = {}
        with contextlib.closing(self.driver.run(order)) as steps:  # an exception aborts the unfinished
            for step in steps:
                request_id = step.output.request_id
                texts[request_id] += step.text
                token_ids[request_id] += step.output.new_token_ids
                if step.output.finished:
                    finished[request_id] = step.output
        outputs = [(texts[rid], token_ids[rid], finished[rid]) for rid in order]
        return [
            GenerationResult(t, ids, o.finish_reason, o.stats.as_dict(), o.error) for t, ids, o in outputs
        ]

    def stream(self, prompt: str | Messages, params: SamplingParams | None = None) -> Iterator[str]:
        """Yield the text of one request piece by piece as it is generated.

        Raises :class:`GenerationError` after the text so far when the request ends with "error".
        """
        request_id = self._add(prompt, params or SamplingParams())
        with contextlib.closing(self.driver.run([request_id])) as steps:  # closed early: aborted
            for step in steps:
                if step.text:
                    yield step.text
                output = step.output
                if output.finished:
                    self.last_stats = output.stats.as_dict()
                    if output.finish_reason == "error":
                        raise GenerationError(output.error or "the request failed")

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams) -> str:
        """Queue one request of token ids with ``params`` as they are (``generate`` fills in the
        pipeline's default γ and tree; this does not); return its id, for :meth:`steps` and
        :meth:`abort`. Raises ValueError, queueing nothing, if the engine refuses it."""
        request_id = f"pipe-{next(self._request_counter)}"
        self.driver.add(request_id, prompt_token_ids, params)
        return request_id

    def steps(self, request_ids: Collection[str]) -> Generator[RequestStep, None, None]:
        """Step the engine until these requests finish, yielding each step's output for them with its
        new text and time (for per-step figures: time to first token, inter-token latency). Closing
        the iterator early aborts the requests still unfinished."""
        return self.driver.run(request_ids)

    def abort(self, request_id: str) -> None:
        """End a queued or running request now, freeing its KV."""
        self.driver.abort(request_id)

    def _add(self, prompt: str | Messages, params: SamplingParams) -> str:
        if params.num_draft_tokens is None and self.default_num_draft_tokens is not None:
            params = dataclasses.replace(params, num_draft_tokens=self.default_num_draft_tokens)
        if params.draft_tree is None and self.default_draft_tree is not None:
            params = dataclasses.replace(params, draft_tree=self.default_draft_tree)
        return self.add_request(self.encode(prompt), params)
