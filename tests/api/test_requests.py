"""Request preparation without a model: the preparer of the demo bundle reads no model's weights,
encodes and templates as the Pipeline does, refuses bad constraints, and checks the cache limit; the
Pipeline's own preparer carries its engine's limits and the grammar limits it was given."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import openvino as ov
import pytest

from tests.conftest import F32
from xpuspec.api.requests import RequestLimits, RequestPreparer, auto_drafter
from xpuspec.models.bundle import ModelBundle
from xpuspec.models.demo import demo_bundle_path
from xpuspec.structured import constraint_of
from xpuspec.structured.matcher import GrammarLimits

MODEL_FILE = "openvino_model.xml"
MESSAGES = [{"role": "user", "content": "Write a haiku."}]


@pytest.fixture(scope="module")
def bundle() -> ModelBundle:
    return ModelBundle.open(demo_bundle_path())


@pytest.fixture(scope="module")
def requests(bundle: ModelBundle) -> RequestPreparer:
    limits = RequestLimits(max_model_len=bundle.max_context, vocab_size=bundle.target.vocab_size)
    return RequestPreparer.load(
        bundle, limits, drafter="draft", grammar_limits=GrammarLimits(compile_seconds=60)
    )


def test_loading_reads_the_tokenizer_models_and_never_a_models_weights(bundle, monkeypatch) -> None:
    read: list[str] = []
    read_model, compile_model = ov.Core.read_model, ov.Core.compile_model

    def recording_read(core: ov.Core, model: Any, *args: Any, **kwargs: Any) -> Any:
        read.append(Path(model).name if isinstance(model, (str, Path)) else "in-memory model")
        return read_model(core, model, *args, **kwargs)

    def recording_compile(core: ov.Core, model: Any, *args: Any, **kwargs: Any) -> Any:
        read.append(Path(model).name if isinstance(model, (str, Path)) else "in-memory model")
        return compile_model(core, model, *args, **kwargs)

    monkeypatch.setattr(ov.Core, "read_model", recording_read)
    monkeypatch.setattr(ov.Core, "compile_model", recording_compile)
    limits = RequestLimits(max_model_len=bundle.max_context, vocab_size=bundle.target.vocab_size)
    loaded = RequestPreparer.load(bundle, limits, drafter="draft")
    assert loaded.encode("def add(a, b):")  # the tokenizer really loaded, through OpenVINO
    assert "openvino_tokenizer.xml" in read
    assert MODEL_FILE not in read


def test_encoding_and_templating_match_the_pipelines(requests, bundle) -> None:
    from xpuspec.api.pipeline import Pipeline

    pipe = Pipeline(bundle, properties=F32, num_kv_blocks=64)
    for prompt in ("def add(a, b):", MESSAGES):
        assert requests.encode(prompt) == pipe.encode(prompt)
    assert requests.apply_chat_template(MESSAGES) == pipe.apply_chat_template(MESSAGES)
    assert requests.drafter == pipe.drafter == pipe.requests.drafter
    assert pipe.requests.limits == RequestLimits(
        pipe.max_model_len, pipe.vocab_size, pipe.engine.block_manager.num_token_slots
    )


def test_a_pipelines_grammar_limits_reach_the_compiler_its_engine_uses(bundle) -> None:
    from xpuspec.api.pipeline import Pipeline

    limits = GrammarLimits(compile_seconds=7.5, max_lexer_states=1234)
    pipe = Pipeline(bundle, properties=F32, num_kv_blocks=64, grammar_limits=limits)
    assert pipe.requests.grammar is not None and pipe.requests.grammar.limits == limits
    assert pipe.engine.grammar is pipe.requests.grammar  # one compiler: its cache serves both


def test_a_bad_constraint_is_refused_before_any_model_work(requests) -> None:
    with pytest.raises(ValueError, match="the Lark grammar allows no output"):
        requests.compile_constraint(constraint_of(guided_grammar="start: a\na: a"))
    requests.compile_constraint(constraint_of(guided_regex="[0-9]+"))  # a good one compiles


def test_without_tokenizer_json_constraints_are_refused(requests, bundle) -> None:
    bare = RequestPreparer(bundle, requests.tokenizer, None, requests.limits, drafter="draft")
    with pytest.raises(ValueError, match="no tokenizer.json"):
        bare.compile_constraint(constraint_of(guided_regex="[0-9]+"))


def test_the_cache_limit_is_checked_only_where_it_is_known() -> None:
    assert RequestLimits(512, 4096, num_token_slots=256).fits_cache(255)
    assert not RequestLimits(512, 4096, num_token_slots=256).fits_cache(256)
    assert RequestLimits(512, 4096).fits_cache(10**6)


def test_no_chat_template_is_a_clear_error(requests, bundle) -> None:
    manifest = copy.deepcopy(bundle.manifest)
    manifest["tokenizer"].pop("chat_template", None)
    plain = ModelBundle(bundle.root, manifest)
    untemplated = RequestPreparer(plain, requests.tokenizer, None, requests.limits, drafter="draft")
    with pytest.raises(ValueError, match="has no chat template"):
        untemplated.encode(MESSAGES)
    assert untemplated.encode("plain text") == requests.encode("plain text")


def test_auto_drafts_with_the_draft_model_unless_its_vocabulary_is_larger(bundle) -> None:
    assert auto_drafter(bundle) == "draft"
    manifest = copy.deepcopy(bundle.manifest)
    manifest["models"]["draft"]["vocab_size"] = bundle.target.vocab_size + 1
    assert auto_drafter(ModelBundle(bundle.root, manifest)) == "ngram"
    del manifest["models"]["draft"]
    assert auto_drafter(ModelBundle(bundle.root, manifest)) == "ngram"
