"""Benchmark prompts: held-out code completion from the demo pair's held-out files, chat, or a JSONL file."""

from __future__ import annotations

import json
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from xpuspec.models.demo.heldout import HELDOUT_FILES

if TYPE_CHECKING:
    from xpuspec.models.bundle import ModelBundle

WORKLOADS = ("code", "chat")  # or the path of a JSONL file

CHAT_QUESTIONS = (
    "Write a Python function that reverses a string.",
    "How do I read a JSON file in Python?",
    "Explain what a generator is.",
    "Write a class for a stack with push and pop.",
    "How do I sort a list of dictionaries by a key?",
    "What does the with statement do?",
    "Write a function that checks whether a number is prime.",
    "How do I join paths with pathlib?",
)


@dataclass(frozen=True)
class Prompt:
    text: str | list[dict[str, str]]
    source: str


def heldout_code_prompts(count: int, prompt_chars: int = 600, seed: int = 0) -> list[Prompt]:
    """Windows of held-out standard-library source, cut at a line end: code completion."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = {
        name: (root / name).read_text(encoding="utf-8") for name in HELDOUT_FILES if (root / name).is_file()
    }
    if not texts:
        raise FileNotFoundError(f"none of the held-out files exist below {root}")
    rng = random.Random(seed)
    names = sorted(texts)
    prompts = []
    for index in range(count):
        name = names[index % len(names)]
        text = texts[name]
        start = rng.randrange(0, max(1, len(text) - prompt_chars))
        start = text.rfind("\n", 0, start) + 1
        end = text.rfind("\n", start, start + prompt_chars) + 1 or start + prompt_chars
        prompts.append(Prompt(text[start:end], f"{name}@{start}"))
    return prompts


def chat_prompts(count: int) -> list[Prompt]:
    return [
        Prompt([{"role": "user", "content": CHAT_QUESTIONS[i % len(CHAT_QUESTIONS)]}], "chat")
        for i in range(count)
    ]


def jsonl_prompts(path: Path, count: int | None = None) -> list[Prompt]:
    """One JSON object per line with "prompt" (text) or "messages" (chat)."""
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error})") from error
        if "prompt" in record:
            prompts.append(Prompt(str(record["prompt"]), f"{path.name}:{number}"))
        elif "messages" in record:
            prompts.append(Prompt(record["messages"], f"{path.name}:{number}"))
        else:
            raise ValueError(f'{path}:{number}: needs a "prompt" or a "messages" field')
    return prompts[:count] if count else prompts


def load_workload(workload: str, count: int, prompt_chars: int = 600) -> list[Prompt]:
    """``code``, ``chat`` or the path of a JSONL prompt file (cycled up to ``count`` prompts)."""
    if workload == "code":
        return heldout_code_prompts(count, prompt_chars=prompt_chars)
    if workload == "chat":
        return chat_prompts(count)
    path = Path(workload)
    if not path.is_file():
        raise ValueError(f"--workload is {WORKLOADS} or a JSONL file; {workload!r} is neither")
    prompts = jsonl_prompts(path)
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return [prompts[i % len(prompts)] for i in range(count)]


class Encoder(Protocol):
    def encode(self, prompt: str | list[dict[str, str]]) -> list[int]: ...


class PromptEncoder:
    """A bundle's prompts to token ids as :meth:`Pipeline.encode` gives them (text as is, chat messages
    through the chat template), loading only the tokenizer: compiling a model to encode a few prompts
    cost the bench seconds and memory."""

    def __init__(self, bundle: ModelBundle) -> None:
        from xpuspec.text.chat_template import ChatTemplate
        from xpuspec.text.tokenizer import Tokenizer

        self.root = bundle.root
        self.tokenizer = Tokenizer(bundle.target.path)
        facts, template = bundle.tokenizer_facts, bundle.chat_template
        self.chat = (
            ChatTemplate(template, facts.get("bos_token"), facts.get("eos_token")) if template else None
        )

    def encode(self, prompt: str | list[dict[str, str]]) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt))
        if self.chat is None:
            raise ValueError(f"{self.root} has no chat template; give plain text prompts")
        # A rendered chat template carries its own special tokens.
        text = self.chat.render(prompt, add_generation_prompt=True)
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def encode_prompts(encoder: Encoder, prompts: list[Prompt], max_prompt_tokens: int) -> list[list[int]]:
    """Token ids of each prompt (chat through the chat template), keeping the last ``max_prompt_tokens``.

    Every engine of a benchmark gets these same ids, so none tokenizes differently. ``encoder``: a
    :class:`PromptEncoder` or a Pipeline.
    """
    return [encoder.encode(prompt.text)[-max_prompt_tokens:] for prompt in prompts]
