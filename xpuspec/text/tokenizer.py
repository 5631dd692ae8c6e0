"""Text <-> token ids with the OpenVINO tokenizer IRs of a model folder (no torch, no transformers).

A model folder holds ``openvino_tokenizer.xml`` and ``openvino_detokenizer.xml`` as written by
``openvino_tokenizers.convert_tokenizer(hf_tokenizer, with_detokenizer=True)``. Those IRs bake
``add_special_tokens`` and ``skip_special_tokens`` in as constants; at load time we rewire each
into a boolean model input, so one compiled model serves both settings per call (the same idea
as openvino_genai's tokenizer, with inputs instead of variables so requests stay stateless).
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as opset
import openvino_tokenizers  # noqa: F401  (registers the tokenizer ops with every ov.Core made after this)

from xpuspec.text.byte_decoder import ByteTable

logger = logging.getLogger(__name__)

TOKENIZER_FILE = "openvino_tokenizer.xml"
DETOKENIZER_FILE = "openvino_detokenizer.xml"
ADD_SPECIAL_TOKENS_INPUT = "add_special_tokens"
SKIP_SPECIAL_TOKENS_INPUT = "skip_special_tokens"

_INT32_MAX = np.iinfo(np.int32).max
_SKIP_TOKENS_PORT = 4  # VocabDecoder(token_ids, begins, ends, chars, skip_token_ids)


def _read_model(core: ov.Core, path: Path) -> ov.Model:
    try:
        return core.read_model(path)
    except RuntimeError as error:
        if "extension" not in str(error):
            raise
        # A Core created before openvino_tokenizers was imported lacks the tokenizer ops.
        core.add_extension(str(openvino_tokenizers._ext_path))
        return core.read_model(path)


def _boolean_switch(model: ov.Model, name: str) -> ov.Node:
    parameter = opset.parameter([], ov.Type.boolean, name=name)
    parameter.output(0).get_tensor().set_names({name})
    model.add_parameters([parameter])
    return parameter


def _make_add_special_tokens_switchable(model: ov.Model) -> bool:
    """Gate the special tokens that CombineSegments inserts (BOS, EOS, CLS...) behind an input.

    CombineSegments takes (begin, end, values) triples; a special-token triple is all
    constants, and setting its ``end`` to 0 drops the token (openvino_genai does the same).
    Returns whether the model had any such tokens.
    """
    combine_nodes = [node for node in model.get_ordered_ops() if node.get_type_name() == "CombineSegments"]
    switch = None
    for node in combine_nodes:
        num_triples = (node.get_input_size() - 1) // 3
        for triple in range(num_triples):
            sources = [node.input_value(3 * triple + offset).get_node() for offset in range(3)]
            if not all(source.get_type_name() == "Constant" for source in sources):
                continue  # a text segment, not a special token
            if switch is None:
                switch = _boolean_switch(model, ADD_SPECIAL_TOKENS_INPUT)
            end = node.input_value(3 * triple + 1)
            zero = opset.constant(np.zeros(end.get_shape(), dtype=np.int32), ov.Type.i32)
            node.input(3 * triple + 1).replace_source_output(opset.select(switch, end, zero).output(0))
    if switch is None:
        return False
    model.validate_nodes_and_infer_types()
    return True


def _make_skip_special_tokens_switchable(model: ov.Model) -> bool:
    """Gate VocabDecoder's list of tokens to skip behind an input (slice it to empty when off)."""
    decoders = [node for node in model.get_ordered_ops() if node.get_type_name() == "VocabDecoder"]
    if not decoders:
        return False
    switch = _boolean_switch(model, SKIP_SPECIAL_TOKENS_INPUT)
    for node in decoders:
        skip_tokens = node.input_value(_SKIP_TOKENS_PORT)
        stop = opset.select(
            switch,
            opset.constant(np.array([_INT32_MAX], dtype=np.int32)),
            opset.constant(np.array([0], dtype=np.int32)),
        )
        sliced = opset.slice(
            skip_tokens,
            opset.constant(np.array([0], dtype=np.int32)),
            stop,
            opset.constant(np.array([1], dtype=np.int32)),
        )
        node.input(_SKIP_TOKENS_PORT).replace_source_output(sliced.output(0))
    model.validate_nodes_and_infer_types()
    return True


