"""How each ``tokenizer.ggml.pre`` value splits text before BPE: the regexes llama.cpp applies, by name.

A byte-level BPE GGUF (``tokenizer.ggml.model`` ``gpt2``) names its pre-tokenizer in ``tokenizer.ggml.pre``;
llama.cpp (``src/llama-vocab.cpp``) maps each name to a list of regexes and splits the text with each in
turn, every piece keeping the text between matches as a piece of its own. A Hugging Face ``tokenizer.json``
says the same with a ``Sequence`` of ``Split`` pre-tokenizers (``behavior: Isolated``) followed by
``ByteLevel`` without its own regex (:mod:`xpuspec.prepare.gguf_tokenizer`).

Where llama.cpp rewrote a model's regex for C++'s ``std::regex`` (``(?i:'s|...)`` spelled out as
``'[sS]``, Unicode classes approximated with lookaheads), the regex here is the model's own, as its
``tokenizer.json`` has it: the Hugging Face ``tokenizers`` library and OpenVINO's tokenizer ops read
it, and the model's own tokenizer is what the text must be split like.

A name llama.cpp splits with code of its own rather than regexes (``kimi-k2``, ``afmoe``, ``gemma4``,
``sarvam-moe``, ``superbpe``, ``chameleon``, ``whitespace``) is not known here: it is refused like an
unknown name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PreTokenizer:
    """The regexes one family of ``tokenizer.ggml.pre`` names splits with, and its BPE options.

    ``ignore_merges``: a pre-token that is itself in the vocabulary is one token, merges unapplied
    (llama.cpp's ``ignore_merges``, Hugging Face's BPE ``ignore_merges``). ``add_bos``: the family adds
    BOS when the GGUF does not say (``tokenizer.ggml.add_bos_token`` overrides it).
    """

    family: str
    regexes: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool = False


_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_TAIL = r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + _QWEN2_TAIL
_QWEN35 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Upper- and lower-case runs as separate words (Tekken, GPT-4o): the Unicode case classes themselves.
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"


def _cased_words(suffix: str) -> str:
    """A word of capitals then small letters, or of capitals alone, each optionally ending in ``suffix``."""
    lead = r"[^\r\n\p{L}\p{N}]?"
    return f"{lead}{_UPPER}*{_LOWER}+{suffix}|{lead}{_UPPER}+{_LOWER}*{suffix}"


_TEKKEN = _cased_words("") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_GPT4O = (
    _cased_words(_CONTRACTIONS + "?") + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CJK = r"[一-龥ࠀ-一가-퟿]+"
_KANA_HAN = r"[一-龥぀-ゟ゠-ヿ]+"
_ASCII_PUNCT_WORD = r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"
# DeepSeek LLM's cased letters, as code points: several of them (U+1F7D, U+1FBE, U+1FD3, U+1FDB, U+2126,
# U+212A) are changed by Unicode normalisation, which an editor may apply to literal characters.
_DEEPSEEK_LETTER_RANGES = (
    (0x41, 0x5A), (0x61, 0x7A), (0xB5,), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA), (0x1BC, 0x1BF),
    (0x1C4, 0x293), (0x295, 0x2AF), (0x370, 0x373), (0x376,), (0x377,), (0x37B, 0x37D), (0x37F,), (0x386,),
    (0x388, 0x38A), (0x38C,), (0x38E, 0x3A1), (0x3A3, 0x3F5), (0x3F7, 0x481), (0x48A, 0x52F),
    (0x531, 0x556), (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF), (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15),
    (0x1F18, 0x1F1D), (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59,), (0x1F5B,),
    (0x1F5D,), (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), (0x1FBE,), (0x1FC2, 0x1FC4),
    (0x1FC6, 0x1FCC), (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4),
    (0x1FF6, 0x1FFC), (0x2102,), (0x2107,), (0x210A, 0x2113), (0x2115,), (0x2119, 0x211D), (0x2124,),
    (0x2126,), (0x2128,), (0x212A, 0x212D), (0x212F, 0x2134), (0x2139,), (0x213C, 0x213F),
    (0x2145, 0x2149), (0x214E,), (0x2183,), (0x2184,), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4),
    (0x2CEB, 0x2CEE), (0x2CF2,), (0x2CF3,), (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F),
    (0xA771, 0xA787), (0xA78B, 0xA78E), (0xAB70, 0xABBF), (0xFB00, 0xFB06), (0xFB13, 0xFB17),
    (0xFF21, 0xFF3A), (0xFF41, 0xFF5A), (0x10400, 0x1044F), (0x104B0, 0x104D3), (0x104D8, 0x104FB),
    (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF), (0x1E900, 0x1E943),
)  # fmt: skip
_DEEPSEEK_LETTERS = "".join(
    "-".join(f"\\x{{{point:X}}}" for point in bounds) for bounds in _DEEPSEEK_LETTER_RANGES
)
_NORDIC = r" ?[^(\s|.,!?…。，、।۔،)]+"

_FAMILIES = (
    PreTokenizer("default", (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")),
    PreTokenizer("gpt2", (_GPT2,)),
    PreTokenizer("starcoder", (r"\p{N}", _GPT2)),
    PreTokenizer("falcon", (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]")),
    PreTokenizer("llama3", (_LLAMA3,), ignore_merges=True, add_bos=True),
    PreTokenizer("llama3-regex", (_LLAMA3,)),
    PreTokenizer(
        "jais2",
        (
            _CONTRACTIONS
            + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
            + "".join(rf"|\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4))
            + r"|\s{1,2}(?!\S)|\s{1}",
        ),
    ),
    PreTokenizer("qwen2", (_QWEN2,)),
    PreTokenizer("qwen35", (_QWEN35,)),
    PreTokenizer("ufakzeka", (_QWEN2_TAIL[1:],)),
    PreTokenizer(
        "seed-coder",
        (
            _CONTRACTIONS
            + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
    ),
    PreTokenizer(
        "bailingmoe",
        (
            r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]"
            r"|\s+(?!\S)|\s+",
        ),
    ),
    PreTokenizer(
        "exaone-moe",
        (
            _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
        ),
    ),
    PreTokenizer("laguna", (r"[^\n]+|[\n]+", _QWEN2)),
    PreTokenizer(
        "minicpm5",
        (
            r"\p{N}{1,3}",
            _CONTRACTIONS
            + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
        ignore_merges=True,
    ),
    PreTokenizer("tekken", (_TEKKEN,), ignore_merges=True, add_bos=True),
    PreTokenizer("gpt-4o", (_GPT4O,)),
    PreTokenizer("tiny-aya", (r"\d{1,3}(?=(?:\d{3})*\b)", _GPT4O)),
    PreTokenizer(
        "deepseek-llm",
        (
            r"[\r\n]",
            rf"\s?[{_DEEPSEEK_LETTERS}]+",
            r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
            r"\s+$",
            _CJK,
            r"\p{N}+",
        ),
    ),
    PreTokenizer("deepseek-coder", (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")),
    PreTokenizer(
        "deepseek-v3",
        (
            r"\p{N}{1,3}",
            _KANA_HAN,
            _ASCII_PUNCT_WORD
            + r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
    ),
    PreTokenizer(
        "spark2_5",
        (
            r"\p{N}{1,3}",
            _KANA_HAN,
            _ASCII_PUNCT_WORD + r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+",
            r"\p{N}",
        ),
    ),
    PreTokenizer(
        "youtu",
        (
            r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
            _cased_words(_CONTRACTIONS + "?") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
        ignore_merges=True,
    ),
    PreTokenizer("bloom", (_NORDIC,)),
    PreTokenizer("viking", (_NORDIC, r"\p{N}")),
)
_BY_FAMILY = {family.family: family for family in _FAMILIES}

# Every ``tokenizer.ggml.pre`` name llama.cpp knows and splits with regexes, by family.
_NAMES = {
    "default": ("default",),
    "gpt2": (
        "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
        "mellum", "modern-bert", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4",
        "jina-v1-en", "jina-v2-code", "roberta-bpe",
    ),
    "starcoder": (
        "starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2",
    ),
    "falcon": ("falcon",),
    "llama3": (
        "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
        "jina-v5-nano",
    ),
    "llama3-regex": ("dbrx", "smaug-bpe", "glm4", "chatglm-bpe"),
    "jais2": ("jais-2",),
    "qwen2": (
        "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open",
        "grok-2",
    ),
    "qwen35": ("qwen35",),
    "ufakzeka": ("ufakzeka",),
    "seed-coder": ("seed-coder",),
    "bailingmoe": ("bailingmoe", "bailingmoe2", "llada-moe"),
    "exaone-moe": ("exaone-moe",),
    "laguna": ("laguna",),
    "minicpm5": ("minicpm5",),
    "tekken": ("tekken",),
    "gpt-4o": ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"),
    "tiny-aya": ("tiny_aya", "cohere2moe"),
    "deepseek-llm": ("deepseek-llm",),
    "deepseek-coder": ("deepseek-coder",),
    "deepseek-v3": ("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"),
    "spark2_5": ("spark2_5",),
    "youtu": ("youtu",),
    "bloom": ("poro-chat", "bloom", "gpt3-finnish"),
    "viking": ("viking",),
}  # fmt: skip
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    name: _BY_FAMILY[family] for family, names in _NAMES.items() for name in names
}
# What llama.cpp does with a byte-level BPE GGUF that names no pre-tokenizer (an old conversion).
MISSING_PRE = "default"


def known_names() -> tuple[str, ...]:
    return tuple(sorted(PRE_TOKENIZERS))
