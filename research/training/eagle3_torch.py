"""The EAGLE-3 head in torch: the reference of the OpenVINO head, and the module training will fit.

Same math as :mod:`xpuspec.executor.eagle3_graph` (its docstring names the sources) and the
same parameter names as the published layout (``fc``, ``midlayer.*``, ``norm``, ``lm_head``, buffers
``d2t``/``t2d``), so ``state_dict()`` is a head EAGLE, vLLM, SGLang and :func:`xpuspec.spec_decode.
eagle3.weights.load_head_weights` read. The token embedding is an input (the target's table), not a
parameter, as in published heads. Needs torch (the ``convert`` extra).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from xpuspec.spec_decode.eagle3.config import CONFIG_FILE, Eagle3HeadConfig
from xpuspec.spec_decode.eagle3.weights import SAFETENSORS_FILE

KeyValue = tuple[torch.Tensor, torch.Tensor]  # each [b, kv_heads, length, head_dim]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: Eagle3HeadConfig):
        super().__init__()
        self.config = config
        hidden, head_dim = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(2 * hidden, config.num_attention_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(2 * hidden, config.num_key_value_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(2 * hidden, config.num_key_value_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * head_dim, hidden, bias=False)
        self.register_buffer(
            "inv_freq", torch.from_numpy(config.rope_inverse_frequencies()), persistent=False
        )

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, past: KeyValue | None, mask: torch.Tensor
    ) -> tuple[torch.Tensor, KeyValue]:
        config = self.config
        batch, new, _ = x.shape
        query = self.q_proj(x).view(batch, new, config.num_attention_heads, config.head_dim).transpose(1, 2)
        key = self.k_proj(x).view(batch, new, config.num_key_value_heads, config.head_dim).transpose(1, 2)
        value = self.v_proj(x).view(batch, new, config.num_key_value_heads, config.head_dim).transpose(1, 2)
        angles = position_ids.float()[..., None] * self.inv_freq  # [b, n, head_dim / 2]
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # [b, 1, n, head_dim]
        cos, sin = angles.cos(), angles.sin()
        query = query * cos + _rotate_half(query) * sin
        key = key * cos + _rotate_half(key) * sin
        if past is not None:
            key = torch.cat((past[0], key), dim=2)
            value = torch.cat((past[1], value), dim=2)
        repeat = config.num_groups
        scores = query @ key.repeat_interleave(repeat, dim=1).transpose(2, 3) / config.head_dim**0.5
        scores = scores.masked_fill(~mask[:, None], torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
        attended = (probs @ value.repeat_interleave(repeat, dim=1)).transpose(1, 2).reshape(batch, new, -1)
        return self.o_proj(attended), (key, value)


class MLP(nn.Module):
    def __init__(self, config: Eagle3HeadConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """EAGLE-3's ``midlayer``: attention over ``[norm(embedding), norm(hidden)]``, residual on hidden."""

    def __init__(self, config: Eagle3HeadConfig):
        super().__init__()
        self.norm_before_residual = config.norm_before_residual
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        past: KeyValue | None,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, KeyValue]:
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat((self.input_layernorm(embeds), normed), dim=-1)
        attended, cache = self.self_attn(x, position_ids, past, mask)
        hidden = residual + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden)), cache