def _output_bytes_before_packing(model: ov.Model) -> bool:
    """Make the detokenizer output the (begins, ends, bytes) of its text; False if it cannot.

    StringTensorPack returns the text of an earlier call when every string is empty (e.g. a
    lone BOS with skip_special_tokens), so we drop it and slice the bytes ourselves. The model is
    edited in place: a new ov.Model would not keep the tokenizer extension library loaded, and
    freeing its nodes after the Core crashes the process.
    """
    results = model.get_results()
    if len(results) != 1:
        return False
    pack = results[0].input_value(0).get_node()
    if pack.get_type_name() != "StringTensorPack":
        return False
    model.add_results([opset.result(pack.input_value(port)) for port in range(3)])  # begins, ends, bytes
    model.remove_result(results[0])
    model.validate_nodes_and_infer_types()
    return True


def _rt_info_int(model: ov.Model, key: str) -> int | None:
    if not model.has_rt_info(key):
        return None
    value = model.get_rt_info(key).astype(str)
    return int(value) if value.lstrip("-").isdigit() else None


class _RequestPool:
    """Infer requests of one compiled model, lent out one per call so threads never share one."""

    def __init__(self, compiled: ov.CompiledModel) -> None:
        self._compiled = compiled
        self._idle: queue.SimpleQueue[ov.InferRequest] = queue.SimpleQueue()

    @contextmanager
    def request(self) -> Iterator[ov.InferRequest]:
        try:
            request = self._idle.get_nowait()
        except queue.Empty:
            request = self._compiled.create_infer_request()
        try:
            yield request
        finally:
            self._idle.put(request)


