from __future__ import annotations

import random
from collections.abc import Iterator, Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xpuspec.core.block_manager import BlockManager
from xpuspec.core.scheduler import ScheduledChunk, Scheduler, SchedulerConfig, SchedulerOutput
from xpuspec.core.sequence import Sequence, SequenceStatus
from xpuspec.sample.sampling_params import SamplingParams

TOKEN = 7


def make_scheduler(num_blocks: int = 64, block_size: int = 4, **config: int | bool) -> Scheduler:
    config.setdefault("max_model_len", 128)
    return Scheduler(SchedulerConfig(**config), BlockManager(num_blocks, block_size))  # type: ignore[arg-type]


def make_sequence(request_id: str, num_prompt_tokens: int, max_tokens: int = 64) -> Sequence:
    return Sequence(request_id, [1] * num_prompt_tokens, SamplingParams(max_tokens=max_tokens))


def drafts(scheduler: Scheduler, num_draft_tokens: int) -> dict[str, int]:
    """The same γ wanted for every sequence the next step decodes."""
    return {seq.request_id: num_draft_tokens for seq in scheduler.will_decode()}


def apply(chunk: ScheduledChunk, num_accepted: int = 0) -> None:
    """What the engine does with a chunk's result: advance the KV counter, append sampled tokens."""
    seq = chunk.sequence
    seq.num_computed_tokens += chunk.num_tokens
    if chunk.samples:
        seq.num_computed_tokens += num_accepted
        seq.append_tokens([TOKEN] * (1 + num_accepted))


def step(scheduler: Scheduler, num_draft_tokens: int = 0) -> SchedulerOutput:
    output = scheduler.schedule(drafts(scheduler, num_draft_tokens))
    for chunk in output.chunks:
        apply(chunk)
    scheduler.check_invariants()
    return output


def chunk_of(output: SchedulerOutput, seq: Sequence) -> ScheduledChunk:
    (chunk,) = [chunk for chunk in output.chunks if chunk.sequence is seq]
    return chunk


# --- Sequence ---------------------------------------------------------------------------------------


def test_sequence_tracks_tokens_and_phases() -> None:
    seq = make_sequence("a", 3)
    assert seq.token_ids == [1, 1, 1] and seq.num_tokens == 3 and seq.is_prefilling
    seq.num_computed_tokens = 2
    assert not seq.is_prefilling
    seq.append_tokens([5, 6])
    assert seq.token_ids == [1, 1, 1, 5, 6]
    assert seq.output_token_ids == [5, 6] and seq.num_output_tokens == 2 and seq.last_token_id == 6
    assert seq.prompt_token_ids == [1, 1, 1]
    assert seq.is_prefilling  # two tokens lack KV now
    seq.num_draft_computed_tokens = 3
    seq.status = SequenceStatus.RUNNING
    seq.reset_for_recompute()
    assert (seq.num_computed_tokens, seq.num_draft_computed_tokens, seq.num_preemptions) == (0, 0, 1)
    assert seq.status is SequenceStatus.WAITING and seq.token_ids == [1, 1, 1, 5, 6]


def test_sequence_rejects_an_empty_prompt() -> None:
    with pytest.raises(ValueError, match="at least one token"):
        make_sequence("a", 0)


def test_finished_statuses() -> None:
    assert not SequenceStatus.WAITING.is_finished and not SequenceStatus.RUNNING.is_finished
    assert all(
        status.is_finished
        for status in (
            SequenceStatus.FINISHED_STOPPED,
            SequenceStatus.FINISHED_LENGTH,
            SequenceStatus.FINISHED_ABORTED,
        )
    )


# --- configuration and add() ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"max_model_len": 0}, "max_model_len must be an integer"),
        ({"max_model_len": 1}, "max_model_len must be >= 2"),
        ({"max_model_len": 64, "max_num_batched_tokens": 0}, "max_num_batched_tokens must be"),
        ({"max_model_len": 64, "max_num_seqs": 2.5}, "max_num_seqs must be"),
        ({"max_model_len": 64, "max_num_seqs": 32, "max_num_batched_tokens": 16}, "max_num_seqs \\(32\\)"),
        ({"max_model_len": 512, "enable_chunked_prefill": False}, "without chunked prefill"),
    ],
)
def test_config_rejects_bad_values(config: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**config)  # type: ignore[arg-type]


