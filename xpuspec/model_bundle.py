"""The model bundle: one folder of OpenVINO IR written by `xpuspec prepare`.

Layout::

    BUNDLE/
      xpuspec.json              the manifest (this module reads and verifies it)
      target/                   stateful OpenVINO IR + HF config files + openvino_(de)tokenizer.xml
      draft/                    the same for the draft model (absent for a target-only bundle)

The target folder on its own loads with ``openvino_genai.LLMPipeline``.
Every file except the manifest is listed in ``manifest["files"]`` with its SHA-256,
so a changed, missing or extra file is found by name.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MANIFEST_NAME = "xpuspec.json"
DEMO_BUNDLE_NAME = "demo"  # names the embedded demo pair wherever a bundle folder is asked for
FORMAT_VERSION = 1
_HASH_CHUNK = 1 << 20


class BundleError(Exception):
    """A bundle that cannot be used: missing, malformed, or failing verification."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def hash_tree(root: Path) -> dict[str, str]:
    """SHA-256 of every file below ``root`` except the manifest, keyed by POSIX relative path."""
    return {
        path.relative_to(root).as_posix(): sha256_file(path)
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.relative_to(root).as_posix() != MANIFEST_NAME
    }


@dataclass(frozen=True)
class VerificationReport:
    changed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.changed or self.missing or self.extra)

    def describe(self) -> str:
        lines = [f"changed: {name}" for name in self.changed]
        lines += [f"missing: {name}" for name in self.missing]
        lines += [f"extra (not in the manifest): {name}" for name in self.extra]
        return "\n".join(lines)


@dataclass(frozen=True)
class ModelInfo:
    """One model of the bundle as the manifest describes it."""

    role: str  # "target" | "draft"
    path: Path
    facts: dict[str, Any]

    @property
    def vocab_size(self) -> int:
        return int(self.facts["vocab_size"])

    @property
    def architecture(self) -> str:
        return str(self.facts.get("architecture", "unknown"))


class ModelBundle:
    """A prepared bundle on disk: its manifest, its models and tokenizer facts."""

    def __init__(self, root: Path, manifest: dict[str, Any]):
        self.root = root
        self.manifest = manifest

    @classmethod
    def open(cls, path: str | Path | None = None, *, verify: bool = False) -> ModelBundle:
        """Open a bundle folder; ``None`` opens the default model, ``"demo"`` the embedded demo pair.

        The default model (:mod:`xpuspec.default_model`) is converted into the user's cache on first use.
        With ``verify`` every file's hash is checked and a mismatch raises ``BundleError``.
        """
        if path is None:
            from xpuspec.default_model import default_bundle_path

            root = default_bundle_path()
        elif str(path) == DEMO_BUNDLE_NAME and not Path(path).is_dir():
            from xpuspec.demo import demo_bundle_path

            root = demo_bundle_path()
        else:
            root = Path(path).expanduser()
        manifest_path = root / MANIFEST_NAME
        if not root.is_dir():
            raise BundleError(f"{root}: no such bundle folder (make one with `xpuspec prepare`)")
        if not manifest_path.is_file():
            raise BundleError(f"{root}: not an xpuspec bundle ({MANIFEST_NAME} is missing)")
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise BundleError(f"{manifest_path}: not valid JSON ({error})") from error
        version = manifest.get("format_version")
        if version != FORMAT_VERSION:
            raise BundleError(
                f"{manifest_path}: format_version {version!r}, this xpuspec reads {FORMAT_VERSION}; "
                "prepare the bundle again with this version"
            )
        bundle = cls(root, manifest)
        if verify:
            report = bundle.verify()
            if not report.ok:
                raise BundleError(f"{root}: bundle failed verification\n{report.describe()}")
        return bundle

    def verify(self) -> VerificationReport:
        expected: dict[str, str] = self.manifest.get("files", {})
        actual = hash_tree(self.root)
        return VerificationReport(
            changed=sorted(n for n in expected if n in actual and actual[n] != expected[n]),
            missing=sorted(n for n in expected if n not in actual),
            extra=sorted(n for n in actual if n not in expected),
        )

    def model(self, role: str) -> ModelInfo | None:
        facts = self.manifest.get("models", {}).get(role)
        if facts is None:
            return None
        return ModelInfo(role=role, path=self.root / facts["path"], facts=facts)

    @property
    def target(self) -> ModelInfo:
        info = self.model("target")
        if info is None:
            raise BundleError(f"{self.root}: the manifest names no target model")
        return info

    @property
    def draft(self) -> ModelInfo | None:
        return self.model("draft")

    @property
    def tokenizer_facts(self) -> dict[str, Any]:
        return self.manifest.get("tokenizer", {})

    @property
    def eos_token_ids(self) -> list[int]:
        return [int(t) for t in self.tokenizer_facts.get("eos_token_ids", [])]

    @property
    def chat_template(self) -> str | None:
        return self.tokenizer_facts.get("chat_template")

    @property
    def max_context(self) -> int:
        return int(self.target.facts.get("max_position_embeddings", 2048))

    @property
    def placement(self) -> dict[str, Any] | None:
        return self.manifest.get("placement")
