"""SSE coalescing: a Generation hands over batches, ``stream`` frames each batch in one write, with one
text chunk per choice, byte for byte what the chunk dicts give; finals are never held back."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import openai
import pytest

from tests.server.conftest import LiveServer
from xpuspec.api.engine_loop import _WAKE_ANY, _WAKE_FINAL, ChoiceEvent, EngineLoop, Generation
from xpuspec.server.responses import ResponseContext, _ChunkFrames, stream

TRICKY_TEXTS = [
    "",
    "plain",
    'quote " and \\ backslash',
    "line\nbreak\ttab\r",
    "é ü 中文 🙂",
    "\x00\x1f\x7f",
    "\u2028",
]


def generation(num_choices: int = 1) -> Generation:
    # An engine loop that is never started: Generation only queues aborts on it when cancelled.
    loop = EngineLoop(lambda: None, max_in_flight=8)  # type: ignore[arg-type,return-value]
    return Generation(loop, [f"req-{index}" for index in range(num_choices)])


def text_event(index: int, text: str) -> ChoiceEvent:
    return ChoiceEvent(index, text, 1)


def final_event(index: int, text: str = "", reason: str = "length") -> ChoiceEvent:
    return ChoiceEvent(index, text, 1, finish_reason=reason)


def data_lines(frame: str) -> list[str]:
    assert frame.endswith("\n\n")
    events = frame[:-2].split("\n\n")
    assert all(event.startswith("data: ") for event in events), frame
    return [event[len("data: ") :] for event in events]


@pytest.mark.parametrize("kind", ["completion", "chat"])
@pytest.mark.parametrize("include_usage", [False, True])
def test_text_frames_from_templates_equal_the_encoded_chunk(kind: str, include_usage: bool) -> None:
    frames = _ChunkFrames(
        ResponseContext(kind=kind, model='m"odel', num_prompt_tokens=3, num_choices=2), include_usage
    )  # type: ignore[arg-type]
    for index in (0, 1, 11):
        for text in TRICKY_TEXTS:
            assert frames.text(index, text) == frames.chunk(index, text, None)
            assert json.loads(data_lines(frames.text(index, text))[0])["choices"][0]["index"] == index


def test_take_events_returns_everything_delivered_in_order() -> None:
    gen = generation(2)
    gen.deliver([text_event(0, "a"), text_event(1, "b")])
    gen.deliver([text_event(0, "c")])
    assert [event.text for event in gen.take_events(timeout=1.0)] == ["a", "b", "c"]
    assert gen.take_events(timeout=0.01) == []
    assert not gen.done
    gen.deliver([final_event(0), final_event(1)])
    assert [event.final for event in gen.take_events(timeout=1.0)] == [True, True]
    assert gen.done


def test_held_text_waits_but_a_final_event_is_handed_over_at_once() -> None:
    gen = generation()
    gen.deliver([text_event(0, "a")])
    # Within the hold, text alone stays queued (the wait ends by its timeout, empty-handed).
    assert gen.take_events(timeout=0.05, hold_until=time.monotonic() + 60) == []
    taken: list[list[ChoiceEvent]] = []
    reader = threading.Thread(
        target=lambda: taken.append(gen.take_events(timeout=60, hold_until=time.monotonic() + 60))
    )
    reader.start()
    gen.deliver([text_event(0, "b")])  # does not wake the holding reader
    gen.deliver([final_event(0, "c")])  # does
    reader.join(timeout=30)
    assert not reader.is_alive(), "a final event did not end the hold"
    assert [event.text for event in taken[0]] == ["a", "b", "c"]
    assert gen.done


def test_a_reader_between_slow_steps_waits_for_events_and_still_holds_early_ones() -> None:
    gen = generation()
    gen.deliver([text_event(0, "a")])
    gen.deliver([text_event(0, "b")])
    assert [event.text for event in gen.take_events(timeout=1.0)] == ["a", "b"]
    gen._delivery_gap = 3600.0  # as if steps were an hour apart: far slower than the hold below
    taken: list[list[ChoiceEvent]] = []
    reader = threading.Thread(
        target=lambda: taken.append(gen.take_events(timeout=60, hold_until=time.monotonic() + 60))
    )
    reader.start()
    # With nothing to hold and the next step due after the hold ends, the reader sleeps until events
    # arrive (no timer at hold_until)...
    deadline = time.monotonic() + 30
    while gen._waiting_for != _WAKE_ANY and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gen._waiting_for == _WAKE_ANY
    # ...and text that still comes within the hold is held back until a final event.
    gen.deliver([text_event(0, "c")])
    while gen._waiting_for != _WAKE_FINAL and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gen._waiting_for == _WAKE_FINAL and reader.is_alive()
    gen.deliver([final_event(0, "d")])
    reader.join(timeout=30)
    assert not reader.is_alive(), "a final event did not end the hold"
    assert [event.text for event in taken[0]] == ["c", "d"]
    assert gen.done


def test_a_non_streamed_response_waits_for_finals_only() -> None:
    gen = generation(2)
    gen.deliver([text_event(0, "a"), text_event(1, "b")])
    assert gen.take_final_events(timeout=0.05) == []
    gen.deliver([final_event(1, "c")])
    assert [event.text for event in gen.take_final_events(timeout=30)] == ["a", "b", "c"]
    assert not gen.done
    assert gen.next_event(timeout=0.01) is None
    gen.deliver([final_event(0)])
    assert gen.next_event(timeout=30) is not None and gen.done


def frames_of(
    kind: str, num_choices: int, batches: list[list[ChoiceEvent]], include_usage: bool
) -> Iterator[str]:
    """Each batch delivered before the stream reads it, so every batch must become one frame."""
    gen = generation(num_choices)
    context = ResponseContext(kind=kind, model="m", num_prompt_tokens=3, num_choices=num_choices)  # type: ignore[arg-type]
    frames = stream(gen, context, include_usage, coalesce_s=0.0)
    if kind == "chat":
        yield next(frames)  # the role chunks, before any event
    for batch in batches:
        gen.deliver(batch)
        yield next(frames)
    assert list(frames) == []


def test_a_batch_becomes_one_frame_with_one_text_chunk_per_choice() -> None:
    batches = [
        [text_event(0, "a"), text_event(1, "x"), text_event(0, "b"), text_event(0, "c")],
        [text_event(1, "y"), final_event(0, "d", "stop")],
        [final_event(1, "", "length")],
    ]
    frames = list(frames_of("completion", 2, batches, include_usage=True))
    assert len(frames) == 3
    first = [json.loads(line) for line in data_lines(frames[0])]
    assert [(chunk["choices"][0]["index"], chunk["choices"][0]["text"]) for chunk in first] == [
        (0, "abc"),
        (1, "x"),
    ]
    assert all(chunk["usage"] is None and chunk["choices"][0]["finish_reason"] is None for chunk in first)
    second = [json.loads(line) for line in data_lines(frames[1])]
    # Choice 0 ends with its last text and finish_reason in one chunk; choice 1's text is still open.
    assert [
        (c["choices"][0]["index"], c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in second
    ] == [
        (0, "d", "stop"),
        (1, "y", None),
    ]
    # The last frame: choice 1's finish, then the usage chunk and [DONE], in one write.
    last = data_lines(frames[2])
    assert json.loads(last[0])["choices"][0] == {
        "index": 1,
        "text": "",
        "logprobs": None,
        "finish_reason": "length",
    }
    assert json.loads(last[1])["choices"] == [] and json.loads(last[1])["usage"]["prompt_tokens"] == 3
    assert last[2] == "[DONE]"


def test_a_stream_reads_its_hold_after_each_frame() -> None:
    """The hold may be a function (the server's load-scaled interval): asked after every frame."""
    gen = generation(1)
    context = ResponseContext(kind="completion", model="m", num_prompt_tokens=3, num_choices=1)
    asked: list[float] = []

    def hold() -> float:
        asked.append(time.monotonic())
        return 60.0

    frames = stream(gen, context, False, coalesce_s=hold)
    gen.deliver([text_event(0, "a")])
    assert json.loads(data_lines(next(frames))[0])["choices"][0]["text"] == "a"
    assert asked == []  # asked when the generator resumes after the frame, not before
    gen.deliver([text_event(0, "b")])
    finisher = threading.Timer(0.3, lambda: gen.deliver([final_event(0, "c")]))
    finisher.start()
    # Held for 60 s after "a": "b" waits for the final event and goes out with it, in one chunk.
    chunks = [json.loads(line) for line in data_lines(next(frames)) if line != "[DONE]"]
    finisher.join()
    assert len(asked) == 1
    assert [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in chunks] == [("bc", "length")]


def test_chat_batches_keep_content_then_finish_reason() -> None:
    frames = list(
        frames_of(
            "chat", 1, [[text_event(0, "he"), text_event(0, "llo"), final_event(0, "!", "stop")]], False
        )
    )
    assert json.loads(data_lines(frames[0])[0])["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    chunks = data_lines(frames[1])
    assert json.loads(chunks[0])["choices"][0]["delta"] == {"content": "hello!"}
    assert json.loads(chunks[1])["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert chunks[2] == "[DONE]"


def test_text_before_a_failure_is_sent_then_the_error_frame_and_done() -> None:
    failed = ChoiceEvent(0, "", 0, finish_reason="error", error="it broke")
    frames = list(
        frames_of("completion", 2, [[text_event(1, "x"), text_event(0, "a"), failed]], include_usage=True)
    )
    lines = data_lines(frames[0])
    assert [json.loads(line)["choices"][0]["text"] for line in lines[:2]] == ["x", "a"]
    assert json.loads(lines[2])["choices"][0]["finish_reason"] == "error"
    assert json.loads(lines[3])["error"]["code"] == "request_failed"
    assert lines[4] == "[DONE]"  # no usage chunk after a failure


def test_streams_through_the_official_client_equal_the_whole_response(
    openai_client: openai.OpenAI, live_server: LiveServer
) -> None:
    # The live server coalesces (its default interval): n = 2 greedy choices streamed, with usage.
    kwargs = dict(model=live_server.model, prompt="The quick brown fox", max_tokens=48, temperature=0, n=2,
                  extra_body={"ignore_eos": True})  # fmt: skip
    whole = openai_client.completions.create(**kwargs)
    chunks = list(
        openai_client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    )
    texts = ["", ""]
    reasons: list[list[str]] = [[], []]
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] += choice.text
        if choice.finish_reason:
            reasons[choice.index].append(choice.finish_reason)
    assert texts == [choice.text for choice in sorted(whole.choices, key=lambda c: c.index)]
    assert reasons == [["length"], ["length"]]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 96  # type: ignore[union-attr]
