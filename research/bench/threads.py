"""Thread settings of the draft and the target in one process, at batch 1, quiet and under a busy core.

python -m research.bench.threads [--bundle default] [--rounds 4] [--prompts 4] [--max-tokens 128]
                                 [--configs default,pin-off,draft-1,both-1] [--loads quiet,busy]

Each configuration is a set of OpenVINO compile properties for the target and for the draft (thread
counts, ``ENABLE_CPU_PINNING``). Every (configuration, load) runs in a fresh process, as `xpuspec serve`
would: it builds the default ``Pipeline`` (the bundle's drafter, prefix caching off so the repeated
prompts are recomputed), warms up, then answers each chat instruction greedily twice, target-only
(``num_draft_tokens=0``) and with the default speculation (adaptive γ), in alternating order, a fixed
128 tokens each (end of sequence ignored). "busy" runs one busy-looping process beside it (one core of
background load, as a laptop's other work). The runs interleave: every round visits every (configuration,
load), in an order rotating with the rounds. Reported: tokens/s per run and the median over rounds of each
configuration's ratio to the plugin defaults in the same round and load. Not a test: timings depend on the
machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# (target properties, draft properties); None: the plugin's defaults.
CONFIGS: dict[str, tuple[dict[str, Any] | None, dict[str, Any] | None]] = {
    "default": (None, None),
    "pin-off": ({"ENABLE_CPU_PINNING": False}, {"ENABLE_CPU_PINNING": False}),
    "pin-on": ({"ENABLE_CPU_PINNING": True}, {"ENABLE_CPU_PINNING": True}),
    "draft-1": (None, {"INFERENCE_NUM_THREADS": 1}),
    "both-1": ({"INFERENCE_NUM_THREADS": 1}, {"INFERENCE_NUM_THREADS": 1}),
    "draft-1-pin-off": (
        {"ENABLE_CPU_PINNING": False},
        {"INFERENCE_NUM_THREADS": 1, "ENABLE_CPU_PINNING": False},
    ),
}
MODES = {"target-only": 0, "speculative": None}
BUSY_LOOP = "while True:\n    pass\n"


def worker(config: str, bundle: str | None, prompts: int, max_tokens: int) -> dict[str, Any]:
    """In a fresh process: build, warm up, time every prompt in both modes; tokens/s per mode."""
    import openvino as ov

    from xpuspec.api.pipeline import Pipeline
    from xpuspec.bench.workloads import load_workload
    from xpuspec.sample.sampling_params import SamplingParams

    target, draft = CONFIGS[config]
    started = time.perf_counter()
    pipeline = Pipeline(
        None if bundle in (None, "default") else bundle,
        properties=target,
        draft_properties=draft,
        enable_prefix_caching=False,
    )
    build_s = time.perf_counter() - started
    messages = [
        p.text if isinstance(p.text, list) else [{"role": "user", "content": p.text}]
        for p in load_workload("chat", prompts)
    ]
    warm = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    pipeline.generate(messages[0], warm)
    tokens = {mode: 0 for mode in MODES}
    seconds = {mode: 0.0 for mode in MODES}
    for index, prompt in enumerate(messages):
        order = list(MODES) if index % 2 == 0 else list(reversed(MODES))
        for mode in order:
            params = SamplingParams(
                max_tokens=max_tokens, temperature=0.0, ignore_eos=True, num_draft_tokens=MODES[mode]
            )
            begin = time.perf_counter()
            result = pipeline.generate(prompt, params)[0]
            seconds[mode] += time.perf_counter() - begin
            tokens[mode] += len(result.token_ids)
    return {
        "config": config,
        "build_s": build_s,
        "cpu_pinning_default": bool(ov.Core().get_property("CPU", "ENABLE_CPU_PINNING")),
        **{mode: tokens[mode] / seconds[mode] for mode in MODES},
    }


def _one_run(config: str, load: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, "-m", "research.bench.threads", "--worker", config]
    command += ["--bundle", args.bundle, "--prompts", str(args.prompts), "--max-tokens", str(args.max_tokens)]
    busy = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if load == "busy" else None
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=True)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {**result, "load": load}


def _ratios(runs: list[dict[str, Any]], configs: list[str], loads: list[str]) -> dict[str, Any]:
    """Per load, configuration and mode: the median over rounds of tokens/s over the defaults' (same
    round and load); and the speculative over target-only ratio of each configuration."""
    table: dict[str, Any] = {}
    for load in loads:
        for config in configs:
            entry: dict[str, Any] = {}
            for mode in MODES:
                ratios, speeds = [], []
                for round_ in sorted({run["round"] for run in runs}):
                    mine = [r for r in runs if (r["round"], r["config"], r["load"]) == (round_, config, load)]
                    base = [
                        r for r in runs if (r["round"], r["config"], r["load"]) == (round_, "default", load)
                    ]
                    if mine and base:
                        ratios.append(mine[0][mode] / base[0][mode])
                        speeds.append(mine[0][mode])
                entry[mode] = {
                    "tokens_per_s": statistics.median(speeds) if speeds else None,
                    "vs_default": statistics.median(ratios) if ratios else None,
                    "vs_default_by_round": [round(r, 3) for r in ratios],
                }
            mine = [r for r in runs if (r["config"], r["load"]) == (config, load)]
            entry["speculative_vs_target_only"] = (
                statistics.median(r["speculative"] / r["target-only"] for r in mine) if mine else None
            )
            table[f"{config} / {load}"] = entry
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bundle", default="default")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--configs", default="default,pin-off,draft-1,both-1")
    parser.add_argument("--loads", default="quiet,busy")
    parser.add_argument("--out", type=Path, default=Path("threads.json"))
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.worker:
        print(json.dumps(worker(args.worker, args.bundle, args.prompts, args.max_tokens)))
        return 0
    configs, loads = args.configs.split(","), args.loads.split(",")
    if "default" not in configs or any(config not in CONFIGS for config in configs):
        parser.error(f"--configs: names from {', '.join(CONFIGS)}, default among them")
    cells = [(config, load) for load in loads for config in configs]
    runs: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        shift = round_ % len(cells)
        for config, load in cells[shift:] + cells[:shift]:
            run = {**_one_run(config, load, args), "round": round_}
            runs.append(run)
            logger.info(
                "round %d %s / %s: target-only %.1f, speculative %.1f tokens/s (build %.1f s)",
                round_,
                config,
                load,
                run["target-only"],
                run["speculative"],
                run["build_s"],
            )
            args.out.write_text(json.dumps({"runs": runs}, indent=1))
    summary = {
        "runs": runs,
        "ratios": _ratios(runs, configs, loads),
        "args": vars(args) | {"out": str(args.out)},
    }
    args.out.write_text(json.dumps(summary, indent=1))
    for name, entry in summary["ratios"].items():
        print(
            f"{name}: target-only {entry['target-only']['tokens_per_s']:.1f} tokens/s "
            f"(x{entry['target-only']['vs_default']:.3f} default), speculative "
            f"{entry['speculative']['tokens_per_s']:.1f} (x{entry['speculative']['vs_default']:.3f}), "
            f"speculative/target-only {entry['speculative_vs_target_only']:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
