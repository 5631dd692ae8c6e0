"""Write a GGUF file from a tiny Hugging Face Llama checkpoint with the `gguf` package (no llama.cpp).

The layout follows llama.cpp's convert_hf_to_gguf.py for Llama: tensor names ``blk.N.*``, the query and
key projections permuted to GGUF's interleaved rotary order, the GPT-2 style BPE tokenizer in
``tokenizer.ggml.*``. F32 or F16 tensors only (norms always F32, as llama.cpp writes them).
"""

from __future__ import annotations

import json
from pathlib import Path

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
    sampling: dict[str, float] | None = None,
) -> Path:
    """Convert the HF Llama in ``checkpoint``; ``architecture`` may name another one on purpose.
    ``sampling``: llama.cpp's recommended-sampling keys to write (``{"general.sampling.temp": 0.6}``;
    top_k and penalty_last_n as integers)."""
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
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "F32" else gguf.LlamaFileType.MOSTLY_F16)

    vocab = tokenizer["model"]["vocab"]
    by_id = {int(i): token for token, i in vocab.items()}
    for added in tokenizer.get("added_tokens", []):
        by_id[int(added["id"])] = added["content"]
    special = {added["id"] for added in tokenizer.get("added_tokens", []) if added.get("special")}
    tokens = [by_id[i] for i in range(len(by_id))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [int(gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL) for i in range(len(tokens))]
    )
    writer.add_token_merges(merges)
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
    writer.add_add_bos_token(False)
    for key, value in (sampling or {}).items():
        if key.endswith(("top_k", "penalty_last_n")):
            writer.add_int32(key, int(value))
        else:
            writer.add_float32(key, float(value))
    template_path = checkpoint / "chat_template.jinja"
    if template_path.is_file():
        writer.add_chat_template(template_path.read_text(encoding="utf-8"))

    def tensor(name: str, value: np.ndarray) -> None:
        value = value.astype(np.float32)
        if dtype == "F16" and value.ndim > 1:
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
            tensor(f"blk.{layer}.{gguf_name}", value)
    tensor("output_norm.weight", state["model.norm.weight"])
    tensor("output.weight", state.get("lm_head.weight", state["model.embed_tokens.weight"]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def tiny_llama_gguf(work: Path) -> Path:
    """The tests' tiny random Llama (``work/target``) written as ``work/tiny.gguf`` in F16: a GGUF that
    OpenVINO GenAI's reader and llama-server both load."""
    from tests.support.tiny_checkpoints import make_tiny_checkpoint

    checkpoint = make_tiny_checkpoint(work / "target", "llama", hidden_size=64, num_layers=2, seed=0)
    return write_gguf_from_checkpoint(checkpoint, work / "tiny.gguf", dtype="F16")
