"""A long soak of one `xpuspec serve`: ``python -m research.bench.soak [--bundle B] --minutes 30 --out DIR``.

Starts the server (``--serve-arg`` passes further flags), runs every kind of client of
:mod:`research.bench.soak_traffic` at once for ``--minutes``, and samples the server's RSS (VmRSS)
and KV blocks in use every ``--interval`` seconds. After the traffic it waits for the requests in
flight to end, reads the KV blocks still in use, then stops the server with SIGTERM.

Writes ``soak.json`` (every sample, per-kind status counts, the summary) and ``soak.md`` (the
summary: RSS at ready, after warm-up, at minutes 10 and 30 where the run is that long, the growth
from minute 10 to the end, 5xx answers, transport errors, KV after, /health p99, the exit code).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from research.bench.soak_traffic import KINDS, Target

logger = logging.getLogger(__name__)

REPOSITORY = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 600.0
IDLE_TIMEOUT_S = 120.0
CHECKPOINT_MINUTES = (1, 5, 10, 20, 30)


@dataclass
class Sample:
    """One reading, ``at_s`` seconds after the server was ready."""

    at_s: float
    rss_mb: float
    kv_blocks_used: int | None
    num_in_flight: int | None
    rss_by_kind_mb: dict[str, float] = field(default_factory=dict)  # see rss_by_kind


@dataclass
class KindCounts:
    """What one kind of client got: statuses by class, transport errors, and call latencies."""

    statuses: Counter[str] = field(default_factory=Counter)
    transport_errors: Counter[str] = field(default_factory=Counter)
    latencies_s: list[float] = field(default_factory=list)

    def record(self, status: int, latency_s: float) -> None:
        self.statuses[status_class(status)] += 1
        self.latencies_s.append(latency_s)


def status_class(status: int) -> str:
    """``"2xx"``, ``"4xx"``, ``"5xx"`` (and so on), or ``"none"`` where no answer was due."""
    return "none" if status == 0 else f"{status // 100}xx"


def rss_mb(pid: int) -> float:
    """VmRSS of ``pid`` in MB (10^6 bytes)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError(f"no VmRSS for {pid}")


# glibc's malloc places each thread arena's heap at an address aligned to its largest size
# (HEAP_MAX_SIZE, 64 MiB on 64-bit); other anonymous mappings are seldom so aligned.
ARENA_HEAP_ALIGNMENT = 64 << 20


def rss_by_kind(pid: int) -> dict[str, float]:
    """Resident MB by kind of mapping: ``files`` (libraries, weights), ``heap`` (the main arena),
    ``arenas`` (other threads' malloc arenas), ``anon`` (the rest: KV tensors, Python's own arenas,
    the plugin's large buffers)."""
    kinds: Counter[str] = Counter()
    kind = "anon"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's header line
            name = fields[5] if len(fields) > 5 else ""
            start = int(fields[0].split("-")[0], 16)
            kind = "files" if name.startswith("/") else "heap" if name == "[heap]" else "anon"
            if kind == "anon" and not name and start % ARENA_HEAP_ALIGNMENT == 0:
                kind = "arenas"
        elif fields[0] == "Rss:":
            kinds[kind] += int(fields[1])
    return {name: round(kb * 1024 / 1e6, 1) for name, kb in sorted(kinds.items())}


def percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def sample_at(samples: list[Sample], at_s: float) -> Sample | None:
    """The last sample taken at or before ``at_s`` (None before the first, or past the run's end)."""
    if not samples or samples[-1].at_s < at_s:
        return None
    earlier = [sample for sample in samples if sample.at_s <= at_s]
    return earlier[-1] if earlier else None


