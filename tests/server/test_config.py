"""ServerConfig: its checks, and the stream interval that grows with the streams open."""

from __future__ import annotations

import pytest

from xpuspec.api.engine_loop import EngineLoop
from xpuspec.server.config import MAX_STREAM_INTERVAL_S, ServerConfig
from xpuspec.server.metrics import ServerMetrics
from xpuspec.server.state import ServerState


def test_the_stream_interval_grows_per_open_stream_up_to_the_cap() -> None:
    config = ServerConfig(stream_interval_s=0.005, stream_interval_per_stream_s=0.002)
    assert config.stream_interval_for(0) == 0.005
    assert config.stream_interval_for(1) == 0.005  # the least interval still rules one stream
    assert config.stream_interval_for(16) == pytest.approx(0.032)
    assert config.stream_interval_for(1000) == MAX_STREAM_INTERVAL_S


def test_a_fixed_interval_and_a_longer_least_one_are_kept() -> None:
    fixed = ServerConfig(stream_interval_s=0.0, stream_interval_per_stream_s=0.0)
    assert fixed.stream_interval_for(64) == 0.0
    assert ServerConfig(stream_interval_s=0.2).stream_interval_for(1000) == 0.2


@pytest.mark.parametrize("name", ["stream_interval_s", "stream_interval_per_stream_s"])
@pytest.mark.parametrize("value", [-0.001, 1.5, True, "5"])
def test_bad_intervals_are_refused_by_name(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=name):
        ServerConfig(**{name: value})  # type: ignore[arg-type]


def test_the_state_counts_streamed_responses_apart() -> None:
    loop = EngineLoop(lambda: None, max_in_flight=4)  # type: ignore[arg-type,return-value]
    metrics = ServerMetrics(lambda: loop.snapshot, lambda: loop.num_in_flight)
    config = ServerConfig(stream_interval_s=0.005, stream_interval_per_stream_s=0.01)
    state = ServerState(config, loop, metrics)
    state.response_opened()  # a whole response: no frames
    for _ in range(3):
        state.response_opened(streamed=True)
    assert state.open_responses == 4
    assert state.stream_interval() == pytest.approx(0.03)
    state.response_closed(streamed=True)
    state.response_closed()
    assert state.open_responses == 2 and state.stream_interval() == pytest.approx(0.02)
