"""The application on a real local Ray cluster (head + worker), two replicas of the demo bundle:
the official client through the ingress, routing by prefix affinity, a replica killed under load
(its streams held open at a gate until the kill, so the outcome does not depend on timing)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.cluster.conftest import APP_NAME, RayCluster, fixed_replicas, wait_for
from tests.server.conftest import LiveServer
from xpuspec.api.engine_loop import ChoiceEvent, ChoiceRequest
from xpuspec.cluster.replica import EngineReplica

if TYPE_CHECKING:
    from ray.actor import ActorHandle

pytestmark = [
    pytest.mark.slow,
    # Ray Serve's own config models use a pydantic idiom pydantic deprecates.
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20"),
]

MODEL = "xpuspec-demo"
NUM_CONVERSATIONS = 8
# Filler that puts each first turn over a few KV blocks (the demo's block holds 32 tokens).
FILLER = "The harbour was quiet in the morning and the boats rocked slowly at their moorings. " * 4


@pytest.fixture(scope="module")
def two_replicas(ray_cluster: RayCluster) -> RayCluster:
    ray_cluster.deploy(fixed_replicas(2))
    wait_for(lambda: ray_cluster.running_replicas() == 2, 120, "two running replicas")
    return ray_cluster


def test_official_client_gets_the_same_greedy_text_as_xpuspec_serve(
    two_replicas: RayCluster, demo_live_server: LiveServer
) -> None:
    import openai

    cluster = two_replicas.openai()
    local = openai.OpenAI(
        base_url=f"{demo_live_server.base_url}/v1", api_key="unused", max_retries=0, timeout=60
    )
    prompt = "def fibonacci(n):"
    request = {"prompt": prompt, "max_tokens": 24, "temperature": 0.0}
    expected = local.completions.create(model=demo_live_server.model, **request).choices[0].text
    assert expected
    got = cluster.completions.create(model=MODEL, **request)
    assert got.choices[0].text == expected
    assert got.model == MODEL and got.usage is not None and got.usage.completion_tokens == 24

    streamed = cluster.completions.create(model=MODEL, stream=True, **request)
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == expected

    messages = [{"role": "user", "content": "Name three colours."}]
    chat_expected = local.chat.completions.create(
        model=demo_live_server.model, messages=messages, max_tokens=16, temperature=0.0
    )
    chat = cluster.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0.0)
    assert chat.choices[0].message.content == chat_expected.choices[0].message.content
    chat_stream = cluster.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0.0, stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chat_stream if chunk.choices)
    assert text == chat_expected.choices[0].message.content


def test_validation_errors_are_the_servers(two_replicas: RayCluster) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as raised:
        two_replicas.openai().completions.create(model=MODEL, prompt="x", max_tokens=8, temperature=-1.0)
    assert raised.value.body["param"] == "temperature"  # type: ignore[index]


def second_turn_hits(cluster: RayCluster, salt: str) -> int:
    """8 two-turn conversations, interleaved: all first turns at once, then all second turns.
    Returns how many second turns found prompt tokens in the cache of the replica they reached."""
    client = cluster.openai()

    def turn(prompt: str) -> Any:
        return client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0.0)

    firsts = [f"# conversation {index} ({salt})\n{FILLER}" for index in range(NUM_CONVERSATIONS)]
    with ThreadPoolExecutor(NUM_CONVERSATIONS) as pool:
        replies = list(pool.map(turn, firsts))
        seconds = [
            first + reply.choices[0].text + f"\n# and then, question {index}:\n"
            for index, (first, reply) in enumerate(zip(firsts, replies, strict=True))
        ]
        answers = list(pool.map(turn, seconds))
    return sum(answer.usage.prompt_tokens_details.cached_tokens > 0 for answer in answers)


def router_counts(cluster: RayCluster) -> dict[str, float]:
    counts = {}
    for line in httpx.get(f"{cluster.base_url}/metrics", timeout=10).text.splitlines():
        if line.startswith("xpuspec_router_requests_total{"):
            outcome = line.split('outcome="')[1].split('"')[0]
            counts[outcome] = float(line.rsplit(" ", 1)[1])
    return counts


def test_second_turns_reach_the_replica_that_holds_their_prefix(two_replicas: RayCluster) -> None:
    before = router_counts(two_replicas)
    hits = second_turn_hits(two_replicas, salt="affinity")
    after = router_counts(two_replicas)
    routed = {outcome: after[outcome] - before.get(outcome, 0) for outcome in after}
    print(f"prefix-affinity routing: {hits}/{NUM_CONVERSATIONS} second turns hit the cache; routed {routed}")
    assert hits >= NUM_CONVERSATIONS - 1
    assert after["affinity"] - before.get("affinity", 0) >= NUM_CONVERSATIONS - 1


def test_random_routing_is_the_baseline(ray_cluster: RayCluster) -> None:
    """The same conversations with the router's random policy: the figure the docs compare with."""
    ray_cluster.deploy(fixed_replicas(2, policy="random"))
    wait_for(lambda: ray_cluster.running_replicas() == 2, 120, "two running replicas")
    before = router_counts(ray_cluster)
    hits = second_turn_hits(ray_cluster, salt="random")
    print(f"random routing: {hits}/{NUM_CONVERSATIONS} second turns hit the cache")
    after = router_counts(ray_cluster)
    assert after["random"] - before.get("random", 0) == 2 * NUM_CONVERSATIONS
    assert after["affinity"] == before.get("affinity", 0)
    ray_cluster.deploy(fixed_replicas(2))  # back to affinity for the tests after this one
    wait_for(lambda: ray_cluster.running_replicas() == 2, 120, "two running replicas")


