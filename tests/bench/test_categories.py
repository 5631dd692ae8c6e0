"""`xpuspec bench --mode categories` (xpuspec.bench.categories): the speculation counts it reads from each
server, its clients, and a whole run on the demo pair through real `xpuspec serve` processes. Never a
timing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from xpuspec.bench import categories, chat_clients
from xpuspec.bench.categories import Speculation, llama_speculation, metrics_delta, settled_metrics
from xpuspec.bench.category_prompts import CATEGORIES
from xpuspec.bench.chat_clients import ChatResult, run_clients, stream_chat
from xpuspec.bench.plots import CATEGORY_PLOT


def test_the_counters_are_subtracted_and_a_missing_one_is_none():
    before = {
        "xpuspec_spec_draft_tokens_total": 10.0,
        "xpuspec_spec_accepted_tokens_total": 4.0,
        "xpuspec_generation_tokens_total": 50.0,
    }
    after = {
        "xpuspec_spec_draft_tokens_total": 30.0,
        "xpuspec_spec_accepted_tokens_total": 16.0,
        "xpuspec_spec_verification_steps_total": 6.0,
        "xpuspec_generation_tokens_total": 90.0,
    }
    assert metrics_delta(before, after) == Speculation(
        drafted=20, accepted=12, verification_steps=6, target_passes=None, generated=40
    )


def test_llama_cpp_draft_counts_are_summed_where_its_responses_carry_them():
    plain = [ChatResult("a", 4, 1.0, 0.1), ChatResult("b", 4, 1.0, 0.1)]
    assert llama_speculation(plain) == Speculation()
    drafted = [ChatResult("a", 4, 1.0, 0.1, draft_n=5, draft_accepted=3), ChatResult("b", 4, 1.0, 0.1)]
    drafted.append(ChatResult("c", 4, 1.0, 0.1, draft_n=2, draft_accepted=2))
    assert llama_speculation(drafted) == Speculation(drafted=7, accepted=5)


def _sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(f"data: {json.dumps(event)}\n\n".encode() for event in events) + b"data: [DONE]\n\n"


def test_a_chat_stream_keeps_llama_servers_draft_timings():
    events = [
        {"choices": [{"delta": {"content": "Hel"}}]},
        {"choices": [{"delta": {"content": "lo"}}]},
        {
            "choices": [{"delta": {}, "finish_reason": "length"}],
            "timings": {"draft_n": 6, "draft_n_accepted": 4},
        },
        {"choices": [], "usage": {"completion_tokens": 3}},
    ]
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=_sse(events)))
    with httpx.Client(transport=transport) as client:
        result = stream_chat(client, "http://server", "m", [{"role": "user", "content": "hi"}], 3)
    assert (result.text, result.tokens, result.draft_n, result.draft_accepted) == ("Hello", 3, 6, 4)
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=_sse(events[:2])))
    with httpx.Client(transport=transport) as client:
        result = stream_chat(client, "http://server", "m", [{"role": "user", "content": "hi"}], 3)
    assert result.draft_n is None and result.tokens == 2


def test_every_server_gets_plain_greedy_requests_without_repetition_controls():
    bodies: list[dict[str, Any]] = []

    def respond(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, content=_sse([{"choices": [{"delta": {"content": "x"}}]}]))

    with httpx.Client(transport=httpx.MockTransport(respond)) as client:
        stream_chat(client, "http://server", "m", [{"role": "user", "content": "hi"}], 3)
        stream_chat(client, "http://server", "m", [{"role": "user", "content": "hi"}], 5, ignore_eos=True)
    plain = {"temperature": 0, "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    assert {key: bodies[0][key] for key in plain} == plain
    assert bodies[0]["dry_multiplier"] == 0.0  # the default model's DRY, where it recommends one, is off
    assert "ignore_eos" not in bodies[0]  # sent only when asked (--same-lengths)
    assert (bodies[1]["ignore_eos"], bodies[1]["max_tokens"]) == (True, 5)


def test_without_cycling_each_prompt_is_sent_once_whatever_the_client_count(monkeypatch):
    sent: list[str] = []

    def fake_chat(
        client: Any, base_url: str, model: str, messages: Any, max_tokens: int, ignore_eos: bool
    ) -> ChatResult:
        sent.append(messages[0]["content"])
        return ChatResult("", 1, 0.0, 0.0)

    monkeypatch.setattr(chat_clients, "stream_chat", fake_chat)
    prompts = [[{"role": "user", "content": str(i)}] for i in range(3)]
    run_clients("http://x", "m", prompts, 8, 4, cycle=False)
    assert sorted(sent) == ["0", "1", "2"]
    sent.clear()
    run_clients("http://x", "m", prompts, 8, 4)  # --mode serve's: every client gets one
    assert len(sent) == 8


def test_each_prompt_can_have_its_own_length_past_the_end_of_sequence(monkeypatch):
    sent: dict[str, tuple[int, bool]] = {}

    def fake_chat(
        client: Any, base_url: str, model: str, messages: Any, max_tokens: int, ignore_eos: bool
    ) -> ChatResult:
        sent[messages[0]["content"]] = (max_tokens, ignore_eos)
        return ChatResult("", max_tokens, 0.0, 0.0)

    monkeypatch.setattr(chat_clients, "stream_chat", fake_chat)
    prompts = [[{"role": "user", "content": str(i)}] for i in range(3)]
    run_clients("http://x", "m", prompts, 2, [5, 7, 9], cycle=False, ignore_eos=True)
    assert sent == {"0": (5, True), "1": (7, True), "2": (9, True)}
    with pytest.raises(ValueError, match="3 prompts but 2 token limits"):
        run_clients("http://x", "m", prompts, 2, [5, 7], cycle=False)


def test_the_scrape_after_a_category_waits_for_the_server_to_count_its_requests(monkeypatch):
    monkeypatch.setattr(categories, "SETTLE_TIMEOUT_S", 5.0)
    finished = 'xpuspec_requests_finished_total{finish_reason="length"}'
    scrapes = iter([{finished: 1.0}, {finished: 2.0}, {finished: 3.0, "marker": 1.0}])

    class Server:
        def metrics(self) -> dict[str, float]:
            return next(scrapes)

    after = settled_metrics(Server(), {finished: 1.0}, requests=2)  # type: ignore[arg-type]  # a stand-in
    assert after.get("marker") == 1.0


def test_a_file_that_is_not_there_is_refused_as_the_workload(capfd):
    from xpuspec.api.errors import EXIT_USAGE
    from xpuspec.cli import main

    code = main(["bench", "--mode", "categories", "--bundle", "demo", "--workload", "absent.jsonl"])
    assert code == EXIT_USAGE and "is not one" in capfd.readouterr().err


def test_a_run_on_the_demo_pair_reports_every_category_and_both_xpuspec_rows(tmp_path: Path, capfd):
    """One prompt a category (the first the demo's 512-token context holds), one round, one client,
    4 tokens; no llama-server (a path that does not exist), so llama.cpp is one line."""
    from xpuspec.cli import main

    out = tmp_path / "report"
    args = ["bench", "--mode", "categories", "--bundle", "demo", "--prompts", "1", "--max-tokens", "4"]
    args += ["--rounds", "1", "--out", str(out), "--llama-server", str(tmp_path / "no-llama-server")]
    assert main(args) == 0
    summary = json.loads((out / "categories.json").read_text())
    (level,) = summary["levels"]
    assert level["clients"] == 1 and [entry["category"] for entry in level["categories"]] == list(CATEGORIES)
    for entry in [*level["categories"], level["overall"]]:
        assert set(entry["rows"]) == {"xpuspec default", "xpuspec target-only"}
        assert all(row["requests"] >= 1 and row["tokens_per_s"] > 0 for row in entry["rows"].values())
        assert entry["default_vs_target_only"] is not None
        # The default's counters came from /metrics: the target-only row drafted nothing.
        assert entry["rows"]["xpuspec target-only"]["drafted"] == 0
        assert entry["rows"]["xpuspec default"]["target_passes"] >= 1
    assert summary["not_run"]["llama.cpp"].startswith("no llama-server")
    assert summary["environment"]["cpu"] and "load_average_at_start" in summary["environment"]
    markdown = (out / "categories.md").read_text()
    assert all(name in markdown for name in CATEGORIES.values())
    assert "llama.cpp: not run: no llama-server" in markdown and markdown in capfd.readouterr().out
    assert (out / CATEGORY_PLOT).is_file() or "reason" in summary["plot"]


def test_with_same_lengths_every_row_generates_target_onlys_answer_lengths(tmp_path: Path):
    """Two prompts a category on the demo pair, 6 tokens, one round, two clients: the lengths come from a
    target-only session first, and both xpuspec rows then generate exactly those (past any end)."""
    from xpuspec.cli import main

    out = tmp_path / "report"
    args = ["bench", "--mode", "categories", "--bundle", "demo", "--prompts", "2", "--max-tokens", "6"]
    args += ["--rounds", "1", "--concurrency", "2", "--same-lengths", "--out", str(out)]
    assert main([*args, "--llama-server", str(tmp_path / "no-llama-server")]) == 0
    summary = json.loads((out / "categories.json").read_text())
    lengths = summary["settings"]["same_lengths"]["2"]
    (level,) = summary["levels"]
    for entry in level["categories"]:
        expected = sum(lengths[entry["category"]])
        assert 1 <= expected <= 6 * entry["prompts"]
        assert {row["completion_tokens"] for row in entry["rows"].values()} == {expected}
    assert "Same lengths: every row generated" in (out / "categories.md").read_text()
    assert any(path.name.endswith("-lengths.log") for path in out.rglob("*.log"))


def test_a_session_with_lengths_asks_each_prompt_for_its_own_past_the_end(monkeypatch):
    """The lengths a target-only session gave (answer_lengths) are what the next session asks for."""
    asked: list[tuple[Any, bool]] = []

    def fake_clients(base_url, model, prompts, clients, max_tokens, *, cycle, ignore_eos=False):
        asked.append((max_tokens, ignore_eos))
        limits = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else max_tokens
        results = [
            ChatResult("", n - index % 2, 0.1, 0.01, prompt_index=index) for index, n in enumerate(limits)
        ]
        return chat_clients.ClientsRound(clients, results[::-1], 1.0)

    class Opened:
        base_url, model, process = "http://x", "m", type("P", (), {"pid": 0})()

        def __enter__(self) -> Opened:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(categories, "run_clients", fake_clients)
    monkeypatch.setattr(categories, "peak_rss_mb", lambda pid: None)
    row = categories.Row("llama.cpp", "peer")  # a row whose counters come from its responses
    groups = {"qa": [[{"role": "user", "content": "a"}]] * 3, "math": [[{"role": "user", "content": "b"}]]}
    first = categories._session(row, Opened(), 2, groups, 8)  # type: ignore[arg-type]  # a stand-in
    lengths = categories.answer_lengths(first, groups)
    assert lengths == {"qa": [8, 7, 8], "math": [8]}  # in prompt order, whatever the completion order
    categories._session(row, Opened(), 2, groups, 8, lengths)  # type: ignore[arg-type]
    assert asked == [(8, False), (8, False), ([8, 7, 8], True), ([8], True)]
