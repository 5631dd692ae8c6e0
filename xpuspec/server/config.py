"""Settings of one API server: what it serves, who may call it, and how much it admits."""

from __future__ import annotations

from dataclasses import dataclass

DEMO_MODEL_NAME = "xpuspec-demo"


@dataclass
class ServerConfig:
    """HTTP-side limits and identity; the engine's own limits live in ``EngineConfig``.

    ``max_queue`` bounds the requests in flight (running or waiting for a batch slot; a request
    with ``n`` choices counts ``n``): beyond it new requests get 503 with Retry-After.
    """

    served_model_name: str = DEMO_MODEL_NAME
    api_key: str | None = None
    max_queue: int = 256
    max_body_bytes: int = 1 << 20
    max_choices: int = 64  # prompts x n of one request
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        if not self.served_model_name:
            raise ValueError("served_model_name must be a non-empty string")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must be None (no authentication) or a non-empty string")
        for name in ("max_queue", "max_body_bytes", "max_choices", "retry_after_s"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
