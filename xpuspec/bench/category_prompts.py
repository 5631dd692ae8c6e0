"""The prompts of `xpuspec bench --mode categories`: chat messages in seven kinds of task.

``categories.jsonl`` beside this module holds one prompt a line: ``category`` (a key of
:data:`CATEGORIES`), ``id``, ``messages`` (OpenAI chat messages, the last one the user's), ``source`` and
``licence``. The texts were written for xpuspec (docs/benchmarks.md, "Category prompts"). A file of the
same shape can replace them (``--workload FILE.jsonl``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from xpuspec.bench.chat_clients import Messages

PROMPTS_FILE = Path(__file__).with_name("categories.jsonl")

# Key -> the name reports give it, in the order reports list them.
CATEGORIES = {
    "chat": "multi-turn chat",
    "translation": "translation",
    "summarization": "summarization",
    "qa": "question answering",
    "math": "math reasoning",
    "rag": "retrieval-augmented QA",
    "code_editing": "code editing",
}
ROLES = frozenset({"system", "user", "assistant"})


@dataclass(frozen=True)
class CategoryPrompt:
    category: str
    id: str
    messages: Messages
    source: str
    licence: str


def _messages(value: Any, where: str) -> Messages:
    """Chat messages, checked: roles and non-empty text, the last message the user's."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: messages must be a non-empty list")
    for message in value:
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise ValueError(f"{where}: each message has exactly a role and a content")
        if message["role"] not in ROLES:
            raise ValueError(f"{where}: unknown role {message['role']!r}")
        if not isinstance(message["content"], str) or not message["content"].strip():
            raise ValueError(f"{where}: a message's content must be non-empty text")
    if value[-1]["role"] != "user":
        raise ValueError(f"{where}: the last message must be the user's")
    return [dict(message) for message in value]


def load_category_prompts(path: Path | None = None) -> list[CategoryPrompt]:
    """Every prompt of the file (default: the shipped set), in file order; ``ValueError`` naming the line
    of one that is malformed."""
    path = path or PROMPTS_FILE
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path.name}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not JSON ({error})") from error
        category = record.get("category")
        if category not in CATEGORIES:
            raise ValueError(f"{where}: category {category!r} is not one of {', '.join(CATEGORIES)}")
        prompts.append(
            CategoryPrompt(
                category,
                str(record.get("id") or f"{category}-{number}"),
                _messages(record.get("messages"), where),
                str(record.get("source") or ""),
                str(record.get("licence") or ""),
            )
        )
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def by_category(prompts: Sequence[CategoryPrompt]) -> dict[str, list[Messages]]:
    """Each category's prompts in file order, the categories in CATEGORIES order."""
    grouped: dict[str, list[Messages]] = {key: [] for key in CATEGORIES}
    for prompt in prompts:
        grouped[prompt.category].append(prompt.messages)
    return {key: group for key, group in grouped.items() if group}


class ChatEncoder(Protocol):
    def encode(self, prompt: str | list[dict[str, str]]) -> list[int]: ...


def fitting(
    groups: dict[str, list[Messages]], encoder: ChatEncoder, max_context: int, max_tokens: int
) -> tuple[dict[str, list[Messages]], dict[str, int]]:
    """The prompts whose tokens and ``max_tokens`` fit the context, and per category how many did not
    (a server refuses those)."""
    kept: dict[str, list[Messages]] = {}
    left_out: dict[str, int] = {}
    for category, prompts in groups.items():
        fits = [p for p in prompts if len(encoder.encode(p)) + max_tokens <= max_context]
        if len(fits) < len(prompts):
            left_out[category] = len(prompts) - len(fits)
        if fits:
            kept[category] = fits
    return kept, left_out
