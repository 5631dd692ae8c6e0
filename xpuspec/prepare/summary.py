"""Human-readable summary of a bundle manifest, for `xpuspec inspect`."""

from __future__ import annotations

from typing import Any

from xpuspec.model_bundle import ModelBundle


def describe_compression(compression: dict[str, Any]) -> str:
    mode = compression.get("mode", "?")
    parts = [mode]
    if compression.get("weights") == "int4":
        group_size = compression.get("group_size")
        parts.append("channel-wise" if group_size == -1 else f"group {group_size}")
        parts.append(f"ratio {compression.get('ratio')}")
        parts += [name for name in ("awq", "scale_estimation") if compression.get(name)]
    int4_count, int8_count = compression.get("int4_constants", 0), compression.get("int8_constants", 0)
    parts.append(f"({int4_count} int4 + {int8_count} int8 weight constants)")
    return " ".join(str(part) for part in parts)


def summarize_bundle(bundle: ModelBundle) -> str:
    manifest = bundle.manifest
    lines = [
        f"bundle: {bundle.root}",
        f"  format {manifest.get('format_version')}, created {manifest.get('created_at')} by "
        f"{manifest.get('created_by')}, prepared for {manifest.get('prepared_for', '?')}",
    ]
    for role in ("target", "draft"):
        info = bundle.model(role)
        if info is None:
            continue
        facts = info.facts
        lines += [
            f"{role}: {facts.get('architecture')} ({facts.get('model_type')}) in {facts.get('path')}/",
            f"  source: {facts.get('source')}",
            f"  vocab {facts.get('vocab_size')}, {facts.get('num_layers')} layers, "
            f"hidden {facts.get('hidden_size')}, "
            f"{facts.get('num_kv_heads')} kv heads x head_dim {facts.get('head_dim')}, "
            f"context {facts.get('max_position_embeddings')}",
            f"  weights: {describe_compression(facts.get('compression', {}))}",
        ]
    tokenizer = bundle.tokenizer_facts
    specials = tokenizer.get("special_tokens", {})
    special_text = ", ".join(
        f"{role}={value.get('token')!r}({value.get('id')})"
        for role, value in specials.items()
        if value.get("token")
    )
    template = bundle.chat_template
    lines += [
        f"tokenizer: vocab {tokenizer.get('vocab_size')}, eos ids {bundle.eos_token_ids}, "
        f"bos {tokenizer.get('bos_token_id')}, pad {tokenizer.get('pad_token_id')}",
        f"  special tokens: {special_text or 'none'}",
        f"  chat template: {'yes (' + str(len(template)) + ' chars)' if template else 'none'}",
    ]
    pairing = manifest.get("pairing") or {}
    if bundle.draft is None:
        lines.append("pairing: no draft (target-only bundle)")
    elif pairing.get("mismatch"):
        lines.append(f"pairing: FORCED despite a mismatch: {pairing['mismatch']}")
    else:
        lines.append(f"pairing: {'checked, tokenizers match' if pairing.get('checked') else 'not checked'}")
    placement = bundle.placement
    lines.append(f"placement: {placement if placement else 'none (decided when the bundle is loaded)'}")
    return "\n".join(lines)