def test_add_rejects_prompts_that_can_never_run() -> None:
    scheduler = make_scheduler(num_blocks=4, block_size=4, max_model_len=32)
    with pytest.raises(ValueError, match="no room to generate"):
        scheduler.add(make_sequence("long", 32))
    with pytest.raises(ValueError, match="whole KV cache holds 16"):
        scheduler.add(make_sequence("too-big-for-cache", 17))
    scheduler.add(make_sequence("fits", 16))
    with pytest.raises(ValueError, match="already queued"):
        scheduler.add(make_sequence("fits", 3))
    used = make_sequence("used", 3)
    used.num_computed_tokens = 2
    with pytest.raises(ValueError, match="new, waiting sequence"):
        scheduler.add(used)
    assert scheduler.num_waiting == 1


# --- scheduling rules -------------------------------------------------------------------------------


def test_prefill_then_decode_with_drafts() -> None:
    scheduler = make_scheduler(block_size=4)
    seq = make_sequence("a", 5)
    scheduler.add(seq)
    output = step(scheduler, num_draft_tokens=3)
    assert output.chunks == [ScheduledChunk(seq, 5, 0, samples=True)]
    assert seq.status is SequenceStatus.RUNNING and seq.num_tokens == 6 and seq.num_computed_tokens == 5

    output = scheduler.schedule(drafts(scheduler, 3))
    assert output.chunks == [ScheduledChunk(seq, 1, 3, samples=True)]
    assert len(seq.block_table) * 4 >= 5 + 1 + 3
    assert scheduler.num_running == 1 and scheduler.kv_blocks_in_use == len(seq.block_table)


def test_long_prompt_is_prefilled_in_budget_sized_chunks() -> None:
    scheduler = make_scheduler(block_size=4, max_num_batched_tokens=8, max_num_seqs=2)
    seq = make_sequence("a", 20)
    scheduler.add(seq)
    sizes = []
    for _ in range(3):
        (chunk,) = step(scheduler).chunks
        sizes.append((chunk.num_tokens, chunk.samples))
        assert len(seq.block_table) == 5  # admission allocates the whole prompt at once
    assert sizes == [(8, False), (8, False), (4, True)]
    assert not seq.is_prefilling


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget() -> None:
    scheduler = make_scheduler(max_model_len=16, max_num_batched_tokens=16, enable_chunked_prefill=False)
    first, second = make_sequence("a", 10), make_sequence("b", 10)
    scheduler.add(first)
    scheduler.add(second)
    assert [chunk.sequence for chunk in step(scheduler).chunks] == [first]
    output = step(scheduler)
    assert chunk_of(output, second).num_tokens == 10  # after first's 1-token decode, 15 remain


def test_decodes_go_before_prefills_and_prefills_take_the_rest() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=8, max_num_seqs=4)
    decoding = make_sequence("a", 2)
    scheduler.add(decoding)
    step(scheduler)
    prefilling = make_sequence("b", 20)
    scheduler.add(prefilling)
    output = scheduler.schedule(drafts(scheduler, 2))
    assert output.chunks == [
        ScheduledChunk(decoding, 1, 2, samples=True),
        ScheduledChunk(prefilling, 5, 0, samples=False),
    ]


def test_every_decode_keeps_one_token_of_the_budget() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=8, max_num_seqs=4)
    sequences = [make_sequence(str(index), 2) for index in range(4)]
    for seq in sequences:
        scheduler.add(seq)
    step(scheduler)
    output = scheduler.schedule(drafts(scheduler, 10))
    assert [chunk.sequence for chunk in output.chunks] == sequences
    assert [chunk.num_draft_tokens for chunk in output.chunks] == [4, 0, 0, 0]
    assert output.num_scheduled_tokens == 8


def test_drafts_are_cut_to_max_model_len_and_max_tokens() -> None:
    scheduler = make_scheduler(max_model_len=10)
    near_model_len = make_sequence("a", 6)
    near_max_tokens = make_sequence("b", 2, max_tokens=3)
    scheduler.add(near_model_len)
    scheduler.add(near_max_tokens)
    step(scheduler)  # 7 and 3 tokens now
    output = scheduler.schedule(drafts(scheduler, 8))
    assert chunk_of(output, near_model_len).num_draft_tokens == 10 - 7 - 1
    assert chunk_of(output, near_max_tokens).num_draft_tokens == 3 - 1 - 1


