"""What a bench run costs the machine: the engines' KV sizing, a rough estimate of its time and peak
memory stated before it starts, and the process's resident memory (read from /proc, Linux).

The estimate counts the engines the run compiles (every engine of a round at once in the full bench,
a pair at a time with --quick) and prices each from the size of its model files: a compiled engine
holds its weights decompressed (int4 and int8 files grow to bf16 or f32) plus its KV cache. The
coefficients are upper bounds fitted to engines measured one at a time on the default model and the
demo pair (docs/bench-cost.md); tracemalloc sees none of OpenVINO's memory,
so they come from VmRSS.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

BLOCK_TOKENS = 16
GIB = 1024**3
# Resident bytes of a compiled engine per byte of its model files, and a fixed part per engine.
WEIGHT_GROWTH = 4.0
ENGINE_FIXED_BYTES = 96 * 1024**2
PROCESS_BYTES = 400 * 1024**2  # Python, OpenVINO and the tokenizers, before any engine
SERVER_KV_BYTES = 512 * 1024**2  # `xpuspec serve`'s default KV cache (executor.paged_runner)
GENAI_CB_CACHE_BYTES = 1 * GIB  # the load mode's GenAI cache (peers._scheduler_config)
# Seconds: compiling an engine (and its warm-up) per GiB of model files, on top of a fixed part; one
# decoded token per GiB of target files (batch 1); starting a server process.
COMPILE_S_PER_GIB, COMPILE_FIXED_S = 80.0, 3.0
TOKEN_S_PER_GIB, TOKEN_FIXED_S = 0.15, 0.002
SERVER_START_S = 15.0


def kv_tokens(prompts: list[list[int]], max_tokens: int, max_draft: int, max_context: int) -> int:
    """The context a batch-1 engine needs for these prompts: the longest prompt, its output and one
    step's drafts and bonus token, in whole blocks, within the model's context."""
    need = max((len(p) for p in prompts), default=0) + max_tokens + max_draft + 1
    return min(max_context, -(-need // BLOCK_TOKENS) * BLOCK_TOKENS)


def kv_blocks(max_model_len: int) -> int:
    """KV blocks of a batch-1 engine: twice one full sequence (tree drafts and the calibration's dummy
    token take blocks of their own), and a few more."""
    return 2 * -(-max_model_len // BLOCK_TOKENS) + 8


def _files_bytes(folder: Path | None) -> int:
    if folder is None or not folder.is_dir():
        return 0
    return sum(p.stat().st_size for p in folder.iterdir() if p.suffix in (".bin", ".safetensors"))


@dataclass(frozen=True)
class Estimate:
    """A run's rough cost: seconds, and peak resident bytes of the bench and its server together."""

    seconds: float
    peak_bytes: int
    engines: int  # engines compiled, over all rounds

    def describe(self) -> str:
        minutes = self.seconds / 60
        span = f"{self.seconds:.0f} s" if minutes < 2 else f"{minutes:.0f} min"
        return (
            f"about {span} and {self.peak_bytes / GIB:.1f} GB of memory at its peak ({self.engines} engines)"
        )


def estimate(config: Any, bundle: Any, engine_groups: list[list[tuple[str, str]]], rows: int) -> Estimate:
    """The rough cost of ``config`` on ``bundle``: ``engine_groups`` lists, per compile group of one
    round, each engine's ``(key, family)`` (the groups' engines live at once); ``rows`` the rows run."""
    target = _files_bytes(bundle.target.path)
    draft = _files_bytes(bundle.draft.path) if bundle.draft is not None else 0
    head = _files_bytes(bundle.eagle3.path) if bundle.eagle3 is not None else 0
    # Code runs about three characters a token: two is an upper bound on a prompt's tokens.
    longest = config.prompt_chars // 2 + config.max_tokens + 16
    kv_bytes = _kv_bytes_per_token(bundle) * BLOCK_TOKENS * kv_blocks(min(longest, bundle.max_context))

    def files(key: str) -> int:
        extra = draft if key.endswith(("/draft", "/adaptive", "/tree auto")) else 0
        return target + (head if key.endswith("eagle3") else extra)

    def engine_bytes(key: str) -> int:
        return int(WEIGHT_GROWTH * files(key)) + kv_bytes + ENGINE_FIXED_BYTES

    latency_peak = max((sum(engine_bytes(key) for key, _ in group) for group in engine_groups), default=0)
    server_bytes = int(WEIGHT_GROWTH * (target + draft)) + SERVER_KV_BYTES + PROCESS_BYTES
    load_peak = max(server_bytes, int(WEIGHT_GROWTH * (target + draft)) + GENAI_CB_CACHE_BYTES)
    peak = PROCESS_BYTES + max(
        latency_peak if config.runs_latency else 0, load_peak if config.runs_load else 0
    )
    engines = sum(len(group) for group in engine_groups) * config.rounds
    token_s = TOKEN_FIXED_S + TOKEN_S_PER_GIB * target / GIB
    seconds = (
        sum(
            COMPILE_FIXED_S + COMPILE_S_PER_GIB * files(key) / GIB
            for group in engine_groups
            for key, _ in group
        )
        * config.rounds
    )
    seconds += rows * config.num_prompts * config.rounds * config.max_tokens * token_s
    if config.runs_load:
        levels = sum(config.concurrency) * config.requests_per_client
        servers = 1 if config.quick else 2  # and as many GenAI CB pipelines (xpuspec.bench.load)
        compiles = COMPILE_FIXED_S + COMPILE_S_PER_GIB * (target + draft) / GIB
        seconds += servers * (SERVER_START_S + 2 * compiles) + 5 * levels * config.max_tokens * token_s
    return Estimate(seconds, peak, engines)


def _kv_bytes_per_token(bundle: Any) -> int:
    """KV bytes per token of the target at f32 (an upper bound for every cache precision)."""
    facts = bundle.target.facts
    layers, heads = int(facts.get("num_layers", 32)), int(facts.get("num_kv_heads", 8))
    return 2 * layers * heads * int(facts.get("head_dim", 128)) * 4


def mem_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes: what the machine can give without swapping; None if
    unknown (not Linux)."""
    return _proc_kib("/proc/meminfo", "MemAvailable:")


def rss_bytes() -> int | None:
    """This process's resident memory now (VmRSS)."""
    return _proc_kib("/proc/self/status", "VmRSS:")


def peak_rss_bytes() -> int | None:
    """This process's peak resident memory so far (VmHWM)."""
    return _proc_kib("/proc/self/status", "VmHWM:")


def _proc_kib(path: str, field: str) -> int | None:
    try:
        with open(path, encoding="ascii") as lines:
            for line in lines:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
