"""llama.cpp's ``llama-server`` as a peer: chats through each server's OpenAI chat route.

`xpuspec bench --mode serve` runs the bundle's own GGUF (a bundle prepared from one records its
path) in ``llama-server`` beside ``xpuspec serve`` on the bundle, with the same chat messages, greedy,
at each client count asked for (``--concurrency``, default one: a laptop's single chat): N clients
send the chat instructions back to back (xpuspec.bench.chat_clients), and llama-server gets N slots
(``-np N``, N slots' context). Rows:

- xpuspec's default (its drafter, prefix caching on), xpuspec target-only (``--drafter none``);
- llama.cpp at 1 and 2 threads, each with and without its n-gram speculation (``--spec-type
  ngram-mod``: a pool shared by the server's requests).

Every row starts its server afresh each round (so llama.cpp's shared n-gram pool cannot replay the
benchmark's earlier answers, and every round times a start), in an order that rotates with the
rounds. Per row and client count: aggregate tokens/s, TTFT p50 and p99 over every request, start
time, peak RSS; per client count, xpuspec's default over llama.cpp's best row. xpuspec's exact mode
answers each prompt once, untimed: each row's greedy agreement with it is reported. ``llama-server``
is built by ``scripts/build-llama-server.sh`` into the xpuspec cache, or given with ``--llama-server
PATH``; nothing in xpuspec's runtime uses it.

The rows, their servers and the rotating rounds (:func:`server_rows`, :func:`run_rounds`) are
`--mode categories`' too (xpuspec.bench.categories).
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from xpuspec.bench.chat_clients import ChatResult, ClientsRound, Messages, percentile, run_clients
from xpuspec.bench.server_process import ServerProcess, free_port
from xpuspec.models.bundle import ModelBundle, cache_dir

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


TARGET_ONLY_ROW = Row("xpuspec", "xpuspec target-only", ("--drafter", "none"))
XPUSPEC_ROWS = [Row("xpuspec", "xpuspec default", ()), TARGET_ONLY_ROW]
EXACT_ROW = Row("xpuspec", "xpuspec exact", ("--exact", "--drafter", "none"))


def slot_context(bundle: ModelBundle, max_tokens: int) -> int:
    """Each llama-server slot's context: a chat instruction and its answer, within the model's window.
    llama-server allocates every slot's KV cache at start, so a larger one would only cost it memory."""
    return min(bundle.max_context, max(2048, max_tokens + 1024))


class LlamaServer(ServerProcess):
    """``llama-server`` on the GGUF, on a free loopback port, with one slot per client: ``-np N`` and a
    context of N slots (``-c`` is split between the slots); continuous batching is its default."""

    def __init__(
        self, binary: Path, gguf: Path, row: Row, context: int, log_path: Path, slots: int = 1
    ) -> None:
        super().__init__(None, log_path, startup_timeout_s=120.0)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port)]
        self.command += ["-c", str(context * slots), "-np", str(slots), "--no-webui", *row.args]


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
    """One row's round at one client count: a fresh server, every prompt at least once."""

    start_s: float
    clients_round: ClientsRound
    peak_rss_mb: float | None

    @property
    def results(self) -> list[ChatResult]:
        return self.clients_round.results

    @property
    def tokens_per_s(self) -> float:
        return self.clients_round.tokens_per_s


@dataclass
class ServeComparison:
    rows: list[Row]
    clients: tuple[int, ...] = (1,)
    # By (row label, client count): one entry per round.
    rounds: dict[tuple[str, int], list[RowRound]] = field(default_factory=dict)
    exact_texts: list[str] = field(default_factory=list)
    not_run: dict[str, str] = field(default_factory=dict)


def not_run_key(label: str, clients: int) -> str:
    return label if clients == 1 else f"{label} at {clients} clients"