def test_drafts_shrink_to_the_free_blocks_before_anything_is_preempted() -> None:
    scheduler = make_scheduler(num_blocks=3, block_size=2)
    seq = make_sequence("a", 3)
    scheduler.add(seq)
    step(scheduler)  # 4 tokens, 3 computed
    output = scheduler.schedule(drafts(scheduler, 5))
    assert output.chunks == [ScheduledChunk(seq, 1, 2, samples=True)]  # 6 slots: positions 3..5
    assert output.preempted == []


def test_max_num_seqs_caps_admission() -> None:
    scheduler = make_scheduler(max_num_seqs=2)
    for index in range(3):
        scheduler.add(make_sequence(str(index), 2))
    assert len(step(scheduler).chunks) == 2
    assert (scheduler.num_running, scheduler.num_waiting) == (2, 1)


def test_admission_is_first_come_first_served_without_skipping() -> None:
    scheduler = make_scheduler(num_blocks=4, block_size=2)
    running = make_sequence("running", 3)
    scheduler.add(running)
    step(scheduler)
    big, small = make_sequence("big", 7), make_sequence("small", 1)
    scheduler.add(big)  # needs 4 blocks, 2 are free
    scheduler.add(small)  # would fit, but arrived later
    output = step(scheduler)
    assert [chunk.sequence for chunk in output.chunks] == [running]
    assert scheduler.num_waiting == 2


def test_running_out_of_blocks_preempts_the_newest_sequence() -> None:
    scheduler = make_scheduler(num_blocks=4, block_size=2)
    old, new = make_sequence("old", 3), make_sequence("new", 3)
    scheduler.add(old)
    scheduler.add(new)
    step(scheduler)  # both prefilled: 4 tokens each, 2 blocks each, no block free
    step(scheduler)  # decodes at position 3 fit
    output_before = list(new.output_token_ids)
    output = step(scheduler)  # position 4 needs a fifth block
    assert [chunk.sequence for chunk in output.chunks] == [old]
    assert output.preempted == [new]
    assert new.status is SequenceStatus.WAITING and new.block_table == []
    assert (new.num_computed_tokens, new.num_draft_computed_tokens, new.num_preemptions) == (0, 0, 1)
    assert new.output_token_ids == output_before
    assert scheduler.waiting == (new,) and scheduler.running == (old,) and len(old.block_table) == 3

    scheduler.finish(old, SequenceStatus.FINISHED_STOPPED)
    output = step(scheduler)
    assert output.chunks == [ScheduledChunk(new, 5, 0, samples=True)]  # prompt + output re-prefilled
    assert new.num_computed_tokens == 5 and new.num_tokens == 6


def test_a_preempted_sequence_goes_back_before_later_arrivals() -> None:
    scheduler = make_scheduler(num_blocks=4, block_size=2, max_num_seqs=2)
    old, new, later = make_sequence("old", 3), make_sequence("new", 3), make_sequence("later", 1)
    for seq in (old, new, later):
        scheduler.add(seq)
    step(scheduler)
    step(scheduler)
    assert step(scheduler).preempted == [new]
    scheduler.finish(old, SequenceStatus.FINISHED_STOPPED)
    output = step(scheduler)
    assert [chunk.sequence for chunk in output.chunks] == [new, later]


def test_the_newest_sequence_preempts_itself() -> None:
    scheduler = make_scheduler(num_blocks=5, block_size=2)
    old, new = make_sequence("old", 3), make_sequence("new", 3)
    scheduler.add(old)
    scheduler.add(new)
    step(scheduler)
    step(scheduler)
    output = step(scheduler)  # one free block: old takes it, new has none left
    assert [chunk.sequence for chunk in output.chunks] == [old]
    assert output.preempted == [new]


def test_a_sequence_that_outgrows_the_whole_cache_finishes_by_length() -> None:
    scheduler = make_scheduler(num_blocks=2, block_size=2)
    seq = make_sequence("a", 3)
    scheduler.add(seq)
    step(scheduler)
    step(scheduler)  # 5 tokens: position 4 does not fit in 4 slots
    output = step(scheduler)
    assert output.chunks == [] and output.finished == [seq]
    assert seq.status is SequenceStatus.FINISHED_LENGTH and seq.block_table == []
    assert not scheduler.has_unfinished and scheduler.kv_blocks_in_use == 0


