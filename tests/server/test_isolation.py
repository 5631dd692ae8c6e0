"""Issue 10's HTTP-visible cases, over a real server with the official `openai` client: a bad request
is a 400 that leaves the server healthy, a client that leaves is aborted with its KV freed, and a
seeded request does not depend on what runs beside it."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from tests.server.conftest import LiveServer, start_server, stop_server, wait_until

PROMPT = "The quick brown fox"
TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}


def metric(server: LiveServer, name: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        if key == name:
            return float(value)
    return 0.0  # a labelled counter appears only once it counted something


def assert_still_serving(client: openai.OpenAI, server: LiveServer) -> None:
    assert httpx.get(f"{server.base_url}/health", timeout=10).json() == {"status": "ok"}
    for temperature in (0.0, 0.7):
        completion = client.completions.create(
            model=server.model, prompt=PROMPT, max_tokens=6, temperature=temperature, seed=3,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert completion.usage is not None and completion.usage.completion_tokens == 6


@pytest.mark.parametrize(
    ("field", "value"), [("seed", -1), ("seed", 2**64), ("temperature", 1e-320), ("temperature", 5e-5)]
)
def test_an_out_of_range_seed_or_temperature_is_400_and_the_server_goes_on(
    openai_client: openai.OpenAI, live_server: LiveServer, field: str, value: float
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.completions.create(
            model=live_server.model, prompt=PROMPT, max_tokens=4, **{field: value}
        )
    assert refused.value.body["param"] == field  # type: ignore[index]
    assert_still_serving(openai_client, live_server)


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "m", "prompt": ' + b"[" * 1000 + b"]" * 1000 + b"}",
        b'{"model": "m", "prompt": "x", "seed": ' + b"7" * 5000 + b"}",
        b'{"model": "m", "prompt": "x", "temperature": NaN}',
        b'{"model": "m", "prompt": "x", "top_p": Infinity}',
    ],
    ids=["depth 1000", "5000-digit integer", "NaN", "Infinity"],
)
def test_hostile_json_is_400_not_500(
    openai_client: openai.OpenAI, live_server: LiveServer, body: bytes
) -> None:
    response = httpx.post(
        f"{live_server.base_url}/v1/completions",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_json"
    assert_still_serving(openai_client, live_server)


@pytest.mark.parametrize(
    ("param", "call"),
    [
        ("best_of", lambda c, m: c.completions.create(model=m, prompt="x", best_of=2)),
        ("suffix", lambda c, m: c.completions.create(model=m, prompt="x", suffix="end")),
        ("logit_bias", lambda c, m: c.completions.create(model=m, prompt="x", logit_bias={"5": 10})),
        ("echo", lambda c, m: c.completions.create(model=m, prompt="x", echo=True)),
        ("logprobs", lambda c, m: c.completions.create(model=m, prompt="x", logprobs=2)),
        (
            "repetition_penalty",
            lambda c, m: c.completions.create(model=m, prompt="x", extra_body={"repetition_penalty": 1.2}),
        ),
        (
            "logprobs",
            lambda c, m: c.chat.completions.create(
                model=m, messages=[{"role": "user", "content": "x"}], logprobs=True
            ),
        ),
    ],
)
def test_unsupported_parameters_are_400_naming_them(
    openai_client: openai.OpenAI, live_server: LiveServer, param: str, call
) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(openai.BadRequestError) as refused:
        call(openai_client, live_server.model)
    error = refused.value.body
    assert error["code"] == "unsupported_parameter" and error["param"] == param  # type: ignore[index]
    assert param in error["message"]  # type: ignore[index]


def test_tool_call_history_with_null_content_is_accepted(
    openai_client: openai.OpenAI, live_server: LiveServer
) -> None:
    completion = openai_client.chat.completions.create(
        model=live_server.model,
        messages=[
            {"role": "user", "content": "look it up"},
            {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": "call_1", "content": "42"},
            {"role": "user", "content": "so?"},
        ],
        max_completion_tokens=4,
        temperature=0,
    )
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].finish_reason in ("stop", "length")


def test_a_prompt_beyond_the_context_is_400_not_503(
    openai_client: openai.OpenAI, live_server: LiveServer
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.completions.create(model=live_server.model, prompt=[5] * 600, max_tokens=1)
    assert refused.value.body["code"] == "context_length_exceeded"  # type: ignore[index]


# A KV cache that holds a few of the choices below at once, never all 16 (the rest wait or are
# preempted, which is recomputed later): the request runs for thousands of steps, so it cannot end by
# itself before the client's disconnect is noticed, and no choice is ever alone in a cache too small.
ABORT_KV_BLOCKS = 96


@pytest.fixture(scope="module")
def abort_server(pair_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server of its own: the shared one's cache and counters see every other test's requests."""
    server = start_server(
        pair_bundle, tmp_path_factory.mktemp("abort") / "server.log",
        "--drafter", "none", "--num-kv-blocks", str(ABORT_KV_BLOCKS),
    )  # fmt: skip
    yield server
    stop_server(server)


