"""Write a GGUF file from a tiny Hugging Face Llama checkpoint with the `gguf` package (no llama.cpp).

The layout follows llama.cpp's convert_hf_to_gguf.py for Llama: tensor names ``blk.N.*``, the query and
key projections permuted to GGUF's interleaved rotary order, the GPT-2 style BPE tokenizer in
``tokenizer.ggml.*`` (pre-tokenizer ``gpt-2``, the byte-level BPE's own regex). F32 or F16 tensors
only (norms always F32, as llama.cpp writes them).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

_LAYER_TENSORS = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """HF's rotate-half q/k rows -> GGUF's interleaved pairs (llama.cpp's LlamaModel.permute)."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_gguf_from_checkpoint(
    checkpoint: Path,
    out_path: Path,
    *,
    dtype: str = "F32",
    architecture: str = "llama",
    tokenizer_options: dict[str, Any] | None = None,
    sampling: dict[str, float] | None = None,
) -> Path:
    """Convert the HF Llama in ``checkpoint``; ``architecture`` may name another one on purpose.
    ``tokenizer_options``: how its tokenizer is written (:func:`add_tokenizer`; default a byte-level BPE
    with pre-tokenizer ``gpt-2``). ``sampling``: llama.cpp's recommended-sampling keys to write
    (``{"general.sampling.temp": 0.6}``; top_k and penalty_last_n as integers)."""
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    tokenizer = json.loads((checkpoint / "tokenizer.json").read_text(encoding="utf-8"))
    state = load_file(str(checkpoint / "model.safetensors"))
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer = gguf.GGUFWriter(str(out_path), architecture)
    writer.add_name("tiny-llama-test")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_rope_dimension_count(config["hidden_size"] // heads)
    writer.add_vocab_size(config["vocab_size"])
    file_types = {"F32": gguf.LlamaFileType.ALL_F32, "Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1}
    writer.add_file_type(file_types.get(dtype, gguf.LlamaFileType.MOSTLY_F16))

    add_tokenizer(writer, tokenizer, special_ids=config, **(tokenizer_options or {"pre": "gpt-2"}))
    for key, value in (sampling or {}).items():
        if key.endswith(("top_k", "penalty_last_n")):
            writer.add_int32(key, int(value))
        else:
            writer.add_float32(key, float(value))
    template_path = checkpoint / "chat_template.jinja"
    if template_path.is_file():
        writer.add_chat_template(template_path.read_text(encoding="utf-8"))

    def tensor(name: str, value: np.ndarray, layer: bool = False) -> None:
        value = value.astype(np.float32)
        if dtype == "Q4_1" and layer:  # the layers' matrices in Q4_1, as llama.cpp quantises them
            quantized = gguf.quants.quantize(value, gguf.GGMLQuantizationType.Q4_1)
            writer.add_tensor(name, quantized, raw_dtype=gguf.GGMLQuantizationType.Q4_1)
            return
        if dtype in ("F16", "Q4_1") and value.ndim > 1:
            value = value.astype(np.float16)
        writer.add_tensor(name, value)

    tensor("token_embd.weight", state["model.embed_tokens.weight"])
    for layer in range(config["num_hidden_layers"]):
        for hf_name, gguf_name in _LAYER_TENSORS.items():
            value = state[f"model.layers.{layer}.{hf_name}"]
            if hf_name.startswith("self_attn.q_proj"):
                value = _permute(value, heads)
            elif hf_name.startswith("self_attn.k_proj"):
                value = _permute(value, kv_heads)
            tensor(f"blk.{layer}.{gguf_name}", value, layer=value.ndim > 1)
    tensor("output_norm.weight", state["model.norm.weight"])
    tensor("output.weight", state.get("lm_head.weight", state["model.embed_tokens.weight"]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def gguf_tokens(tokenizer: dict[str, Any]) -> tuple[list[str], list[int]]:
    """Token strings by id and llama.cpp's token types, as llama.cpp's convert_hf_to_gguf.py writes them:
    special added tokens are CONTROL, other added ones USER_DEFINED, ``<0xNN>`` pieces BYTE."""
    import gguf

    by_id = {int(i): token for token, i in tokenizer["model"]["vocab"].items()}
    added = {int(entry["id"]): entry for entry in tokenizer.get("added_tokens", [])}
    by_id.update({token_id: entry["content"] for token_id, entry in added.items()})
    tokens = [by_id[i] for i in range(max(by_id) + 1)]
    types = []
    for token_id, token in enumerate(tokens):
        if token_id in added:
            kind = gguf.TokenType.CONTROL if added[token_id]["special"] else gguf.TokenType.USER_DEFINED
        elif tokenizer["model"].get("byte_fallback") and re.fullmatch(r"<0x[0-9A-F]{2}>", token):
            kind = gguf.TokenType.BYTE
        else:
            kind = gguf.TokenType.NORMAL
        types.append(int(kind))
    return tokens, types


def add_tokenizer(
    writer: Any,
    tokenizer: dict[str, Any],
    *,
    pre: str | None,
    special_ids: dict[str, Any],
    add_bos: bool = False,
    scores: list[float] | None = None,
    add_space_prefix: bool | None = None,
) -> None:
    """Write a Hugging Face ``tokenizer.json`` (as a dict) into a GGUF's ``tokenizer.ggml.*`` metadata.

    ``pre`` given: a byte-level BPE (``gpt2``) with its merges; None: a SentencePiece BPE (``llama``)
    with ``scores`` and no merges, as llama.cpp's converter writes a Llama 2 / Mistral tokenizer."""
    tokens, types = gguf_tokens(tokenizer)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if pre is not None:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
        merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
        writer.add_token_merges(merges)
    else:
        writer.add_tokenizer_model("llama")
        writer.add_token_scores(scores if scores is not None else [0.0] * len(tokens))
        if add_space_prefix is not None:
            writer.add_add_space_prefix(add_space_prefix)
    for role, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id)):
        if special_ids.get(f"{role}_token_id") is not None:
            add(int(special_ids[f"{role}_token_id"]))
    if special_ids.get("pad_token_id") is not None:
        writer.add_pad_token_id(int(special_ids["pad_token_id"]))
    if special_ids.get("unk_token_id") is not None:
        writer.add_unk_token_id(int(special_ids["unk_token_id"]))
    writer.add_add_bos_token(add_bos)


def write_tokenizer_gguf(path: Path, tokenizer: dict[str, Any], **options: Any) -> Path:
    """A GGUF that holds only a tokenizer (no tensors): what `GgufModel.read` needs to build one."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    add_tokenizer(writer, tokenizer, **options)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def with_tokenizer(
    checkpoint: Path, out_dir: Path, tokenizer: dict[str, Any], special: dict[str, str]
) -> Path:
    """A copy of ``checkpoint`` with another tokenizer: its embedding and LM head resized to the new
    vocabulary (new rows random), the config's size and special ids updated."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from tests.support.tokenizer_families import vocabulary_size

    out_dir.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "generation_config.json", "chat_template.jinja"):
        if (checkpoint / name).is_file():
            shutil.copy2(checkpoint / name, out_dir / name)
    size = vocabulary_size(tokenizer)
    state = load_file(str(checkpoint / "model.safetensors"))
    rng = np.random.default_rng(0)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        rows = state[name]
        extra = rng.standard_normal((max(0, size - rows.shape[0]), rows.shape[1])).astype(rows.dtype)
        state[name] = np.concatenate([rows, extra * rows.std()])[:size].copy()
    save_file(state, str(out_dir / "model.safetensors"))
    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    ids = {content: token_id for content, token_id in tokenizer["model"]["vocab"].items()}
    config.update(vocab_size=size, **{f"{role}_token_id": ids[token] for role, token in special.items()})
    (out_dir / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (out_dir / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    return out_dir


def tiny_llama_gguf(work: Path) -> Path:
    """The tests' tiny random Llama (``work/target``) written as ``work/tiny.gguf`` in F16: a GGUF that
    OpenVINO GenAI's reader and llama-server both load."""
    from tests.support.tiny_checkpoints import make_tiny_checkpoint

    checkpoint = make_tiny_checkpoint(work / "target", "llama", hidden_size=64, num_layers=2, seed=0)
    return write_gguf_from_checkpoint(checkpoint, work / "tiny.gguf", dtype="F16")
