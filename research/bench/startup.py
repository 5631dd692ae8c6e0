"""What a start costs: ``python -m research.bench.startup cache [--bundle B]`` and
``python -m research.bench.startup serve [--bundle B] [--rounds 3] [--source ROOT ...]``.

``cache``: each model of the bundle (tokenizer, detokenizer, the draft and the target made paged as the
runner makes them, and the target unpaged for comparison) compiled without a cache, then twice in a
fresh ``ov.Core`` on one ``CACHE_DIR``; each row prints the three walls and whether the last compile
loaded the blob (``LOADED_FROM_CACHE``). Compare within a row: on a busy machine the walls move.

``serve``: ``xpuspec serve`` started from each ``--source`` (a folder holding an ``xpuspec`` package,
default: this checkout) in turn, ``--rounds`` times, interleaved; one JSON line per start with the
seconds from spawn to the first 200 of ``/health`` (polled every 20 ms), the server's CPU seconds
(all its threads) and RSS at that moment, then the time to first token and the streamed chunks per
second of three greedy chat requests of ``--max-tokens``, and the RSS after them.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

REPOSITORY = Path(__file__).resolve().parents[2]
PROMPTS = (
    "Give three tips for staying healthy.",
    "Write a short poem about the sea.",
    "Explain what a binary search is.",
)


def _models(bundle: Any, core: Any) -> Iterator[tuple[str, Any, dict[str, Any]]]:
    from xpuspec.executor.graph_edits import make_paged_model

    target = bundle.target.path / "openvino_model.xml"
    yield "tokenizer", core.read_model(bundle.target.path / "openvino_tokenizer.xml"), {}
    yield "detokenizer", core.read_model(bundle.target.path / "openvino_detokenizer.xml"), {}
    if bundle.draft is not None:
        draft = core.read_model(bundle.draft.path / "openvino_model.xml")
        yield "draft, paged", make_paged_model(draft), {}
    per_token = {"KEY_CACHE_QUANT_MODE": "BY_TOKEN"}  # as the pipeline compiles a drafting target
    yield "target, paged", make_paged_model(core.read_model(target)), per_token
    yield "target, stateful (unpaged)", core.read_model(target), {}


def cache_rows(bundle_name: str | None) -> list[str]:
    import openvino as ov
    import openvino_tokenizers  # noqa: F401  (the tokenizer models' operations, for every Core after)

    from xpuspec.models.resolve import resolve_bundle

    bundle = resolve_bundle(bundle_name)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, model, properties in _models(bundle, ov.Core()):
            walls, loaded = [], False
            for cache in (None, folder, folder):
                core = ov.Core()
                if cache is not None:
                    core.set_property({"CACHE_DIR": cache})
                started = time.perf_counter()
                compiled = core.compile_model(model, "CPU", properties)
                walls.append(time.perf_counter() - started)
                loaded = bool(cache) and bool(compiled.get_property("LOADED_FROM_CACHE"))
            state = "loaded" if loaded else "not loaded"
            rows.append(
                f"{name}: no cache {walls[0]:.3f} s, cache 1st {walls[1]:.3f} s, "
                f"cache 2nd {walls[2]:.3f} s ({state})"
            )
    return rows


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _chat(client: httpx.Client, base: str, model: str, prompt: str, max_tokens: int) -> tuple[float, float]:
    """Time to first token and streamed chunks per second of one greedy chat request."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    first, chunks = None, 0
    with client.stream("POST", f"{base}/v1/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[len("data: ") :])
                if any(choice.get("delta", {}).get("content") for choice in event.get("choices", ())):
                    chunks += 1
                    first = first or time.perf_counter()
    ended = time.perf_counter()
    return ((first or ended) - started, chunks / (ended - started))


def serve_round(source: Path, bundle: str | None, max_tokens: int, log: Path) -> dict[str, Any]:
    port = _free_port()
    command = [sys.executable, "-m", "xpuspec.cli", "serve", "--port", str(port), "--host", "127.0.0.1"]
    command += ["--bundle", bundle] if bundle else []
    env = {**os.environ, "PYTHONPATH": str(source)}
    base = f"http://127.0.0.1:{port}"
    with open(log, "ab") as output:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env, cwd=source)
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the server from {source} exited with {process.returncode}; see {log}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        row: dict[str, Any] = {"source": str(source), "ready_s": round(time.perf_counter() - started, 3)}
        row["cpu_at_ready_s"] = round(_cpu_seconds(process.pid), 2)
        row["rss_at_ready_mb"] = round(_rss_mb(process.pid))
        model = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
        with httpx.Client(timeout=300) as client:
            results = [_chat(client, base, model, prompt, max_tokens) for prompt in PROMPTS]
        row["ttft_ms"] = [round(ttft * 1e3, 1) for ttft, _ in results]
        row["chunks_per_s"] = [round(rate, 1) for _, rate in results]
        row["rss_after_mb"] = round(_rss_mb(process.pid))
        return row
    finally:
        process.terminate()
        process.wait(timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m research.bench.startup", description=__doc__)
    parser.add_argument("what", choices=("cache", "serve"))
    parser.add_argument(
        "--bundle", default=None, help="a bundle folder or 'demo' (default: the default model)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--source", type=Path, action="append", help="a folder holding an xpuspec package")
    parser.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "startup-serve.log")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.max_tokens < 1:
        parser.error("--rounds and --max-tokens must be at least 1")
    sources = args.source or [REPOSITORY]
    for source in sources:
        if not (source / "xpuspec" / "__init__.py").is_file():
            parser.error(f"{source} holds no xpuspec package")
    if args.what == "cache":
        for row in cache_rows(args.bundle):
            print(row, flush=True)
        return 0
    for _ in range(args.rounds):
        for source in sources:
            print(json.dumps(serve_round(source, args.bundle, args.max_tokens, args.log)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
