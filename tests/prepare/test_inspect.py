"""`xpuspec inspect`: summary, hash verification, tampering named by file, non-bundles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.prepare.conftest import BundleFactory
from xpuspec.cli import main
from xpuspec.models.bundle import MANIFEST_NAME


@pytest.mark.slow
def test_inspect_summarizes_and_verifies(
    bundle_factory: BundleFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", str(bundle_factory("phi3", "int4"))]) == 0
    out = capsys.readouterr().out
    assert "target: Phi3ForCausalLM (phi3)" in out
    assert "draft: LlamaForCausalLM (llama)" in out
    assert "int4_asym group 32 ratio 1.0 (8 int4 + 2 int8 weight constants)" in out
    assert "eos ids [0]" in out
    assert "placement: none" in out
    assert "default properties, target on CPU: compute=f32, kv=u8, dq_group=128, keys=BY_TOKEN" in out
    assert "verified: all" in out


@pytest.mark.slow
def test_inspect_json_prints_the_manifest(
    bundle_factory: BundleFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    root = bundle_factory("llama", "int8")
    capsys.readouterr()  # NNCF prints its statistics when this test is the one that builds the bundle
    assert main(["inspect", "--json", str(root)]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads((root / MANIFEST_NAME).read_text())


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        (
            lambda root: _flip_last_byte(root / "target" / "openvino_model.bin"),
            "changed: target/openvino_model.bin",
        ),
        (
            lambda root: (root / "draft" / "openvino_tokenizer.xml").unlink(),
            "missing: draft/openvino_tokenizer.xml",
        ),
        (
            lambda root: (root / "target" / "notes.txt").write_text("hi"),
            "extra (not in the manifest): target/notes.txt",
        ),
    ],
    ids=["changed-byte", "deleted-file", "extra-file"],
)
def test_inspect_names_the_tampered_file(
    bundle_copy: Path, tamper, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", str(bundle_copy)]) == 0
    capsys.readouterr()
    tamper(bundle_copy)
    assert main(["inspect", str(bundle_copy)]) == 1
    err = capsys.readouterr().err
    assert "verification FAILED" in err
    assert expected in err.splitlines()


def test_inspect_rejects_a_non_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "some.txt").write_text("not a bundle")
    assert main(["inspect", str(tmp_path)]) == 2
    assert "not an xpuspec bundle" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "absent")]) == 2
    assert "no such bundle folder" in capsys.readouterr().err
