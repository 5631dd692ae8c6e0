"""`xpuspec bench --mode categories`: speculation per kind of task, through the real servers.

The rows are --mode serve's (xpuspec.bench.llama_cpp): ``xpuspec serve`` by default and with
``--drafter none``, and llama.cpp's ``llama-server`` with and without its n-gram speculation (``-t 2``
unless ``--llama-threads`` says otherwise) where one is found. Each round starts every row's server
afresh, in an order rotating with the rounds; in each server's session every category's prompts
(xpuspec.bench.category_prompts) are sent, category after category, each prompt exactly once: the
server keeps a cross-request suffix index, so a repeated prompt would be answered faster. At N clients
the category's prompts are sent by N clients back to back, so at most as many are in flight as the
category has prompts.

For xpuspec's rows, /metrics is read before and after each category: draft tokens proposed and
accepted, the target passes that verified drafts, and every target pass that gave a request tokens.
For llama.cpp's rows, the draft counts its responses' ``timings`` carry (``draft_n``,
``draft_n_accepted``), where they do. The summary is in xpuspec.bench.category_summary.

With ``same_lengths``, every row generates the same number of tokens for each prompt: target-only's own
greedy answer's length at that client count, measured in a session before the rounds, sent as
``max_tokens`` with ``ignore_eos``. Outside exact mode a row's answers part from target-only's after a
few dozen tokens (a batch's shape changes the rounding) and end at other lengths; with several clients a
category's wall time is its longest answers', so fewer tokens in all read as fewer tokens per second.
The same lengths compare equal work.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpuspec.bench.category_prompts import by_category, fitting, load_category_prompts
from xpuspec.bench.chat_clients import ChatResult, ClientsRound, Messages, run_clients
from xpuspec.bench.environment import environment, load_average
from xpuspec.bench.llama_cpp import (
    TARGET_ONLY_ROW,
    Row,
    ServerRows,
    not_run_key,
    peak_rss_mb,
    run_rounds,
    server_rows,
)
from xpuspec.bench.server_process import ServerProcess
from xpuspec.bench.workloads import PromptEncoder
from xpuspec.models.bundle import ModelBundle

logger = logging.getLogger(__name__)

# Speculation field -> the xpuspec server's counter (xpuspec.server.metrics) on /metrics.
COUNTERS = {
    "drafted": "xpuspec_spec_draft_tokens_total",
    "accepted": "xpuspec_spec_accepted_tokens_total",
    "verification_steps": "xpuspec_spec_verification_steps_total",
    "target_passes": "xpuspec_target_passes_total",
    "generated": "xpuspec_generation_tokens_total",
}
FINISHED = "xpuspec_requests_finished_total{"  # one sample per finish reason
SETTLE_TIMEOUT_S = 10.0


@dataclass
class Speculation:
    """Counts over one category's requests; None where the server does not report them."""

    drafted: int | None = None
    accepted: int | None = None
    verification_steps: int | None = None  # target passes that verified drafts, once per request
    target_passes: int | None = None  # target passes that gave a request tokens, once per request
    generated: int | None = None  # tokens, as the server counted them


def metrics_delta(before: dict[str, float], after: dict[str, float]) -> Speculation:
    """The speculation counters between two /metrics scrapes (None for a counter the server lacks)."""
    values: dict[str, int | None] = {
        field_name: int(after[name] - before.get(name, 0.0)) if name in after else None
        for field_name, name in COUNTERS.items()
    }
    return Speculation(**values)


def llama_speculation(results: Sequence[ChatResult]) -> Speculation:
    """llama-server's draft counts summed over the responses that carried them."""
    carried = [r for r in results if r.draft_n is not None]
    if not carried:
        return Speculation()
    return Speculation(
        drafted=sum(r.draft_n or 0 for r in carried), accepted=sum(r.draft_accepted or 0 for r in carried)
    )


@dataclass
class CategoryResult:
    clients_round: ClientsRound
    speculation: Speculation


@dataclass
class Session:
    """One server process (one row, one round, one client count): every category once."""

    start_s: float
    categories: dict[str, CategoryResult]
    peak_rss_mb: float | None = None


@dataclass
class CategoriesRun:
    rows: list[Row]
    prompts: dict[str, int]  # per category, in report order
    clients: tuple[int, ...]
    max_tokens: int
    rounds: int
    # By (row label, client count): one session a round.
    sessions: dict[tuple[str, int], list[Session]] = field(default_factory=dict)
    not_run: dict[str, str] = field(default_factory=dict)
    left_out: dict[str, int] = field(default_factory=dict)  # prompts too long for the context
    environment: dict[str, Any] = field(default_factory=dict)
    bundle: str = ""
    # With same_lengths: per client count, each category's answer lengths every row generated.
    lengths: dict[int, dict[str, list[int]]] = field(default_factory=dict)


