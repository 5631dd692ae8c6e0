"""Decode token ids with a per-token byte table read out of the OpenVINO detokenizer IR.

Calling the detokenizer model costs far more than the lookup it does (input dispatch, a synchronous
infer; figure in docs/experiments/code-comment-figures.md), and streaming calls it about twice per
generated token. A detokenizer IR written by
openvino_tokenizers is a vocab lookup followed by a chain of string ops:

    Parameter -> Convert -> VocabDecoder(ids, begins, ends, chars, skip_ids)
              -> [per-token ops] -> FuzeRagged -> [whole-text ops] -> StringTensorPack -> Result

OpenVINO GenAI's GGUF reader writes the same graph with the skip list behind a ``Slice`` of constants
(the whole list); that slice is evaluated here like a constant.

Byte-level BPE tokenizers (GPT-2, Qwen, Llama 3, SmolLM2, the demo's) have no per-token op and only
UTF8Validate after the join. SentencePiece-style ones (Llama 2, Mistral, TinyLlama) replace ``▁``
with a space and turn ``<0xNN>`` tokens into bytes per token (RegexNormalization, ByteFallback),
then strip one leading space of the text (RegexNormalization ``^ ``). The per-token ops are applied
to the vocabulary once, when the table is built; the whole-text ops are re-done in Python on the
joined bytes, exactly as the IR does them; the result is decoded with the lenient
``decode("utf-8", errors="replace")`` that :class:`~xpuspec.text.tokenizer.Tokenizer` applies to the
model's output. An IR with any other op, or a regex that is not a plain literal, is not tabled and the
caller keeps the model.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import openvino as ov

logger = logging.getLogger(__name__)

_REPLACEMENT = b"\xef\xbf\xbd"  # U+FFFD in UTF-8
# The smallest code point a UTF-8 sequence of 1..4 bytes may encode (a smaller one is overlong).
_SMALLEST_CODE_POINT = (0, 0x80, 0x800, 0x10000)
_MAX_CHARACTER_BYTES = 4
_VOCAB_DECODER_INPUTS = 5  # token ids, begins, ends, chars, skip_ids
_REGEX_INPUTS = 5  # begins, ends, chars, search pattern, replacement
# Regexes tabled: an optional start anchor, then literal characters or escaped punctuation. Python's
# re and the IR's PCRE2 agree on these; anything richer stays with the model.
_LITERAL_REGEX = re.compile(r"\^?(?:[^\\.^$*+?()\[\]{}|]|\\[^A-Za-z0-9])+")
_STRUCTURAL_OPS = {
    "Parameter",
    "Convert",
    "Constant",
    "VocabDecoder",
    "FuzeRagged",
    "StringTensorPack",
    "Result",
}
_STRING_OPS = {"RegexNormalization", "ByteFallback", "UTF8Validate"}
# The attributes each op may carry: one we do not know might change what the op does.
_KNOWN_ATTRIBUTES = {
    "VocabDecoder": {"skip_tokens"},
    "RegexNormalization": {"global_replace"},
    "UTF8Validate": {"replace_mode"},
    "ByteFallback": set(),
    "FuzeRagged": set(),
}


@dataclass(frozen=True)
class RegexReplace:
    """RegexNormalization with a literal pattern: replace the first or every match."""

    pattern: re.Pattern[bytes]
    replacement: bytes
    replace_all: bool

    def apply(self, data: bytes) -> bytes:
        return self.pattern.sub(self.replacement, data, count=0 if self.replace_all else 1)


@dataclass(frozen=True)
class Utf8Validate:
    """UTF8Validate: invalid sequences become U+FFFD (``replace``) or are dropped."""

    replace: bool

    def apply(self, data: bytes) -> bytes:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return utf8_validate(data, replace=self.replace)
        return data  # valid UTF-8 passes unchanged: the common case needs no byte loop


TextStep = RegexReplace | Utf8Validate


@dataclass(frozen=True)
class ByteTable:
    """The bytes of every token id, and how the detokenizer IR turns their join into text.

    ``token_bytes[i]`` is token ``i``'s bytes after the IR's per-token ops; ``special_ids`` are the
    ids dropped when ``skip_special_tokens`` is on; ``text_steps`` are the IR's ops on the joined
    bytes, in order.
    """

    token_bytes: tuple[bytes, ...]
    special_ids: frozenset[int]
    text_steps: tuple[TextStep, ...] = ()

    def __post_init__(self) -> None:
        if not self.token_bytes:
            raise ValueError("a byte table needs at least one token")
        bad = [token_id for token_id in self.special_ids if not 0 <= token_id < len(self.token_bytes)]
        if bad:
            raise ValueError(f"special token ids {sorted(bad)} lie outside the vocabulary of {len(self)}")

    def __len__(self) -> int:
        return len(self.token_bytes)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text the detokenizer IR gives for ``token_ids`` (ids outside the vocabulary give nothing)."""
        table = self.token_bytes
        size = len(table)
        skipped = self.special_ids if skip_special_tokens else ()
        data = b"".join(
            table[token_id] for token_id in token_ids if 0 <= token_id < size and token_id not in skipped
        )
        for step in self.text_steps:
            data = step.apply(data)
        return data.decode("utf-8", errors="replace")

    def ends_mid_character(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> bool:
        """Whether the bytes of ``token_ids`` end inside a UTF-8 character, its last bytes still to come.

        Streaming must hold such tokens back. A detokenizer that replaces invalid UTF-8 shows the
        cut as U+FFFD, but one that drops it (GenAI's GGUF reader writes ``replace_mode=False``)
        gives no sign in the text, so the bytes are read here.
        """
        table = self.token_bytes
        size = len(table)
        skipped = self.special_ids if skip_special_tokens else ()
        tail = b""
        for token_id in reversed(token_ids):
            if 0 <= token_id < size and token_id not in skipped:
                tail = table[token_id] + tail
                if len(tail) >= _MAX_CHARACTER_BYTES - 1:
                    break
        # The character's lead is the last byte that is not a continuation byte (10xxxxxx).
        for back in range(1, min(len(tail), _MAX_CHARACTER_BYTES - 1) + 1):
            byte = tail[-back]
            if byte >> 6 != 0b10:
                return back < _utf8_length(byte)
        return False

    @classmethod
    def from_detokenizer(cls, model: ov.Model) -> ByteTable | None:
        """Read the table out of an unedited detokenizer IR; None if it holds ops we cannot redo."""
        try:
            return cls._read(model)
        except _NotTabled as reason:
            logger.debug(
                "detokenizer %s is decoded by the model, not a byte table: %s", model.get_name(), reason
            )
            return None

    @classmethod
    def _read(cls, model: ov.Model) -> ByteTable:
        vocab_decoder = _check_structure(model)
        begins, ends, chars, skip_ids = (
            _constant_data(vocab_decoder.input_value(port).get_node())
            for port in range(1, _VOCAB_DECODER_INPUTS)
        )
        char_bytes = chars.tobytes()
        pairs = zip(begins.tolist(), ends.tolist(), strict=True)
        token_bytes: list[bytes] = [char_bytes[begin:end] for begin, end in pairs]
        text_steps: list[TextStep] = []
        joined = False
        for node in model.get_ordered_ops():
            kind = node.get_type_name()
            if kind == "FuzeRagged":
                joined = True
            elif kind == "ByteFallback":
                if joined:
                    raise _NotTabled("ByteFallback after the tokens are joined")
                token_bytes = [_byte_fallback(data) for data in token_bytes]
            elif kind == "RegexNormalization":
                step = _regex_step(node)
                if joined:
                    text_steps.append(step)
                else:
                    token_bytes = [step.apply(data) for data in token_bytes]
            elif kind == "UTF8Validate":
                if not joined:
                    raise _NotTabled("UTF8Validate before the tokens are joined")
                text_steps.append(Utf8Validate(bool(node.get_attributes().get("replace_mode", False))))
        special_ids = frozenset(
            int(token_id) for token_id in skip_ids.tolist() if 0 <= token_id < len(token_bytes)
        )
        return cls(tuple(token_bytes), special_ids, tuple(text_steps))


class _NotTabled(Exception):
    """The detokenizer IR does something the byte table does not redo."""


def _byte_fallback(token: bytes) -> bytes:
    """ByteFallback on one token: ``<0xNN>`` becomes byte NN.

    Like the op (sentencepiece's PieceToByte): any 6-byte ``<....>`` counts as a byte token, and one
    that is not ``<0x`` + two upper-case hex digits + ``>`` becomes 0xFF (PieceToByte's -1 as a byte).
    """
    if len(token) != 6 or token[0] != ord("<") or token[5] != ord(">") or b"<" in token[1:]:
        return token
    digits = token[3:5]
    if token[1:3] == b"0x" and all(char in b"0123456789ABCDEF" for char in digits):
        return bytes([int(digits, 16)])
    return b"\xff"


def _regex_step(node: ov.Node) -> RegexReplace:
    if node.get_input_size() != _REGEX_INPUTS:
        raise _NotTabled(f"RegexNormalization with {node.get_input_size()} inputs")
    sources = [node.input_value(port).get_node() for port in (3, 4)]
    if any(source.get_type_name() != "Constant" for source in sources):
        raise _NotTabled("a regex that is not a constant")
    search, replacement = (source.get_data().tobytes() for source in sources)
    try:
        pattern_text = search.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _NotTabled(f"a regex that is not UTF-8: {search!r}") from error
    if not _LITERAL_REGEX.fullmatch(pattern_text) or b"\\" in replacement or b"$" in replacement:
        raise _NotTabled(f"regex {search!r} -> {replacement!r} is not a literal replacement")
    replace_all = bool(node.get_attributes().get("global_replace", True))
    return RegexReplace(re.compile(search), replacement, replace_all)


def _utf8_length(lead: int) -> int:
    """The length of the UTF-8 sequence ``lead`` starts, read from its bit pattern as UTF8Validate does
    (1 for ASCII and for bytes that start no sequence)."""
    if lead >> 5 == 0b110:
        return 2
    if lead >> 4 == 0b1110:
        return 3
    if lead >> 3 == 0b11110:
        return 4
    return 1


def utf8_validate(data: bytes, replace: bool = True) -> bytes:
    """The bytes openvino_tokenizers' UTF8Validate op makes of ``data``.

    It reads a sequence's length from the lead byte's bit pattern (so it also takes F5-F7 leads
    and surrogates, which Python's decoder rejects), replaces a lone or cut-short sequence with
    one U+FFFD and an overlong one with one U+FFFD per byte; ``replace=False`` drops them instead.
    """
    out = bytearray()
    replacement = _REPLACEMENT if replace else b""
    position = 0
    end = len(data)
    while position < end:
        lead = data[position]
        if lead < 0x80:
            out.append(lead)
            position += 1
            continue
        length = _utf8_length(lead)
        if length == 1:  # a continuation byte or 0xF8-0xFF where a sequence should start
            out += replacement
            position += 1
            continue
        code_point = lead & (0xFF >> (length + 1))  # the lead's payload bits after its length prefix
        cursor = position + 1
        while cursor < position + length and cursor < end and data[cursor] >> 6 == 0b10:
            code_point = (code_point << 6) | (data[cursor] & 0b111111)
            cursor += 1
        if cursor < position + length:
            # Cut short by a non-continuation byte (read again as a new start) or by the end.
            out += replacement
            position = cursor
            continue
        if code_point < _SMALLEST_CODE_POINT[length - 1]:
            out += replacement * length
        else:
            out += data[position:cursor]
        position = cursor
    return bytes(out)


def _constant_data(node: ov.Node) -> np.ndarray:
    """The value of a Constant, or of a 1-D Slice of constants (GenAI's GGUF reader slices the skip list)."""
    if node.get_type_name() == "Constant":
        return node.get_data()
    if node.get_type_name() != "Slice":
        raise _NotTabled(f"the vocabulary or skip list comes from {node.get_type_name()}, not a constant")
    inputs = [node.input_value(port).get_node() for port in range(node.get_input_size())]
    if any(source.get_type_name() != "Constant" for source in inputs):
        raise _NotTabled("a Slice of something other than constants")
    data, start, stop, step, *axes = (source.get_data() for source in inputs)
    if data.ndim != 1 or any(value.size != 1 for value in (start, stop, step, *axes)) or int(step[0]) == 0:
        raise _NotTabled("a Slice that is not one range of a list")
    if axes and int(axes[0][0]) not in (0, -1):
        raise _NotTabled("a Slice along another axis")
    # numpy's slice clamps start and stop like the op (negative values count from the end).
    return data[int(start[0]) : int(stop[0]) : int(step[0])]


def _check_structure(model: ov.Model) -> ov.Node:
    """Check ``model`` is one vocab lookup, string ops and a join; return its VocabDecoder."""
    types = [node.get_type_name() for node in model.get_ordered_ops()]
    extra = sorted(set(types) - _STRUCTURAL_OPS - _STRING_OPS - {"Slice"})
    if extra:
        raise _NotTabled(f"ops {extra} besides the vocab lookup and the string ops we redo")
    if types.count("VocabDecoder") != 1 or types.count("Result") != 1 or types.count("Parameter") != 1:
        raise _NotTabled("not one input, one VocabDecoder and one output")
    if types.count("FuzeRagged") != 1:
        raise _NotTabled("not one FuzeRagged")
    for node in model.get_ordered_ops():
        unknown = set(node.get_attributes()) - _KNOWN_ATTRIBUTES.get(
            node.get_type_name(), set(node.get_attributes())
        )
        if unknown:
            raise _NotTabled(f"{node.get_type_name()} has attributes {sorted(unknown)}")
    vocab_decoder = next(node for node in model.get_ordered_ops() if node.get_type_name() == "VocabDecoder")
    if list(vocab_decoder.get_attributes().get("skip_tokens", [])):
        raise _NotTabled("VocabDecoder lists skip tokens in an attribute")
    if vocab_decoder.get_input_size() != _VOCAB_DECODER_INPUTS:
        raise _NotTabled(f"VocabDecoder has {vocab_decoder.get_input_size()} inputs")
    sources = [vocab_decoder.input_value(port).get_node() for port in range(1, _VOCAB_DECODER_INPUTS)]
    skip_list_port = _VOCAB_DECODER_INPUTS - 1
    for node in model.get_ordered_ops():
        if node.get_type_name() == "Slice" and any(
            target.get_node().get_type_name() != "VocabDecoder" or target.get_index() != skip_list_port
            for target in node.output(0).get_target_inputs()
        ):
            raise _NotTabled("a Slice that does not make the skip list")
    begins, ends, chars, skip_ids = (_constant_data(source) for source in sources)
    if begins.shape != ends.shape or begins.ndim != 1 or chars.dtype != np.uint8 or skip_ids.ndim != 1:
        raise _NotTabled("unexpected vocabulary constants")
    if begins.size and (begins.min() < 0 or ends.max() > chars.size or (ends < begins).any()):
        raise _NotTabled("vocabulary offsets outside its bytes")
    # The input must reach VocabDecoder through at most a Convert (ids cast to i32).
    source = vocab_decoder.input_value(0).get_node()
    if source.get_type_name() == "Convert":
        source = source.input_value(0).get_node()
    if source.get_type_name() != "Parameter":
        raise _NotTabled("the token ids reach VocabDecoder through other ops")
    return vocab_decoder
