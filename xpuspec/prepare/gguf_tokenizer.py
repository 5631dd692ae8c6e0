"""A Hugging Face ``tokenizer.json`` built from a GGUF's own tokenizer metadata, and its OpenVINO IRs.

A GGUF carries its tokenizer as metadata (``tokenizer.ggml.*``): the model type, the pre-tokenizer's
name, the tokens with their types, the BPE merges or SentencePiece scores, the special ids and whether
BOS/EOS and a leading space are added. From these a ``tokenizer.json`` is written that splits and merges
text as llama.cpp does with the same file, which is how the model's own tokenizer does it:

* ``gpt2`` (byte-level BPE): the pre-tokenizer's regexes (:mod:`xpuspec.prepare.gguf_pretokenizers`),
  each a ``Split`` with ``Isolated`` behaviour, then ``ByteLevel`` without its own regex; the merges as
  the GGUF lists them (their order is their rank).
* ``llama`` (SentencePiece BPE with ``▁`` and byte fallback): spaces become ``▁``, one is prepended
  when ``add_space_prefix`` (after each special token too, as llama.cpp does), and the merges are derived
  from the scores: SentencePiece merges the adjacent pair whose joined piece scores highest, so every
  split of a piece into two pieces is a merge ranked by that piece's score.

Control tokens (type 3) become special added tokens, user-defined ones (type 4) plain added tokens, so
both are matched whole before any splitting, as llama.cpp does. The bundle keeps the file beside the
IR: it gives structured output its vocabulary (:mod:`xpuspec.structured.grammar_tokenizer`), and the
OpenVINO tokenizer IRs are converted from it (which needs ``transformers``; without it GenAI's GGUF
reader's IRs stay, with a warning).
"""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xpuspec.prepare.config import PrepareError
from xpuspec.prepare.gguf_pretokenizers import MISSING_PRE, PRE_TOKENIZERS, PreTokenizer

logger = logging.getLogger(__name__)

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG_JSON = "tokenizer_config.json"
SPACE_MARK = "▁"  # SentencePiece's stand-in for a space
# llama.cpp's token types (tokenizer.ggml.token_type)
UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 0, 1, 2, 3, 4, 5, 6
_BYTE_LEVEL_MODEL = "gpt2"
_GENAI_PRE_TOKENIZERS = ("smollm",)  # the pre-tokenizers OpenVINO GenAI's GGUF reader splits by
_SENTENCEPIECE_MODEL = "llama"


@dataclass(frozen=True)
class GgufVocabulary:
    """The ``tokenizer.ggml.*`` metadata of one GGUF: what its ``tokenizer.json`` is built from."""

    model: str
    pre: str | None
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    scores: tuple[float, ...]
    special_ids: dict[str, int | None]  # bos, eos, unk, pad
    add_bos: bool | None  # None: the GGUF does not say
    add_eos: bool | None
    add_space_prefix: bool | None

    @classmethod
    def from_fields(cls, fields: dict[str, Any], special_ids: dict[str, int | None]) -> GgufVocabulary:
        tokens = tuple(str(token) for token in fields.get("tokenizer.ggml.tokens") or ())
        types = tuple(int(kind) for kind in fields.get("tokenizer.ggml.token_type") or ())
        pre = fields.get("tokenizer.ggml.pre")
        return cls(
            model=str(fields.get("tokenizer.ggml.model", "")),
            pre=str(pre) if pre else None,
            tokens=tokens,
            token_types=types if len(types) == len(tokens) else (NORMAL,) * len(tokens),
            merges=tuple(str(merge) for merge in fields.get("tokenizer.ggml.merges") or ()),
            scores=tuple(float(score) for score in fields.get("tokenizer.ggml.scores") or ()),
            special_ids=special_ids,
            add_bos=_flag(fields.get("tokenizer.ggml.add_bos_token")),
            add_eos=_flag(fields.get("tokenizer.ggml.add_eos_token")),
            add_space_prefix=_flag(fields.get("tokenizer.ggml.add_space_prefix")),
        )

    def pre_tokenizer(self, where: str, *, warn: bool = True) -> PreTokenizer | None:
        """The byte-level BPE's pre-tokenizer (None for SentencePiece); a one-line PrepareError naming
        a model type or pre-tokenizer that is not known here. ``warn``: log a missing name's default."""
        if self.model == _SENTENCEPIECE_MODEL:
            return None
        if self.model != _BYTE_LEVEL_MODEL:
            raise PrepareError(
                f"{where}: tokenizer model {self.model!r} is not supported (known: "
                f"{_BYTE_LEVEL_MODEL} byte-level BPE, {_SENTENCEPIECE_MODEL} SentencePiece BPE)"
            )
        if self.pre is None:
            if not warn:
                return PRE_TOKENIZERS[MISSING_PRE]
            logger.warning(
                "%s names no pre-tokenizer (tokenizer.ggml.pre): splitting text with llama.cpp's %r, as "
                "llama.cpp does; an old conversion, its tokens may differ from the model's own",
                where,
                MISSING_PRE,
            )
            return PRE_TOKENIZERS[MISSING_PRE]
        known = PRE_TOKENIZERS.get(self.pre)
        if known is None:
            known_list = ", ".join(sorted(PRE_TOKENIZERS))
            raise PrepareError(
                f"{where}: pre-tokenizer {self.pre!r} (tokenizer.ggml.pre) is not known here, so its "
                f"text would be split unlike the model's own tokenizer; known: {known_list}"
            )
        return known

    def check(self, where: str) -> None:
        """Refuse, before any work, a GGUF whose tokenizer.json cannot be built (building it warns)."""
        self.pre_tokenizer(where, warn=False)
        seen: dict[str, int] = {}
        for token_id, token in enumerate(_unique_tokens(self.tokens)):
            if seen.setdefault(token, token_id) != token_id:
                first = seen[token]
                raise PrepareError(f"{where}: token {token!r} appears twice (ids {first} and {token_id})")
        if self.model == _BYTE_LEVEL_MODEL and not self.merges:
            raise PrepareError(f"{where}: a byte-level BPE GGUF without merges (tokenizer.ggml.merges)")
        if self.model == _SENTENCEPIECE_MODEL and len(self.scores) < len(self.tokens):
            raise PrepareError(f"{where}: a SentencePiece GGUF without scores (tokenizer.ggml.scores)")
        if self.model == _SENTENCEPIECE_MODEL and importlib.util.find_spec("transformers") is None:
            # GenAI's reader builds byte-level tokenizers only: its IRs cannot stand in for this one.
            raise PrepareError(
                f"{where}: a SentencePiece GGUF needs transformers (no torch) to convert its tokenizer: "
                "pip install transformers"
            )

    def token(self, role: str) -> str | None:
        token_id = self.special_ids.get(role)
        if token_id is None or not 0 <= token_id < len(self.tokens):
            return None
        return self.tokens[token_id]


