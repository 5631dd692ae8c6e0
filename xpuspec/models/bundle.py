"""The model bundle: one folder of OpenVINO IR written by `xpuspec prepare`.

Layout::

    BUNDLE/
      xpuspec.json              the manifest (this module reads and verifies it)
      target/                   stateful OpenVINO IR + HF config files + openvino_(de)tokenizer.xml
      draft/                    the same for the draft model (absent for a target-only bundle)
      eagle3/                   an EAGLE-3 head, config.json + model.safetensors (optional; see
                                xpuspec.prepare.eagle3), described by manifest["eagle3"]

The target folder on its own loads with ``openvino_genai.LLMPipeline``.
Every file except the manifest is listed in ``manifest["files"]`` with its SHA-256,
so a changed, missing or extra file is found by name.

Opening a bundle checks it: every load compares the files' sizes and modification times with the
state last verified, and the first load of a bundle (or of changed files) hashes every file. The
verified state is remembered per user (``XPUSPEC_CACHE`` or ``~/.cache/xpuspec``), keyed by the
bundle's path, so a read-only bundle (the demo pair in site-packages) is hashed once per user too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpuspec.sample.defaults import SamplingDefaults, from_generation_config

logger = logging.getLogger(__name__)

MANIFEST_NAME = "xpuspec.json"
FORMAT_VERSION = 1
_HASH_CHUNK = 1 << 20
CACHE_ENV = "XPUSPEC_CACHE"
_STAMP_VERSION = 1
_ANNOUNCE_HASHING_BYTES = 256 << 20


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

    def summary(self) -> str:
        """The same facts on one line: ``changed: a, b; missing: c``."""
        parts = [
            f"{label}: {', '.join(names)}"
            for label, names in (
                ("changed", self.changed),
                ("missing", self.missing),
                ("extra (not in the manifest)", self.extra),
            )
            if names
        ]
        return "; ".join(parts)


DRAFT_IS_TARGET = (
    "the draft model is the target itself (same weights): every drafted token costs a target pass, so "
    "speculation can only slow generation; prepare with a smaller --draft, or run with --drafter ngram"
)


def cache_dir() -> Path:
    """Per-user cache folder: ``XPUSPEC_CACHE``, else ``$XDG_CACHE_HOME/xpuspec`` or ``~/.cache/xpuspec``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "xpuspec"


class _VerifiedState:
    """What a successful hash check saw: the manifest's file list and each file's size and mtime.

    While both are unchanged the files are taken as verified; any difference means hashing again.
    """

    def __init__(self, root: Path, files: dict[str, str]):
        self.root = root
        self.files_digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
        key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:32]
        self.path = cache_dir() / "verified" / f"{key}.json"

    def current(self, stats: dict[str, list[int]]) -> dict[str, Any]:
        return {
            "version": _STAMP_VERSION,
            "root": str(self.root.resolve()),
            "files_digest": self.files_digest,
            "stats": stats,
        }

    def matches(self, stats: dict[str, list[int]]) -> bool:
        try:
            recorded = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return recorded == self.current(stats)

    def remember(self, stats: dict[str, list[int]]) -> None:
        """Write the stamp atomically; a cache that cannot be written only costs a re-hash next time."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".stamp-")
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                json.dump(self.current(stats), stream)
            os.replace(temporary, self.path)
        except OSError as error:
            logger.debug("cannot remember that %s is verified (%s); hashing on every load", self.root, error)


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


@dataclass(frozen=True)
class Eagle3Info:
    """The bundle's EAGLE-3 head as the manifest describes it (``xpuspec prepare --eagle3``)."""

    path: Path
    facts: dict[str, Any]

    @property
    def tap_layers(self) -> tuple[int, ...]:
        """The target boundaries whose hidden states the head fuses (checked when it was prepared)."""
        return tuple(int(layer) for layer in self.facts.get("tap_layers") or ())

    @property
    def draft_vocab_size(self) -> int:
        return int(self.facts["draft_vocab_size"])

    def config(self) -> Any:
        """The head's :class:`xpuspec.spec_decode.eagle3.config.Eagle3HeadConfig`, read from its folder."""
        from xpuspec.spec_decode.eagle3.config import Eagle3HeadConfig

        return Eagle3HeadConfig.from_folder(self.path)


