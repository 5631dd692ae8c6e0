"""The tokenizer a GGUF bundle gets: built from the GGUF's metadata alone, it tokenizes as the model's own.

GGUFs of several tokenizer families are made here from Hugging Face tokenizers (tests/support/
tokenizer_families.py) and must give the same tokens and the same text as their source on a varied
text set, both as ``tokenizer.json`` (the ``tokenizers`` library) and as the bundle's OpenVINO IRs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from pathlib import Path

import pytest

from tests.support.tiny_gguf import write_tokenizer_gguf
from tests.support.tokenizer_families import FAMILIES, TEXTS, Family, make_family
from xpuspec.cli import main
from xpuspec.prepare.config import PrepareError
from xpuspec.prepare.gguf_model import GgufModel
from xpuspec.prepare.gguf_pretokenizers import PRE_TOKENIZERS
from xpuspec.prepare.gguf_tokenizer import tokenizer_json, write_tokenizer
from xpuspec.text import Tokenizer as OpenVinoTokenizer


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Family]:
    work = tmp_path_factory.mktemp("families")
    return {name: make_family(name, work) for name in FAMILIES}


def built_tokenizer(gguf_path: Path):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer

    model = GgufModel.read(gguf_path, "target")
    return Tokenizer.from_str(json.dumps(tokenizer_json(model.vocabulary, gguf_path.name)))


def differences(source, encode, decode) -> list[str]:  # type: ignore[no-untyped-def]
    """The texts (with or without special tokens) whose ids or decoded text differ from ``source``'s."""
    found = []
    for text in TEXTS:
        for special in (False, True):
            expected = source.encode(text, add_special_tokens=special).ids
            got = encode(text, special)
            if got != expected:
                found.append(f"{text!r} (special tokens {special}): {got[:16]} != {expected[:16]}")
        for skip in (False, True):
            if decode(expected, skip) != source.decode(expected, skip_special_tokens=skip):
                found.append(f"decoding {text!r} (skip special {skip}): {decode(expected, skip)!r}")
    return found


@pytest.mark.parametrize("name", FAMILIES)
def test_tokenizer_json_tokenizes_like_the_source(families: dict[str, Family], name: str) -> None:
    family = families[name]
    built = built_tokenizer(family.gguf)
    assert built.get_vocab_size() == family.source.get_vocab_size()
    found = differences(
        family.source,
        lambda text, special: built.encode(text, add_special_tokens=special).ids,
        lambda ids, skip: built.decode(ids, skip_special_tokens=skip),
    )
    assert not found, "\n".join(found)


@pytest.mark.parametrize("name", FAMILIES)
def test_bundle_tokenizer_irs_tokenize_like_the_source(
    families: dict[str, Family], name: str, tmp_path: Path
) -> None:
    family = families[name]
    vocabulary = GgufModel.read(family.gguf, "target").vocabulary
    assert write_tokenizer(vocabulary, None, tmp_path, name) == "tokenizer.json"
    tokenizer = OpenVinoTokenizer(tmp_path)
    found = differences(
        family.source,
        lambda text, special: tokenizer.encode(text, add_special_tokens=special),
        lambda ids, skip: tokenizer.decode(ids, skip_special_tokens=skip),
    )
    assert not found, "\n".join(found)


def test_a_wrong_pre_tokenizer_name_would_be_caught(families: dict[str, Family]) -> None:
    """The text set tells the families apart: Qwen2's text split as GPT-2's gives other tokens."""
    from tokenizers import Tokenizer

    family = families["qwen2"]
    vocabulary = dataclasses.replace(GgufModel.read(family.gguf, "t").vocabulary, pre="gpt-2")
    wrong = Tokenizer.from_str(json.dumps(tokenizer_json(vocabulary, "t")))
    assert any(wrong.encode(text).ids != family.source.encode(text).ids for text in TEXTS)


@pytest.mark.parametrize(
    "pre", sorted({family.family: name for name, family in PRE_TOKENIZERS.items()}.values())
)
def test_every_known_pre_tokenizer_splits_alike_in_tokenizers_and_openvino(
    families: dict[str, Family], pre: str, tmp_path: Path
) -> None:
    """Each family's regexes compile in both regex engines and split the text set the same way."""
    from tokenizers import Tokenizer

    vocabulary = dataclasses.replace(GgufModel.read(families["gpt-2"].gguf, "t").vocabulary, pre=pre)
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer_json(vocabulary, pre)), encoding="utf-8")
    reference = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    write_tokenizer(vocabulary, None, tmp_path, pre)
    tokenizer = OpenVinoTokenizer(tmp_path)
    found = differences(
        reference,
        lambda text, special: tokenizer.encode(text, add_special_tokens=special),
        lambda ids, skip: tokenizer.decode(ids, skip_special_tokens=skip),
    )
    assert not found, "\n".join(found)