def category_groups(
    bundle: ModelBundle, path: Path | None, per_category: int | None, max_tokens: int
) -> tuple[dict[str, list[Messages]], dict[str, int]]:
    """Each category's prompts from ``path`` (default: the shipped set) that the bundle's context holds
    with ``max_tokens``, the first ``per_category`` of them when given; and how many did not fit, per
    category."""
    groups, left_out = fitting(
        by_category(load_category_prompts(path)), PromptEncoder(bundle), bundle.max_context, max_tokens
    )
    return {key: prompts[:per_category] for key, prompts in groups.items()}, left_out


def _finished(samples: dict[str, float]) -> float:
    return sum(value for name, value in samples.items() if name.startswith(FINISHED))


def settled_metrics(server: ServerProcess, before: dict[str, float], requests: int) -> dict[str, float]:
    """/metrics once the server has counted ``requests`` more finished requests than ``before`` (it
    counts one as its answer ends), or after SETTLE_TIMEOUT_S."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        after = server.metrics()
        if _finished(after) - _finished(before) >= requests or time.monotonic() > deadline:
            return after
        time.sleep(0.05)


def answer_lengths(session: Session, groups: dict[str, list[Messages]]) -> dict[str, list[int]]:
    """Each category's answer lengths in prompt order, from a session that sent every prompt once."""
    lengths: dict[str, list[int]] = {}
    for category, prompts in groups.items():
        by_prompt = {r.prompt_index: r.tokens for r in session.categories[category].clients_round.results}
        lengths[category] = [max(by_prompt.get(index, 1), 1) for index in range(len(prompts))]
    return lengths


def _session(
    row: Row,
    opened: ServerProcess,
    clients: int,
    groups: dict[str, list[Messages]],
    max_tokens: int,
    lengths: dict[str, list[int]] | None = None,
) -> Session:
    """Every category's prompts through ``opened``; with ``lengths``, each answer exactly that long."""
    started = time.perf_counter()
    results: dict[str, CategoryResult] = {}
    with opened as server:
        start_s = time.perf_counter() - started
        for category, prompts in groups.items():
            scraped = row.engine == "xpuspec"
            before = server.metrics() if scraped else {}
            limits = max_tokens if lengths is None else lengths[category]
            clients_round = run_clients(
                server.base_url,
                server.model,
                prompts,
                clients,
                limits,
                cycle=False,
                ignore_eos=lengths is not None,
            )
            if scraped:
                speculation = metrics_delta(before, settled_metrics(server, before, len(prompts)))
            else:
                speculation = llama_speculation(clients_round.results)
            results[category] = CategoryResult(clients_round, speculation)
            logger.info(
                "%s, %s, %d client(s): %.1f tokens/s",
                row.label,
                category,
                clients,
                clients_round.tokens_per_s,
            )
        assert server.process is not None
        rss = peak_rss_mb(server.process.pid)
    return Session(start_s, results, rss)


def run_categories(
    bundle_path: Path | None,
    bundle: ModelBundle,
    groups: dict[str, list[Messages]],
    *,
    rounds: int,
    max_tokens: int,
    out: Path,
    llama_server: Path | None = None,
    threads: Sequence[int] = (2,),
    clients: Sequence[int] = (1,),
    left_out: dict[str, int] | None = None,
    same_lengths: bool = False,
) -> CategoriesRun:
    """Every row's server at each client count, fresh each round in a rotating order, each session
    sending every category's prompts once; the machine and its load average first. ``same_lengths``:
    first a target-only session at each count gives every answer's length, which every row then
    generates (see the module's docstring)."""
    env = environment()
    env["load_average_at_start"] = load_average()
    plan = server_rows(
        bundle_path, bundle, max_tokens=max_tokens, out=out, llama_server=llama_server, threads=threads
    )
    sessions: dict[tuple[str, int], list[Session]] = {}
    lengths: dict[int, dict[str, list[int]]] = {}
    for count in clients:
        if same_lengths:
            lengths[count] = _target_only_lengths(plan, count, groups, max_tokens)
        per_count = lengths.get(count)
        sessions |= run_rounds(
            plan,
            rounds,
            [count],
            functools.partial(_session, groups=groups, max_tokens=max_tokens, lengths=per_count),
        )
    return CategoriesRun(
        rows=plan.rows,
        prompts={category: len(prompts) for category, prompts in groups.items()},
        clients=tuple(clients),
        max_tokens=max_tokens,
        rounds=rounds,
        sessions=sessions,
        not_run=plan.not_run,
        left_out=dict(left_out or {}),
        environment=env,
        bundle=str(bundle.root),
        lengths=lengths,
    )


def _target_only_lengths(
    plan: ServerRows, clients: int, groups: dict[str, list[Messages]], max_tokens: int
) -> dict[str, list[int]]:
    """Target-only's greedy answer lengths at ``clients`` clients, from one session before the rounds."""
    row = next(row for row in plan.rows if row.label == TARGET_ONLY_ROW.label)
    log = plan.logs / f"{not_run_key(row.label, clients)}-lengths.log"
    logger.info("answer lengths: %s, %d client(s)", row.label, clients)
    return answer_lengths(_session(row, plan.open(row, clients, log), clients, groups, max_tokens), groups)