def test_a_non_streaming_client_that_leaves_is_aborted_within_a_second(abort_server: LiveServer) -> None:
    n = 16
    body = json.dumps(
        {"model": abort_server.model, "prompt": PROMPT, "max_tokens": 480, "n": n, "temperature": 0,
         "ignore_eos": True}
    ).encode()  # fmt: skip
    cancelled = "xpuspec_requests_cancelled_total"
    cancelled_before = metric(abort_server, cancelled)
    finished_before = {
        reason: metric(abort_server, f'xpuspec_requests_finished_total{{finish_reason="{reason}"}}')
        for reason in ("length", "stop", "error")
    }
    sock = socket.create_connection(("127.0.0.1", abort_server.port), timeout=30)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    assert wait_until(lambda: abort_server.state()["kv_blocks_used"] > 0, 30, interval=0.01)
    state = abort_server.state()
    assert state["num_in_flight"] == n and state["num_running"] >= 1, state
    sock.close()
    left = time.monotonic()
    assert wait_until(lambda: abort_server.state()["num_in_flight"] == 0, 30, interval=0.01)
    aborted_after = time.monotonic() - left
    state = abort_server.state()
    assert state["kv_blocks_used"] == 0 and state["num_running"] == 0 and state["num_waiting"] == 0, state
    # Every choice was aborted (each counts once), none finished by itself.
    assert metric(abort_server, cancelled) - cancelled_before == n
    for reason, before in finished_before.items():
        assert metric(abort_server, f'xpuspec_requests_finished_total{{finish_reason="{reason}"}}') == before
    # That every choice was cancelled and none finished is the proof of the abort; the time is
    # reported, not asserted tightly (a loaded CI machine stretches it), only bounded well below
    # what running all 16 x 480 tokens takes.
    print(f"aborted {aborted_after * 1000:.0f} ms after the client left")
    assert aborted_after < 3.0
    client = openai.OpenAI(base_url=f"{abort_server.base_url}/v1", api_key="-", max_retries=0, timeout=60)
    assert_still_serving(client, abort_server)


# ------------------------------------------------------------------ seeded reproducibility
@pytest.fixture(scope="module")
def ngram_server(pair_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_server(pair_bundle, tmp_path_factory.mktemp("ngram") / "server.log", "--drafter", "ngram")
    yield server
    stop_server(server)


@pytest.mark.parametrize("drafter", ["draft", "ngram"])
def test_a_seeded_request_gives_the_same_tokens_alone_and_among_15_others(
    request: pytest.FixtureRequest, drafter: str
) -> None:
    server: LiveServer = request.getfixturevalue("live_server" if drafter == "draft" else "ngram_server")
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    seeded = dict(
        model=server.model, prompt="def fibonacci(n):", max_tokens=64, temperature=0.9, seed=20261130,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    alone = client.completions.create(**seeded).choices[0].text

    def other(index: int) -> str:
        # Long prompts and outputs that outlast the seeded one: together more than the KV cache
        # holds, so the engine cuts speculation lengths (and preempts) while the seeded one runs.
        return client.completions.create(
            model=server.model, prompt=f"other request {index} " * (6 + 4 * (index % 4)),
            max_tokens=200, temperature=0.3 * (index % 3), extra_body={"ignore_eos": True},
        ).choices[0].text  # fmt: skip

    with ThreadPoolExecutor(16) as pool:
        others = [pool.submit(other, index) for index in range(15)]
        among = pool.submit(lambda: client.completions.create(**seeded).choices[0].text)
        assert all(isinstance(future.result(), str) for future in others)
        assert among.result() == alone
