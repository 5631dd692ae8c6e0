"""xpuspec against OpenVINO GenAI on the same IR, prompts and settings, in one run.

    python -m xpuspec.bench.genai_compare [--bundle B] [--prompts 12] [--max-tokens 64] [--gamma 4]

Four batch-1 configurations, each over the same held-out code prompts, greedy, a fixed number
of new tokens (ignore_eos): xpuspec and GenAI target-only, xpuspec and GenAI speculative with
the bundle's draft. Rounds interleave the configurations so that machine noise hits all alike;
each configuration's figure is its best round. Prints a Markdown table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from xpuspec.bench.workloads import heldout_code_prompts
from xpuspec.model_bundle import ModelBundle
from xpuspec.sample.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class RunFigures:
    name: str
    tokens: int = 0
    seconds: list[float] = field(default_factory=list)  # one per round
    outputs: list[list[int]] = field(default_factory=list)
    acceptance_rate: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / min(self.seconds) if self.seconds else 0.0


class XpuspecRunner:
    def __init__(self, bundle: Path | None, drafter: str, gamma: int | None, properties: dict[str, str]):
        from xpuspec.pipeline import Pipeline

        self.pipe = Pipeline(bundle, drafter=drafter, properties=properties or None)
        self.gamma = gamma
        self.tokenizer = self.pipe.tokenizer
        self.drafted = self.accepted = 0

    def generate(self, token_ids: list[int], max_tokens: int) -> list[int]:
        params = SamplingParams(
            max_tokens=max_tokens, temperature=0.0, ignore_eos=True, num_draft_tokens=self.gamma
        )
        engine = self.pipe.engine
        engine.add_request("bench", token_ids, params)
        output: list[int] = []
        while True:
            for step in engine.step():
                output.extend(step.new_token_ids)
                if step.finished:
                    self.drafted += step.stats.drafted
                    self.accepted += step.stats.accepted
                    return output


class GenaiRunner:
    def __init__(self, bundle: ModelBundle, speculative: bool, gamma: int, properties: dict[str, str]):
        import openvino_genai

        self.genai = openvino_genai
        kwargs: dict[str, Any] = dict(properties)
        if speculative:
            kwargs["draft_model"] = openvino_genai.draft_model(str(bundle.draft.path), "CPU", **properties)
        self.pipe = openvino_genai.LLMPipeline(str(bundle.target.path), "CPU", **kwargs)
        self.speculative = speculative
        self.gamma = gamma

    def generate(self, token_ids: list[int], max_tokens: int) -> list[int]:
        import openvino as ov

        config = self.genai.GenerationConfig()
        config.max_new_tokens = max_tokens
        config.min_new_tokens = max_tokens
        config.ignore_eos = True
        config.do_sample = False
        if self.speculative:
            config.num_assistant_tokens = self.gamma
        ids = np.array([token_ids], dtype=np.int64)
        inputs = self.genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
        return list(self.pipe.generate(inputs, config).tokens[0])


def run(args: argparse.Namespace) -> dict[str, Any]:
    import openvino as ov

    bundle = ModelBundle.open(args.bundle)
    if bundle.draft is None:
        raise SystemExit("the bundle has no draft model: speculative figures need one")
    properties = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"} if args.f32 else {}
    prompts = heldout_code_prompts(args.prompts, prompt_chars=args.prompt_chars)
    runners: dict[str, Any] = {
        "xpuspec target-only": XpuspecRunner(args.bundle, "none", None, properties),
        "GenAI target-only": GenaiRunner(bundle, False, args.gamma, properties),
        f"xpuspec speculative (γ={args.gamma})": XpuspecRunner(args.bundle, "draft", args.gamma, properties),
        "xpuspec speculative (adaptive γ)": XpuspecRunner(args.bundle, "draft", None, properties),
        f"GenAI speculative (γ={args.gamma})": GenaiRunner(bundle, True, args.gamma, properties),
    }
    tokenizer = next(iter(runners.values())).tokenizer
    token_prompts = [tokenizer.encode(p.text) for p in prompts]  # type: ignore[arg-type]
    figures = {name: RunFigures(name) for name in runners}
    for runner in runners.values():  # warm-up: first inferences compile kernels
        runner.generate(token_prompts[0], 8)
    for round_index in range(args.rounds):
        for name, runner in runners.items():
            started = time.perf_counter()
            outputs = [runner.generate(ids, args.max_tokens) for ids in token_prompts]
            figures[name].seconds.append(time.perf_counter() - started)
            figures[name].tokens = sum(len(o) for o in outputs)
            figures[name].outputs = outputs
            logger.info(
                "round %d %-34s %.1f tokens/s",
                round_index + 1,
                name,
                figures[name].tokens / figures[name].seconds[-1],
            )
    for name, runner in runners.items():
        if isinstance(runner, XpuspecRunner) and runner.drafted:
            figures[name].acceptance_rate = runner.accepted / runner.drafted

    reference = figures["GenAI target-only"].outputs
    rows = []
    for name, figure in figures.items():
        identical = sum(a == b for a, b in zip(figure.outputs, reference, strict=True))
        rows.append(
            {
                "configuration": name,
                "tokens_per_s": round(figure.tokens_per_s, 1),
                "acceptance_rate": figure.acceptance_rate,
                "identical_to_genai_target_only": f"{identical}/{len(reference)}",
                "seconds_per_round": [round(s, 3) for s in figure.seconds],
            }
        )
    by_name = {row["configuration"]: row["tokens_per_s"] for row in rows}
    speculative_xpuspec = max(
        by_name[f"xpuspec speculative (γ={args.gamma})"], by_name["xpuspec speculative (adaptive γ)"]
    )
    ratios = {
        "target-only xpuspec/GenAI": by_name["xpuspec target-only"] / by_name["GenAI target-only"],
        f"speculative xpuspec (γ={args.gamma})/GenAI": by_name[f"xpuspec speculative (γ={args.gamma})"]
        / by_name[f"GenAI speculative (γ={args.gamma})"],
        "speculative xpuspec (best of fixed, adaptive)/GenAI": speculative_xpuspec
        / by_name[f"GenAI speculative (γ={args.gamma})"],
    }
    return {
        "bundle": str(bundle.root),
        "target": bundle.target.facts.get("architecture"),
        "settings": {
            "prompts": args.prompts,
            "max_tokens": args.max_tokens,
            "gamma": args.gamma,
            "rounds": args.rounds,
            "properties": properties or "OpenVINO CPU defaults",
        },
        "environment": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "openvino": ov.__version__,
        },
        "rows": rows,
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "| configuration | tokens/s | acceptance | identical to GenAI target-only |",
        "|---|---:|---:|---:|",
    ]
    for row in report["rows"]:
        rate = row["acceptance_rate"]
        lines.append(
            f"| {row['configuration']} | {row['tokens_per_s']} | "
            f"{'' if rate is None else f'{rate:.1%}'} | {row['identical_to_genai_target_only']} |"
        )
    lines.append("")
    lines += [f"- {name}: **{value:.2f}**" for name, value in report["ratios"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bundle", type=Path, default=None, help="default: the embedded demo pair")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--prompt-chars", type=int, default=600)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4, help="fixed draft length for both engines")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--f32", action="store_true", help="f32 compute and KV cache (default: CPU defaults)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    report = run(args)
    print(markdown(report))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
