"""What a reply counts and says, through the official ``openai`` client against a real server:
cached prompt tokens are counted as ``prompt_tokens`` is (each prompt once), and the note that a
constrained output was cut short appears only when it really was."""

from __future__ import annotations

import json
import re

import openai

from tests.server.conftest import LiveServer

# Several KV blocks of prompt, distinct from every other test's prompts.
PROMPT = "Usage counting test. " + "def cube(x):\n    return x * x * x\n\n" * 10 + "print(cube(2))"
PROMPTS = [PROMPT, PROMPT + " x"]
# Only "{}" satisfies it (no free whitespace): the constraint is complete after two characters.
EMPTY_OBJECT = {
    "type": "json_schema",
    "json_schema": {
        "name": "empty",
        "schema": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}


def _cached(client: openai.OpenAI, model: str, prompt: str | list[str], n: int = 1) -> tuple[int, int]:
    usage = client.completions.create(model=model, prompt=prompt, n=n, max_tokens=2, temperature=0).usage
    assert usage is not None and usage.prompt_tokens_details is not None
    return usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens or 0


def test_cached_tokens_are_summed_per_prompt_like_prompt_tokens(
    openai_client: openai.OpenAI, live_server: LiveServer
) -> None:
    model = live_server.model
    _cached(openai_client, model, PROMPTS)  # both prompts' blocks are in the prefix cache after this
    single = [_cached(openai_client, model, prompt) for prompt in PROMPTS]
    assert all(cached > 0 for _, cached in single), single
    both = _cached(openai_client, model, PROMPTS)
    assert both == (sum(p for p, _ in single), sum(c for _, c in single))
    # n choices of a prompt share its one count, as prompt_tokens does.
    assert _cached(openai_client, model, PROMPTS, n=3) == both


def test_a_satisfied_constraint_run_on_by_ignore_eos_gets_no_note(
    openai_client: openai.OpenAI, live_server: LiveServer
) -> None:
    request = dict(
        model=live_server.model, prompt="x", max_tokens=8, temperature=0,
        extra_body={"guided_regex": "[0-9]+", "ignore_eos": True},
    )  # fmt: skip
    # Any run of digits satisfies the regex: cut at max_tokens, the output is still complete.
    choice = openai_client.completions.create(**request).choices[0]  # type: ignore[call-overload]
    assert choice.finish_reason == "length" and re.fullmatch("[0-9]+", choice.text), choice
    assert "xpuspec_note" not in (choice.model_extra or {})
    streamed = openai_client.completions.create(stream=True, **request)  # type: ignore[call-overload]
    finals = [c.choices[0] for c in streamed if c.choices and c.choices[0].finish_reason]
    assert finals[-1].finish_reason == "length" and "xpuspec_note" not in (finals[-1].model_extra or {})
    # "{}" and nothing may follow: with ignore_eos the engine may stop there or run on to max_tokens,
    # either way the JSON is complete and no note says otherwise.
    empty = dict(request, extra_body={"response_format": EMPTY_OBJECT, "ignore_eos": True})
    choice = openai_client.completions.create(**empty).choices[0]  # type: ignore[call-overload]
    assert json.loads(choice.text) == {} and "xpuspec_note" not in (choice.model_extra or {})
    # Cut short of "{}": the note is there.
    cut = openai_client.completions.create(**{**empty, "max_tokens": 1}).choices[0]  # type: ignore[call-overload]
    assert cut.finish_reason == "length" and "xpuspec_note" in (cut.model_extra or {})
