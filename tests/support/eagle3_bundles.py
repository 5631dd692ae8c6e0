"""A tiny target with a random EAGLE-3 head, prepared into a bundle (needs torch: the test extra)."""

from __future__ import annotations

import json
from pathlib import Path

from research.training.eagle3_torch import random_head, save_head
from tests.support.tiny_checkpoints import make_tiny_checkpoint


def tiny_eagle3_bundle(work: Path, taps: tuple[int, ...]) -> Path:
    """A 4-layer tiny Llama target with a random head tapping ``taps``, prepared (fp16) under ``work``."""
    from xpuspec.prepare import PrepareConfig, prepare_bundle

    target = make_tiny_checkpoint(work / "target", "llama", hidden_size=64, num_layers=4, seed=0)
    config = json.loads((target / "config.json").read_text())
    module, head_config = random_head(config, 96, seed=5, aux_layer_ids=taps)
    head = save_head(module, head_config, work / "head")
    prepared = PrepareConfig(target=str(target), eagle3=str(head), output=work / "b", weights="fp16")
    return prepare_bundle(prepared)
