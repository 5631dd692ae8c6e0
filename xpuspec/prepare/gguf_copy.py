"""The copy of a GGUF that OpenVINO GenAI's GGUF reader converts: as is, or with its tokenizer relabelled.

GenAI's reader builds a tokenizer besides the weights and refuses any GGUF whose
``tokenizer.ggml.model`` is not ``gpt2`` (a check in its gguf_tokenizer.cpp), so a SentencePiece GGUF
(``llama``: Llama 2, Mistral) would not convert at all. Its tokenizer is replaced anyway by the one built
from the GGUF's metadata (:mod:`xpuspec.prepare.gguf_tokenizer`), so such a GGUF is handed to GenAI
as a byte-level one: the same tensors and metadata, with the model type ``gpt2``, a pre-tokenizer name
and the merges derived from the scores. Only GenAI's scratch copy changes; the user's file never does.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from xpuspec.prepare.gguf_tokenizer import GgufVocabulary, sentencepiece_merges

_RELABELLED = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.merges")


def copy_for_genai(source: Path, destination: Path, vocabulary: GgufVocabulary, architecture: str) -> None:
    """Copy ``source`` to ``destination``, relabelling a SentencePiece tokenizer as GenAI requires."""
    if vocabulary.model != "llama":
        shutil.copyfile(source, destination)
        return
    import gguf

    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(destination), architecture)
    for field in reader.fields.values():
        # The writer adds the architecture and the GGUF.* header fields itself.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name in _RELABELLED:
            continue
        kind = field.types[0]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub_type)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_merges([" ".join(pair) for pair in _merges(vocabulary)])
    for tensor in reader.tensors:
        writer.add_tensor_info(
            tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes, tensor.tensor_type
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()


def _merges(vocabulary: GgufVocabulary) -> list[list[str]]:
    return sentencepiece_merges(list(vocabulary.tokens), vocabulary.token_types, vocabulary.scores)
