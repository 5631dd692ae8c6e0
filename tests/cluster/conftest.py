"""A real Ray cluster on loopback (a head and one worker node, small resources) and the xpuspec
application on it, over the demo bundle, reached through Serve's HTTP proxy."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.conftest import F32
from tests.server.conftest import NUM_KV_BLOCKS, free_port, wait_until

APP_NAME = "xpuspec"
# Each node's object store: the smallest Ray accepts is far more than the events this app moves.
OBJECT_STORE_BYTES = 80 * 2**20
DEPLOY_TIMEOUT_S = 240.0
SETTINGS: dict[str, Any] = {"bundle": "demo", "properties": F32, "num_kv_blocks": NUM_KV_BLOCKS}


@dataclass
class RayCluster:
    http_port: int
    address: str  # the head's GCS, for `ray.init` / `serve run --address`

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def openai(self, timeout: float = 120.0):  # type: ignore[no-untyped-def]
        import openai

        # No retries: a 5xx must fail the test, not be hidden by a retry.
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0, timeout=timeout)

    def deploy(self, replica_options: dict[str, Any], **settings: Any) -> None:
        """Run the application (replacing the one running) and wait until it answers /health."""
        from ray import serve

        from xpuspec.cluster.application import application

        app = application({**SETTINGS, **settings}, replica_options)
        serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
        assert wait_until(self.healthy, DEPLOY_TIMEOUT_S, interval=0.5), (
            "the application did not become healthy"
        )

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.base_url}/health", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def running_replicas(self) -> int:
        from ray import serve

        status = serve.status().applications[APP_NAME].deployments["EngineReplica"]
        return int(status.replica_states.get("RUNNING", 0))


# Package scope: the cluster ends with the last test of tests/cluster. Kept for the whole session, its
# driver stayed connected in the pytest process through every later suite; CI runs then ended with exit
# status 127 while tests that use no Ray ran (.ci/run named one), the Ray processes' logs having
# stopped a few minutes before.
@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[RayCluster]:
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "object_store_memory": OBJECT_STORE_BYTES, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=2, object_store_memory=OBJECT_STORE_BYTES)
    ray.init(address=cluster.address, logging_level="warning", log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield RayCluster(port, cluster.address)
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()


def fixed_replicas(count: int, policy: str = "affinity") -> dict[str, Any]:
    """Replica options: ``count`` replicas, no autoscaling, the given routing policy."""
    from xpuspec.cluster.application import ROUTER_CLASS

    return {
        "num_replicas": count,
        "autoscaling_config": None,
        "ray_actor_options": {"num_cpus": 1},
        "request_router_config": {
            "request_router_class": ROUTER_CLASS,
            "request_router_kwargs": {"policy": policy},
            "request_routing_stats_period_s": 0.5,
        },
    }


def wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


# The real `xpuspec serve` over the same bundle, properties and cache size, for the parity checks.
from tests.server.conftest import demo_live_server  # noqa: E402,F401
