"""Opening a bundle checks it: sizes and mtimes on every load, hashes on the first load of a bundle
(remembered per user), so a damaged bundle is refused before any model is compiled."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

import xpuspec.models.bundle as model_bundle
from xpuspec.models.bundle import CACHE_ENV, BundleError, ModelBundle
from xpuspec.models.demo import demo_bundle_path
from xpuspec.models.resolve import resolve_bundle


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every file hashed from here on (the real hash runs; the list only records the calls)."""
    calls: list[Path] = []
    real = model_bundle.sha256_file

    def counting(path: Path) -> str:
        calls.append(Path(path))
        return real(path)

    monkeypatch.setattr(model_bundle, "sha256_file", counting)
    return calls


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(path))
    return path


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return Path(shutil.copytree(demo_bundle_path(), tmp_path / "bundle"))


def test_first_load_hashes_every_file_later_loads_only_stat(
    bundle: Path, cache: Path, hashed: list[Path]
) -> None:
    files = json.loads((bundle / "xpuspec.json").read_text())["files"]
    ModelBundle.open(bundle)
    assert len(hashed) == len(files)
    assert len(list((cache / "verified").glob("*.json"))) == 1
    hashed.clear()
    ModelBundle.open(bundle)
    assert hashed == []
    # a placement written by `plan --write` changes the manifest, not the files: still no re-hash
    manifest = json.loads((bundle / "xpuspec.json").read_text())
    manifest["placement"] = {"target_device": "CPU", "draft_device": "CPU", "drafter": "draft"}
    (bundle / "xpuspec.json").write_text(json.dumps(manifest))
    ModelBundle.open(bundle)
    assert hashed == []


def test_a_file_rewritten_after_verification_is_hashed_again(
    bundle: Path, cache: Path, hashed: list[Path]
) -> None:
    ModelBundle.open(bundle)
    weights = bundle / "draft" / "openvino_model.bin"
    data = bytearray(weights.read_bytes())
    data[100] ^= 0xFF  # same size: only the changed mtime gives it away before hashing
    weights.write_bytes(bytes(data))
    hashed.clear()
    with pytest.raises(BundleError, match="changed: draft/openvino_model.bin") as raised:
        ModelBundle.open(bundle)
    assert hashed  # the check hashed again rather than trusting the stamp
    assert "\n" not in str(raised.value) and "xpuspec inspect" in str(raised.value)


def test_missing_and_extra_files_are_refused_without_hashing(
    bundle: Path, cache: Path, hashed: list[Path]
) -> None:
    (bundle / "target" / "notes.txt").write_text("not in the manifest")
    (bundle / "draft" / "tokenizer.json").unlink()
    with pytest.raises(BundleError) as raised:
        ModelBundle.open(bundle)
    message = str(raised.value)
    assert "missing: draft/tokenizer.json" in message
    assert "extra (not in the manifest): target/notes.txt" in message
    assert hashed == []


def test_opening_without_checks_reads_only_the_manifest(
    bundle: Path, cache: Path, hashed: list[Path]
) -> None:
    (bundle / "target" / "openvino_model.bin").write_bytes(b"truncated")
    opened = ModelBundle.open(bundle, verify=False)  # `xpuspec inspect` reports on damage itself
    assert not opened.verify().ok
    with pytest.raises(BundleError, match="changed: target/openvino_model.bin"):
        ModelBundle.open(bundle, verify=True)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_bundle_and_cache_still_open(bundle: Path, tmp_path: Path, monkeypatch, hashed) -> None:
    read_only_cache = tmp_path / "ro-cache"
    read_only_cache.mkdir()
    monkeypatch.setenv(CACHE_ENV, str(read_only_cache / "xpuspec"))
    for path in [read_only_cache, bundle, *bundle.rglob("*")]:
        path.chmod(stat.S_IMODE(path.stat().st_mode) & ~0o222)
    try:
        ModelBundle.open(bundle)
        ModelBundle.open(bundle)  # nothing could be remembered: hashed each time, still opens
        assert len(hashed) == 2 * len(ModelBundle.open(bundle, verify=False).manifest["files"])
    finally:
        for path in [read_only_cache, bundle, *bundle.rglob("*")]:
            path.chmod(stat.S_IMODE(path.stat().st_mode) | 0o200)


def test_an_unwritable_cache_only_costs_hashing(bundle: Path, tmp_path: Path, monkeypatch, hashed) -> None:
    """Even as root: a cache path below a regular file can never be created."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "cache"))
    ModelBundle.open(bundle)
    ModelBundle.open(bundle)
    files = len(ModelBundle.open(bundle, verify=False).manifest["files"])
    assert len(hashed) == 2 * files


def test_the_embedded_demo_pair_opens_checked(cache: Path) -> None:
    bundle = resolve_bundle("demo")
    assert bundle.target.vocab_size == 4096
    assert list((cache / "verified").glob("*.json"))  # remembered in the user's cache, not beside it
    assert not any(name.startswith(".") for name in os.listdir(demo_bundle_path()))
