"""The OpenVINO tokenizer IRs give the same ids and text as the Hugging Face tokenizer."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from xpuspec.text import Tokenizer

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n\tif i % 2 == 0:  # even\n\t\tcontinue",
    "Grüße aus Köln — naïve café, 日本語のテキスト, Ελληνικά",
    "emoji 😀👍🏽 and a family 👨‍👩‍👧 in text 🚀",
    "  leading and trailing spaces  \n\n",
    "<|bos|>special tokens<|endoftext|> inside <|pad|>text",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_hf(tokenizer: Tokenizer, hf_tokenizer, text: str) -> None:
    assert tokenizer.encode(text) == hf_tokenizer.encode(text)
    assert tokenizer.encode(text, add_special_tokens=False) == hf_tokenizer.encode(
        text, add_special_tokens=False
    )


@pytest.mark.parametrize("text", TEXTS)
def test_decode_matches_hf(tokenizer: Tokenizer, hf_tokenizer, text: str) -> None:
    token_ids = hf_tokenizer.encode(text)
    assert tokenizer.decode(token_ids) == hf_tokenizer.decode(token_ids, skip_special_tokens=True)
    assert tokenizer.decode(token_ids, skip_special_tokens=False) == hf_tokenizer.decode(
        token_ids, skip_special_tokens=False
    )


def test_bos_is_added_only_when_asked(bos_tokenizer_dir: Path) -> None:
    tokenizer = Tokenizer(bos_tokenizer_dir)
    with_bos = tokenizer.encode("hello")
    assert with_bos[0] == tokenizer.bos_token_id
    assert tokenizer.encode("hello", add_special_tokens=False) == with_bos[1:]


def test_encode_batch_strips_padding(tokenizer: Tokenizer, hf_tokenizer) -> None:
    # Different lengths force padding inside the IR; the pad id is also a real token here.
    texts = ["a", "a much longer line of text", "", "<|pad|>"]
    assert tokenizer.encode_batch(texts) == [hf_tokenizer.encode(text) for text in texts]
    assert tokenizer.encode_batch([]) == []


def test_decode_batch_and_edge_cases(tokenizer: Tokenizer, hf_tokenizer) -> None:
    batch = [hf_tokenizer.encode(text) for text in TEXTS[:3]]
    assert tokenizer.decode_batch(batch) == hf_tokenizer.batch_decode(batch, skip_special_tokens=True)
    assert tokenizer.decode([]) == ""


def test_text_that_decodes_to_nothing_after_other_text(tokenizer: Tokenizer) -> None:
    # StringTensorPack hands back an earlier call's text when the result is empty.
    special_ids = [tokenizer.bos_token_id, tokenizer.eos_token_id]
    for _ in range(3):
        assert tokenizer.decode(tokenizer.encode("some text")) == "some text"
        assert tokenizer.decode(special_ids) == ""
        assert tokenizer.decode([]) == ""


def test_special_token_metadata(tokenizer: Tokenizer, hf_tokenizer) -> None:
    assert tokenizer.bos_token_id == hf_tokenizer.bos_token_id
    assert tokenizer.eos_token_id == hf_tokenizer.eos_token_id
    assert tokenizer.pad_token_id == hf_tokenizer.pad_token_id
    assert tokenizer.token_to_text(tokenizer.eos_token_id) == hf_tokenizer.eos_token
    assert tokenizer.chat_template == hf_tokenizer.chat_template


def test_concurrent_calls_give_the_same_results(tokenizer: Tokenizer) -> None:
    expected = [tokenizer.encode(text, add_special_tokens=False) for text in TEXTS]

    def round_trip(index: int) -> tuple[list[int], str]:
        text = TEXTS[index % len(TEXTS)]
        token_ids = tokenizer.encode(text, add_special_tokens=False)
        return token_ids, tokenizer.decode(token_ids, skip_special_tokens=False)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(round_trip, range(4 * len(TEXTS))))
    for index, (token_ids, text) in enumerate(results):
        assert token_ids == expected[index % len(TEXTS)]
        assert text == TEXTS[index % len(TEXTS)]


def test_encode_batch_rejects_a_bare_string(tokenizer: Tokenizer) -> None:
    with pytest.raises(ValueError, match="list of strings"):
        tokenizer.encode_batch("abc")


def test_missing_ir_is_reported(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="openvino_tokenizer.xml"):
        Tokenizer(tmp_path)


def test_process_exits_cleanly_after_use(plain_tokenizer_dir: Path) -> None:
    # Rebuilt ov.Models lose their hold on the tokenizer extension library; freeing them after
    # the Core used to crash the interpreter.
    script = (
        "import sys; from xpuspec.text import Tokenizer; "
        "t = Tokenizer(sys.argv[1]); assert t.decode(t.encode('ab')) == 'ab'; del t"
    )
    repo_root = Path(__file__).resolve().parents[2]
    completed = subprocess.run(
        [sys.executable, "-c", script, str(plain_tokenizer_dir)],
        cwd=repo_root,
        capture_output=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr.decode()