@dataclass
class ServerRows:
    """The rows a comparison runs, why others are not run, and what starting each row's server needs."""

    rows: list[Row]
    not_run: dict[str, str]
    bundle_path: Path | None
    gguf: Path | None
    binary: Path | None
    context: int  # each llama-server slot's
    logs: Path

    def open(self, row: Row, clients: int, log: Path) -> ServerProcess:
        """The row's server, not yet started: ``with`` starts it."""
        if row.engine == "llama.cpp":
            assert self.binary is not None and self.gguf is not None
            return LlamaServer(self.binary, self.gguf, row, self.context, log, slots=clients)
        # Prefix caching as `xpuspec serve` has it by default (llama-server keeps its prompt cache too).
        # Its continuous batching takes any number of requests in flight: nothing to size per client count.
        return ServerProcess(self.bundle_path, log, prefix_caching=True, extra_args=row.args)


def server_rows(
    bundle_path: Path | None,
    bundle: ModelBundle,
    *,
    max_tokens: int,
    out: Path,
    llama_server: Path | None = None,
    threads: Sequence[int] = (1, 2),
) -> ServerRows:
    """xpuspec's default and target-only rows, and llama.cpp's at each thread count with and without its
    n-gram speculation when a llama-server and the bundle's GGUF are there (else one line why not)."""
    binary = find_llama_server(llama_server)
    gguf = bundle_gguf(bundle)
    rows = list(XPUSPEC_ROWS)
    not_run: dict[str, str] = {}
    if binary is None:
        not_run["llama.cpp"] = f"no llama-server: build one with {BUILD_SCRIPT}, or pass --llama-server PATH"
    elif gguf is None:
        not_run["llama.cpp"] = "the bundle was not prepared from a GGUF file llama.cpp can read"
    else:
        rows += llama_rows(threads)
    context = slot_context(bundle, max_tokens)
    return ServerRows(rows, not_run, bundle_path, gguf, binary, context, out / "servers")


T = TypeVar("T")


def run_rounds(
    plan: ServerRows,
    rounds: int,
    clients: Sequence[int],
    session: Callable[[Row, ServerProcess, int], T],
) -> dict[tuple[str, int], list[T]]:
    """At each client count, every row's server, fresh each round, in an order rotating with the rounds;
    ``session(row, server, clients)`` starts the server (``with``) and measures it. A row that fails is
    one line in ``plan.not_run`` and stays out of that client count's later rounds; its log says the rest.
    Returns each (row label, client count)'s sessions, one a round."""
    results: dict[tuple[str, int], list[T]] = {}
    rows = plan.rows
    for count in clients:
        for index in range(rounds):
            shift = index % len(rows)
            for row in rows[shift:] + rows[:shift]:
                key = not_run_key(row.label, count)
                if key in plan.not_run:
                    continue
                log = plan.logs / f"{key}.log"
                try:
                    result = session(row, plan.open(row, count, log), count)
                except (httpx.HTTPError, RuntimeError, TimeoutError, ValueError) as error:
                    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                    plan.not_run[key] = f"{reason} (log: {log})"
                    results.pop((row.label, count), None)
                    logger.warning("%s: not run: %s", key, reason)
                    continue
                results.setdefault((row.label, count), []).append(result)
    return results


def _run_row(
    row: Row, opened: ServerProcess, clients: int, prompts: list[Messages], max_tokens: int
) -> RowRound:
    started = time.perf_counter()
    with opened as server:
        start_s = time.perf_counter() - started
        clients_round = run_clients(server.base_url, server.model, prompts, clients, max_tokens)
        assert server.process is not None
        rss = peak_rss_mb(server.process.pid)
    logger.info(
        "%s at %d clients: %.1f tokens/s, start %.1f s",
        row.label,
        clients,
        clients_round.tokens_per_s,
        start_s,
    )
    return RowRound(start_s, clients_round, rss)