def summarize(
    samples: list[Sample],
    counts: dict[str, KindCounts],
    warmup_s: float,
    after: dict[str, Any],
) -> dict[str, Any]:
    """The figures a reader wants from a soak (``after``: the server's state once traffic ended)."""
    warm = sample_at(samples, warmup_s)
    minute_10 = sample_at(samples, 600)
    last = samples[-1] if samples else None
    growth = None
    if minute_10 is not None and last is not None and last.at_s > minute_10.at_s:
        growth = round(100 * (last.rss_mb - minute_10.rss_mb) / minute_10.rss_mb, 1)
    health = counts.get("health")
    checkpoints = {}
    for minutes in CHECKPOINT_MINUTES:
        sample = sample_at(samples, minutes * 60)
        if sample is not None:
            checkpoints[str(minutes)] = round(sample.rss_mb, 1)
    return {
        "rss_by_kind_at_ready_mb": samples[0].rss_by_kind_mb if samples else None,
        "rss_by_kind_at_end_mb": last.rss_by_kind_mb if last else None,
        "rss_at_ready_mb": round(samples[0].rss_mb, 1) if samples else None,
        "rss_after_warmup_mb": round(warm.rss_mb, 1) if warm else None,
        "rss_at_minute_mb": checkpoints,
        "rss_at_end_mb": round(last.rss_mb, 1) if last else None,
        "rss_max_mb": round(max(sample.rss_mb for sample in samples), 1) if samples else None,
        "rss_growth_minute_10_to_end_pct": growth,
        "responses_5xx": sum(kind.statuses["5xx"] for kind in counts.values()),
        "hostile_accepted": counts["hostile"].statuses["2xx"] if "hostile" in counts else None,
        "transport_errors": sum(sum(kind.transport_errors.values()) for kind in counts.values()),
        "requests": sum(sum(kind.statuses.values()) for kind in counts.values()),
        "health_p99_s": percentile(health.latencies_s, 0.99) if health else None,
        **after,
    }


def markdown(summary: dict[str, Any], counts: dict[str, KindCounts], command: str) -> str:
    lines = [
        "# Soak of `xpuspec serve`",
        "",
        f"`{command}`",
        "",
        "| figure | value |",
        "|---|---|",
    ]
    for key, value in summary.items():
        lines.append(f"| {key} | {value} |")
    lines += ["", "| client | statuses | transport errors | p50 s | p99 s |", "|---|---|---|---|---|"]
    for name, kind in counts.items():
        statuses = ", ".join(f"{key}: {value}" for key, value in sorted(kind.statuses.items()))
        errors = ", ".join(f"{key}: {value}" for key, value in sorted(kind.transport_errors.items())) or "0"
        p50, p99 = percentile(kind.latencies_s, 0.5), percentile(kind.latencies_s, 0.99)
        lines.append(f"| {name} | {statuses} | {errors} | {_round(p50)} | {_round(p99)} |")
    return "\n".join(lines) + "\n"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(bundle: str | None, extra: list[str], log_path: Path) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    command = [sys.executable, "-m", "xpuspec.cli", "serve", "--port", str(port), "--quiet", *extra]
    if bundle is not None:
        command += ["--bundle", bundle]
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=REPOSITORY, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}: see {log_path}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process, port
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"the server did not become ready in {STARTUP_TIMEOUT_S:g} s: see {log_path}")