class Eagle3Head(nn.Module):
    """``fc`` fusion, one decoder layer, final ``norm`` and ``lm_head`` over the draft vocabulary."""

    def __init__(self, config: Eagle3HeadConfig):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(3 * config.hidden_size, config.hidden_size, bias=False)
        self.midlayer = DecoderLayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))

    def fuse(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """``[..., 3*hidden]`` tapped target states -> ``[..., hidden]``."""
        return self.fc(target_hidden)

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        past: KeyValue | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, KeyValue]:
        """Logits ``[b, n, draft_vocab]``, the carried state ``[b, n, hidden]`` (before the final norm)
        and the whole cache (past and new). ``attention_mask`` ``[b, n, past + n]`` bool; default all of
        the past and causal among the new positions."""
        batch, new, _ = hidden.shape
        if attention_mask is None:
            cached = 0 if past is None else past[0].shape[2]
            causal = torch.ones(new, new, dtype=torch.bool).tril()
            attention_mask = torch.cat((torch.ones(new, cached, dtype=torch.bool), causal), dim=1)
            attention_mask = attention_mask.expand(batch, -1, -1)
        hidden_out, cache = self.midlayer(inputs_embeds, hidden, position_ids, past, attention_mask)
        return self.lm_head(self.norm(hidden_out)), hidden_out, cache

    def set_draft_vocabulary(self, target_ids: Sequence[int] | np.ndarray) -> None:
        """Set ``d2t``/``t2d`` from the target id of each draft id (increasing, as EAGLE builds them)."""
        ids = torch.as_tensor(np.asarray(target_ids), dtype=torch.long)
        if ids.shape != (self.config.draft_vocab_size,):
            raise ValueError(f"need {self.config.draft_vocab_size} target ids, got {list(ids.shape)}")
        self.d2t.copy_(ids - torch.arange(ids.shape[0]))
        self.t2d.zero_()
        self.t2d[ids] = True


def save_head(
    module: Eagle3Head, config: Eagle3HeadConfig, folder: str | Path, dtype: torch.dtype | None = None
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (with ``d2t``/``t2d``) in the published layout.

    ``dtype`` (e.g. ``torch.float16``, how a head ships) casts the float tensors; the maps keep theirs.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    state = {}
    for name, tensor in module.state_dict().items():
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        state[name] = tensor.detach().contiguous().cpu()
    save_file(state, str(folder / SAFETENSORS_FILE))
    return folder


def random_head(
    target_config: Mapping[str, Any],
    draft_vocab: int | None = None,
    *,
    seed: int = 0,
    aux_layer_ids: Sequence[int] | None = None,
    intermediate_size: int | None = None,
) -> tuple[Eagle3Head, Eagle3HeadConfig]:
    """A randomly initialised head for a target (its ``config.json`` dict), for tests.

    ``draft_vocab`` ids are a random increasing subset of the target's (all of them when None). Norm
    weights are perturbed from 1 so a test notices a norm applied to the wrong tensor. The matrices sit
    on the int8 grid of :func:`xpuspec.executor.eagle3_graph.quantise_int8_rows`, so the engine's
    int8 head computes this very module and tests can compare drafts with it token for token.
    """
    from xpuspec.executor.eagle3_graph import quantise_int8_rows

    vocab = int(target_config["vocab_size"])
    heads = int(target_config["num_attention_heads"])
    config = Eagle3HeadConfig(
        hidden_size=int(target_config["hidden_size"]),
        num_attention_heads=heads,
        num_key_value_heads=int(target_config.get("num_key_value_heads") or heads),
        head_dim=int(target_config.get("head_dim") or int(target_config["hidden_size"]) // heads),
        intermediate_size=int(intermediate_size or target_config["intermediate_size"]),
        rms_norm_eps=float(target_config.get("rms_norm_eps", 1e-6)),
        rope_theta=float(target_config.get("rope_theta", 10000.0)),
        vocab_size=vocab,
        draft_vocab_size=int(draft_vocab or vocab),
        aux_layer_ids=tuple(aux_layer_ids) if aux_layer_ids is not None else None,
        max_position_embeddings=int(target_config.get("max_position_embeddings", 2048)),
    )
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    module = Eagle3Head(config).eval()
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(1 + 0.2 * torch.randn(parameter.shape, generator=generator))
            elif parameter.ndim == 2 and name != "embed_tokens.weight":
                quantised, scale = quantise_int8_rows(parameter.numpy())
                parameter.copy_(torch.from_numpy(quantised * scale))
        ids = torch.randperm(vocab, generator=generator)[: config.draft_vocab_size].sort().values
        module.set_draft_vocabulary(ids.numpy())
    return module, config
