"""Tokenizer side of a bundle: OpenVINO (de)tokenizer models and the manifest's tokenizer facts."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openvino as ov

from xpuspec.prepare.config import PrepareError
from xpuspec.prepare.export import import_conversion_module
from xpuspec.prepare.pairing import SPECIAL_TOKEN_ROLES

logger = logging.getLogger(__name__)

TOKENIZER_XML = "openvino_tokenizer.xml"
DETOKENIZER_XML = "openvino_detokenizer.xml"


@contextmanager
def _sequential_regex_splits() -> Iterator[None]:
    """Keep a tokenizer's regex splits one after another while openvino_tokenizers converts it.

    Its pipeline joins consecutive regex splits into one alternation (``A|B``), which splits text
    differently from splitting by ``A`` and then each piece by ``B`` as the Hugging Face tokenizer (and
    llama.cpp) do: StarCoder's ``\\p{N}`` then GPT-2's regex keeps " ½" whole instead of " " + "½".
    Joining refused, the merge step keeps each split as its own op (it stops joining on ValueError).
    """
    from openvino_tokenizers.tokenizer_pipeline import RegexSplitStep

    joined = RegexSplitStep.__add__

    def refuse(self: Any, other: Any) -> Any:
        raise ValueError("regex splits kept in sequence")

    RegexSplitStep.__add__ = refuse
    try:
        yield
    finally:
        RegexSplitStep.__add__ = joined


def write_openvino_tokenizer(hf_tokenizer: Any, model_dir: Path) -> None:
    """Save openvino_tokenizer.xml/.bin and openvino_detokenizer.xml/.bin in ``model_dir``."""
    openvino_tokenizers = import_conversion_module("openvino_tokenizers")
    try:
        with _sequential_regex_splits():
            tokenizer_model, detokenizer_model = openvino_tokenizers.convert_tokenizer(
                hf_tokenizer, with_detokenizer=True
            )
    except Exception as error:  # noqa: BLE001 - unsupported tokenizer types raise various errors
        raise PrepareError(
            f"cannot convert the tokenizer to OpenVINO ({type(error).__name__}: {error})"
        ) from error
    ov.save_model(tokenizer_model, str(model_dir / TOKENIZER_XML))
    ov.save_model(detokenizer_model, str(model_dir / DETOKENIZER_XML))


def tokenizer_facts(hf_tokenizer: Any, config: Any, generation_config: Any | None) -> dict[str, Any]:
    """EOS ids (generation config, model config and tokenizer, in that order), special tokens, template."""
    eos_ids: list[int] = []
    for source in (generation_config, config):
        eos_ids += _as_id_list(getattr(source, "eos_token_id", None) if source is not None else None)
    eos_ids += _as_id_list(hf_tokenizer.eos_token_id)
    special_tokens = {
        role: {
            "token": getattr(hf_tokenizer, f"{role}_token", None),
            "id": getattr(hf_tokenizer, f"{role}_token_id", None),
        }
        for role in SPECIAL_TOKEN_ROLES
    }
    chat_template = getattr(hf_tokenizer, "chat_template", None)
    return {
        "eos_token_ids": list(dict.fromkeys(eos_ids)),
        "bos_token_id": hf_tokenizer.bos_token_id,
        "pad_token_id": hf_tokenizer.pad_token_id,
        "vocab_size": len(hf_tokenizer),
        "chat_template": chat_template if isinstance(chat_template, str) else None,
        "special_tokens": special_tokens,
        "all_special_tokens": list(hf_tokenizer.all_special_tokens),
    }


def _as_id_list(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def load_generation_config(source_loadable: str) -> Any | None:
    transformers = import_conversion_module("transformers")
    try:
        return transformers.GenerationConfig.from_pretrained(source_loadable)
    except Exception:  # noqa: BLE001 - many checkpoints have no generation_config.json
        return None