def test_unknown_pre_tokenizer_is_one_line_and_leaves_no_folder(
    families: dict[str, Family], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gguf_path = write_tokenizer_gguf(
        tmp_path / "odd.gguf", families["gpt-2"].json, pre="not-a-tokenizer", special_ids={}
    )
    output = tmp_path / "bundle"
    assert main(["prepare", str(gguf_path), "-o", str(output)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "pre-tokenizer 'not-a-tokenizer'" in err and "qwen2" in err and "odd.gguf" in err
    assert not output.exists()


def test_unsupported_tokenizer_model_is_refused(families: dict[str, Family], tmp_path: Path) -> None:
    vocabulary = dataclasses.replace(GgufModel.read(families["gpt-2"].gguf, "t").vocabulary, model="bert")
    with pytest.raises(PrepareError, match="tokenizer model 'bert' is not supported"):
        vocabulary.check("target t.gguf")


def test_missing_pre_tokenizer_splits_as_llama_cpp_does_with_a_warning(
    families: dict[str, Family], caplog: pytest.LogCaptureFixture
) -> None:
    from tokenizers import Tokenizer

    gpt2 = GgufModel.read(families["gpt-2"].gguf, "t").vocabulary
    with caplog.at_level(logging.WARNING):
        built = tokenizer_json(dataclasses.replace(gpt2, pre=None), "target old.gguf")
    assert "target old.gguf names no pre-tokenizer" in caplog.text
    default = tokenizer_json(dataclasses.replace(gpt2, pre="default"), "t")
    assert built == default
    # llama.cpp's 'default' isolates punctuation first: " =" splits into " " and "=".
    assert Tokenizer.from_str(json.dumps(built)).encode("x = 1").tokens == ["x", "Ġ", "=", "Ġ", "1"]


@pytest.mark.smollm2
def test_smollm2_gguf_builds_smollm2s_own_tokenizer(smollm2_gguf: Path, families: dict[str, Family]) -> None:
    """The real GGUF (pre-tokenizer ``smollm``) gives SmolLM2's tokens on the whole text set."""
    model = GgufModel.read(smollm2_gguf, "target")
    assert model.vocabulary.pre == "smollm"
    built = built_tokenizer(smollm2_gguf)
    source = families["smollm2"].source
    for text in TEXTS:
        expected = source.encode(text, add_special_tokens=False).ids
        assert built.encode(text, add_special_tokens=False).ids == expected, text


def test_the_docs_list_every_known_pre_tokenizer() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text(encoding="utf-8")
    section = text.split("<!-- gguf-pre-tokenizers: start -->")[1].split("<!-- gguf-pre-tokenizers: end -->")[
        0
    ]
    assert sorted(re.findall(r"`([^`]+)`", section)) == sorted(PRE_TOKENIZERS)


@pytest.fixture
def without_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime install: `transformers` cannot be found (nothing else is hidden)."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "transformers" else find_spec(name, *args),
    )


def test_without_transformers_a_byte_level_gguf_keeps_genais_irs_with_a_warning(
    families: dict[str, Family], without_transformers: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    vocabulary = GgufModel.read(families["qwen2"].gguf, "target").vocabulary
    with caplog.at_level(logging.WARNING):
        assert write_tokenizer(vocabulary, None, tmp_path, "target q.gguf") == "OpenVINO GenAI's GGUF reader"
    assert (tmp_path / "tokenizer.json").is_file() and not (tmp_path / "openvino_tokenizer.xml").exists()
    assert "target q.gguf: transformers is not installed" in caplog.text


def test_without_transformers_a_sentencepiece_gguf_is_refused(
    families: dict[str, Family], without_transformers: None
) -> None:
    vocabulary = GgufModel.read(families["sentencepiece"].gguf, "target").vocabulary
    with pytest.raises(PrepareError, match="a SentencePiece GGUF needs transformers"):
        vocabulary.check("target sp.gguf")
