"""Hugging Face tokenizers of several families, made locally (no hub), each with the GGUF llama.cpp's
converter would write for it: the ground truth of the GGUF tokenizer tests.

Byte-level BPEs are trained with each family's own pre-tokenizer as its ``tokenizer.json`` states it
(GPT-2's ByteLevel regex, Llama 3's, Qwen2's, DeepSeek Coder's sequence, GPT-4o's cased words,
StarCoder/SmolLM2's digits); SmolLM2's real vocabulary and merges come from the default draft's
``tokenizer.json`` (its pre-tokenizer section is a lossy conversion's, so the real one is put back). The
SentencePiece family is a Llama 2 style ``tokenizer.json`` as transformers converts a SentencePiece
model: ``▁`` for spaces, byte fallback, merges generated from the pieces' scores.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.tiny_gguf import write_tokenizer_gguf

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DRAFT_TOKENIZER = REPO_ROOT / "xpuspec" / "models" / "default_draft" / "tokenizer.json"

# Code, digits, punctuation, whitespace runs, contractions, cased words, non-Latin scripts, emoji,
# special tokens inside text.
TEXTS = [
    "def add(a, b):\n    return a  ==  b + 12345\n",
    "for (int i = 0; i < n; ++i) { x[i] = y[i] * 2.5e-3; }",
    "Hello, world! I'm here; you're not. We'LL SEE, they'd say.",
    "  lots   of\t\tspaces\n\n\n and   trailing   ",
    "3.14159 1,000,000 x=-7e10 0xFF 2024-01-31 ½ ² ٣",
    "HTTPServer parseJSONString getURLForID CamelCase snake_case",
    "你好，世界！这是一个测试。日本語のテキストです。",
    "Привет, мир — ёжик в тумане.",
    "مرحبا بالعالم، كيف حالك؟",
    "नमस्ते दुनिया, यह एक परीक्षण है।",
    "Ελληνικά κείμενα και ελληνικά γράμματα",
    "emoji 👍🏽🎉 ok 👨‍👩‍👧 🇫🇷",
    "\u00a0non-breaking\u00a0space\u2003em space\r\nCRLF line\rCR",
    '{"key": "value", "list": [1, 2, 3], "nested": {"a": null}}',
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "",
    " ",
    "\n",
]
CORPUS = [text for text in TEXTS if text.strip()] * 3 + [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "import os\nimport sys\n\nprint(os.path.join('a', 'b'))\n" * 3,
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n" * 3,
    "Das ist ein Test. C'est un test. Es una prueba. これはテストです。 이것은 테스트입니다." * 3,
]
CHAT_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_TOKEN = "<tool_call>"  # a non-special added token (llama.cpp's USER_DEFINED)

_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_GPT4O_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _split(regex: str) -> dict[str, Any]:
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
_BYTE_LEVEL_OWN_REGEX = {**_BYTE_LEVEL, "use_regex": True}
# Each byte-level family: its GGUF pre-tokenizer name and its tokenizer.json's pre-tokenizer section.
BYTE_LEVEL_FAMILIES: dict[str, tuple[str, dict[str, Any], bool]] = {
    "gpt-2": ("gpt-2", _BYTE_LEVEL_OWN_REGEX, False),
    "llama-3": (
        "llama-bpe",
        {"type": "Sequence", "pretokenizers": [_split(_LLAMA3_REGEX), _BYTE_LEVEL]},
        True,
    ),
    "qwen2": ("qwen2", {"type": "Sequence", "pretokenizers": [_split(_QWEN2_REGEX), _BYTE_LEVEL]}, False),
    "gpt-4o": ("gpt-4o", {"type": "Sequence", "pretokenizers": [_split(_GPT4O_REGEX), _BYTE_LEVEL]}, False),
    "deepseek-coder": (
        "deepseek-coder",
        {
            "type": "Sequence",
            "pretokenizers": [
                _split(r"[\r\n]"),
                _split(r"\s?\p{L}+"),
                _split(r"\s?\p{P}+"),
                _split(r"[一-龥ࠀ-一가-퟿]+"),
                _split(r"\p{N}"),
                _BYTE_LEVEL,
            ],
        },
        False,
    ),
}
# StarCoder / SmolLM2's own pre-tokenizer: single digits, then GPT-2's regex.
_STARCODER_PRE = {
    "type": "Sequence",
    "pretokenizers": [{"type": "Digits", "individual_digits": True}, _BYTE_LEVEL_OWN_REGEX],
}
FAMILIES = (*BYTE_LEVEL_FAMILIES, "smollm2", "sentencepiece")


@dataclass
class Family:
    """One family's source tokenizer (``tokenizers.Tokenizer``) and the GGUF made from it."""

    name: str
    source: Any
    gguf: Path
    json: dict[str, Any] = field(repr=False)


