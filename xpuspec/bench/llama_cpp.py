"""llama.cpp's ``llama-server`` as a peer: one chat at a time through each server's OpenAI chat route.

`xpuspec bench --mode serve` runs the bundle's own GGUF (a bundle prepared from one records its
path) in ``llama-server`` beside ``xpuspec serve`` on the bundle, with the same chat messages, one
request at a time, greedy. Rows:

- xpuspec's default (its drafter, prefix caching on), xpuspec target-only (``--drafter none``);
- llama.cpp at 1 and 2 threads, each with and without its n-gram speculation (``--spec-type
  ngram-mod``: a pool shared by the server's requests).

Every row starts its server afresh each round (so llama.cpp's shared n-gram pool cannot replay the
benchmark's earlier answers, and every round times a start), in an order that rotates with the
rounds. xpuspec's exact mode answers each prompt once, untimed: each row's greedy agreement with it
is reported. ``llama-server`` is built by ``scripts/build-llama-server.sh`` into the xpuspec cache,
or given with ``--llama-server PATH``; nothing in xpuspec's runtime uses it.
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from xpuspec.bench.server_process import ServerProcess, free_port, sse_events
from xpuspec.model_bundle import ModelBundle, cache_dir

logger = logging.getLogger(__name__)

LLAMA_SERVER_ENV = "XPUSPEC_LLAMA_SERVER"
BUILD_SCRIPT = "scripts/build-llama-server.sh"


def find_llama_server(explicit: Path | None = None) -> Path | None:
    """``explicit``, else ``$XPUSPEC_LLAMA_SERVER``, else the newest build in the xpuspec cache, else
    ``llama-server`` on the PATH."""
    if explicit is not None:
        return explicit if explicit.is_file() else None
    if os.environ.get(LLAMA_SERVER_ENV):
        path = Path(os.environ[LLAMA_SERVER_ENV])
        return path if path.is_file() else None
    built = sorted((cache_dir() / "llama.cpp").glob("*/bin/llama-server"))
    if built:
        return built[-1]
    found = shutil.which("llama-server")
    return Path(found) if found else None


def bundle_gguf(bundle: ModelBundle) -> Path | None:
    """The GGUF file the bundle's target was prepared from, when it was and the file is still there."""
    facts = bundle.target.facts
    source = facts.get("source")
    if "gguf" not in facts or not source or not Path(source).is_file():
        return None
    return Path(source)


@dataclass(frozen=True)
class Row:
    """One server configuration of the comparison."""

    engine: str  # "xpuspec" | "llama.cpp"
    label: str
    args: tuple[str, ...] = ()


def llama_rows(threads: Sequence[int] = (1, 2)) -> list[Row]:
    rows = []
    for count in threads:
        rows.append(Row("llama.cpp", f"llama.cpp -t {count}", ("-t", str(count))))
        rows.append(
            Row("llama.cpp", f"llama.cpp -t {count} n-gram", ("-t", str(count), "--spec-type", "ngram-mod"))
        )
    return rows


XPUSPEC_ROWS = [
    Row("xpuspec", "xpuspec default", ()),
    Row("xpuspec", "xpuspec target-only", ("--drafter", "none")),
]
EXACT_ROW = Row("xpuspec", "xpuspec exact", ("--exact", "--drafter", "none"))


class LlamaServer(ServerProcess):
    """``llama-server`` on the GGUF, on a free loopback port; one slot, like a laptop's single chat."""

    def __init__(self, binary: Path, gguf: Path, row: Row, context: int, log_path: Path) -> None:
        super().__init__(None, log_path, startup_timeout_s=120.0)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port)]
        self.command += ["-c", str(context), "-np", "1", "--no-webui", *row.args]


@dataclass
class ChatResult:
    text: str
    tokens: int
    seconds: float
    ttft_s: float | None


def stream_chat(
    client: httpx.Client, base_url: str, model: str, messages: list[dict[str, str]], max_tokens: int
) -> ChatResult:
    """One streamed greedy /v1/chat/completions; the text, the completion tokens (usage, else one per
    chunk with content), the wall time and the time to the first content."""
    payload = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first = None
    pieces: list[str] = []
    usage_tokens = None
    # One connection per request, for both servers alike: llama-server's HTTP library closes a kept-alive
    # connection after a few requests, and a reused connection it closed fails the next request.
    headers = {"Connection": "close"}
    with client.stream(
        "POST", f"{base_url}/v1/chat/completions", json=payload, headers=headers, timeout=600
    ) as response:
        for event in sse_events(response):
            for choice in event.get("choices") or ():
                content = (choice.get("delta") or {}).get("content")
                if content:
                    first = first or time.perf_counter()
                    pieces.append(content)
            if event.get("usage"):
                usage_tokens = int(event["usage"]["completion_tokens"])
    seconds = time.perf_counter() - started
    tokens = usage_tokens if usage_tokens is not None else len(pieces)
    return ChatResult("".join(pieces), tokens, seconds, None if first is None else first - started)


def peak_rss_mb(pid: int) -> float | None:
    """The process's peak resident set (VmHWM), in MB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass
class RowRound:
    """One row's round: a fresh server, every prompt once."""

    start_s: float
    results: list[ChatResult]
    peak_rss_mb: float | None

    @property
    def tokens_per_s(self) -> float:
        return sum(r.tokens for r in self.results) / max(sum(r.seconds for r in self.results), 1e-9)


@dataclass
class ServeComparison:
    rows: list[Row]
    rounds: dict[str, list[RowRound]] = field(default_factory=dict)
    exact_texts: list[str] = field(default_factory=list)
    not_run: dict[str, str] = field(default_factory=dict)


