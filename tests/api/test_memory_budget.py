"""How a KV budget is split between the target and a draft model, and the line `serve` logs."""

from __future__ import annotations

from xpuspec.api.memory_budget import MIB, KVCacheSize, describe, kv_width, target_share

TARGET = {"num_layers": 30, "num_kv_heads": 3, "head_dim": 64}
DRAFT = {"num_layers": 3, "num_kv_heads": 2, "head_dim": 64}


def test_the_split_follows_each_models_kv_width() -> None:
    assert kv_width(TARGET) == 5760 and kv_width({"num_layers": 2}) is None
    assert target_share(TARGET, DRAFT) == 5760 / (5760 + 384)
    assert target_share(TARGET, None) == 1.0
    assert target_share(TARGET, {"architecture": "unknown"}) == 1.0


def test_the_line_names_the_budget_and_its_parts() -> None:
    caches = [KVCacheSize("target", 100, 32, 150 * MIB), KVCacheSize("draft", 100, 32, 10 * MIB)]
    line = describe(192 * MIB, caches, 64)
    assert line == (
        "memory budget 192 MiB: KV cache 160 MiB = target 150 MiB (3200 tokens) + draft 10 MiB "
        "(3200 tokens), the prefix cache within it; compiled-shape cache 64 entries per model"
    )
    assert describe(None, caches[:1], None).startswith("no memory budget: KV cache 150 MiB = target")