def make_family(name: str, work: Path) -> Family:
    work.mkdir(parents=True, exist_ok=True)
    if name == "sentencepiece":
        data, scores = _sentencepiece_tokenizer()
        options: dict[str, Any] = {"pre": None, "scores": scores, "add_space_prefix": True, "add_bos": True}
    elif name == "smollm2":
        data, options = _smollm2_tokenizer(), {"pre": "smollm"}
    else:
        pre, section, ignore_merges = BYTE_LEVEL_FAMILIES[name]
        data = _byte_level_tokenizer(section, ignore_merges, add_bos=name == "llama-3")
        options = {"pre": pre, "add_bos": name == "llama-3"}
    from tokenizers import Tokenizer

    source = Tokenizer.from_str(json.dumps(data))
    special_ids = {f"{role}_token_id": source.token_to_id(token) for role, token in _roles(name).items()}
    gguf_path = write_tokenizer_gguf(work / f"{name}.gguf", data, special_ids=special_ids, **options)
    return Family(name, source, gguf_path, data)


def sentencepiece_scores(tokens: list[str]) -> list[float]:
    """SentencePiece-like scores: 0 for the 3 specials and 256 byte pieces, then falling with the id."""
    fixed = 3 + 256
    return [0.0] * fixed + [-float(index) for index in range(len(tokens) - fixed)]


def vocabulary_size(tokenizer: dict[str, Any]) -> int:
    ids = list(tokenizer["model"]["vocab"].values()) + [entry["id"] for entry in tokenizer["added_tokens"]]
    return max(ids) + 1


def special_tokens(name: str) -> dict[str, str]:
    """The family's special tokens by role (bos, eos, and unk for SentencePiece)."""
    return _roles(name)


def _roles(name: str) -> dict[str, str]:
    if name == "sentencepiece":
        return {"bos": "<s>", "eos": "</s>", "unk": "<unk>"}
    if name == "smollm2":
        return {"bos": "<|im_start|>", "eos": "<|im_end|>"}
    return {"bos": "<|im_start|>" if name == "llama-3" else "<|endoftext|>", "eos": "<|endoftext|>"}


def _bos_template(bos: str, bos_id: int) -> dict[str, Any]:
    return {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "B", "type_id": 0}},
        ],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }


def _byte_level_tokenizer(section: dict[str, Any], ignore_merges: bool, add_bos: bool) -> dict[str, Any]:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    # The pre-tokenizer goes in as its JSON section, exactly as the family's tokenizer.json states it.
    empty = json.loads(Tokenizer(models.BPE()).to_str())
    tokenizer = Tokenizer.from_str(json.dumps({**empty, "pre_tokenizer": section}))
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=CHAT_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    tokenizer.add_tokens([AddedToken(USER_TOKEN, normalized=False, special=False)])
    data = json.loads(tokenizer.to_str())
    data["model"]["ignore_merges"] = ignore_merges
    if add_bos:
        data["post_processor"] = _bos_template("<|im_start|>", tokenizer.token_to_id("<|im_start|>"))
    return data


def _smollm2_tokenizer() -> dict[str, Any]:
    """SmolLM2's vocabulary and merges with its own pre-tokenizer and decoder (StarCoder's)."""
    data = json.loads(DEFAULT_DRAFT_TOKENIZER.read_text(encoding="utf-8"))
    data["normalizer"] = None
    data["pre_tokenizer"] = _STARCODER_PRE
    data["post_processor"] = None
    data["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    model = data["model"]
    model.update(unk_token=None, fuse_unk=False, byte_fallback=False)
    return data


def _sentencepiece_tokenizer() -> tuple[dict[str, Any], list[float]]:
    """A Llama 2 style tokenizer.json: pieces trained on ``CORPUS``, scores falling with the id, and
    the merges transformers generates from those scores (``generate_merges``), as its SentencePiece
    converter does."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers.convert_slow_tokenizer import generate_merges

    trainer_tokenizer = Tokenizer(models.BPE())
    trainer_tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=600, show_progress=False)
    trainer_tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    trained = trainer_tokenizer.get_vocab()
    pieces = sorted(trained, key=trained.__getitem__)
    specials = ["<unk>", "<s>", "</s>"]
    byte_pieces = [f"<0x{byte:02X}>" for byte in range(256)]
    tokens = specials + byte_pieces + [piece for piece in pieces if piece not in byte_pieces]
    vocab = {token: token_id for token_id, token in enumerate(tokens)}
    scores = sentencepiece_scores(tokens)
    normal = {token: scores[token_id] for token, token_id in vocab.items() if token_id >= 3 + 256}
    merges = [list(pair) for pair in generate_merges(vocab, normal)]
    data = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, token in enumerate(specials)
        ],  # fmt: skip
        "normalizer": {
            "type": "Sequence",
            "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
            ],
        },
        "pre_tokenizer": None,
        "post_processor": _bos_template("<s>", 1),
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },  # fmt: skip
    }
    return data, scores
