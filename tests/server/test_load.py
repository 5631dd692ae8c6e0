"""Many concurrent clients, a quarter leaving mid-stream: no 5xx, every other request complete, no
KV block held afterwards."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai

from tests.server.conftest import LiveServer, wait_until

NUM_REQUESTS = 200
NUM_CLIENTS = 16


def test_200_requests_from_16_clients_with_a_quarter_cancelled(live_server: LiveServer) -> None:
    client = openai.OpenAI(
        base_url=f"{live_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120
    )
    plan = random.Random(0)
    kinds = ["cancel"] * (NUM_REQUESTS // 4) + ["stream"] * (NUM_REQUESTS * 3 // 8)
    kinds += ["whole"] * (NUM_REQUESTS - len(kinds))
    plan.shuffle(kinds)
    jobs = [(kind, plan.randint(4, 24), plan.choice([0.0, 0.8])) for kind in kinds]

    def run(job: tuple[str, int, float]) -> str:
        kind, max_tokens, temperature = job
        common = dict(
            model=live_server.model, prompt=f"request {max_tokens}", max_tokens=max_tokens,
            temperature=temperature, extra_body={"ignore_eos": True},
        )  # fmt: skip
        if kind == "whole":
            response = client.completions.create(**common)
            assert response.choices[0].finish_reason == "length"
            assert response.usage is not None and response.usage.completion_tokens == max_tokens
            return "complete"
        stream = client.completions.create(**common, stream=True, stream_options={"include_usage": True})
        if kind == "cancel":
            next(iter(stream))
            stream.close()
            return "cancelled"
        chunks = list(stream)
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert reasons == ["length"]
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == max_tokens
        return "complete"

    # An exception (a 5xx is openai.InternalServerError, no retries) fails the test via result().
    with ThreadPoolExecutor(NUM_CLIENTS) as pool:
        outcomes = [future.result() for future in [pool.submit(run, job) for job in jobs]]
    assert outcomes.count("complete") == NUM_REQUESTS - NUM_REQUESTS // 4
    assert outcomes.count("cancelled") == NUM_REQUESTS // 4

    def drained() -> bool:
        state = live_server.state()
        return state["num_in_flight"] == 0 and state["kv_blocks_used"] == 0 and state["num_running"] == 0

    assert wait_until(drained, 30), live_server.state()
    metrics = httpx.get(f"{live_server.base_url}/metrics", timeout=10).text
    # /health answered 503 while the model loaded; no other endpoint may have answered 5xx.
    server_errors = [
        line for line in metrics.splitlines() if 'status="5' in line and 'endpoint="/health"' not in line
    ]
    assert not server_errors
    assert httpx.get(f"{live_server.base_url}/health", timeout=10).status_code == 200
