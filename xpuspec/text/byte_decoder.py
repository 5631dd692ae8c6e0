"""Decode token ids with a per-token byte table read out of the OpenVINO detokenizer IR.

Calling the detokenizer model costs ~0.1-0.2 ms per call (input dispatch, a synchronous infer),
and streaming calls it about twice per generated token. The common detokenizer IR is only a vocab
lookup followed by byte-level fixes:

    Parameter -> Convert -> VocabDecoder(ids, begins, ends, chars, skip_ids)
              -> FuzeRagged -> [UTF8Validate] -> StringTensorPack -> Result

(byte-level BPE tokenizers: GPT-2, Qwen, Llama 3, SmolLM2, the demo's). Its constants are the
vocabulary as bytes, so a lookup and a join in Python give the same bytes without a model call,
and the bytes are turned into text exactly as the model would: UTF8Validate's rules, then the
lenient ``decode("utf-8", errors="replace")`` that :class:`~xpuspec.text.tokenizer.Tokenizer`
applies to the model's output. An IR with any other op (regex clean-up, SentencePiece's
``▁``/byte-fallback steps, a strip at sequence start) is not tabled: the caller keeps the model.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import openvino as ov

logger = logging.getLogger(__name__)

_REPLACEMENT = b"\xef\xbf\xbd"  # U+FFFD in UTF-8
# The smallest code point a UTF-8 sequence of 1..4 bytes may encode (a smaller one is overlong).
_SMALLEST_CODE_POINT = (0, 0x80, 0x800, 0x10000)
_VOCAB_DECODER_INPUTS = 5  # token ids, begins, ends, chars, skip_ids


@dataclass(frozen=True)
class ByteTable:
    """The bytes of every token id, and how the detokenizer IR turns joined bytes into text.

    ``token_bytes[i]`` is token ``i``'s bytes; ``special_ids`` are the ids dropped when
    ``skip_special_tokens`` is on; ``utf8_validate`` is None when the IR has no UTF8Validate op,
    else its ``replace_mode`` (True: invalid bytes become U+FFFD, False: they are dropped).
    """

    token_bytes: tuple[bytes, ...]
    special_ids: frozenset[int]
    utf8_validate: bool | None

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
        if self.utf8_validate is not None:
            try:
                # Valid UTF-8 passes UTF8Validate unchanged: the common case needs no byte loop.
                return data.decode("utf-8")
            except UnicodeDecodeError:
                data = utf8_validate(data, replace=self.utf8_validate)
        return data.decode("utf-8", errors="replace")

    @classmethod
    def from_detokenizer(cls, model: ov.Model) -> ByteTable | None:
        """Read the table out of an unedited detokenizer IR; None if its ops are not the simple chain."""
        reason = _unsupported_reason(model)
        if reason is not None:
            logger.debug(
                "detokenizer %s is decoded by the model, not a byte table: %s", model.get_name(), reason
            )
            return None
        vocab_decoder = _vocab_decoder(model)
        begins, ends, chars, skip_ids = (
            vocab_decoder.input_value(port).get_node().get_data() for port in range(1, _VOCAB_DECODER_INPUTS)
        )
        chars = chars.tobytes()
        token_bytes = tuple(
            chars[begin:end] for begin, end in zip(begins.tolist(), ends.tolist(), strict=True)
        )
        validate = next(
            (node for node in model.get_ordered_ops() if node.get_type_name() == "UTF8Validate"), None
        )
        utf8_mode = None if validate is None else bool(validate.get_attributes().get("replace_mode", False))
        special_ids = frozenset(
            int(token_id) for token_id in skip_ids.tolist() if 0 <= token_id < len(token_bytes)
        )
        return cls(token_bytes, special_ids, utf8_mode)


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
        if lead >> 5 == 0b110:
            length, code_point = 2, lead & 0b11111
        elif lead >> 4 == 0b1110:
            length, code_point = 3, lead & 0b1111
        elif lead >> 3 == 0b11110:
            length, code_point = 4, lead & 0b111
        else:  # a continuation byte or 0xF8-0xFF where a sequence should start
            out += replacement
            position += 1
            continue
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


def _vocab_decoder(model: ov.Model) -> ov.Node:
    return next(node for node in model.get_ordered_ops() if node.get_type_name() == "VocabDecoder")


def _unsupported_reason(model: ov.Model) -> str | None:
    """Why ``model`` is not a vocab lookup plus byte fixes, or None when it is."""
    types = [node.get_type_name() for node in model.get_ordered_ops()]
    allowed = {"Parameter", "Convert", "Constant", "VocabDecoder", "FuzeRagged", "UTF8Validate"}
    allowed |= {"StringTensorPack", "Result"}
    extra = sorted(set(types) - allowed)
    if extra:
        return f"ops {extra} besides the vocab lookup"
    if types.count("VocabDecoder") != 1 or types.count("Result") != 1 or types.count("Parameter") != 1:
        return "not one input, one VocabDecoder and one output"
    if types.count("UTF8Validate") > 1 or types.count("FuzeRagged") != 1:
        return "not one FuzeRagged and at most one UTF8Validate"
    vocab_decoder = _vocab_decoder(model)
    if vocab_decoder.get_input_size() != _VOCAB_DECODER_INPUTS:
        return f"VocabDecoder has {vocab_decoder.get_input_size()} inputs"
    sources = [vocab_decoder.input_value(port).get_node() for port in range(1, _VOCAB_DECODER_INPUTS)]
    if any(source.get_type_name() != "Constant" for source in sources):
        return "the vocabulary or skip list is not a constant"
    begins, ends, chars, skip_ids = (source.get_data() for source in sources)
    if begins.shape != ends.shape or begins.ndim != 1 or chars.dtype != np.uint8:
        return "unexpected vocabulary constants"
    if begins.size and (begins.min() < 0 or ends.max() > chars.size or (ends < begins).any()):
        return "vocabulary offsets outside its bytes"
    if skip_ids.ndim != 1:
        return "unexpected skip list"
    # The input must reach VocabDecoder through at most a Convert (ids cast to i32).
    source = vocab_decoder.input_value(0).get_node()
    if source.get_type_name() == "Convert":
        source = source.input_value(0).get_node()
    if source.get_type_name() != "Parameter":
        return "the token ids reach VocabDecoder through other ops"
    return None