class ModelBundle:
    """A prepared bundle on disk: its manifest, its models and tokenizer facts."""

    def __init__(self, root: Path, manifest: dict[str, Any]):
        self.root = root
        self.manifest = manifest

    @classmethod
    def open(cls, path: str | Path, *, verify: bool | None = None) -> ModelBundle:
        """Open the bundle folder ``path`` (:func:`xpuspec.models.resolve.resolve_bundle` also takes
        ``None`` for the default model and ``"demo"`` for the embedded demo pair).

        ``verify=None`` (the default) checks every file's presence, size and mtime against the state
        last verified, and hashes every file when they differ or on a bundle's first load;
        ``True`` hashes every file now; ``False`` only reads the manifest (``xpuspec inspect``
        reports on damage itself). A damaged bundle raises ``BundleError`` naming the files.
        """
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
        if verify is None:
            bundle.check()
        elif verify:
            bundle._refuse_if_damaged(bundle.verify())
        return bundle

    def check(self) -> None:
        """Sizes and mtimes against the last verified state; hash everything if they differ."""
        expected: dict[str, str] = self.manifest.get("files", {})
        stats: dict[str, list[int]] = {}
        for path in sorted(self.root.rglob("*")):
            name = path.relative_to(self.root).as_posix()
            if name != MANIFEST_NAME and path.is_file():
                stat = path.stat()
                stats[name] = [stat.st_size, stat.st_mtime_ns]
        self._refuse_if_damaged(
            VerificationReport(
                missing=sorted(n for n in expected if n not in stats),
                extra=sorted(n for n in stats if n not in expected),
            )
        )
        state = _VerifiedState(self.root, expected)
        if state.matches(stats):
            return
        total = sum(size for size, _ in stats.values())
        # A large bundle takes seconds to hash: say why the first load pauses.
        log = logger.info if total >= _ANNOUNCE_HASHING_BYTES else logger.debug
        log(
            "verifying %s: hashing %d files, %.1f GB (first load, or files changed)",
            self.root,
            len(stats),
            total / 1e9,
        )
        self._refuse_if_damaged(self.verify())
        state.remember(stats)

    def _refuse_if_damaged(self, report: VerificationReport) -> None:
        if not report.ok:
            raise BundleError(
                f"{self.root}: the bundle is damaged ({report.summary()}); prepare it again "
                f"(`xpuspec inspect {self.root}` lists every file)"
            )

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
    def draft_is_target(self) -> bool:
        """Whether the draft model is the target itself (the same weights, by the manifest's hashes;
        the graphs' XML differ in names even for one checkpoint exported twice): each draft token then
        costs a target pass, so speculation can only slow generation."""
        draft = self.draft
        if draft is None:
            return False
        files = self.manifest.get("files", {})
        weights = files.get(f"{self.target.facts['path']}/openvino_model.bin")
        return weights is not None and weights == files.get(f"{draft.facts['path']}/openvino_model.bin")

    @property
    def eagle3(self) -> Eagle3Info | None:
        """The EAGLE-3 head, or ``None`` when the bundle has none."""
        facts = self.manifest.get("eagle3")
        if not facts:
            return None
        return Eagle3Info(path=self.root / facts["path"], facts=facts)

    @property
    def translates_tokens(self) -> bool:
        """Whether the draft has a tokenizer of its own, its drafts translated into the target's tokens
        through text (``xpuspec prepare`` records it in the manifest's "pairing")."""
        return self.draft is not None and bool((self.manifest.get("pairing") or {}).get("translate"))

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
    def generation_config(self) -> dict[str, Any]:
        """The target's ``generation_config.json`` (Hugging Face's; ``prepare`` writes one from a GGUF's
        metadata too), or {} when the bundle has none or it does not parse."""
        path = self.target.path / "generation_config.json"
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            logger.debug("no generation config at %s: %s", path, error)
            return {}
        return config if isinstance(config, dict) else {}

    @property
    def sampling_defaults(self) -> SamplingDefaults:
        """What requests get for the sampling fields they leave out (:mod:`xpuspec.sample.defaults`):
        the manifest's ``sampling`` (recommended where the model says nothing: the default model's),
        then the target's generation config, then llama.cpp's defaults."""
        recommended = dict(self.manifest.get("sampling") or {})
        source = str(recommended.pop("source", "the bundle's manifest"))
        return from_generation_config(self.generation_config, recommended, source)

    @property
    def max_context(self) -> int:
        return int(self.target.facts.get("max_position_embeddings", 2048))

    @property
    def placement(self) -> dict[str, Any] | None:
        return self.manifest.get("placement")


def write_manifest_field(bundle_root: Path, key: str, value: Any) -> None:
    """Set one top-level field of the manifest (a plan's "placement", the quality measure's "quality"),
    replacing the file atomically.

    The manifest is not among the hashed files, so `xpuspec inspect` still verifies the bundle.
    The temporary file lives in the bundle folder (``os.replace`` is atomic only within one file
    system) and is removed on failure, so it can never show up as an extra file.
    """
    manifest_path = Path(bundle_root) / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    manifest[key] = value
    handle, temporary = tempfile.mkstemp(dir=manifest_path.parent, prefix=f".{MANIFEST_NAME}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(json.dumps(manifest, indent=2) + "\n")
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, manifest_path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
