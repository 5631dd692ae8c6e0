"""Shared, expensive fixtures of the prepare tests: tiny checkpoints and their OpenVINO exports.

Exports take seconds each, so every architecture is exported once per session and the bundles
are prepared from those IR folders (the export step is then skipped, compression is not).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.tiny_checkpoints import ARCHITECTURES, make_tiny_checkpoint

# Tiny layers are 64/128 wide: the default int4 group size 128 does not divide them.
TINY_GROUP_SIZE = 32

BundleFactory = Callable[..., Path]


@pytest.fixture(scope="session")
def checkpoint_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("prepare_checkpoints")


@pytest.fixture(scope="session")
def target_checkpoints(checkpoint_root: Path) -> dict[str, Path]:
    return {arch: make_tiny_checkpoint(checkpoint_root / f"target-{arch}", arch) for arch in ARCHITECTURES}


@pytest.fixture(scope="session")
def draft_checkpoint(checkpoint_root: Path) -> Path:
    """A smaller llama with another seed and the same tokenizer: pairs with every target."""
    return make_tiny_checkpoint(checkpoint_root / "draft", "llama", hidden_size=32, seed=1)


@pytest.fixture(scope="session")
def mismatched_draft_checkpoint(checkpoint_root: Path) -> Path:
    """Trained on other text, so its vocabulary differs from the targets'."""
    return make_tiny_checkpoint(
        checkpoint_root / "draft-xyz", "llama", hidden_size=32, seed=2, corpus_suffix="xyz"
    )


def _export(checkpoint: Path, out_dir: Path) -> Path:
    from xpuspec.prepare.export import ModelSource, export_to_openvino

    out_dir.mkdir()
    export_to_openvino(ModelSource.resolve(str(checkpoint), "target"), out_dir, "target")
    return out_dir


@pytest.fixture(scope="session")
def target_irs(target_checkpoints: dict[str, Path], checkpoint_root: Path) -> dict[str, Path]:
    return {arch: _export(path, checkpoint_root / f"ir-{arch}") for arch, path in target_checkpoints.items()}


@pytest.fixture(scope="session")
def draft_ir(draft_checkpoint: Path, checkpoint_root: Path) -> Path:
    return _export(draft_checkpoint, checkpoint_root / "ir-draft")


@pytest.fixture(scope="session")
def bundle_factory(
    target_irs: dict[str, Path], draft_ir: Path, tmp_path_factory: pytest.TempPathFactory
) -> BundleFactory:
    """``make(arch, weights)`` -> a target+draft bundle, built once per (arch, weights)."""
    from xpuspec.prepare import PrepareConfig, prepare_bundle

    root = tmp_path_factory.mktemp("prepare_bundles")
    built: dict[tuple[str, str], Path] = {}

    def make(arch: str, weights: str) -> Path:
        key = (arch, weights)
        if key not in built:
            built[key] = prepare_bundle(
                PrepareConfig(
                    target=str(target_irs[arch]),
                    draft=str(draft_ir),
                    output=root / f"{arch}-{weights}",
                    weights=weights,  # type: ignore[arg-type]
                    group_size=TINY_GROUP_SIZE if weights == "int4" else None,
                )
            )
        return built[key]

    return make


@pytest.fixture
def bundle_copy(bundle_factory: BundleFactory, tmp_path: Path) -> Path:
    """A private copy of one bundle, free to tamper with."""
    return Path(shutil.copytree(bundle_factory("llama", "int8"), tmp_path / "bundle"))
