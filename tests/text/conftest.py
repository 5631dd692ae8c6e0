"""Tiny byte-level BPE tokenizers, converted to OpenVINO IR as `xpuspec prepare` does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tiny_checkpoints import make_tokenizer


def _convert(model_dir: Path, hf_tokenizer) -> None:
    import openvino as ov
    import openvino_tokenizers

    tokenizer_ir, detokenizer_ir = openvino_tokenizers.convert_tokenizer(hf_tokenizer, with_detokenizer=True)
    ov.save_model(tokenizer_ir, model_dir / "openvino_tokenizer.xml")
    ov.save_model(detokenizer_ir, model_dir / "openvino_detokenizer.xml")


@pytest.fixture(scope="session")
def plain_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """No post-processor: encode adds no special tokens (like GPT-2 / Qwen)."""
    model_dir = tmp_path_factory.mktemp("plain_tokenizer")
    _convert(model_dir, make_tokenizer(model_dir))
    return model_dir


@pytest.fixture(scope="session")
def bos_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A post-processor that prepends BOS, like Llama 3's."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    model_dir = tmp_path_factory.mktemp("bos_tokenizer")
    make_tokenizer(model_dir)
    hf_tokenizer = AutoTokenizer.from_pretrained(model_dir)
    bos = hf_tokenizer.bos_token
    hf_tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, hf_tokenizer.bos_token_id)]
    )
    hf_tokenizer.save_pretrained(model_dir)
    hf_tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert hf_tokenizer.encode("x")[0] == hf_tokenizer.bos_token_id
    _convert(model_dir, hf_tokenizer)
    return model_dir


@pytest.fixture(scope="session", params=["plain", "bos"])
def tokenizer_dir(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(f"{request.param}_tokenizer_dir")


@pytest.fixture(scope="session")
def hf_tokenizer(tokenizer_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path):
    from xpuspec.text import Tokenizer

    return Tokenizer(tokenizer_dir)