class Tokenizer:
    """Encode and decode with a model folder's OpenVINO tokenizer and detokenizer IRs on CPU.

    Thread-safe: every call borrows its own infer request.

    Decoding uses a per-token byte table read out of the detokenizer IR when the IR is a plain
    vocab lookup (:mod:`xpuspec.text.byte_decoder`), with the same text as the model and no model
    call; ``byte_table=False`` (or an IR that cannot be tabled) decodes with the model.
    """

    def __init__(self, model_dir: Path, core: ov.Core | None = None, *, byte_table: bool = True) -> None:
        model_dir = Path(model_dir)
        missing = [name for name in (TOKENIZER_FILE, DETOKENIZER_FILE) if not (model_dir / name).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{model_dir} lacks {', '.join(missing)}; convert the tokenizer with "
                "openvino_tokenizers.convert_tokenizer(hf_tokenizer, with_detokenizer=True)"
            )
        core = core or ov.Core()
        self.model_dir = model_dir

        tokenizer_model = _read_model(core, model_dir / TOKENIZER_FILE)
        self._has_add_switch = _make_add_special_tokens_switchable(tokenizer_model)
        detokenizer_model = _read_model(core, model_dir / DETOKENIZER_FILE)
        # Read before the edits below, which add ops the table reader does not know.
        self.byte_table: ByteTable | None = (
            ByteTable.from_detokenizer(detokenizer_model) if byte_table else None
        )
        if self.byte_table is None and any(
            node.get_type_name() == "UTF8Validate" and not node.get_attributes().get("replace_mode", True)
            for node in detokenizer_model.get_ordered_ops()
        ):
            logger.warning(
                "%s drops invalid UTF-8 and is not tabled: streaming cannot see characters cut "
                "between tokens and may lose them",
                DETOKENIZER_FILE,
            )
        self._has_skip_switch = _make_skip_special_tokens_switchable(detokenizer_model)
        if not self._has_skip_switch:
            logger.warning("%s has no VocabDecoder: skip_special_tokens is ignored", DETOKENIZER_FILE)
        self._decodes_to_bytes = _output_bytes_before_packing(detokenizer_model)
        if not self._decodes_to_bytes:
            logger.warning(
                "%s does not end in StringTensorPack: decoding to '' may be wrong", DETOKENIZER_FILE
            )

        self.bos_token_id = _rt_info_int(tokenizer_model, "bos_token_id")
        self.eos_token_id = _rt_info_int(tokenizer_model, "eos_token_id")
        self.pad_token_id = _rt_info_int(tokenizer_model, "pad_token_id")
        self.chat_template: str | None = (
            tokenizer_model.get_rt_info("chat_template").astype(str)
            if tokenizer_model.has_rt_info("chat_template")
            else None
        )

        # One thread per call: the work is tiny, and more threads only contend with the LLM's.
        config = {"INFERENCE_NUM_THREADS": 1}
        self._encoder = _RequestPool(core.compile_model(tokenizer_model, "CPU", config))
        self._decoder = _RequestPool(core.compile_model(detokenizer_model, "CPU", config))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.encode_batch([text], add_special_tokens=add_special_tokens)[0]

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        if isinstance(texts, str) or not all(isinstance(text, str) for text in texts):
            raise ValueError("encode_batch takes a list of strings")
        if not texts:
            return []
        inputs: dict[int | str, np.ndarray] = {0: np.array(list(texts), dtype=object).astype(str)}
        if self._has_add_switch:
            inputs[ADD_SPECIAL_TOKENS_INPUT] = np.array(add_special_tokens, dtype=bool)
        with self._encoder.request() as request:
            request.infer(inputs)
            input_ids = request.get_tensor("input_ids").data  # [batch, padded_length]
            attention_mask = request.get_tensor("attention_mask").data  # [batch, padded_length]
            # The mask, not a pad id, tells padding apart: pad may also be a real token.
            return [row[mask == 1].tolist() for row, mask in zip(input_ids, attention_mask, strict=True)]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if self.byte_table is not None:
            return self.byte_table.decode(token_ids, skip_special_tokens)
        return self.decode_batch([token_ids], skip_special_tokens=skip_special_tokens)[0]

    def ends_mid_character(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> bool | None:
        """Whether ``token_ids`` end inside a UTF-8 character; None without a byte table (cannot tell)."""
        if self.byte_table is None:
            return None
        return self.byte_table.ends_mid_character(token_ids, skip_special_tokens)

    def decode_batch(self, batch: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        """Decode several sequences; ids outside the vocabulary decode to nothing."""
        if not batch:
            return []
        if self.byte_table is not None:
            return [self.byte_table.decode(token_ids, skip_special_tokens) for token_ids in batch]
        if len(batch) == 1:
            token_ids = np.asarray(batch[0], dtype=np.int64).reshape(1, -1)  # [1, num_tokens]
            return [self._decode_row(token_ids, skip_special_tokens)]
        # Rows of different lengths go one by one: padding would need a token that decodes to nothing.
        return [self.decode(token_ids, skip_special_tokens) for token_ids in batch]

    def _decode_row(self, token_ids: np.ndarray, skip_special_tokens: bool) -> str:
        if token_ids.size == 0:
            return ""
        inputs: dict[int | str, np.ndarray] = {0: token_ids}
        if self._has_skip_switch:
            inputs[SKIP_SPECIAL_TOKENS_INPUT] = np.array(skip_special_tokens, dtype=bool)
        with self._decoder.request() as request:
            request.infer(inputs)
            if self._decodes_to_bytes:
                begin = int(request.get_output_tensor(0).data[0])
                end = int(request.get_output_tensor(1).data[0])
                text = request.get_output_tensor(2).data[begin:end].tobytes()  # [num_bytes] u8
            else:
                text = request.get_output_tensor(0).bytes_data[0]
        # The IR already replaced invalid UTF-8 (utf8_replace_mode); decoding leniently keeps an
        # IR converted without that mode from raising here.
        return text.decode("utf-8", errors="replace")

    def token_to_text(self, token_id: int) -> str:
        """The text of one token, special tokens included (for chat templates' bos/eos strings)."""
        return self.decode([token_id], skip_special_tokens=False)
