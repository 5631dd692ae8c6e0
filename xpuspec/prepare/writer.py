"""Atomic bundle writing: build in a temp folder beside the output, manifest last, then rename.

An interrupted or failed prepare (exception, Ctrl-C) removes the temp folder, so the output path
holds either the previous bundle or the complete new one, never half of one.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from xpuspec.models.bundle import FORMAT_VERSION, MANIFEST_NAME, hash_tree
from xpuspec.prepare.config import PrepareError
from xpuspec.prepare.default_properties import default_properties_record
from xpuspec.version import __version__

logger = logging.getLogger(__name__)

STAGING_PREFIX = ".xpuspec-staging-"


def check_output_path(output: Path, overwrite: bool) -> None:
    """Refuse early: an existing output without ``overwrite``, or one that is not a bundle."""
    if not output.exists():
        if not output.parent.is_dir():
            raise PrepareError(f"{output}: parent folder {output.parent} does not exist")
        return
    if not overwrite:
        raise PrepareError(f"{output} already exists; pass --overwrite to replace it")
    # --overwrite deletes the folder, so it must be something prepare made (or empty).
    if not output.is_dir() or not ((output / MANIFEST_NAME).is_file() or not any(output.iterdir())):
        raise PrepareError(f"{output} exists and is not an xpuspec bundle; refusing to replace it")


@contextmanager
def staging_folder(output: Path) -> Iterator[Path]:
    """A fresh folder beside ``output``; removed again unless :func:`commit_bundle` moved it."""
    staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{output.name}-", dir=output.parent))
    try:
        yield staging
    finally:
        # Also runs for KeyboardInterrupt: an interrupted prepare leaves nothing behind.
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def write_manifest(
    staging: Path,
    *,
    prepared_for: str,
    toolchain: dict[str, Any],
    models: dict[str, Any],
    tokenizer: dict[str, Any],
    pairing: dict[str, Any],
    eagle3: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Hash every file, then write the manifest (the last file of a complete bundle).

    One header for every source (Hugging Face folder or GGUF file), so bundles differ only in facts.
    """
    manifest = {
        "format_version": FORMAT_VERSION,
        "created_by": f"xpuspec {__version__}",
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "prepared_for": prepared_for,
        "toolchain": toolchain,
        "models": models,
        "tokenizer": tokenizer,
        "pairing": pairing,
        "eagle3": eagle3,  # the EAGLE-3 head (xpuspec.prepare.eagle3), or None
        # What the models compile with when nobody chooses (xpuspec.prepare.default_properties).
        "default_properties": default_properties_record(models),
        "placement": None,
        "files": hash_tree(staging),
    }
    text = json.dumps(manifest, indent=2, sort_keys=False) + "\n"
    (staging / MANIFEST_NAME).write_text(text, encoding="utf-8")
    return manifest


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def give_ordinary_permissions(root: Path) -> None:
    """Folders 0777 and files 0666 less the umask (0755/0644 usually), as if made by ``mkdir``/``open``.

    The staging folder comes from ``mkdtemp`` (0700): renamed as it is, a service account could not
    read the bundle; copied support files would keep whatever mode their source had.
    """
    mask = current_umask()
    for folder, _, files in os.walk(root):
        os.chmod(folder, 0o777 & ~mask)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o666 & ~mask)


def commit_bundle(staging: Path, output: Path, overwrite: bool) -> None:
    """Move the finished staging folder to ``output`` (replacing an old bundle if allowed)."""
    give_ordinary_permissions(staging)
    if output.exists():
        check_output_path(output, overwrite)
        retired = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{output.name}-old-", dir=output.parent))
        retired.rmdir()
        output.rename(retired)
        try:
            staging.rename(output)
        except BaseException:
            retired.rename(output)  # put the old bundle back
            raise
        shutil.rmtree(retired, ignore_errors=True)
    else:
        staging.rename(output)
