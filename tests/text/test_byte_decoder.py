"""The byte-table decoder gives the detokenizer model's text exactly, alone and under streaming.

The reference is the same ``Tokenizer`` with ``byte_table=False`` (the OpenVINO detokenizer model),
itself pinned to the Hugging Face tokenizer by test_tokenizer.py. Random streams lean on single
high bytes, so that characters split across tokens, lone continuation bytes, overlong and cut-short
sequences all come up, and on special tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xpuspec.models.demo import BUNDLE_DIR
from xpuspec.text import IncrementalDetokenizer, Tokenizer
from xpuspec.text.byte_decoder import ByteTable, Utf8Validate, utf8_validate

SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module", params=["plain", "bos", "sentencepiece", "demo", "smollm2", "gguf"])
def tokenizer_pair(request: pytest.FixtureRequest) -> tuple[Tokenizer, Tokenizer]:
    """(byte-table tokenizer, model tokenizer) of one model folder."""
    if request.param == "demo":
        model_dir = BUNDLE_DIR / "target"
    else:
        model_dir = request.getfixturevalue(f"{request.param}_tokenizer_dir")
    tabled = Tokenizer(model_dir)
    assert tabled.byte_table is not None, "byte-level BPE and SentencePiece detokenizers must be tabled"
    return tabled, Tokenizer(model_dir, byte_table=False)


def _token_streams(table: ByteTable) -> st.SearchStrategy[list[int]]:
    """Ids mixing any token, tokens of one byte >= 0x80, special tokens and ids past the vocabulary."""
    high_bytes = [index for index, data in enumerate(table.token_bytes) if len(data) == 1 and data[0] >= 0x80]
    assert len(high_bytes) > 100, "byte-level vocabularies hold every byte as a token"
    token = st.one_of(
        st.integers(0, len(table) - 1),
        st.sampled_from(high_bytes),
        st.sampled_from(sorted(table.special_ids)),
        st.integers(len(table), len(table) + 3),
    )
    return st.lists(token, max_size=24)


def _chunks(data: st.DataObject, token_ids: list[int]) -> list[list[int]]:
    """``token_ids`` cut into pushes of 1-5 tokens, as engine steps emit them."""
    chunks = []
    position = 0
    while position < len(token_ids):
        size = data.draw(st.integers(1, 5))
        chunks.append(token_ids[position : position + size])
        position += size
    return chunks


@SETTINGS
@given(data=st.data())
def test_table_decodes_like_the_model(
    tokenizer_pair: tuple[Tokenizer, Tokenizer], data: st.DataObject
) -> None:
    tabled, model = tokenizer_pair
    token_ids = data.draw(_token_streams(tabled.byte_table))
    for skip_special_tokens in (True, False):
        assert tabled.decode(token_ids, skip_special_tokens) == model.decode(token_ids, skip_special_tokens)


@SETTINGS
@given(data=st.data())
def test_streamed_text_is_never_taken_back(
    tokenizer_pair: tuple[Tokenizer, Tokenizer], data: st.DataObject
) -> None:
    # After every push the text so far is the start of the whole decode, and in the end all of it.
    # Pieces of characters are held back until they complete (the table reads the bytes), while a
    # byte no later token can complete goes out at once.
    tabled, model = tokenizer_pair
    token_ids = data.draw(_token_streams(tabled.byte_table))
    skip_special_tokens = data.draw(st.booleans())
    whole = model.decode(token_ids, skip_special_tokens)
    streamed = ""
    detokenizer = IncrementalDetokenizer(tabled, skip_special_tokens=skip_special_tokens)
    for chunk in _chunks(data, token_ids):
        streamed += detokenizer.push(chunk)
        assert whole.startswith(streamed)
    assert streamed + detokenizer.flush() == whole


@SETTINGS
@given(data=st.data())
def test_streamed_deltas_after_a_prompt_equal_the_model_path(
    tokenizer_pair: tuple[Tokenizer, Tokenizer], data: st.DataObject
) -> None:
    # On text a tokenizer makes (whole characters, no stray bytes) both paths stream alike, a prompt's
    # tail as context included.
    tabled, model = tokenizer_pair
    alphabet = st.sampled_from("ab é日本😀\n\t")
    prompt_ids = model.encode(data.draw(st.text(alphabet, max_size=6)), add_special_tokens=False)
    token_ids = model.encode(data.draw(st.text(alphabet, max_size=16)), add_special_tokens=False)
    chunks = _chunks(data, token_ids)
    fast = IncrementalDetokenizer(tabled, prompt_ids)
    fast_deltas = [fast.push(chunk) for chunk in chunks] + [fast.flush()]
    assert "".join(fast_deltas) == model.decode(prompt_ids + token_ids)[len(model.decode(prompt_ids)) :]
    if Utf8Validate(replace=False) in tabled.byte_table.text_steps:
        return  # a model that drops invalid UTF-8 shows no sign of a cut character: only the table streams it
    slow = IncrementalDetokenizer(model, prompt_ids)
    assert fast_deltas == [slow.push(chunk) for chunk in chunks] + [slow.flush()]


@pytest.mark.parametrize(
    "text", ["naïve café", "日本語のテキスト", "emoji 😀👍🏽 family 👨‍👩‍👧 🚀", "tab\tand\nnewline"]
)
def test_multibyte_characters_split_over_tokens(
    tokenizer_pair: tuple[Tokenizer, Tokenizer], text: str
) -> None:
    tabled, model = tokenizer_pair
    token_ids = model.encode(text, add_special_tokens=False)
    if "😀" in text:
        # Some token holds only part of a character (the case streaming must hold back).
        partial = [tabled.byte_table.token_bytes[token_id] for token_id in token_ids]
        assert any(_is_partial_utf8(data) for data in partial)
    detokenizer = IncrementalDetokenizer(tabled)
    deltas = [detokenizer.push([token_id]) for token_id in token_ids] + [detokenizer.flush()]
    assert "".join(deltas) == text == tabled.decode(token_ids)
    assert not any("\ufffd" in delta for delta in deltas)


def _is_partial_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_special_tokens_follow_skip_special_tokens(tokenizer_pair: tuple[Tokenizer, Tokenizer]) -> None:
    tabled, model = tokenizer_pair
    eos = tabled.eos_token_id
    token_ids = [*model.encode("a b", add_special_tokens=False), eos]
    assert eos in tabled.byte_table.special_ids
    assert tabled.decode(token_ids) == "a b" == model.decode(token_ids)
    with_special = tabled.decode(token_ids, skip_special_tokens=False)
    assert with_special == model.decode(token_ids, skip_special_tokens=False)
    assert with_special == "a b" + tabled.token_to_text(eos)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"ok \xe2\x82\xac", b"ok \xe2\x82\xac"),  # valid UTF-8 passes unchanged
        (b"\x80a", b"\xef\xbf\xbda"),  # a lone continuation byte: one U+FFFD
        (b"\xf0\x9f\x98", b"\xef\xbf\xbd"),  # cut short by the end: one U+FFFD for the whole start
        (b"\xe2\x82a", b"\xef\xbf\xbda"),  # cut short by an ASCII byte, read again as a start
        (b"\xc0\x80", b"\xef\xbf\xbd" * 2),  # overlong: one U+FFFD per byte
        (b"\xf5\x80\x80\x80", b"\xf5\x80\x80\x80"),  # taken by its bit pattern (Python then replaces it)
        (b"\xff", b"\xef\xbf\xbd"),
    ],
)
def test_utf8_validate_follows_the_ir_op(data: bytes, expected: bytes) -> None:
    assert utf8_validate(data) == expected
    assert utf8_validate(data, replace=False) == expected.replace(b"\xef\xbf\xbd", b"")


def test_ir_with_text_clean_up_falls_back_to_the_model(tmp_path: Path) -> None:
    # clean_up_tokenization_spaces adds regex ops over the joined text: no table, same text as Hugging Face.
    import openvino as ov
    import openvino_tokenizers

    from tests.support.tiny_checkpoints import make_tokenizer

    hf_tokenizer = make_tokenizer(tmp_path)
    _, detokenizer_ir = openvino_tokenizers.convert_tokenizer(
        hf_tokenizer, with_detokenizer=True, clean_up_tokenization_spaces=True
    )
    assert ByteTable.from_detokenizer(detokenizer_ir) is None
    ov.save_model(detokenizer_ir, tmp_path / "openvino_detokenizer.xml")
    tokenizer_ir, _ = openvino_tokenizers.convert_tokenizer(hf_tokenizer, with_detokenizer=True)
    ov.save_model(tokenizer_ir, tmp_path / "openvino_tokenizer.xml")
    tokenizer = Tokenizer(tmp_path)
    assert tokenizer.byte_table is None
    text = "a , b . c ! don 't"
    token_ids = hf_tokenizer.encode(text)
    assert tokenizer.decode(token_ids) == hf_tokenizer.decode(token_ids, clean_up_tokenization_spaces=True)
    assert tokenizer.decode(token_ids) != text


def test_table_rejects_special_ids_outside_the_vocabulary() -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ByteTable((b"a", b"b"), frozenset({5}))


@pytest.mark.parametrize("text", ["Hello world", "  two  leading", "naïve 日本 😀\tok\n", "x"])
def test_sentencepiece_table_decodes_like_hugging_face(sentencepiece_tokenizer_dir: Path, text: str) -> None:
    # ▁ becomes a space, <0xNN> tokens become bytes, and one leading space of the text is stripped.
    from transformers import AutoTokenizer

    hf_tokenizer = AutoTokenizer.from_pretrained(sentencepiece_tokenizer_dir)
    tokenizer = Tokenizer(sentencepiece_tokenizer_dir)
    assert tokenizer.byte_table is not None and tokenizer.byte_table.text_steps
    token_ids = hf_tokenizer.encode(text)
    for skip_special_tokens in (True, False):
        assert tokenizer.decode(token_ids, skip_special_tokens) == hf_tokenizer.decode(
            token_ids, skip_special_tokens=skip_special_tokens
        )


def test_a_skipped_special_token_between_words_keeps_the_space(sentencepiece_tokenizer_dir: Path) -> None:
    # The special token decodes to nothing; were it the next push's only context, the SentencePiece
    # decoder would strip " world"'s space as the text's start.
    tokenizer = Tokenizer(sentencepiece_tokenizer_dir)
    words = tokenizer.encode("hello world", add_special_tokens=False)
    space = words.index(words[0], 1)  # "hello world" starts each word with the space token
    token_ids = words[:space] + [tokenizer.eos_token_id] + words[space:]
    for prompt_ids in ([], tokenizer.encode("say", add_special_tokens=False)):
        detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
        streamed = "".join(detokenizer.push([token_id]) for token_id in token_ids) + detokenizer.flush()
        assert streamed == ("hello world" if not prompt_ids else " hello world")
