"""Regenerate docs/examples.md's answers: the default model at its defaults (the seed aside), each prompt
a chat user message, as `xpuspec generate` sends it. Prints the page's answer section as Markdown.

    python scripts/doc_examples.py > /tmp/answers.md

``--runaways ROUNDS`` counts instead how many replies run to the cap (finish_reason "length") over
ROUNDS other seeds of every prompt (round r gives prompt i the seed i + 23 r, r = 1..ROUNDS: none is
the page's own): one line per reply that ran on, then the count. ``--max-tokens`` and
``--dry-multiplier`` (0: DRY off) and ``--dry-include-prompt true|false`` replace the model's
defaults, on the page too:

    python scripts/doc_examples.py --runaways 4 --max-tokens 512 --dry-multiplier 0
"""

from __future__ import annotations

import argparse
import sys

from xpuspec import Pipeline, SamplingParams
from xpuspec.cli.generate import boolean

README_PROMPTS = ["Write a haiku about caches", "Name three colors.", "Hi"]
EVERYDAY_PROMPTS = [
    "What is the capital of France?",
    "What is 2+2?",
    "Tell me a short joke.",
    "Write a haiku about the sea.",
    "Explain what a CPU cache is in two sentences.",
    "Write a Python function that reverses a string.",
    "Give me three tips for sleeping better.",
    "What is photosynthesis?",
    "Translate 'good morning' into Spanish.",
    "Suggest a name for a pet cat.",
    "How many days are in a week?",
    "Write a short thank-you note to a friend.",
    "What does HTML stand for?",
    "Summarize the plot of Romeo and Juliet in one sentence.",
    "List three fruits that are red.",
    "Why is the sky blue?",
    "Give me a simple recipe for scrambled eggs.",
    "What is the boiling point of water in Celsius?",
    "Write one sentence encouraging someone who is learning to code.",
    "What are the three primary colors?",
]


def overrides(args: argparse.Namespace) -> dict[str, float | int | bool]:
    """The fields the options set in place of the model's defaults."""
    fields = {
        "max_tokens": args.max_tokens,
        "dry_multiplier": args.dry_multiplier,
        "dry_include_prompt": args.dry_include_prompt,
    }
    return {name: value for name, value in fields.items() if value is not None}


def runaways(pipe: Pipeline, prompts: list[str], args: argparse.Namespace) -> int:
    """How many replies over ``args.runaways`` rounds of other seeds run to the cap."""
    fields = overrides(args)
    seeds = [index + len(prompts) * r for r in range(1, args.runaways + 1) for index in range(len(prompts))]
    requests = [prompts[seed % len(prompts)] for seed in seeds]
    params = [SamplingParams(seed=seed, **fields) for seed in seeds]
    results = pipe.generate([[{"role": "user", "content": p}] for p in requests], params)
    ran_on = 0
    for seed, prompt, result in zip(seeds, requests, results, strict=True):
        if result.finish_reason == "length":
            ran_on += 1
            print(f"seed {seed}: {prompt!r} ran to the cap ({len(result.token_ids)} tokens)")
    print(f"{ran_on} of {len(results)} replies ran to the cap; settings {fields or 'the defaults'}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runaways", type=int, default=0, metavar="ROUNDS")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--dry-multiplier", type=float, default=None)
    parser.add_argument("--dry-include-prompt", type=boolean, default=None, metavar="true|false")
    args = parser.parse_args()
    pipe = Pipeline(None)
    prompts = README_PROMPTS + EVERYDAY_PROMPTS
    if args.runaways:
        return runaways(pipe, prompts, args)
    # Seeds only make the page reproducible; every other field is the model's default.
    params = [SamplingParams(seed=index, **overrides(args)) for index in range(len(prompts))]
    results = pipe.generate([[{"role": "user", "content": p}] for p in prompts], params)
    for index, (prompt, result) in enumerate(zip(prompts, results, strict=True)):
        print(f"### {index + 1}. {prompt}\n")
        print(f"seed {index}, {len(result.token_ids)} tokens, finish_reason `{result.finish_reason}`\n")
        print("````text\n" + result.text.strip() + "\n````\n")  # a reply may hold ``` fences
    ended = sum(result.finish_reason == "stop" for result in results)
    print(f"{ended} of {len(results)} ended by themselves", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
