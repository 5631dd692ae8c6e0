"""Regenerate docs/examples.md's answers: the default model at its defaults (the seed aside), each prompt
a chat user message, as `xpuspec generate` sends it. Prints the page's answer section as Markdown.

    python scripts/doc_examples.py > /tmp/answers.md
"""

from __future__ import annotations

import sys

from xpuspec import Pipeline, SamplingParams

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


def main() -> int:
    pipe = Pipeline(None)
    prompts = README_PROMPTS + EVERYDAY_PROMPTS
    # Seeds only make the page reproducible; every other field is the model's default.
    params = [SamplingParams(seed=index) for index in range(len(prompts))]
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