def test_nothing_is_admitted_in_a_step_that_preempted() -> None:
    scheduler = make_scheduler(num_blocks=4, block_size=2)
    old, new = make_sequence("old", 3), make_sequence("new", 3)
    scheduler.add(old)
    scheduler.add(new)
    step(scheduler)
    step(scheduler)
    scheduler.add(make_sequence("tiny", 1))
    output = step(scheduler)
    assert output.preempted == [new]
    assert [chunk.sequence.request_id for chunk in output.chunks] == ["old"]


def test_a_running_sequence_left_at_its_limit_is_finished_by_length() -> None:
    scheduler = make_scheduler()
    seq = make_sequence("a", 2, max_tokens=1)
    scheduler.add(seq)
    step(scheduler)  # the engine "forgets" to finish it after its only token
    output = scheduler.schedule(drafts(scheduler, 0))
    assert output.chunks == [] and output.finished == [seq]
    assert seq.status is SequenceStatus.FINISHED_LENGTH


def test_a_step_without_appended_tokens_is_an_engine_error() -> None:
    scheduler = make_scheduler()
    seq = make_sequence("a", 2)
    scheduler.add(seq)
    scheduler.schedule(drafts(scheduler, 0))
    seq.num_computed_tokens = 2  # computed, but the sampled token was never appended
    with pytest.raises(RuntimeError, match="must append"):
        scheduler.schedule(drafts(scheduler, 0))


def test_bad_draft_counts_are_rejected() -> None:
    scheduler = make_scheduler()
    scheduler.add(make_sequence("a", 2))
    step(scheduler)
    with pytest.raises(ValueError, match="draft length of 'a' is -1"):
        scheduler.schedule(drafts(scheduler, -1))


# --- draft lengths: decided before the step, passed in ----------------------------------------------


def test_the_draft_lengths_mapping_drives_each_decodes_gamma() -> None:
    scheduler = make_scheduler()
    for request_id in ("a", "b", "c"):
        scheduler.add(make_sequence(request_id, 2))
    step(scheduler)  # prefills: no γ asked
    assert [seq.request_id for seq in scheduler.will_decode()] == ["a", "b", "c"]
    output = scheduler.schedule({"a": 3, "c": 1})  # "b" missing: no drafts
    assert {chunk.sequence.request_id: chunk.num_draft_tokens for chunk in output.chunks} == {
        "a": 3,
        "b": 0,
        "c": 1,
    }


class _ReadOnlyLengths(Mapping[str, int]):
    """A mapping that records how it was used: the scheduler may only look lengths up."""

    def __init__(self, lengths: dict[str, int]) -> None:
        self.lengths = lengths
        self.looked_up: list[str] = []

    def __getitem__(self, request_id: str) -> int:
        self.looked_up.append(request_id)
        return self.lengths[request_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self.lengths)

    def __len__(self) -> int:
        return len(self.lengths)


def test_the_scheduler_only_reads_the_lengths_it_is_given() -> None:
    scheduler = make_scheduler()
    scheduler.add(make_sequence("a", 2))
    scheduler.add(make_sequence("b", 2))
    step(scheduler)
    lengths = _ReadOnlyLengths({"a": 2, "b": 4})
    output = scheduler.schedule(lengths)
    assert sorted(lengths.looked_up) == ["a", "b"]  # one look-up per decode, nothing called back
    assert [chunk.num_draft_tokens for chunk in output.chunks] == [2, 4]


def test_a_callable_for_draft_lengths_is_refused() -> None:
    """The scheduler never calls back for γ: the former callable is refused, not called."""
    scheduler = make_scheduler()
    scheduler.add(make_sequence("a", 2))
    step(scheduler)
    called: list[Sequence] = []

    def num_draft_tokens(seq: Sequence) -> int:
        called.append(seq)
        return 1

    with pytest.raises(TypeError, match="mapping"):
        scheduler.schedule(num_draft_tokens)  # type: ignore[arg-type]
    assert called == []


def test_will_decode_names_the_running_decodes_within_their_limits() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=8, max_num_seqs=4)
    scheduler.add(make_sequence("done", 2, max_tokens=1))
    scheduler.add(make_sequence("decoding", 2))
    scheduler.add(make_sequence("prefilling", 20))
    step(scheduler)  # the first two prefill whole; the long prompt gets the rest of the budget
    assert [seq.request_id for seq in scheduler.will_run()] == ["decoding", "prefilling"]
    assert [seq.request_id for seq in scheduler.will_decode()] == ["decoding"]


# --- abort and finish -------------------------------------------------------------------------------