def served_model(base_url: str) -> str:
    return str(httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"])


def engine_state(base_url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{base_url}/v1/xpuspec/state", timeout=30).json())


def run_clients(target: Target, deadline: float, seed: int) -> dict[str, KindCounts]:
    """Every kind of client, each on its own threads, until ``deadline`` (time.monotonic)."""
    counts = {name: KindCounts() for name in KINDS}
    lock = threading.Lock()

    def client(name: str, index: int) -> None:
        call, _, pause = KINDS[name]
        rng = random.Random(f"{seed}-{name}-{index}")
        while time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                status = call(target, rng)
            except Exception as error:  # a transport failure is a finding, not a crash of the soak
                with lock:
                    counts[name].transport_errors[type(error).__name__] += 1
                logger.warning("%s: %s: %s", name, type(error).__name__, error)
                time.sleep(1)
                continue
            with lock:
                counts[name].record(status, time.perf_counter() - started)
            if status >= 500:
                logger.warning("%s: got %d", name, status)
            time.sleep(pause)

    threads = [
        threading.Thread(target=client, args=(name, index), name=f"soak-{name}-{index}", daemon=True)
        for name, (_, clients, _) in KINDS.items()
        for index in range(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return counts


def sample_until(pid: int, base_url: str, started: float, stop: threading.Event, interval: float,
                 samples: list[Sample]) -> None:  # fmt: skip
    while True:
        try:
            state: dict[str, Any] = engine_state(base_url)
        except httpx.HTTPError:
            state = {}
        samples.append(
            Sample(
                time.monotonic() - started,
                rss_mb(pid),
                state.get("kv_blocks_used"),
                state.get("num_in_flight"),
                rss_by_kind(pid),
            )
        )
        if stop.wait(interval):
            return


def wait_idle(base_url: str) -> dict[str, Any]:
    """The engine state once nothing is in flight (or after IDLE_TIMEOUT_S)."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    state = engine_state(base_url)
    while time.monotonic() < deadline and (state["num_in_flight"] or state["num_running"]):
        time.sleep(0.5)
        state = engine_state(base_url)
    return state


def stop_server(process: subprocess.Popen) -> tuple[int, float]:
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        code = process.wait()
    return code, time.monotonic() - started


def soak(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    process, port = start_server(args.bundle, args.serve_arg, out / "server.log")
    base_url = f"http://127.0.0.1:{port}"
    samples: list[Sample] = []
    stop = threading.Event()
    ready = time.monotonic()
    sampler = threading.Thread(
        target=sample_until, args=(process.pid, base_url, ready, stop, args.interval, samples), daemon=True
    )
    try:
        target = Target(base_url, port, served_model(base_url))
        sampler.start()
        counts = run_clients(target, ready + args.minutes * 60, args.seed)
        idle = wait_idle(base_url)
        stop.set()
        sampler.join()
        samples.append(
            Sample(
                time.monotonic() - ready,
                rss_mb(process.pid),
                idle["kv_blocks_used"],
                0,
                rss_by_kind(process.pid),
            )
        )
        after = {
            "kv_blocks_used_after": idle["kv_blocks_used"],
            "kv_blocks_total": idle["kv_blocks_total"],
            "in_flight_after": idle["num_in_flight"],
            "requests_failed": idle["requests_failed"],
            "engine_failures": idle["engine_failures"],
        }
    finally:
        stop.set()
        exit_code, stop_s = stop_server(process)
    after.update({"exit_code": exit_code, "stop_s": round(stop_s, 2), "minutes": args.minutes})
    summary = summarize(samples, counts, args.warmup_minutes * 60, after)
    command = " ".join(["python -m research.bench.soak", *sys.argv[1:]])
    report = {
        "command": command,
        "summary": summary,
        "kinds": {name: {"statuses": dict(kind.statuses), "transport_errors": dict(kind.transport_errors),
                         "p99_s": percentile(kind.latencies_s, 0.99)} for name, kind in counts.items()},
        "samples": [asdict(sample) for sample in samples],
        "memory_log": [line for line in (out / "server.log").read_text(errors="replace").splitlines()
                       if "memory budget" in line],
    }  # fmt: skip
    (out / "soak.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "soak.md").write_text(markdown(summary, counts, command))
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default=None, help="a bundle folder or demo (default: the default model)")
    parser.add_argument("--minutes", type=float, default=30.0, help="how long the traffic runs")
    parser.add_argument("--warmup-minutes", type=float, default=2.0, help="where 'after warm-up' is read")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between two samples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--serve-arg", action="append", default=[], help="a further `serve` flag (repeatable)"
    )
    parser.add_argument("--out", required=True, help="folder for soak.json, soak.md and server.log")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request drowns the findings
    report = soak(args)
    print(json.dumps(report["summary"]))


if __name__ == "__main__":
    main()
