"""The Ray Serve application: one ingress running the server's Flask app, N engine replicas.

``build_app(args)`` is the application builder a Serve config names
(``import_path: xpuspec.cluster.application:build_app``); ``args`` are
:class:`~xpuspec.cluster.settings.ClusterSettings` fields. The deployments' defaults below (replica
resources, health checks, drain, the prefix-affinity router) are what a config's ``deployments:``
entries override, by the names :data:`INGRESS_NAME` and :data:`REPLICA_NAME`. Autoscaling on ongoing
requests is the config's (deploy/ray/serve_config.yaml); without it, one replica.

The ingress wraps the WSGI app in ASGI (a2wsgi) for Serve's HTTP proxy; its engine loop forwards
every prepared request to a replica through a streaming deployment handle
(:class:`~xpuspec.cluster.forwarding.ForwardingLoop`).
"""

from __future__ import annotations

import functools
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from xpuspec.cluster.forwarding import ForwardingLoop
from xpuspec.cluster.replica import EngineReplica
from xpuspec.cluster.reports import ReplicaMetricsCollector
from xpuspec.cluster.settings import ClusterSettings
from xpuspec.server.app import create_app
from xpuspec.server.state import server_state

INGRESS_NAME = "XpuspecIngress"
REPLICA_NAME = "EngineReplica"
ROUTER_CLASS = "xpuspec.cluster.router:PrefixAffinityRouter"
# Threads of the WSGI bridge: each open response holds one (a stream for its whole length).
WSGI_THREADS = 256
# Custom Ray resources a node with an Intel GPU or NPU declares (`ray start --resources`), so
# replicas that run there are placed there.
DEVICE_RESOURCES = {"GPU": "intel_gpu", "NPU": "intel_npu"}


class IngressServer:
    """The HTTP ingress: ``xpuspec.server``'s app with a forwarding engine loop."""

    def __init__(self, engine: DeploymentHandle, settings: dict[str, Any]) -> None:
        self._engine = engine
        self._settings = ClusterSettings.from_args(settings)
        self._app: Any = None

    def __serve_build_asgi_app__(self) -> Any:
        from a2wsgi import WSGIMiddleware

        app = create_app(
            self._settings.load_requests,
            self._settings.server_config(),
            make_loop=functools.partial(ForwardingLoop, handle=self._engine),
        )
        server_state(app).metrics.registry.register(ReplicaMetricsCollector())
        self._app = app
        # Flask's __call__ types its environ as a dict, a2wsgi's protocol as its Environ TypedDict.
        return WSGIMiddleware(app, workers=WSGI_THREADS)  # type: ignore[arg-type]  # environ types differ

    def check_health(self) -> None:
        error = server_state(self._app).loop.load_error if self._app is not None else None
        if error is not None:
            raise RuntimeError(f"the ingress could not load the model's text files: {error}")


def device_resources(settings: ClusterSettings) -> dict[str, float]:
    """The custom resources a replica asks for: one per Intel GPU or NPU it runs a model on."""
    resources: dict[str, float] = {}
    for device in (settings.target_device, settings.draft_device):
        name = DEVICE_RESOURCES.get(device.split(".")[0].upper())
        if name is not None:
            resources[name] = 1.0
    return resources


def replica_deployment(settings: ClusterSettings) -> Any:
    """The engine replicas' deployment with its defaults (a config's ``deployments`` override them)."""
    return serve.deployment(
        name=REPLICA_NAME,
        ray_actor_options={"num_cpus": 2, "resources": device_resources(settings)},
        # One replica unless the config scales (deploy/ray/serve_config.yaml's autoscaling_config): a
        # default autoscaling_config here would override a config's num_replicas.
        num_replicas=1,
        max_ongoing_requests=32,
        health_check_period_s=5,
        health_check_timeout_s=30,
        graceful_shutdown_wait_loop_s=1,
        graceful_shutdown_timeout_s=120,
        request_router_config=RequestRouterConfig(
            # Ray 2.60 types these pydantic fields wrongly (as dicts); the model takes these values.
            request_router_class=ROUTER_CLASS,  # type: ignore[arg-type]  # Ray 2.60 types it as a dict
            request_router_kwargs={"policy": "affinity"},
            request_routing_stats_period_s=1,  # type: ignore[arg-type]  # Ray 2.60 types it as a dict
            request_routing_stats_timeout_s=10,  # type: ignore[arg-type]  # Ray 2.60 types it as a dict
        ),
    )(EngineReplica)


def ingress_deployment() -> Any:
    return serve.deployment(
        name=INGRESS_NAME,
        num_replicas=1,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=WSGI_THREADS,
        health_check_period_s=5,
        graceful_shutdown_timeout_s=120,
    )(serve.ingress()(IngressServer))


def build_app(args: dict[str, Any] | None = None) -> Any:
    """The application: ``serve run xpuspec.cluster.application:build_app bundle=demo``, or a config."""
    return application(args)


def application(args: dict[str, Any] | None, replica_options: dict[str, Any] | None = None) -> Any:
    """The application with ``replica_options`` over the replicas' defaults (``Deployment.options``)."""
    settings = ClusterSettings.from_args(args)
    plain = dict(args or {})
    engine = replica_deployment(settings).options(**(replica_options or {})).bind(plain)
    return ingress_deployment().bind(engine, plain)
