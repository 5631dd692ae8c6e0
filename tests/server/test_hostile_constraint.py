"""A hostile constraint beside four unrelated streams, on the real server (issue 38, cases 1-2).

The hostile requests carry a secret in their constraint: a grammar that admits the secret and then
no token (it compiles, and dead-ends at run time), and one that can never start. The four streams
finish normally with the text they have without the hostile requests, and none of their bytes holds
any part of the hostile requests; the hostile ones end on their own, with their own message: a 400
at admission for the one that can never start, code ``constraint_failed`` at run time for the dead end.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.server.conftest import LiveServer

SECRET = "SECRET-CUSTOMER-12345"
DEAD_END = f'start: "{SECRET}" a\na: a'  # writes the secret, then nothing can follow
NEVER_STARTS = f'start: b "{SECRET}"\nb: b "x"'  # no token can start it
PROMPTS = ["The history of the city", "def parse(line):", "Once upon a time", "Ingredients: flour,"]
STREAM = dict(max_tokens=160, temperature=0.0, stream=True, ignore_eos=True)


def stream_raw(server: LiveServer, prompt: str, started: threading.Event | None = None) -> tuple[str, bytes]:
    """One streamed completion: its text and every byte the server sent."""
    body = {"model": server.model, "prompt": prompt, **STREAM}
    raw = b""
    text = []
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            raw += line.encode() + b"\n"
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                text.append(choice["text"])
                assert choice["finish_reason"] in (None, "length"), line
                if started is not None:
                    started.set()
    return "".join(text), raw


def hostile(client: openai.OpenAI, server: LiveServer, grammar: str, stream: bool) -> tuple[str, str]:
    """The hostile request's own outcome: (error code, message), or ("served", finish reason)."""
    try:
        result = client.completions.create(
            model=server.model, prompt="Tell me", max_tokens=48, temperature=0.0, stream=stream,
            extra_body={"guided_grammar": grammar},
        )  # fmt: skip
        if not stream:
            return "served", str(result.choices[0].finish_reason)  # type: ignore[union-attr]
        reasons = [chunk.choices[0].finish_reason for chunk in result if chunk.choices]  # type: ignore[union-attr]
        return "served", str(reasons[-1])
    except openai.APIError as error:
        if not stream:
            assert isinstance(error, openai.BadRequestError), error  # the client's constraint: a 400
        return str(error.code), str(error)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_four_streams_are_untouched_by_a_hostile_constraint(live_server: LiveServer, stream: bool) -> None:
    client = openai.OpenAI(
        base_url=f"{live_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120
    )
    with ThreadPoolExecutor(4) as pool:
        alone = list(pool.map(lambda prompt: stream_raw(live_server, prompt), PROMPTS))
    failures_before = live_server.state().get("engine_failures")
    started = [threading.Event() for _ in PROMPTS]
    with ThreadPoolExecutor(8) as pool:
        streams = [pool.submit(stream_raw, live_server, p, e) for p, e in zip(PROMPTS, started, strict=True)]
        assert all(event.wait(60) for event in started)  # all four in flight
        outcomes = [pool.submit(hostile, client, live_server, g, stream) for g in (DEAD_END, NEVER_STARTS)]
        beside = [future.result() for future in streams]
        dead_end, never_starts = (future.result() for future in outcomes)
    for (text_alone, _), (text_beside, raw) in zip(alone, beside, strict=True):
        assert text_beside == text_alone
        for part in (SECRET.encode(), b"SECRET", b"12345", b"start:", b"lark", b"grammar"):
            assert part not in raw
    # Each hostile request ended by itself: the one that can never start is refused at admission, the
    # dead end fails at run time with a message about its own constraint.
    assert never_starts[0] == "invalid_value" and "allows no output" in never_starts[1]
    assert dead_end[0] == "constraint_failed" and "output constraint failed" in dead_end[1]
    assert live_server.state().get("engine_failures") == failures_before
    assert httpx.get(f"{live_server.base_url}/health", timeout=10).status_code == 200
