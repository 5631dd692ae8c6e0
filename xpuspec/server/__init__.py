"""The OpenAI-compatible HTTP server over the engine (``xpuspec serve``)."""

from xpuspec.server.app import create_app
from xpuspec.server.config import ServerConfig
from xpuspec.server.state import server_state

__all__ = ["ServerConfig", "create_app", "server_state"]
