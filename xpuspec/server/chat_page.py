"""The chat page at ``/`` (static files shipped in ``xpuspec/server/static``) and the defaults it starts
from, ``GET /v1/xpuspec/defaults``.

The page and its files are public (they hold no data; the API calls they make need the key, and the
page asks for it on a 401). A Content-Security-Policy keeps the page to the server's own origin: it
loads nothing and connects nowhere else, so it works on an air-gapped box.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from flask import Blueprint, Response, jsonify, send_from_directory

from xpuspec.sample.defaults import SamplingDefaults
from xpuspec.server.schemas import ChatCompletionRequest
from xpuspec.server.state import server_state

if TYPE_CHECKING:
    from xpuspec.api.requests import RequestPreparer

STATIC_DIR = Path(__file__).resolve().parent / "static"
PAGE_PREFIX = "/chat/"  # the page's own files; "/" is its HTML
# Nothing but this origin: scripts, styles, fetches; data: images for the icons drawn in CSS.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

chat_page = Blueprint("chat_page", __name__)


def is_public(path: str) -> bool:
    """Paths the page needs before it knows the API key."""
    return path == "/" or path.startswith(PAGE_PREFIX)


def _page_file(name: str) -> Response:
    response = send_from_directory(STATIC_DIR, name, max_age=0)
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Cache-Control"] = "no-cache"
    return response


@chat_page.get("/")
def index() -> Response:
    return _page_file("index.html")


@chat_page.get(PAGE_PREFIX + "<path:name>")
def page_file(name: str) -> Response:
    return _page_file(name)  # send_from_directory refuses names outside STATIC_DIR (404)


def _field_default(name: str) -> object:
    return ChatCompletionRequest.model_fields[name].default


def _sampling_defaults(requests: RequestPreparer | None) -> dict[str, object]:
    """The model's sampling defaults and reply cap, and where each came from (null until loaded)."""
    if requests is None:
        names = [f.name for f in dataclasses.fields(SamplingDefaults) if f.name != "sources"]
        return {**dict.fromkeys(names), "sources": {}}
    defaults = requests.sampling_defaults
    values = defaults.as_dict()
    return {**values, "sources": {name: defaults.source(name) for name in values}}


@chat_page.get("/v1/xpuspec/defaults")
def defaults() -> Response:
    """What a request gets when it leaves a parameter out, and the drafters it may ask for."""
    state = server_state()
    requests = state.loop.requests
    drafter = requests.drafter if requests is not None else None
    tree = requests.default_draft_tree if requests is not None else None
    return jsonify(
        {
            "model": state.config.served_model_name,
            "ready": state.loop.ready.is_set() and state.loop.load_error is None,
            **_sampling_defaults(requests),
            "seed": _field_default("seed"),
            "max_model_len": requests.max_model_len if requests is not None else None,
            "drafter": drafter,
            "drafters": list(dict.fromkeys(name for name in ("auto", drafter, "none") if name is not None)),
            "draft_tree": tree if tree is None or isinstance(tree, str) else dataclasses.asdict(tree),
            "num_draft_tokens": _field_default("num_draft_tokens"),
        }
    )