def test_each_replicas_metrics_are_labelled_by_replica(two_replicas: RayCluster) -> None:
    from xpuspec.cluster.reports import REPLICA_LABEL

    def labelled() -> set[str]:
        text = httpx.get(f"{two_replicas.base_url}/metrics", timeout=10).text
        return {
            line.split(f'{REPLICA_LABEL}="')[1].split('"')[0]
            for line in text.splitlines()
            if line.startswith("xpuspec_kv_cache_blocks_total{")
        }

    wait_for(lambda: len(labelled()) == 2, 30, "both replicas' metrics at the ingress")


# Where the test's stream gate lives (a named actor the gated replicas look up).
GATE_NAME, GATE_NAMESPACE = "xpuspec-test-stream-gate", "xpuspec-tests"
NUM_STREAMS = 16


class StreamGate:
    """Holds every stream after its first events until the test opens it; records which replica
    (Ray actor name) held each, so the test kills a replica that has open streams on it."""

    def __init__(self) -> None:
        self._opened = asyncio.Event()
        self._holders: list[str] = []

    async def hold(self, replica: str) -> None:
        self._holders.append(replica)
        await self._opened.wait()

    def holders(self) -> list[str]:
        return list(self._holders)

    def open(self) -> None:
        self._opened.set()


class GatedReplica(EngineReplica):
    """The real engine replica whose streams wait at the test's gate after their first events: the
    engine generates on, but no stream can finish before the test has killed a replica. The events
    keep their order; a final event that came with the first ones waits behind the gate with the rest."""

    async def generate(self, choices: list[ChoiceRequest]) -> AsyncIterator[list[ChoiceEvent]]:
        import ray

        gate = ray.get_actor(GATE_NAME, namespace=GATE_NAMESPACE)
        replica = ray.get_runtime_context().get_actor_name()
        held = False
        async for events in super().generate(choices):
            if held:
                yield events
                continue
            held = True
            first_final = next((at for at, event in enumerate(events) if event.final), len(events))
            if first_final:
                yield events[:first_final]
            await gate.hold.remote(replica)
            if events[first_final:]:
                yield events[first_final:]


@pytest.fixture
def gated_replicas(two_replicas: RayCluster) -> Iterator[tuple[RayCluster, ActorHandle]]:
    """Two gated replicas and their open-able gate; two plain replicas again afterwards."""
    import ray
    from ray import serve

    gate = ray.remote(num_cpus=0)(StreamGate).options(name=GATE_NAME, namespace=GATE_NAMESPACE).remote()
    try:
        two_replicas.deploy({**fixed_replicas(2), "func_or_class": GatedReplica})

        def rolled_out() -> bool:
            deployment = serve.status().applications[APP_NAME].deployments["EngineReplica"]
            return deployment.status == "HEALTHY" and two_replicas.running_replicas() == 2

        wait_for(rolled_out, 120, "two gated replicas")
        yield two_replicas, gate
    finally:
        ray.get(gate.open.remote())
        two_replicas.deploy(fixed_replicas(2))
        wait_for(lambda: two_replicas.running_replicas() == 2, 120, "two running replicas")
        ray.kill(gate)


def test_a_replica_killed_under_load_fails_its_requests_clearly_and_is_replaced(
    gated_replicas: tuple[RayCluster, ActorHandle],
) -> None:
    import openai
    import ray

    cluster, gate = gated_replicas
    client = cluster.openai(timeout=120)
    outcomes: list[str] = []
    lock = threading.Lock()

    def stream(index: int) -> None:
        try:
            chunks = client.completions.create(
                model=MODEL, prompt=f"Story {index}: once upon a time", max_tokens=64, temperature=0.0,
                stream=True, extra_body={"ignore_eos": True},
            )  # fmt: skip
            finish = None
            for chunk in chunks:
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            outcome = f"finished:{finish}"
        except openai.APIError as error:
            outcome = f"error:{error.message}"
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=stream, args=(index,), daemon=True) for index in range(NUM_STREAMS)]
    for thread in threads:
        thread.start()
    # Every stream has reached a replica, sent its first events and waits at the gate: none can end.
    wait_for(lambda: len(ray.get(gate.holders.remote())) == NUM_STREAMS, 120, "every stream at the gate")
    assert not outcomes, outcomes
    held = Counter(ray.get(gate.holders.remote()))
    victim, num_on_victim = held.most_common(1)[0]
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    ray.get(gate.open.remote())
    for thread in threads:
        thread.join(180)
    assert not any(thread.is_alive() for thread in threads), "a request hangs"
    assert len(outcomes) == NUM_STREAMS
    errors = [outcome for outcome in outcomes if outcome.startswith("error:")]
    assert len(errors) == num_on_victim, (held, outcomes)
    assert all("engine replica failed" in error for error in errors), errors
    assert outcomes.count("finished:length") == NUM_STREAMS - num_on_victim, outcomes

    wait_for(lambda: cluster.running_replicas() == 2, 180, "Serve to replace the replica")
    time.sleep(2)  # the router learns of the new replica set
    for index in range(4):
        reply = client.completions.create(
            model=MODEL, prompt=f"After {index}:", max_tokens=8, temperature=0.0
        )
        assert reply.choices[0].finish_reason in ("length", "stop")
