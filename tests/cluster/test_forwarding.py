"""The ingress without Ray: its app over a stand-in deployment handle prepares requests with the
bundle's text files alone (no Pipeline, no model weights read), refuses bad requests itself, and
forwards good ones; the replica's events become the server's response."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openvino as ov
import pytest
from flask import Flask

from tests.server.conftest import STARTUP_TIMEOUT_S
from xpuspec.api.engine_loop import ChoiceEvent, ChoiceRequest
from xpuspec.api.pipeline import Pipeline
from xpuspec.cluster.application import IngressServer
from xpuspec.cluster.forwarding import ForwardingLoop
from xpuspec.core.request_stats import RequestStats
from xpuspec.server import server_state

MODEL = "xpuspec-demo"
MODEL_FILES = ("openvino_model.xml", "openvino_model.bin")


class ReplicaStream:
    """A replica's streamed response: every choice's text in one list of events."""

    def __init__(self, choices: list[ChoiceRequest]) -> None:
        self.choices = choices

    def __iter__(self) -> Iterator[list[ChoiceEvent]]:
        stats = RequestStats(arrival_time=0.0, max_draft_tokens=0, num_output_tokens=2)
        yield [ChoiceEvent(c.index, "ok!", 2, finish_reason="length", stats=stats) for c in self.choices]

    def cancel(self) -> None:
        pass


class StandInHandle:
    """What ForwardingLoop uses of a Serve DeploymentHandle; records what it was sent."""

    def __init__(self) -> None:
        self.sent: list[list[ChoiceRequest]] = []
        self.generate = self

    def options(self, **_: Any) -> StandInHandle:
        return self

    def remote(self, choices: list[ChoiceRequest]) -> ReplicaStream:
        self.sent.append(choices)
        return ReplicaStream(choices)


@pytest.fixture(scope="module")
def ingress() -> Iterator[tuple[IngressServer, StandInHandle, list[str]]]:
    """The ingress app over the demo bundle, built while no Pipeline can be made and every model
    file OpenVINO reads or compiles is recorded."""
    patches = pytest.MonkeyPatch()
    opened: list[str] = []

    def refuse_pipeline(*_: Any, **__: Any) -> None:
        raise AssertionError("the ingress constructed a Pipeline")

    def recording(method: Any) -> Any:
        def record(core: ov.Core, model: Any, *args: Any, **kwargs: Any) -> Any:
            opened.append(Path(model).name if isinstance(model, (str, Path)) else "in-memory model")
            return method(core, model, *args, **kwargs)

        return record

    patches.setattr(Pipeline, "__init__", refuse_pipeline)
    patches.setattr(ov.Core, "read_model", recording(ov.Core.read_model))
    patches.setattr(ov.Core, "compile_model", recording(ov.Core.compile_model))
    handle = StandInHandle()
    server = IngressServer(handle, {"bundle": "demo"})  # type: ignore[arg-type]
    server.__serve_build_asgi_app__()
    app = server._app
    loop = server_state(app).loop
    try:
        assert loop.ready.wait(STARTUP_TIMEOUT_S) and loop.load_error is None, loop.load_error
        yield server, handle, opened
    finally:
        loop.stop()
        patches.undo()


def test_the_ingress_loads_no_model(ingress) -> None:
    server, _, opened = ingress
    app: Flask = server._app
    loop = server_state(app).loop
    assert isinstance(loop, ForwardingLoop)
    assert loop.pipeline is None and loop.requests is not None
    assert "openvino_tokenizer.xml" in opened  # the recording works: the tokenizer was read
    assert not set(opened) & set(MODEL_FILES)
    assert app.test_client().get("/health").json == {"status": "ok"}
    server.check_health()  # Serve's health check of the ingress passes


def test_a_bad_grammar_is_refused_at_the_ingress(ingress) -> None:
    server, handle, _ = ingress
    app: Flask = server._app
    sent = len(handle.sent)
    response = app.test_client().post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "x", "max_tokens": 4, "guided_grammar": "start: a\na: a"},
    )
    assert response.status_code == 400, response.json
    assert response.json["error"]["param"] == "guided_grammar"
    assert len(handle.sent) == sent  # nothing reached a replica


def test_a_good_request_is_prepared_here_and_run_by_a_replica(ingress) -> None:
    server, handle, _ = ingress
    app: Flask = server._app
    requests = server_state(app).loop.requests
    messages = [{"role": "user", "content": "Hello"}]
    response = app.test_client().post(
        "/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 2, "n": 2}
    )
    assert response.status_code == 200, response.json
    assert [choice["message"]["content"] for choice in response.json["choices"]] == ["ok!", "ok!"]
    choices = handle.sent[-1]
    assert [choice.prompt_token_ids for choice in choices] == [requests.encode(messages)] * 2
    assert all(choice.params.max_tokens == 2 for choice in choices)
