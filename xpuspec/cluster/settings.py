"""The application's arguments (``args`` of a Serve config), as one frozen dataclass."""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from xpuspec.server.config import DEMO_MODEL_NAME, ServerConfig

# The bundle when the config's args name none: a container image says where its bundle lies (the
# Serve config stays the same on a laptop and in Kubernetes); unset, the default model.
BUNDLE_ENV = "XPUSPEC_BUNDLE"

if TYPE_CHECKING:
    from xpuspec.api.pipeline import Pipeline
    from xpuspec.api.requests import RequestPreparer


@dataclass(frozen=True)
class ClusterSettings:
    """What every replica loads and what the ingress serves.

    ``bundle``: None (``$XPUSPEC_BUNDLE``, else the default model), ``"demo"`` or a bundle folder
    present on every node.
    ``properties``: OpenVINO properties of both models (``{"INFERENCE_PRECISION_HINT": "f32"}``).
    ``replica_max_in_flight``: the engine loop's bound inside one replica; Serve's
    ``max_ongoing_requests`` bounds the HTTP requests a replica gets, and each may hold several choices.
    ``allowed_hosts``: the ``Host`` names the ingress answers beside loopback names and IP addresses;
    any by default, as clients reach it through Serve's proxy, a load balancer or a Service under
    names it cannot know (list them to refuse others). ``allowed_origins``: the browser origins
    whose pages may call it (none by default), as ``xpuspec serve --allowed-origins``.
    """

    bundle: str | None = None
    served_model_name: str | None = None
    target_device: str = "CPU"
    draft_device: str = "CPU"
    drafter: str = "auto"
    properties: Mapping[str, Any] = field(default_factory=dict)
    num_kv_blocks: int | None = None
    enable_prefix_caching: bool = True
    max_queue: int = 256
    replica_max_in_flight: int = 1024
    api_key: str | None = None
    allowed_hosts: tuple[str, ...] = ("*",)
    allowed_origins: tuple[str, ...] = ()

    @classmethod
    def from_args(cls, args: Mapping[str, Any] | None) -> ClusterSettings:
        """From a Serve config's ``args``; an unknown key is a ValueError naming it."""
        args = dict(args or {})
        if args.get("bundle") is None and os.environ.get(BUNDLE_ENV):
            args["bundle"] = os.environ[BUNDLE_ENV]
        known = {item.name for item in fields(cls)}
        unknown = sorted(set(args) - known)
        if unknown:
            raise ValueError(f"unknown application argument(s) {unknown}; known: {sorted(known)}")
        return cls(**args)

    def server_config(self) -> ServerConfig:
        from xpuspec.models.resolve import is_demo

        name = self.served_model_name
        if name is None:
            name = DEMO_MODEL_NAME if is_demo(self.bundle) else _bundle_name(self.bundle)
        return ServerConfig(
            served_model_name=name,
            api_key=self.api_key,
            max_queue=self.max_queue,
            allowed_hosts=tuple(self.allowed_hosts),
            allowed_origins=tuple(self.allowed_origins),
        )

    def load_pipeline(self) -> Pipeline:
        from xpuspec.api.pipeline import Pipeline

        pipeline = Pipeline(
            self.bundle,
            target_device=self.target_device,
            draft_device=self.draft_device,
            drafter=self.drafter,
            properties=dict(self.properties) or None,
            num_kv_blocks=self.num_kv_blocks,
            enable_prefix_caching=self.enable_prefix_caching,
        )
        gc.collect()
        gc.freeze()  # as `xpuspec serve` does: the loaded model stays out of the collector's walks
        return pipeline

    def load_requests(self) -> RequestPreparer:
        """What the ingress prepares requests with: the bundle's tokenizer, template and grammar
        compiler, the replicas' context and the drafter their placement settles on, and no weights.
        The KV cache is the replicas' own (unknown here): their engines refuse a prompt too long for it.
        """
        import openvino as ov

        from xpuspec.api.requests import RequestLimits, RequestPreparer, auto_drafter
        from xpuspec.devices.placement import Placement, choose_placement
        from xpuspec.devices.registry import default_registry
        from xpuspec.models.resolve import resolve_bundle

        bundle = resolve_bundle(self.bundle)
        # The replicas' Pipeline takes the placement the bundle records for arguments left at their
        # defaults; reading it opens no model.
        requested = Placement(self.target_device, self.draft_device, self.drafter)
        drafter = choose_placement(bundle, requested, ov.Core(), default_registry()).drafter
        limits = RequestLimits(max_model_len=bundle.max_context, vocab_size=bundle.target.vocab_size)
        return RequestPreparer.load(
            bundle, limits, drafter=auto_drafter(bundle) if drafter == "auto" else drafter
        )


def _bundle_name(bundle: str | None) -> str:
    """The name ``xpuspec serve`` gives the same bundle: the default model's, or the folder's."""
    if bundle is None:
        from xpuspec.models.default_model import SMOLLM2

        return SMOLLM2.name
    return os.path.basename(os.path.normpath(os.path.expanduser(bundle))) or DEMO_MODEL_NAME