def _open_server(
    row: Row, bundle_path: Path | None, gguf: Path | None, binary: Path | None, log: Path, context: int
) -> ServerProcess:
    if row.engine == "llama.cpp":
        assert binary is not None and gguf is not None
        return LlamaServer(binary, gguf, row, context, log)
    # Prefix caching as `xpuspec serve` has it by default (llama-server keeps its prompt cache too).
    return ServerProcess(bundle_path, log, prefix_caching=True, extra_args=row.args)


def _run_row(
    row: Row,
    prompts: list[list[dict[str, str]]],
    max_tokens: int,
    opened: ServerProcess,
) -> RowRound:
    started = time.perf_counter()
    with opened as server, httpx.Client() as client:
        start_s = time.perf_counter() - started
        results = [
            stream_chat(client, server.base_url, server.model, messages, max_tokens) for messages in prompts
        ]
        assert server.process is not None
        rss = peak_rss_mb(server.process.pid)
    logger.info(
        "%s: %.1f tokens/s, start %.1f s",
        row.label,
        sum(r.tokens for r in results) / max(sum(r.seconds for r in results), 1e-9),
        start_s,
    )
    return RowRound(start_s, results, rss)


def run_serve_comparison(
    bundle_path: Path | None,
    bundle: ModelBundle,
    prompts: list[list[dict[str, str]]],
    *,
    rounds: int,
    max_tokens: int,
    out: Path,
    llama_server: Path | None = None,
    threads: Sequence[int] = (1, 2),
) -> ServeComparison:
    """Every row's server, fresh each round, in an order rotating with the rounds; then xpuspec's exact
    mode once, for agreement."""
    binary = find_llama_server(llama_server)
    gguf = bundle_gguf(bundle)
    rows = list(XPUSPEC_ROWS)
    comparison = ServeComparison(rows)
    if binary is None:
        comparison.not_run["llama.cpp"] = (
            f"no llama-server: build one with {BUILD_SCRIPT}, or pass --llama-server PATH"
        )
    elif gguf is None:
        comparison.not_run["llama.cpp"] = "the bundle was not prepared from a GGUF file llama.cpp can read"
    else:
        rows += llama_rows(threads)
    context = min(bundle.max_context, 4096)
    logs = out / "servers"
    for index in range(rounds):
        shift = index % len(rows)
        for row in rows[shift:] + rows[:shift]:
            if row.label in comparison.not_run:
                continue
            opened = _open_server(row, bundle_path, gguf, binary, logs / f"{row.label}.log", context)
            try:
                comparison.rounds.setdefault(row.label, []).append(_run_row(row, prompts, max_tokens, opened))
            except (httpx.HTTPError, RuntimeError, TimeoutError, ValueError) as error:
                # One line, and the row stays out of later rounds; its log says the rest.
                reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                comparison.not_run[row.label] = f"{reason} (log: {logs / f'{row.label}.log'})"
                comparison.rounds.pop(row.label, None)
                logger.warning("%s: not run: %s", row.label, reason)
    exact = _open_server(EXACT_ROW, bundle_path, None, None, logs / "exact.log", context)
    comparison.exact_texts = [r.text for r in _run_row(EXACT_ROW, prompts, max_tokens, exact).results]
    return comparison


def summarise(comparison: ServeComparison) -> dict[str, Any]:
    """Per row: median tokens/s and TTFT over rounds, median start, peak RSS, agreement with exact."""
    rows: list[dict[str, Any]] = []
    for row in comparison.rows:
        rounds = comparison.rounds.get(row.label, [])
        if not rounds:
            continue
        ttfts = [r.ttft_s for round_ in rounds for r in round_.results if r.ttft_s is not None]
        texts = [r.text for r in rounds[0].results]
        rss = [round_.peak_rss_mb for round_ in rounds if round_.peak_rss_mb is not None]
        rows.append(
            {
                "engine": row.engine,
                "row": row.label,
                "tokens_per_s": statistics.median(round_.tokens_per_s for round_ in rounds),
                "tokens_per_s_by_round": [round(round_.tokens_per_s, 2) for round_ in rounds],
                "ttft_ms": 1000 * statistics.median(ttfts) if ttfts else None,
                "start_s": statistics.median(round_.start_s for round_ in rounds),
                "peak_rss_mb": max(rss) if rss else None,
                "agreement_with_exact": sum(
                    a == b for a, b in zip(texts, comparison.exact_texts, strict=True)
                ),
                "prompts": len(texts),
            }
        )
    llama = [r["tokens_per_s"] for r in rows if r["engine"] == "llama.cpp"]
    best = max(llama) if llama else None
    for entry in rows:
        entry["vs_llama_cpp_best"] = entry["tokens_per_s"] / best if best else None
    return {
        "rows": rows,
        "not_run": comparison.not_run,
        "rounds": max((len(v) for v in comparison.rounds.values()), default=0),
    }


def markdown(summary: dict[str, Any]) -> str:
    lines = [
        "| row | tokens/s (median) | × llama.cpp best | TTFT ms | start s | peak RSS MB | = exact |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]

    def number(value: float | None, digits: int) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    for row in summary["rows"]:
        lines.append(
            f"| {row['row']} | {number(row['tokens_per_s'], 1)} | {number(row['vs_llama_cpp_best'], 2)} | "
            f"{number(row['ttft_ms'], 1)} | {number(row['start_s'], 2)} | {number(row['peak_rss_mb'], 0)} | "
            f"{row['agreement_with_exact']}/{row['prompts']} |"
        )
    for peer, reason in summary["not_run"].items():
        lines.append(f"\n{peer}: not run: {reason}")
    return "\n".join(lines) + "\n"
