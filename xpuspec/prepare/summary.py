"""Human-readable summary of a bundle manifest, for `xpuspec inspect`."""

from __future__ import annotations

from typing import Any

from xpuspec.executor.properties import readable
from xpuspec.models.bundle import ModelBundle


def describe_compression(compression: dict[str, Any]) -> str:
    mode = compression.get("mode", "?")
    parts = [mode]
    if compression.get("weights") == "int4":
        group_size = compression.get("group_size")
        parts.append("channel-wise" if group_size == -1 else f"group {group_size}")
        parts.append(f"ratio {compression.get('ratio')}")
        parts += [name for name in ("awq", "scale_estimation") if compression.get(name)]
        if compression.get("group_size_fallback") not in (None, "error"):
            parts.append(f"fallback {compression['group_size_fallback']}")
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
        if facts.get("draft_vocab"):
            lines.append(f"  proposes token ids below {facts['draft_vocab']} (its LM head is cut to them)")
    lines += describe_eagle3(bundle)
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
    elif pairing.get("translate"):
        lines.append(
            "pairing: the tokenizers differ, so the draft's drafts are translated into target tokens "
            f"through text ({pairing.get('difference')})"
        )
        if pairing.get("check"):
            lines.append(f"  pair check: {pairing['check']}")
    elif pairing.get("mismatch"):
        lines.append(f"pairing: FORCED despite a mismatch: {pairing['mismatch']}")
    else:
        lines.append(f"pairing: {'checked, tokenizers match' if pairing.get('checked') else 'not checked'}")
    for device, record in (manifest.get("default_properties") or {}).items():
        for role in ("target", "draft"):
            if isinstance(record.get(role), dict):
                lines.append(f"default properties, {role} on {device}: {readable(record[role])}")
        if record.get("speculation"):
            lines.append(f"  speculation: {record['speculation']}")
    placement = bundle.placement
    if placement:
        lines += ["placement (recorded by `xpuspec plan --write`):", *describe_placement(placement)]
    else:
        lines.append("placement: none (decided when the bundle is loaded)")
    return "\n".join(lines)


def describe_eagle3(bundle: ModelBundle) -> list[str]:
    """The head's lines: where it is, the target layers it reads, its draft vocabulary and size."""
    head = bundle.eagle3
    if head is None:
        return []
    facts = head.facts
    size = facts.get("size_bytes")
    parameters = facts.get("num_parameters")
    return [
        f"eagle3: {facts.get('architecture')} in {facts.get('path')}/ (`--drafter eagle3`)",
        f"  source: {facts.get('source')}",
        f"  reads target layers {list(head.tap_layers)}, hidden {facts.get('hidden_size')}, "
        f"draft vocab {facts.get('draft_vocab_size')} of {facts.get('vocab_size')}",
        f"  weights: {'?' if parameters is None else f'{parameters / 1e6:.2f}M parameters'}, "
        f"{'?' if size is None else f'{size / 1e6:.1f} MB'}",
    ]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return ", ".join(f"{key}={_cell(item)}" for key, item in value.items()) or "-"
    if isinstance(value, list | tuple):
        return ", ".join(_cell(item) for item in value) or "-"
    return str(value)


def _flatten(record: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Dotted keys for nested dicts, so every key of the record shows, whoever added it."""
    rows: list[tuple[str, Any]] = []
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            rows += _flatten(value, f"{name}.")
        else:
            rows.append((name, value))
    return rows


def table(header: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [
        (indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))).rstrip()
        for row in [header, *rows]
    ]


def describe_placement(placement: dict[str, Any]) -> list[str]:
    """Every field of the placement record as a KEY/VALUE table; lists of records as their own table."""
    scalars: list[list[str]] = []
    record_lists: list[tuple[str, list[dict[str, Any]]]] = []
    for key, value in _flatten(placement):
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            record_lists.append((key, value))
        else:
            scalars.append([key, _cell(value)])
    lines = table(["FIELD", "VALUE"], scalars)
    for key, records in record_lists:
        flat = [dict(_flatten(record)) for record in records]
        columns = list(dict.fromkeys(column for record in flat for column in record))
        lines += [f"  {key}:"] + table(
            [column.upper() for column in columns],
            [[_cell(record.get(column)) for column in columns] for record in flat],
            indent="    ",
        )
    return lines