def test_abort_works_in_any_state_and_frees_blocks() -> None:
    scheduler = make_scheduler(max_num_seqs=1)
    running, waiting = make_sequence("running", 5), make_sequence("waiting", 5)
    scheduler.add(running)
    scheduler.add(waiting)
    step(scheduler)
    assert scheduler.abort("waiting") and waiting.status is SequenceStatus.FINISHED_ABORTED
    assert scheduler.abort("running") and running.block_table == []
    assert not scheduler.abort("running")  # already finished
    assert not scheduler.abort("unknown")
    assert not scheduler.has_unfinished and scheduler.kv_blocks_in_use == 0
    scheduler.check_invariants()
    scheduler.add(make_sequence("running", 2))  # the id is free again


def test_finish_frees_blocks_and_checks_its_arguments() -> None:
    scheduler = make_scheduler()
    seq = make_sequence("a", 5)
    scheduler.add(seq)
    step(scheduler)
    with pytest.raises(ValueError, match="FINISHED_"):
        scheduler.finish(seq, SequenceStatus.RUNNING)
    with pytest.raises(ValueError, match="never added"):
        scheduler.finish(make_sequence("stranger", 2), SequenceStatus.FINISHED_STOPPED)
    scheduler.finish(seq, SequenceStatus.FINISHED_STOPPED)
    scheduler.finish(seq, SequenceStatus.FINISHED_LENGTH)  # already finished: kept as it was
    assert seq.status is SequenceStatus.FINISHED_STOPPED
    assert scheduler.num_running == 0 and scheduler.kv_blocks_in_use == 0
    scheduler.check_invariants()


# --- a simulated engine -----------------------------------------------------------------------------


@st.composite
def workloads(draw: st.DrawFn) -> dict[str, object]:
    # Small caches and several requests, so that preemption is common.
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    num_blocks = draw(st.integers(1, 16))
    max_model_len = draw(st.integers(2, 64))
    chunked = draw(st.booleans())
    budget = draw(st.integers(1, 48))
    if not chunked:
        budget = max(budget, max_model_len)
    max_num_seqs = draw(st.integers(1, min(budget, 8)))
    longest_prompt = min(max_model_len - 1, num_blocks * block_size)
    requests = draw(
        st.lists(
            st.tuples(
                st.integers(0, 8),  # arrival step
                st.integers(1, longest_prompt),
                st.integers(1, 24),  # max_tokens
                st.none() | st.integers(0, 6),  # fixed γ, or random every step
            ),
            min_size=2,
            max_size=10,
        )
    )
    return {
        "block_size": block_size,
        "num_blocks": num_blocks,
        "config": SchedulerConfig(
            max_model_len=max_model_len,
            max_num_batched_tokens=budget,
            max_num_seqs=max_num_seqs,
            enable_chunked_prefill=chunked,
        ),
        "requests": sorted(requests, key=lambda request: request[0]),
        "seed": draw(st.integers(0, 2**32 - 1)),
    }


def check_output(
    scheduler: Scheduler,
    output: SchedulerOutput,
    wanted_drafts: dict[str, int],
    num_outputs_before: dict[str, int],
) -> None:
    config, block_size = scheduler.config, scheduler.block_manager.block_size
    assert output.num_scheduled_tokens <= config.max_num_batched_tokens
    assert len({id(chunk.sequence) for chunk in output.chunks}) == len(output.chunks)
    for chunk in output.chunks:
        seq = chunk.sequence
        first = seq.num_computed_tokens
        assert seq.status is SequenceStatus.RUNNING
        assert chunk.num_tokens >= 1 and chunk.num_draft_tokens >= 0
        assert first + chunk.num_tokens <= seq.num_tokens
        assert chunk.samples == (first + chunk.num_tokens == seq.num_tokens)
        if chunk.num_draft_tokens:
            assert chunk.num_tokens == 1 and first == seq.num_tokens - 1
            assert chunk.num_draft_tokens <= wanted_drafts[seq.request_id]
        last_position = first + chunk.num_tokens + chunk.num_draft_tokens
        assert len(seq.block_table) * block_size >= last_position  # every position has a slot
        if chunk.samples:  # never produces more than the length limits allow
            assert seq.num_tokens + 1 + chunk.num_draft_tokens <= config.max_model_len
            assert seq.num_output_tokens + 1 + chunk.num_draft_tokens <= seq.params.max_tokens
    for seq in output.preempted:
        assert seq.status is SequenceStatus.WAITING and seq.block_table == []
        assert seq.num_computed_tokens == 0 and seq.num_draft_computed_tokens == 0
        assert seq.num_output_tokens == num_outputs_before[seq.request_id]  # generated tokens kept
        assert all(chunk.sequence is not seq for chunk in output.chunks)
    for seq in output.finished:
        assert seq.status is SequenceStatus.FINISHED_LENGTH and seq.block_table == []