def run_serve_comparison(
    bundle_path: Path | None,
    bundle: ModelBundle,
    prompts: list[Messages],
    *,
    rounds: int,
    max_tokens: int,
    out: Path,
    llama_server: Path | None = None,
    threads: Sequence[int] = (1, 2),
    clients: Sequence[int] = (1,),
) -> ServeComparison:
    """At each client count, every row's server, fresh each round, in an order rotating with the
    rounds; then xpuspec's exact mode once, one request at a time, for agreement."""
    plan = server_rows(
        bundle_path, bundle, max_tokens=max_tokens, out=out, llama_server=llama_server, threads=threads
    )
    measured = run_rounds(
        plan, rounds, clients, lambda row, opened, count: _run_row(row, opened, count, prompts, max_tokens)
    )
    comparison = ServeComparison(plan.rows, tuple(clients), measured, not_run=plan.not_run)
    exact = plan.open(EXACT_ROW, 1, plan.logs / "exact.log")
    comparison.exact_texts = _run_row(EXACT_ROW, exact, 1, prompts, max_tokens).clients_round.texts_by_prompt(
        len(prompts)
    )
    return comparison


def _summarise_row(row: Row, clients: int, rounds: list[RowRound], exact_texts: list[str]) -> dict[str, Any]:
    ttfts = [1000 * r.ttft_s for round_ in rounds for r in round_.results if r.ttft_s is not None]
    texts = rounds[0].clients_round.texts_by_prompt(len(exact_texts))
    rss = [round_.peak_rss_mb for round_ in rounds if round_.peak_rss_mb is not None]
    return {
        "engine": row.engine,
        "row": row.label,
        "clients": clients,
        "tokens_per_s": statistics.median(round_.tokens_per_s for round_ in rounds),
        "tokens_per_s_by_round": [round(round_.tokens_per_s, 2) for round_ in rounds],
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_p99_ms": percentile(ttfts, 99),
        "requests": sum(len(round_.results) for round_ in rounds),
        "start_s": statistics.median(round_.start_s for round_ in rounds),
        "peak_rss_mb": max(rss) if rss else None,
        "agreement_with_exact": sum(a == b for a, b in zip(texts, exact_texts, strict=True)),
        "prompts": len(texts),
    }


def summarise(comparison: ServeComparison) -> dict[str, Any]:
    """Per row and client count: median aggregate tokens/s over rounds, TTFT p50 and p99 over every
    request, median start, peak RSS, agreement with exact; and, per client count, xpuspec's default
    over llama.cpp's best row."""
    rows: list[dict[str, Any]] = []
    default_vs_best: dict[str, float | None] = {}
    for clients in comparison.clients:
        level = [
            _summarise_row(row, clients, comparison.rounds[(row.label, clients)], comparison.exact_texts)
            for row in comparison.rows
            if comparison.rounds.get((row.label, clients))
        ]
        llama = [r["tokens_per_s"] for r in level if r["engine"] == "llama.cpp"]
        best = max(llama) if llama else None
        for entry in level:
            entry["vs_llama_cpp_best"] = entry["tokens_per_s"] / best if best else None
        default = [r for r in level if r["row"] == XPUSPEC_ROWS[0].label]
        default_vs_best[str(clients)] = default[0]["vs_llama_cpp_best"] if default else None
        rows += level
    return {
        "rows": rows,
        "default_vs_llama_cpp_best": default_vs_best,
        "not_run": comparison.not_run,
        "rounds": max((len(v) for v in comparison.rounds.values()), default=0),
    }


def markdown(summary: dict[str, Any]) -> str:
    lines = [
        "| row | clients | tokens/s (median) | × llama.cpp best | TTFT p50 ms | TTFT p99 ms | start s "
        "| peak RSS MB | = exact |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def number(value: float | None, digits: int) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    for row in summary["rows"]:
        lines.append(
            f"| {row['row']} | {row['clients']} | {number(row['tokens_per_s'], 1)} | "
            f"{number(row['vs_llama_cpp_best'], 2)} | {number(row['ttft_p50_ms'], 1)} | "
            f"{number(row['ttft_p99_ms'], 1)} | {number(row['start_s'], 2)} | "
            f"{number(row['peak_rss_mb'], 0)} | {row['agreement_with_exact']}/{row['prompts']} |"
        )
    for peer, reason in summary["not_run"].items():
        lines.append(f"\n{peer}: not run: {reason}")
    return "\n".join(lines) + "\n"
