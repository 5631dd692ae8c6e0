"""Edge deployment: one verified tar.gz with the model bundle, xpuspec, its pinned runtime and launchers.

`xpuspec bundle` writes it (:func:`build_edge_archive`), `xpuspec verify` and the archive's own
``verify_edge.py`` check it (:func:`verify_path`), and its ``run.sh`` / ``run.ps1`` install and serve it.
The builder needs ``packaging`` (present wherever pip is), which an edge install does not have:
it is imported only when used, so `xpuspec verify` and `xpuspec serve` work without it.
"""

from __future__ import annotations

from typing import Any

from xpuspec.edge.verify_edge import (
    EdgeArchiveError,
    EdgeReport,
    verify_archive,
    verify_directory,
    verify_path,
)

_BUILDER_NAMES = ("EdgeConfig", "build_edge_archive", "write_edge_archive")

__all__ = [
    "EdgeArchiveError",
    "EdgeConfig",
    "EdgeReport",
    "build_edge_archive",
    "verify_archive",
    "verify_directory",
    "verify_path",
    "write_edge_archive",
]


def __getattr__(name: str) -> Any:
    if name in _BUILDER_NAMES:
        from xpuspec.edge import archive

        return getattr(archive, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
