"""Chat templates render exactly as Hugging Face's apply_chat_template(tokenize=False)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tiny_checkpoints import CHAT_TEMPLATE
from xpuspec.text import ChatTemplate, Tokenizer

# Meta-Llama-3-8B-Instruct's template, verbatim.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# In the style of Llama 3.1/3.2: whitespace control, strftime_now, tojson, raise_exception.
LLAMA31_STYLE_TEMPLATE = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none %}
    {{- "Tools: " + tools | tojson(indent=4) + "\\n\\n" }}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message['role'] not in ['user', 'assistant'] %}
        {{- raise_exception("Only user and assistant roles are supported after the system message!") }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {{- message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# ChatML as Qwen writes it, with plain block tags on their own lines (trim/lstrip_blocks matter)
# and loop controls.
CHATML_TEMPLATE = """{% for message in messages %}
    {% if message['role'] == 'ignored' %}
        {% continue %}
    {% endif %}
    {% if loop.first and message['role'] != 'system' %}
<|im_start|>system
You are a helpful assistant. {{ {"quote": "<b>&</b>", "emoji": "😀"} | tojson }}<|im_end|>
    {% endif %}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
    {% if message['content'] == 'STOP HERE' %}
        {% break %}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "  Be brief.  "},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "Und auf Deutsch? 😀\n<b>bold</b>"},
    ],
    [
        {"role": "user", "content": "one"},
        {"role": "ignored", "content": "skipped by the template's continue"},
        {"role": "user", "content": "STOP HERE"},
        {"role": "assistant", "content": "after the break"},
    ],
]
TEMPLATES = {
    "tiny": CHAT_TEMPLATE,
    "llama3": LLAMA3_TEMPLATE,
    "llama31_style": LLAMA31_STYLE_TEMPLATE,
    "chatml": CHATML_TEMPLATE,
}


@pytest.fixture(scope="module")
def hf_tokenizer(plain_tokenizer_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(plain_tokenizer_dir)


# The Llama 3.1 style template rejects the "ignored" role (tested separately).
RENDER_CASES = [
    (name, index)
    for name in TEMPLATES
    for index in range(len(CONVERSATIONS))
    if (name, index) != ("llama31_style", 2)
]


@pytest.mark.parametrize(("template_name", "conversation_index"), RENDER_CASES)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_render_matches_hf(
    hf_tokenizer, template_name: str, conversation_index: int, add_generation_prompt: bool
):
    template = TEMPLATES[template_name]
    messages = CONVERSATIONS[conversation_index]
    expected = hf_tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    chat_template = ChatTemplate(template, hf_tokenizer.bos_token, hf_tokenizer.eos_token)
    assert chat_template.render(messages, add_generation_prompt=add_generation_prompt) == expected


def test_tools_reach_the_template(hf_tokenizer) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"city": "Köln"}}}]
    messages = CONVERSATIONS[0]
    expected = hf_tokenizer.apply_chat_template(
        messages,
        chat_template=LLAMA31_STYLE_TEMPLATE,
        tools=tools,
        tokenize=False,
        add_generation_prompt=True,
    )
    chat_template = ChatTemplate(LLAMA31_STYLE_TEMPLATE, hf_tokenizer.bos_token, hf_tokenizer.eos_token)
    assert chat_template.render(messages, tools=tools) == expected
    assert '"city": "Köln"' in expected


def test_missing_bos_stays_undefined_like_hf() -> None:
    # Undefined renders as "" (not "None"); concatenating it fails, as in HF.
    rendered = ChatTemplate(LLAMA31_STYLE_TEMPLATE).render(CONVERSATIONS[0])
    assert rendered.startswith("<|start_header_id|>system")
    with pytest.raises(ValueError, match="'bos_token' is undefined"):
        ChatTemplate(LLAMA3_TEMPLATE).render(CONVERSATIONS[0])


def test_template_raise_exception_becomes_value_error() -> None:
    chat_template = ChatTemplate(LLAMA31_STYLE_TEMPLATE, "<s>", "</s>")
    with pytest.raises(ValueError, match="Only user and assistant roles"):
        chat_template.render([{"role": "tool", "content": "42"}])


def test_generation_tag_renders_its_body() -> None:
    template = "{% for m in messages %}{% generation %}[{{ m['content'] }}]{% endgeneration %}{% endfor %}"
    assert ChatTemplate(template).render([{"role": "assistant", "content": "x"}]) == "[x]"


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ("hello", "must be a list"),
        ([], "must not be empty"),
        (["hello"], r"messages\[0\] must be a dict"),
        ([{"role": "user"}], r"messages\[0\] lacks the key 'content'"),
        (
            [{"role": "user", "content": "a"}, {"role": 1, "content": "b"}],
            r"messages\[1\]\['role'\] must be a string",
        ),
        ([{"role": "user", "content": None}], r"messages\[0\]\['content'\] must be a string"),
        ([{"role": "", "content": "a"}], "must not be empty"),
    ],
)
def test_bad_messages_are_rejected(messages, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ChatTemplate(CHAT_TEMPLATE).render(messages)


def test_bad_templates_are_rejected() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        ChatTemplate("  ")
    with pytest.raises(ValueError, match="does not parse"):
        ChatTemplate("{% for message in messages %}")


def test_sandbox_blocks_unsafe_access() -> None:
    import jinja2.exceptions

    template = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises((ValueError, jinja2.exceptions.SecurityError)):
        template.render(CONVERSATIONS[0])


def test_from_model_dir_and_from_tokenizer_match_hf(hf_tokenizer, plain_tokenizer_dir: Path) -> None:
    expected = hf_tokenizer.apply_chat_template(CONVERSATIONS[1], tokenize=False, add_generation_prompt=True)
    from_dir = ChatTemplate.from_model_dir(plain_tokenizer_dir)
    assert from_dir.render(CONVERSATIONS[1]) == expected
    assert (from_dir.bos_token, from_dir.eos_token) == (hf_tokenizer.bos_token, hf_tokenizer.eos_token)
    from_ir = ChatTemplate.from_tokenizer(Tokenizer(plain_tokenizer_dir))
    assert from_ir.render(CONVERSATIONS[1]) == expected
    assert (from_ir.bos_token, from_ir.eos_token) == (hf_tokenizer.bos_token, hf_tokenizer.eos_token)
