"""Settings of one API server: what it serves, who may call it, and how much it admits."""

from __future__ import annotations

from dataclasses import dataclass, field

from xpuspec.models.resolve import DEMO_MODEL_NAME

# Text that arrives within this of a stream's previous text frame waits and shares the next frame.
# A frame wakes three threads (the HTTP worker, the server's socket loop, the client), and when the
# engine's OpenVINO threads hold every core, each wakeup preempts one of them and stalls its step:
# a few-ms interval cost one client a large share of its in-process tokens/s, and this one almost
# none (measured with ``python -m xpuspec.bench.http_parity --clients 1``:
# docs/experiments/2026-12-01-http-streaming.md). 25 ms is 40 frames a second, smoother than text
# needs; the first and last frames are never held.
DEFAULT_STREAM_INTERVAL_S = 0.025
# Ollama's tag for "the one version there is": `name:latest` names the same model as `name`.
LATEST_TAG = ":latest"
# With many streams open, each one's frames come further apart: this much per open stream, up to
# MAX_STREAM_INTERVAL_S. With 16 streams the wider interval won back most of what a fixed few-ms one
# lost (``--clients 16``, same doc): 48 ms at 16 streams is still 20 frames a second.
DEFAULT_STREAM_INTERVAL_PER_STREAM_S = 0.003
MAX_STREAM_INTERVAL_S = 0.05


@dataclass
class ServerConfig:
    """HTTP-side limits and identity; the engine's own limits live in ``EngineConfig``.

    ``max_queue`` bounds the requests in flight (running or waiting for a batch slot; a request
    with ``n`` choices counts ``n``): beyond it new requests get 503 with Retry-After, and a single
    request with more choices than that gets 400 (it could never be admitted).
    ``model_aliases`` are further names requests may use for the served model; responses and the
    listings (``/v1/models``, ``/api/tags``) name ``served_model_name`` only, once.
    ``stream_interval_s`` is the least time between two text frames of one stream: tokens that come
    faster (several engine steps within it) share a frame, which saves the server and the client a
    frame each; a choice's last frame is never held back, and 0 sends every step's tokens at once.
    ``stream_interval_per_stream_s`` lengthens it with the number of streams open, up to
    :data:`MAX_STREAM_INTERVAL_S` (0: a fixed interval; see :meth:`stream_interval_for`).
    ``allowed_hosts`` are ``Host`` names answered beside loopback names and IP addresses (``*``: any;
    ``xpuspec serve`` adds its ``--host``), ``allowed_origins`` browser origins answered beside the
    server's own (``scheme://host[:port]``, ``*`` a wildcard): see ``xpuspec.server.origins``.
    """

    served_model_name: str = DEMO_MODEL_NAME
    model_aliases: tuple[str, ...] = field(default_factory=tuple)
    api_key: str | None = None
    max_queue: int = 256
    max_body_bytes: int = 1 << 20
    max_choices: int = 64  # prompts x n of one request
    retry_after_s: int = 1
    stream_interval_s: float = DEFAULT_STREAM_INTERVAL_S
    stream_interval_per_stream_s: float = DEFAULT_STREAM_INTERVAL_PER_STREAM_S
    allowed_hosts: tuple[str, ...] = field(default_factory=tuple)
    allowed_origins: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.served_model_name:
            raise ValueError("served_model_name must be a non-empty string")
        self.model_aliases = tuple(self.model_aliases)
        if not all(isinstance(alias, str) and alias for alias in self.model_aliases):
            raise ValueError(f"model_aliases must be non-empty strings, got {self.model_aliases!r}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must be None (no authentication) or a non-empty string")
        for name in ("max_queue", "max_body_bytes", "max_choices", "retry_after_s"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.allowed_hosts = tuple(self.allowed_hosts)
        self.allowed_origins = tuple(self.allowed_origins)
        for origin in self.allowed_origins:
            if not isinstance(origin, str) or (origin != "*" and "://" not in origin):
                raise ValueError(f"an allowed origin is scheme://host[:port] or *, got {origin!r}")
        if not all(isinstance(host, str) and host for host in self.allowed_hosts):
            raise ValueError(f"allowed_hosts must be non-empty strings, got {self.allowed_hosts!r}")
        for name in ("stream_interval_s", "stream_interval_per_stream_s"):
            interval = getattr(self, name)
            if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 <= interval <= 1:
                raise ValueError(f"{name} must be a number of seconds in [0, 1], got {interval!r}")

    def stream_interval_for(self, num_streams: int) -> float:
        """The least time between two text frames of a stream while ``num_streams`` streams are open:
        ``stream_interval_s``, or ``stream_interval_per_stream_s`` per stream where that is longer, at
        most :data:`MAX_STREAM_INTERVAL_S` (unless ``stream_interval_s`` itself is longer)."""
        scaled = min(self.stream_interval_per_stream_s * num_streams, MAX_STREAM_INTERVAL_S)
        return max(self.stream_interval_s, scaled)

    @property
    def model_names(self) -> tuple[str, ...]:
        """The served name first, then each alias once."""
        return tuple(dict.fromkeys((self.served_model_name, *self.model_aliases)))

    def serves(self, name: str) -> bool:
        """Whether a request's ``name`` names the served model: its name or an alias, on every route
        with or without Ollama's ``:latest`` tag (``/api/tags`` lists ``NAME:latest``)."""
        return name in self.model_names or name.removesuffix(LATEST_TAG) in self.model_names
