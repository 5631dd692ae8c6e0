"""Autoscaling on ongoing requests: a burst scales the engine replicas 1 -> 2, idling back to 1.

Lives in its own module (it redeploys the application with an autoscaling config) and reads
Serve's own view of the replica states; the delays are short so that it takes seconds, not minutes.
"""

from __future__ import annotations

import threading

import pytest

from tests.cluster.conftest import RayCluster, fixed_replicas, wait_for
from xpuspec.cluster.application import ROUTER_CLASS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20"),
]

MODEL = "xpuspec-demo"
BURST = 8


def autoscaling_replicas() -> dict:
    return {
        "ray_actor_options": {"num_cpus": 1},
        "autoscaling_config": {
            "min_replicas": 1,
            "max_replicas": 2,
            "target_ongoing_requests": 2,
            "look_back_period_s": 1.0,
            "upscale_delay_s": 0.5,
            "downscale_delay_s": 2.0,
        },
        "request_router_config": {
            "request_router_class": ROUTER_CLASS,
            "request_routing_stats_period_s": 0.5,
        },
        "graceful_shutdown_timeout_s": 60,
    }


def test_a_burst_scales_up_and_idling_scales_back_down(ray_cluster: RayCluster) -> None:
    ray_cluster.deploy(autoscaling_replicas())
    wait_for(lambda: ray_cluster.running_replicas() == 1, 120, "one replica at rest")
    client = ray_cluster.openai(timeout=300)
    stop = threading.Event()
    finishes: list[str | None] = []
    lock = threading.Lock()

    def keep_busy(index: int) -> None:
        # Back-to-back long requests until the second replica runs, so the load outlasts its start.
        turn = 0
        while not stop.is_set():
            reply = client.completions.create(
                model=MODEL, prompt=f"Burst {index}.{turn}:", max_tokens=256, temperature=0.0,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            with lock:
                finishes.append(reply.choices[0].finish_reason)
            turn += 1

    threads = [threading.Thread(target=keep_busy, args=(index,), daemon=True) for index in range(BURST)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: ray_cluster.running_replicas() == 2, 180, "a second replica under the burst")
    finally:
        stop.set()
        for thread in threads:
            thread.join(300)
    assert not any(thread.is_alive() for thread in threads), "a request hangs"
    assert finishes and all(finish == "length" for finish in finishes), finishes
    wait_for(lambda: ray_cluster.running_replicas() == 1, 120, "back to one replica when idle")
    reply = client.completions.create(model=MODEL, prompt="Still there?", max_tokens=8, temperature=0.0)
    assert reply.choices[0].finish_reason == "length"


def test_scaling_down_drains_the_requests_of_the_replica_it_stops(ray_cluster: RayCluster) -> None:
    """Streams running on both replicas when the config drops to one replica all finish normally:
    the stopped replica gets no new requests and finishes its own first."""
    ray_cluster.deploy(fixed_replicas(2))
    wait_for(lambda: ray_cluster.running_replicas() == 2, 120, "two running replicas")
    client = ray_cluster.openai(timeout=300)
    started = threading.Semaphore(0)
    finishes: list[str | None] = []
    lock = threading.Lock()

    def stream(index: int) -> None:
        chunks = client.completions.create(
            model=MODEL, prompt=f"Drain {index}:", max_tokens=400, temperature=0.0, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        finish = None
        for number, chunk in enumerate(chunks):
            if number == 0:
                started.release()
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        with lock:
            finishes.append(finish)

    threads = [threading.Thread(target=stream, args=(index,), daemon=True) for index in range(6)]
    for thread in threads:
        thread.start()
    for _ in threads:
        assert started.acquire(timeout=120), "a stream never started"
    # Streams still running when the scale-down starts, spread over both replicas by load.
    assert sum(thread.is_alive() for thread in threads) >= 4
    ray_cluster.deploy(fixed_replicas(1))
    for thread in threads:
        thread.join(300)
    assert not any(thread.is_alive() for thread in threads), "a request hangs"
    assert finishes == ["length"] * 6
    wait_for(lambda: ray_cluster.running_replicas() == 1, 120, "one replica after the drain")