def _flag(value: Any) -> bool | None:
    return None if value is None else bool(value)


def tokenizer_json(vocabulary: GgufVocabulary, where: str) -> dict[str, Any]:
    """The Hugging Face ``tokenizer.json`` that tokenizes as the GGUF's model does."""
    pre = vocabulary.pre_tokenizer(where)
    tokens = _unique_tokens(vocabulary.tokens)
    sentencepiece = pre is None
    add_bos = (
        vocabulary.add_bos if vocabulary.add_bos is not None else (sentencepiece or bool(pre and pre.add_bos))
    )
    add_eos = bool(vocabulary.add_eos)
    if pre is None:
        add_space_prefix = vocabulary.add_space_prefix is not False
        normalizer, pre_tokenizer, decoder = _sentencepiece_text_steps(add_space_prefix)
        merges = sentencepiece_merges(tokens, vocabulary.token_types, vocabulary.scores)
    else:
        normalizer, pre_tokenizer, decoder = None, _byte_level_pre_tokenizer(pre), _BYTE_LEVEL_DECODER
        merges = [_split_merge(merge) for merge in vocabulary.merges]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(tokens, vocabulary.token_types),
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": _post_processor(vocabulary, tokens, add_bos, add_eos),
        "decoder": decoder,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": vocabulary.token("unk") if sentencepiece else None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": sentencepiece,
            "byte_fallback": sentencepiece,
            "ignore_merges": bool(pre and pre.ignore_merges),
            "vocab": {token: token_id for token_id, token in enumerate(tokens)},
            "merges": merges,
        },
    }


def _unique_tokens(tokens: tuple[str, ...]) -> list[str]:
    """The tokens with llama.cpp's name for an empty one (``[EMPTY_i]``)."""
    return [token if token else f"[EMPTY_{token_id}]" for token_id, token in enumerate(tokens)]


def _added_tokens(tokens: list[str], types: tuple[int, ...]) -> list[dict[str, Any]]:
    return [
        {
            "id": token_id,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": kind == CONTROL,
        }
        for token_id, (token, kind) in enumerate(zip(tokens, types, strict=True))
        if kind in (CONTROL, USER_DEFINED)
    ]


def _byte_level_pre_tokenizer(pre: PreTokenizer) -> dict[str, Any]:
    splits = [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}
        for regex in pre.regexes
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {"type": "Sequence", "pretokenizers": [*splits, byte_level]}


_BYTE_LEVEL_DECODER = {
    "type": "ByteLevel",
    "add_prefix_space": False,
    "trim_offsets": False,
    "use_regex": False,
}


