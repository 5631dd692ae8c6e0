"""Which ``Host`` names and browser ``Origin``s the server answers, so that a web page cannot drive it.

Two attacks reach a server on a laptop from a page in its user's browser (docs/server.md, "Who may
call the server"):

- a cross-site request: the page posts to ``http://127.0.0.1:8000`` directly. The browser sends it
  with the page's ``Origin`` and does not let the page read the answer, but the server still
  generates. Refused here: a request whose ``Origin`` is neither the server's own (same-origin, as the
  chat page's) nor on ``allowed_origins`` gets 403;
- DNS rebinding: the page's own host name is made to resolve to 127.0.0.1, so its requests are
  same-origin to the browser and the page reads the answers. They carry that name in ``Host``;
  refused here: a ``Host`` that is not a loopback name, an IP address or on ``allowed_hosts`` gets
  403. An IP address cannot be rebound (only a name resolves), so any address passes.

A request without ``Origin`` (curl, the ``openai`` and ``ollama`` clients) is not from a page and
passes the origin check. Browsers send ``Origin`` on every cross-origin request that can change
state (POST) and on every ``fetch`` across origins.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

from xpuspec.server.errors import APIError

# Names that always mean this machine (RFC 6761: "localhost" and every name under it).
LOOPBACK_NAME = "localhost"
ANY = "*"
DEFAULT_PORTS = {"http": 80, "https": 443}
# What a preflight may ask for: the methods the routes take, and any header (the origin is trusted).
PREFLIGHT_METHODS = "GET, POST, DELETE, OPTIONS"
PREFLIGHT_MAX_AGE_S = 600


def split_host(host: str) -> tuple[str, int | None]:
    """``Host`` (or an origin's netloc) as (lower-case name without brackets or final dot, port)."""
    host = host.strip().lower()
    name, port = host, None
    if host.startswith("["):  # [::1]:8000
        name, _, rest = host[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif host.count(":") == 1:
        name, _, port_text = host.partition(":")
    else:  # no port, or a bare IPv6 address
        port_text = ""
    if port_text.isdigit():
        port = int(port_text)
    return name.rstrip("."), port


def _is_ip_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name.split("%")[0])  # fe80::1%eth0: the zone is not part of the address
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class AccessPolicy:
    """Who may call: ``allowed_hosts`` are further ``Host`` names (``*``: any), ``allowed_origins``
    further browser origins (``scheme://host[:port]``, with ``*`` as a wildcard: ``http://localhost:*``;
    ``*`` alone: any)."""

    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        hosts = tuple(split_host(host)[0] if host != ANY else ANY for host in self.allowed_hosts)
        object.__setattr__(self, "allowed_hosts", hosts)
        origins = tuple(origin.strip().lower().rstrip("/") for origin in self.allowed_origins)
        object.__setattr__(self, "allowed_origins", origins)

    def host_allowed(self, host: str | None) -> bool:
        """Whether a request with this ``Host`` header is answered (None: no header, not a browser)."""
        if not host or ANY in self.allowed_hosts:
            return True
        name, _ = split_host(host)
        if name == LOOPBACK_NAME or name.endswith("." + LOOPBACK_NAME) or _is_ip_address(name):
            return True
        return name in self.allowed_hosts

    def is_same_origin(self, origin: str, host: str | None) -> bool:
        """Whether ``origin`` is the server's own as the request reached it (the chat page's)."""
        parts = urlsplit(origin.strip().lower())
        if not host or parts.scheme not in DEFAULT_PORTS or not parts.hostname:
            return False
        name, port = split_host(host)
        default = DEFAULT_PORTS[parts.scheme]
        return (parts.hostname, parts.port or default) == (name, port or default)

    def origin_listed(self, origin: str) -> bool:
        """Whether ``origin`` is on ``allowed_origins`` (the browser may also read the answers)."""
        origin = origin.strip().lower().rstrip("/")
        return any(pattern == ANY or fnmatchcase(origin, pattern) for pattern in self.allowed_origins)

    def refusal(self, host: str | None, origin: str | None) -> APIError | None:
        """The 403 a request with these headers gets, or None if it may pass."""
        if not self.host_allowed(host):
            return APIError(
                403,
                f"the Host {host!r} is not this server's; start it with --allowed-hosts to allow it",
                code="host_not_allowed",
            )
        if origin is None or self.is_same_origin(origin, host) or self.origin_listed(origin):
            return None
        return APIError(
            403,
            f"requests from the web origin {origin!r} are not allowed; start the server with "
            "--allowed-origins to allow it",
            code="origin_not_allowed",
        )


def cors_headers(origin: str, requested_headers: str | None, preflight: bool) -> dict[str, str]:
    """The CORS headers of an answer to an allowed foreign origin (a preflight's with its extras)."""
    headers = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
    if preflight:
        headers["Access-Control-Allow-Methods"] = PREFLIGHT_METHODS
        headers["Access-Control-Max-Age"] = str(PREFLIGHT_MAX_AGE_S)
        if requested_headers:
            headers["Access-Control-Allow-Headers"] = requested_headers
    return headers