def run_engine(workload: dict[str, object]) -> None:
    config: SchedulerConfig = workload["config"]  # type: ignore[assignment]
    num_blocks: int = workload["num_blocks"]  # type: ignore[assignment]
    block_manager = BlockManager(num_blocks, workload["block_size"])  # type: ignore[arg-type]
    scheduler = Scheduler(config, block_manager)
    rng = random.Random(workload["seed"])
    arrivals = list(workload["requests"])  # type: ignore[call-overload]
    fixed_drafts: dict[str, int | None] = {}
    sequences: list[Sequence] = []
    wanted_drafts: dict[str, int] = {}

    def draft_lengths() -> dict[str, int]:
        for seq in scheduler.will_decode():
            fixed = fixed_drafts[seq.request_id]
            wanted_drafts[seq.request_id] = fixed if fixed is not None else rng.randint(0, 6)
        return {seq.request_id: wanted_drafts[seq.request_id] for seq in scheduler.will_decode()}

    for step_index in range(3000):
        while arrivals and arrivals[0][0] <= step_index:
            _, num_prompt_tokens, max_tokens, fixed = arrivals.pop(0)
            seq = make_sequence(f"r{len(sequences)}", num_prompt_tokens, max_tokens)
            fixed_drafts[seq.request_id] = fixed
            sequences.append(seq)
            scheduler.add(seq)
        if not arrivals and not scheduler.has_unfinished:
            break
        num_outputs_before = {seq.request_id: seq.num_output_tokens for seq in sequences}
        had_work = scheduler.has_unfinished
        output = scheduler.schedule(draft_lengths())
        check_output(scheduler, output, wanted_drafts, num_outputs_before)
        assert not had_work or output.chunks or output.finished  # some progress every step

        for chunk in output.chunks:
            seq = chunk.sequence
            num_accepted = rng.randint(0, chunk.num_draft_tokens)
            apply(chunk, num_accepted)
            seq.num_draft_computed_tokens = seq.num_computed_tokens
            if not chunk.samples:
                continue
            if seq.num_tokens >= config.max_model_len or seq.num_output_tokens >= seq.params.max_tokens:
                scheduler.finish(seq, SequenceStatus.FINISHED_LENGTH)
            elif rng.random() < 0.05:  # end of sequence
                scheduler.finish(seq, SequenceStatus.FINISHED_STOPPED)
        if sequences and rng.random() < 0.05:
            victim = rng.choice(sequences)
            was_unfinished = not victim.is_finished
            assert scheduler.abort(victim.request_id) == was_unfinished

        scheduler.check_invariants()
        live_blocks = [block for seq in sequences if not seq.is_finished for block in seq.block_table]
        assert len(live_blocks) == len(set(live_blocks)) == block_manager.num_used_blocks
        assert all(not seq.block_table for seq in sequences if seq.is_finished)
    else:
        pytest.fail("the simulated engine did not finish every request in 3000 steps")

    assert all(seq.is_finished for seq in sequences)
    assert block_manager.num_free_blocks == num_blocks and scheduler.kv_blocks_in_use == 0
    block_manager.check_invariants()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads())
def test_a_simulated_engine_always_finishes_and_keeps_the_books(workload: dict[str, object]) -> None:
    run_engine(workload)


def test_a_tight_cache_preempts_and_still_finishes_everything() -> None:
    # One fixed heavy case, so preemption is exercised whatever hypothesis draws.
    requests = [(0, 5, 24, 4), (0, 6, 24, None), (1, 7, 24, 2), (2, 4, 24, 6), (3, 3, 24, None)]
    workload = {
        "block_size": 2,
        "num_blocks": 12,
        "config": SchedulerConfig(max_model_len=40, max_num_batched_tokens=16, max_num_seqs=4),
        "requests": requests,
        "seed": 3,
    }
    preemptions: list[int] = []
    original_reset = Sequence.reset_for_recompute

    def counting_reset(self: Sequence) -> None:
        preemptions.append(1)
        original_reset(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Sequence, "reset_for_recompute", counting_reset)
        run_engine(workload)
    assert preemptions
