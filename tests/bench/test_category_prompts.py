"""The prompt set of `bench --mode categories` (xpuspec.bench.category_prompts): seven categories, well
formed chat messages, passages long enough to copy from, and the context filter."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from xpuspec.bench.category_prompts import (
    CATEGORIES,
    PROMPTS_FILE,
    by_category,
    fitting,
    load_category_prompts,
)

PROMPTS = load_category_prompts()


def test_the_shipped_set_has_the_seven_categories_with_sixteen_prompts_or_more_each():
    # Each prompt is sent once a category, so 16 clients need 16 prompts to have 16 requests in flight.
    counts = {key: sum(p.category == key for p in PROMPTS) for key in CATEGORIES}
    assert len(CATEGORIES) == 7 and all(count >= 16 for count in counts.values()), counts
    assert list(by_category(PROMPTS)) == list(CATEGORIES)


def test_every_prompt_is_well_formed_chat_with_a_source_and_licence():
    assert len({p.id for p in PROMPTS}) == len(PROMPTS)
    for prompt in PROMPTS:
        roles = [m["role"] for m in prompt.messages]
        assert roles[-1] == "user" and set(roles) <= {"user", "assistant"}, prompt.id
        # Turns alternate, the user first.
        assert all(role == ("user" if i % 2 == 0 else "assistant") for i, role in enumerate(roles)), prompt.id
        assert all(m["content"].strip() for m in prompt.messages)
        assert prompt.source and prompt.licence, prompt.id


def test_multi_turn_chats_have_earlier_turns_and_some_quote_them():
    chats = [p.messages for p in PROMPTS if p.category == "chat"]
    assert all(len(messages) >= 3 for messages in chats)
    quoting = 0
    for messages in chats:
        earlier = " ".join(m["content"] for m in messages[:-1] if m["role"] == "assistant")
        quotes = re.findall(r'"([^"]{12,})"', messages[-1]["content"])
        quoting += any(quote.rstrip(".") in earlier for quote in quotes)
    assert quoting >= len(chats) // 2


def _words(text: str) -> int:
    return len(text.split())


def test_summarization_and_rag_passages_give_150_to_400_words_to_copy():
    for prompt in PROMPTS:
        text = prompt.messages[-1]["content"]
        if prompt.category == "summarization":
            passage = text.split("\n\n", 1)[1]  # after the instruction
        elif prompt.category == "rag":
            passage = " ".join(re.findall(r"Passage \d+:\n(.*?)(?:\n\n|$)", text, flags=re.S))
            assert "Question:" in text
        else:
            continue
        assert 150 <= _words(passage) <= 400, (prompt.id, _words(passage))


def test_code_editing_prompts_give_a_function_and_an_instruction():
    for prompt in (p for p in PROMPTS if p.category == "code_editing"):
        text = prompt.messages[-1]["content"]
        instruction, _, code = text.partition("```python\n")
        assert instruction.strip() and ("def " in code or "class " in code), prompt.id
        compile(code.rsplit("```", 1)[0], prompt.id, "exec")  # the code parses


def test_a_malformed_line_is_refused_with_its_line(tmp_path: Path):
    good = {"category": "qa", "messages": [{"role": "user", "content": "Why?"}]}
    bad_records = [
        {"category": "poetry", "messages": good["messages"]},
        {"category": "qa", "messages": []},
        {"category": "qa", "messages": [{"role": "robot", "content": "x"}]},
        {
            "category": "qa",
            "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
        },
    ]
    for bad in bad_records:
        path = tmp_path / "prompts.jsonl"
        path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(ValueError, match="prompts.jsonl:2"):
            load_category_prompts(path)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no prompts"):
        load_category_prompts(tmp_path / "empty.jsonl")


def test_prompts_the_context_cannot_hold_are_left_out_and_counted():
    class Words:
        def encode(self, prompt: str | list[dict[str, str]]) -> list[int]:
            assert isinstance(prompt, list)
            return [0] * sum(len(m["content"].split()) for m in prompt)

    short, long = [{"role": "user", "content": "one two"}], [{"role": "user", "content": "a " * 20}]
    kept, left_out = fitting({"qa": [short, long], "math": [long]}, Words(), max_context=12, max_tokens=8)
    assert kept == {"qa": [short]} and left_out == {"qa": 1, "math": 1}


def test_the_prompt_file_ships_beside_its_module():
    assert PROMPTS_FILE.is_file() and PROMPTS_FILE.parent.name == "bench"
