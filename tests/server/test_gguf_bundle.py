"""A bundle prepared from a GGUF alone keeps every feature: structured output and forced tool calls,
through the official ``openai`` client against a real server process.

The GGUF is written from a tiny random Llama whose checkpoint is then deleted, so nothing but the GGUF's
metadata can give the bundle its tokenizer.json.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import openai
import pytest

from tests.server.conftest import LiveServer, start_server, stop_server
from tests.server.test_ollama_routes import ITEM, WEATHER  # the same schemas as the Ollama route tests
from tests.support.tiny_checkpoints import make_tiny_checkpoint
from tests.support.tiny_gguf import with_tokenizer, write_gguf_from_checkpoint
from tests.support.tokenizer_families import make_family, sentencepiece_scores, special_tokens
from xpuspec.models.bundle import ModelBundle
from xpuspec.prepare.config import PrepareConfig
from xpuspec.prepare.gguf import prepare_gguf_bundle

SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "item", "schema": ITEM, "strict": True}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]


TOKENIZERS = {
    "byte-level": {"model": "gpt2", "pre": "gpt-2"},
    "sentencepiece": {"model": "llama", "pre": None},
}


@pytest.fixture(scope="module", params=list(TOKENIZERS))
def gguf_bundle(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama as a GGUF with a byte-level BPE (GPT-2's split) or a SentencePiece BPE (Llama 2's)."""
    work = tmp_path_factory.mktemp("gguf-bundle")
    # A 2048-token context: a prompt with tools fits the tiny tokenizers' few characters per token.
    checkpoint = make_tiny_checkpoint(
        work / "checkpoint", "llama", hidden_size=64, num_layers=2, max_position_embeddings=2048, seed=0
    )
    options = None
    if request.param == "sentencepiece":
        family = make_family("sentencepiece", work / "family")
        tokens = list(family.json["model"]["vocab"])
        checkpoint = with_tokenizer(checkpoint, work / "sp", family.json, special_tokens("sentencepiece"))
        options = {
            "pre": None,
            "scores": sentencepiece_scores(tokens),
            "add_space_prefix": True,
            "add_bos": True,
        }
    gguf_path = write_gguf_from_checkpoint(
        checkpoint, work / "model.gguf", dtype="F16", tokenizer_options=options
    )
    for folder in work.iterdir():
        if folder.is_dir():
            shutil.rmtree(folder)  # no Hugging Face file left beside the GGUF
    return prepare_gguf_bundle(PrepareConfig(target=str(gguf_path), output=work / "bundle"))


@pytest.fixture(scope="module")
def gguf_server(gguf_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_server(gguf_bundle, tmp_path_factory.mktemp("gguf-server") / "server.log")
    yield server
    stop_server(server)


@pytest.fixture
def client(gguf_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gguf_server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_the_bundle_holds_a_tokenizer_built_from_the_gguf(gguf_bundle: Path, gguf_server: LiveServer) -> None:
    bundle = ModelBundle.open(gguf_bundle, verify=True)
    assert (bundle.target.path / "tokenizer.json").is_file()
    record = bundle.target.facts["gguf"]["tokenizer"]
    assert record in [{**expected, "irs_from": "tokenizer.json"} for expected in TOKENIZERS.values()]
    assert "structured output is off" not in gguf_server.log()


def test_json_schema_gives_valid_json(client: openai.OpenAI, gguf_server: LiveServer) -> None:
    reply = client.chat.completions.create(
        model=gguf_server.model,
        messages=[{"role": "user", "content": "Order one item as JSON."}],
        response_format=SCHEMA_FORMAT,  # type: ignore[arg-type]
        temperature=0.8,
        n=3,
        seed=3,
        max_tokens=200,
    )
    for choice in reply.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content or ""), ITEM)


def test_required_tool_choice_gives_valid_calls(client: openai.OpenAI, gguf_server: LiveServer) -> None:
    reply = client.chat.completions.create(
        model=gguf_server.model,
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        temperature=1.0,
        top_p=1.0,
        extra_body={"top_k": 0, "min_p": 0.0},  # the whole distribution, whatever the model's defaults
        n=3,
        seed=1,
        max_tokens=210,
    )
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls", choice.message.content
        calls = choice.message.tool_calls
        assert calls
        for call in calls:
            assert call.type == "function" and call.function.name == "get_weather"
            jsonschema.validate(json.loads(call.function.arguments), WEATHER)
