"""Fault injection through the server's EngineLoop (issue 10, Done-when bullet 1).

Eight streaming requests run at once on the demo bundle at exact precision. One of them meets a
fault: NaN logits rows, a detokenizer or a stop-string matcher that raises. The other seven must
stream exactly the text of a clean run; the faulty one ends with finish_reason "error"; no KV block
is held afterwards. A failure of a whole step ends every request with "error", is counted in the
snapshot, and the next requests are served as if nothing happened.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support.faults import EXACT, FaultyRunner, RaisingDetokenizer, RaisingStopMatcher, fail_nth
from xpuspec.api import request_text as request_text_module
from xpuspec.api.engine_loop import ChoiceRequest, EngineLoop, Generation
from xpuspec.api.pipeline import Pipeline
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.text import IncrementalDetokenizer, StopStringMatcher

PROMPTS = [
    "def add(a, b):",
    "import os\n",
    "for i in range(10):",
    "class Point:",
    "The quick brown fox",
    "return a + b",
    "x = 1\ny = 2\n",
    "if __name__ == '__main__':",
]
FAULTY = 2
TIMEOUT_S = 120.0


def params(stop: list[str] | None = None) -> list[SamplingParams]:
    return [
        SamplingParams(
            max_tokens=20,
            temperature=0.0 if index % 2 == 0 else 0.8,
            seed=None if index % 2 == 0 else 40 + index,
            ignore_eos=True,
            num_draft_tokens=4,
            stop=stop or [],
        )
        for index in range(len(PROMPTS))
    ]


@dataclass
class Outcome:
    text: str
    num_tokens: int
    finish_reason: str | None
    error: str | None


def collect(generation: Generation) -> Outcome:
    pieces: list[str] = []
    num_tokens = 0
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        event = generation.next_event(timeout=1.0)
        if event is None:
            continue
        pieces.append(event.text)
        num_tokens += event.num_new_tokens
        if event.final:
            return Outcome("".join(pieces), num_tokens, event.finish_reason, event.error)
    raise AssertionError("a request never finished")


def submit(loop: EngineLoop, stop: list[str] | None = None) -> list[Generation]:
    assert loop.pipeline is not None
    return [
        loop.submit([ChoiceRequest(0, loop.pipeline.encode(prompt), request_params)])
        for prompt, request_params in zip(PROMPTS, params(stop), strict=True)
    ]


def run(loop: EngineLoop, stop: list[str] | None = None) -> list[Outcome]:
    """Submit the eight requests as eight streams at once; return how each ended."""
    return [collect(generation) for generation in submit(loop, stop)]


def assert_no_kv_held(loop: EngineLoop) -> None:
    assert loop.wait_idle(10)
    assert loop.pipeline is not None
    engine = loop.pipeline.engine
    assert engine.num_requests == 0 and engine.block_manager.num_used_blocks == 0
    # The snapshot is refreshed after the last event of an iteration is queued.
    deadline = time.monotonic() + 5
    while loop.snapshot.kv_blocks_used and time.monotonic() < deadline:
        time.sleep(0.05)
    assert loop.snapshot.kv_blocks_used == 0


@pytest.fixture(scope="module", params=["draft", "ngram", "overlap"])
def loop(request) -> Iterator[EngineLoop]:
    drafter = "ngram" if request.param == "ngram" else "draft"
    engine_loop = EngineLoop(
        lambda: Pipeline("demo", drafter=drafter, properties=EXACT, overlap=request.param == "overlap"),
        max_in_flight=64,
    )
    engine_loop.start()
    assert engine_loop.ready.wait(TIMEOUT_S) and engine_loop.load_error is None, engine_loop.load_error
    yield engine_loop
    engine_loop.stop()


@pytest.fixture(scope="module")
def clean(loop) -> list[Outcome]:
    outcomes = run(loop)
    assert all(o.finish_reason == "length" and o.num_tokens == 20 for o in outcomes)
    return outcomes


def assert_others_clean(outcomes: list[Outcome], clean: list[Outcome]) -> None:
    for index, (outcome, expected) in enumerate(zip(outcomes, clean, strict=True)):
        if index != FAULTY:
            assert outcome == expected, index
    assert outcomes[FAULTY].finish_reason == "error" and outcomes[FAULTY].error


def test_nan_rows_of_one_sequence_end_it_alone(loop, clean):
    engine = loop.pipeline.engine
    faulty_prompt = loop.pipeline.encode(PROMPTS[FAULTY])
    target = FaultyRunner(engine.target)
    # Called in the loop thread, the only one that touches the engine.
    target.poison = lambda sid: (
        getattr(engine.scheduler.get(sid or ""), "prompt_token_ids", None) == faulty_prompt
    )
    assert loop.wait_idle(10)
    engine.target = target
    try:
        outcomes = run(loop)
    finally:
        engine.target = target._runner
    assert_others_clean(outcomes, clean)
    assert "NaN" in outcomes[FAULTY].error
    assert_no_kv_held(loop)
    assert loop.snapshot.engine_failures == engine.num_engine_failures


@pytest.mark.parametrize("part", ["detokenizer", "stop matcher"])
def test_a_text_failure_of_one_request_ends_it_alone(loop, clean, monkeypatch, part):
    if part == "detokenizer":
        factory = fail_nth(IncrementalDetokenizer, RaisingDetokenizer, FAULTY)
        monkeypatch.setattr(request_text_module, "IncrementalDetokenizer", factory)
    else:
        factory = fail_nth(StopStringMatcher, RaisingStopMatcher, FAULTY)
        monkeypatch.setattr(request_text_module, "StopStringMatcher", factory)
    outcomes = run(loop, stop=["\x00never\x00"])  # every request gets a matcher; none stops
    assert_others_clean(outcomes, clean)
    assert "injected" in outcomes[FAULTY].error
    assert_no_kv_held(loop)


def test_a_failed_step_ends_every_request_then_new_ones_work(loop, clean):
    engine = loop.pipeline.engine
    failures, failed = engine.num_engine_failures, engine.num_requests_failed
    loop_failed = loop.snapshot.requests_failed  # every error end so far, earlier tests' included
    target = FaultyRunner(engine.target)
    # Fail the first inference with all eight in flight. The first inference waits until all are
    # submitted, so none can finish before the last is admitted, however fast the machine.
    target.hold = threading.Event()
    target.fail_when = lambda: engine.num_requests == len(PROMPTS)
    assert loop.wait_idle(10)
    engine.target = target
    try:
        generations = submit(loop)
        target.hold.set()
        outcomes = [collect(generation) for generation in generations]
    finally:
        engine.target = target._runner
    assert {o.finish_reason for o in outcomes} == {"error"}
    # Each client hears of its own request only; the failure's detail is in the server log alone.
    assert all(o.error.startswith("engine failure, request id req-") for o in outcomes)
    assert not any("injected inference failure" in o.error for o in outcomes)
    assert_no_kv_held(loop)
    assert engine.num_engine_failures == failures + 1
    assert engine.num_requests_failed == failed + len(PROMPTS)
    assert loop.snapshot.engine_failures == failures + 1
    assert loop.snapshot.requests_failed == loop_failed + len(PROMPTS)
    assert loop.stepping
    assert run(loop) == clean


def test_a_rejected_request_leaves_no_trace_in_the_loop(loop, clean):
    bad = SamplingParams(max_tokens=8, seed=3)
    bad.seed = -1  # past SamplingParams' own check: the engine must refuse it whole
    generation = loop.submit([ChoiceRequest(0, [1, 2, 3], bad)])
    outcome = collect(generation)
    assert outcome.finish_reason == "error" and "seed" in outcome.error
    assert_no_kv_held(loop)
    assert run(loop) == clean


def test_stepping_follows_the_loop_thread():
    engine_loop = EngineLoop(lambda: Pipeline("demo", drafter="none", properties=EXACT), max_in_flight=4)
    assert not engine_loop.stepping
    engine_loop.start()
    assert engine_loop.ready.wait(TIMEOUT_S)
    time.sleep(0.3)  # idle: the loop still iterates every IDLE_WAIT_S
    assert engine_loop.stepping and time.monotonic() - engine_loop.last_iteration < 1.0
    engine_loop.stop()
    assert not engine_loop.stepping


def test_queued_requests_and_aborts_end_a_decode_burst():
    """The loop hands every step its interrupt: True while a command waits to be taken."""
    engine_loop = EngineLoop(lambda: Pipeline("demo", drafter="none", properties=EXACT), max_in_flight=4)
    engine_loop.start()
    assert engine_loop.ready.wait(TIMEOUT_S)
    assert engine_loop.pipeline is not None
    engine = engine_loop.pipeline.engine
    interrupts = []
    original_step = engine.step

    def recording_step(interrupt=None):
        interrupts.append(interrupt)
        return original_step(interrupt=interrupt)

    engine.step = recording_step
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    assert collect(engine_loop.submit([ChoiceRequest(0, [1, 2, 3], params)])).finish_reason == "length"
    engine_loop.stop()  # nothing takes the queue from now on
    assert interrupts and all(interrupt == engine_loop.has_waiting_commands for interrupt in interrupts)
    assert not engine_loop.has_waiting_commands()
    engine_loop.abort("nobody")
    assert engine_loop.has_waiting_commands()
