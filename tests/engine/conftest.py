"""Fixtures of the engine tests: tiny random checkpoints exported once per session to stateful IR."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.tiny_checkpoints import make_tiny_checkpoint


def export_tiny_ir(work_dir: Path, architecture: str) -> Path:
    """Build a tiny random checkpoint and export it as a stateful optimum-intel IR folder with tokenizer."""
    from optimum.intel import OVModelForCausalLM
    from transformers import AutoTokenizer

    from xpuspec.prepare.export import quiet_tracing

    checkpoint_dir = make_tiny_checkpoint(work_dir / f"{architecture}-checkpoint", architecture)
    ir_dir = work_dir / f"{architecture}-ir"
    with quiet_tracing():
        model = OVModelForCausalLM.from_pretrained(checkpoint_dir, export=True, stateful=True, compile=False)
        model.save_pretrained(ir_dir)
        del model  # its temporary export folder goes now, inside quiet_tracing
    AutoTokenizer.from_pretrained(checkpoint_dir).save_pretrained(ir_dir)
    return ir_dir


@pytest.fixture(scope="session")
def tiny_ir_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``tiny_ir_dir(architecture)``: the IR folder of a tiny model, exported on first use."""
    exported: dict[str, Path] = {}

    def get(architecture: str) -> Path:
        if architecture not in exported:
            exported[architecture] = export_tiny_ir(tmp_path_factory.mktemp("tiny-ir"), architecture)
        return exported[architecture]

    return get