def _sentencepiece_text_steps(add_space_prefix: bool) -> tuple[dict[str, Any], None, dict[str, Any]]:
    """Normalizer, pre-tokenizer and decoder of a SentencePiece BPE (Llama 2 / Mistral's legacy form)."""
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE_MARK}
    prepend = [{"type": "Prepend", "prepend": SPACE_MARK}] if add_space_prefix else []
    decoders: list[dict[str, Any]] = [
        {"type": "Replace", "pattern": {"String": SPACE_MARK}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    if add_space_prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return (
        {"type": "Sequence", "normalizers": [*prepend, replace]},
        None,
        {"type": "Sequence", "decoders": decoders},
    )


def sentencepiece_merges(
    tokens: list[str], types: tuple[int, ...], scores: tuple[float, ...]
) -> list[list[str]]:
    """BPE merges equivalent to SentencePiece's score-ordered merging.

    Each normal piece that splits into two normal pieces gives merges ranked by the joined piece's
    score, highest first (ties by id, as the vocabulary lists them); the splits of one piece by the ids
    of their parts.
    """
    mergeable = {
        token: token_id for token_id, token in enumerate(tokens) if types[token_id] in (UNDEFINED, NORMAL)
    }
    ranked: list[tuple[float, int, int, int, str, str]] = []
    for piece, piece_id in mergeable.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in mergeable and right in mergeable:
                ranked.append((-scores[piece_id], piece_id, mergeable[left], mergeable[right], left, right))
    ranked.sort()
    return [[left, right] for *_, left, right in ranked]


def _split_merge(merge: str) -> list[str]:
    """``"a b"`` -> ``["a", "b"]``, split at the first space after the first character, as llama.cpp does."""
    cut = merge.find(" ", 1)
    if cut < 0:
        raise PrepareError(f"a BPE merge without a space: {merge!r}")
    return [merge[:cut], merge[cut + 1 :]]


def _post_processor(
    vocabulary: GgufVocabulary, tokens: list[str], add_bos: bool, add_eos: bool
) -> dict[str, Any] | None:
    """BOS/EOS around the text when the GGUF adds them (TemplateProcessing), else nothing."""
    wanted = [role for role, add in (("bos", add_bos), ("eos", add_eos)) if add]
    missing = [role for role in wanted if vocabulary.special_ids.get(role) is None]
    if missing:
        raise PrepareError(
            f"tokenizer.ggml.add_{missing[0]}_token is true but the GGUF has no {missing[0]} id"
        )
    if not wanted:
        return None
    ids = {role: int(vocabulary.special_ids[role] or 0) for role in wanted}

    def template(sequence: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        if "bos" in ids:
            items.append({"SpecialToken": {"id": tokens[ids["bos"]], "type_id": 0}})
        items.append({"Sequence": {"id": sequence, "type_id": 0}})
        if "eos" in ids:
            items.append({"SpecialToken": {"id": tokens[ids["eos"]], "type_id": 0}})
        return items

    return {
        "type": "TemplateProcessing",
        "single": template("A"),
        "pair": template("A") + template("B"),
        "special_tokens": {
            tokens[token_id]: {"id": tokens[token_id], "ids": [token_id], "tokens": [tokens[token_id]]}
            for token_id in ids.values()
        },
    }


def tokenizer_config(vocabulary: GgufVocabulary, chat_template: str | None) -> dict[str, Any]:
    """A ``tokenizer_config.json`` naming the special tokens, so transformers loads the folder as is."""
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
    }
    for role in ("bos", "eos", "unk", "pad"):
        token = vocabulary.token(role)
        if token is not None:
            config[f"{role}_token"] = token
    if chat_template:
        config["chat_template"] = chat_template
    return config


def write_tokenizer(vocabulary: GgufVocabulary, chat_template: str | None, out_dir: Path, where: str) -> str:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``out_dir`` and, when transformers is
    installed, replace the tokenizer IRs with ones converted from them. Returns where the IRs came from."""
    (out_dir / TOKENIZER_JSON).write_text(
        json.dumps(tokenizer_json(vocabulary, where), ensure_ascii=False) + "\n", encoding="utf-8"
    )
    config = tokenizer_config(vocabulary, chat_template)
    (out_dir / TOKENIZER_CONFIG_JSON).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    if importlib.util.find_spec("transformers") is None:
        # GenAI's reader knows one pre-tokenizer (SmolLM's, the default model's) and splits any other
        # GGUF with llama.cpp's 'default' regexes, which cut the space off punctuation.
        level = logging.INFO if vocabulary.pre in _GENAI_PRE_TOKENIZERS else logging.WARNING
        logger.log(
            level,
            "%s: transformers is not installed, so the tokenizer IRs are OpenVINO GenAI's, which may split "
            "text unlike the model's own tokenizer (tokenizer.json is exact); pip install transformers "
            "(no torch needed) and prepare again for exact tokenization",
            where,
        )
        return "OpenVINO GenAI's GGUF reader"
    _convert_irs(out_dir, config)
    return TOKENIZER_JSON


def _convert_irs(out_dir: Path, config: dict[str, Any]) -> None:
    from transformers import PreTrainedTokenizerFast

    from xpuspec.prepare.tokenizer import write_openvino_tokenizer

    special = {key: value for key, value in config.items() if key.endswith("_token")}
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(out_dir / TOKENIZER_JSON), clean_up_tokenization_spaces=False, **special
    )
    if "chat_template" in config:
        hf_tokenizer.chat_template = config["chat_template"]
    write_openvino_tokenizer(hf_tokenizer, out_dir)
