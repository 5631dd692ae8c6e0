"""The cross-request suffix drafter (xpuspec.spec_decode.suffix_index) on and off, in interleaved rounds.

Two workloads, one request at a time, greedy:

* ``agent``: an agent loop that re-sends tool results. Each request carries one of two tool results
  (a window of held-out source) under a header naming the call, and one of three instructions; the
  loop runs its steps twice, the second time with refreshed headers, as an agent re-running its
  steps does. The requests share no conversation: what the shared index can
  offer is the earlier requests' tokens.
* ``retry``: the first ``--prompts / 2`` fresh requests, then the same again (a client retrying or
  regenerating at temperature 0): the most an index of earlier answers can give.
* ``fresh``: fresh requests that share nothing but the chat template (held-out chat instructions on a
  chat model, held-out code windows on the demo pair): where the shared index must not lose.

One pipeline serves both settings; each request runs with the shared index on and off, the order
alternating request by request, and every round starts from an empty index (so that a round cannot
replay an earlier round's answers). Prefix caching is off, so that neither setting finds the other's
prompt cached. Reported per workload: tokens per second of each setting and their ratio (the median
over rounds of the ratio of the round's totals; also per CPU second of the process, which other
processes' load sways less than wall time), the shared drafts' acceptance, the share of
requests whose tokens agree, and the index's lookup cost at its full size.

Run: ``python -m research.bench.suffix_drafter --bundle demo --rounds 3`` (exact preset) or
``--bundle default --prompts 6 --max-tokens 96 --rounds 2`` (the default model, its properties).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpuspec.bench.workloads import heldout_code_prompts
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.spec_decode.suffix_index import DEFAULT_CAPACITY, SharedSuffixIndex

HELDOUT_CHAT = Path(__file__).resolve().parents[2] / "xpuspec" / "models" / "demo" / "smollm2_heldout.jsonl"
INSTRUCTIONS = (
    "List the functions this file defines, one per line.",
    "Summarize what this file does in two sentences.",
    "What does the first function in this file do?",
)
CODE_SUFFIXES = ("\n\ndef ", "\n\nclass ", "\n\n# Tests\n")

Prompt = str | list[dict[str, str]]


def agent_prompts(chat: bool, count: int) -> list[Prompt]:
    """The agent loop's ``count`` requests: ``count // 2`` (tool result, instruction) steps, then the
    same steps again with refreshed headers."""
    tools = [p.text for p in heldout_code_prompts(2, prompt_chars=900 if chat else 650, seed=7)]
    steps = [(tool, instruction) for tool in range(len(tools)) for instruction in range(len(INSTRUCTIONS))]
    prompts: list[Prompt] = []
    for rerun in range(2):
        for call, (tool, instruction) in enumerate(steps[: max(1, count // 2)]):
            header = f"# read_file result (call {rerun * 10 + call}, status ok)\n"
            if chat:
                content = f"Tool result:\n{header}{tools[tool]}\n\n{INSTRUCTIONS[instruction]}"
                system = "You are a coding agent. Answer from the tool results."
                prompts.append([{"role": "system", "content": system}, {"role": "user", "content": content}])
            else:
                prompts.append(header + tools[tool] + CODE_SUFFIXES[instruction])
    return prompts


def fresh_prompts(chat: bool, count: int) -> list[Prompt]:
    if chat:
        lines = HELDOUT_CHAT.read_text(encoding="utf-8").splitlines()
        return [json.loads(line)["messages"] for line in lines if line.strip()][:count]
    return [p.text for p in heldout_code_prompts(count, prompt_chars=500, seed=3)]


def workload_prompts(workload: str, chat: bool, count: int) -> list[Prompt]:
    if workload == "agent":
        return agent_prompts(chat, count)
    if workload == "retry":
        return fresh_prompts(chat, max(1, count // 2)) * 2
    return fresh_prompts(chat, count)


@dataclass
class Totals:
    tokens: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # the process's CPU time: less swayed than wall time by other processes' load
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_cpu_second(self) -> float:
        return self.tokens / self.cpu_seconds if self.cpu_seconds else 0.0


def run_round(pipe: Any, prompts: list[Prompt], params: SamplingParams, capacity: int) -> dict[str, Any]:
    lookup = pipe.prompt_lookup
    index = SharedSuffixIndex(capacity)
    totals = {"on": Totals(), "off": Totals()}
    drafted, accepted = lookup.shared_drafted, lookup.shared_accepted
    for number, prompt in enumerate(prompts):
        for setting in ("on", "off") if number % 2 == 0 else ("off", "on"):
            lookup.shared = index if setting == "on" else None
            started, cpu_started = time.perf_counter(), time.process_time()
            result = pipe.generate(prompt, params)[0]
            totals[setting].seconds += time.perf_counter() - started
            totals[setting].cpu_seconds += time.process_time() - cpu_started
            totals[setting].tokens += len(result.token_ids)
            totals[setting].outputs.append(result.token_ids)
    lookup.shared = None
    same = sum(a == b for a, b in zip(totals["on"].outputs, totals["off"].outputs, strict=True))
    return {
        "on_tps": totals["on"].tokens_per_second,
        "off_tps": totals["off"].tokens_per_second,
        "ratio": totals["on"].tokens_per_second / totals["off"].tokens_per_second,
        "cpu_ratio": totals["on"].tokens_per_cpu_second / totals["off"].tokens_per_cpu_second,
        "shared_drafted": lookup.shared_drafted - drafted,
        "shared_accepted": lookup.shared_accepted - accepted,
        "same_tokens": f"{same}/{len(prompts)}",
        "index_tokens": index.num_tokens,
    }


def lookup_microseconds(capacity: int, repeats: int = 20000) -> dict[str, float]:
    """One lookup's cost in an index filled to ``capacity`` with random documents: a hit and a miss."""
    rng = random.Random(0)
    index = SharedSuffixIndex(capacity)
    documents = []
    while index.num_tokens < capacity * 0.95:
        document = [rng.randrange(49152) for _ in range(rng.randrange(200, 2000))]
        documents.append(document)
        index.add(None, document)
    hit = [1, 2] + documents[-1][:200]
    miss = [rng.randrange(49152) for _ in range(200)]
    figures = {}
    for name, tokens in (("hit", hit), ("miss", miss)):
        started = time.perf_counter()
        for _ in range(repeats):
            index.lookup(None, tokens, 8)
        figures[f"lookup_{name}_us"] = (time.perf_counter() - started) / repeats * 1e6
    started = time.perf_counter()
    filled = SharedSuffixIndex(capacity)
    for document in documents:
        filled.add("t", document)
    figures["add_us_per_token"] = (time.perf_counter() - started) / sum(map(len, documents)) * 1e6
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default="demo", help="demo, default, or a bundle folder")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=12, help="requests per workload")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--capacity", type=int, default=DEFAULT_CAPACITY)
    parser.add_argument("--workloads", default="agent,fresh")
    args = parser.parse_args()

    from xpuspec.api.pipeline import Pipeline

    demo = args.bundle == "demo"
    bundle = None if args.bundle == "default" else args.bundle
    # The demo pair in exact mode (outputs must agree); the default model with its own properties.
    pipe = Pipeline(bundle, properties="exact" if demo else None, enable_prefix_caching=False)
    if pipe.prompt_lookup is None:
        raise SystemExit(
            f"drafter {pipe.drafter!r}: prompt lookup (and so the shared index) needs a draft model"
        )
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    print(json.dumps({"bundle": args.bundle, "drafter": pipe.drafter, **lookup_microseconds(args.capacity)}))
    pipe.generate(fresh_prompts(not demo, 1)[0], params)  # warm-up
    for workload in args.workloads.split(","):
        prompts = workload_prompts(workload, not demo, args.prompts)
        rounds = []
        for number in range(args.rounds):
            rounds.append(run_round(pipe, prompts, params, args.capacity))
            print(json.dumps({"workload": workload, "round": number, **rounds[-1]}), flush=True)
        drafted = sum(r["shared_drafted"] for r in rounds)
        summary = {
            "workload": workload,
            "requests": len(prompts),
            "ratio_median": statistics.median(r["ratio"] for r in rounds),
            "ratios": [round(r["ratio"], 3) for r in rounds],
            "cpu_ratio_median": statistics.median(r["cpu_ratio"] for r in rounds),
            "cpu_ratios": [round(r["cpu_ratio"], 3) for r in rounds],
            "on_tps": statistics.median(r["on_tps"] for r in rounds),
            "off_tps": statistics.median(r["off_tps"] for r in rounds),
            "shared_acceptance": sum(r["shared_accepted"] for r in rounds) / drafted if drafted else None,
            "shared_drafted": drafted,
        }
        print("SUMMARY " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
