"""Run commands inside a built image without a container runtime: mount it with podman, chroot into it.

`podman build` works on machines where `podman run` does not (a sandbox that refuses the OCI
runtime's setrlimit or cgroups), so the image is checked by running its own files: ``podman image
mount`` exposes its filesystem, and each command runs in a private mount namespace (``unshare
--mount``) where that filesystem is bound read-only, with a fresh /proc, the host's /dev and /sys,
and a tmpfs on /tmp and /dev/shm, then ``chroot`` into it as the image's user, in its working folder,
with its environment. The namespace takes every one of those mounts with it when its last process
exits, so nothing is left mounted on the host even after a kill; the image itself is unmounted in a
``finally``. A read-only root is stricter than a container's writable layer: what passes here also
runs with ``--read-only`` or a Kubernetes ``readOnlyRootFilesystem``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# Runs as root in the new mount namespace: $1 the image's root, $2 its working folder, $3 uid:gid.
_ENTER = r"""
set -eu
root=$1 workdir=$2 userspec=$3
shift 3
mount --bind "$root" "$root"
mount -o remount,bind,ro "$root"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
mount --bind /sys "$root/sys"
mount -o remount,bind,ro "$root/sys"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
exec chroot --userspec="$userspec" "$root" /bin/sh -c 'cd "$1" && shift && exec "$@"' sh "$workdir" "$@"
"""


class ImageCheckError(RuntimeError):
    """A podman call failed, or the image lacks what a check needs."""


@dataclass(frozen=True)
class Podman:
    """The podman command with its global options (a private storage root, a storage driver)."""

    options: tuple[str, ...] = ()

    @classmethod
    def from_environment(cls) -> Podman:
        """The options scripts/build-images.sh reads: ``XPUSPEC_PODMAN_OPTS``."""
        return cls(tuple(shlex.split(os.environ.get("XPUSPEC_PODMAN_OPTS", ""))))

    def run(self, *arguments: str, timeout: float = 120) -> str:
        podman = shutil.which("podman")
        if podman is None:
            raise ImageCheckError("podman is not installed")
        result = subprocess.run(
            [podman, *self.options, *arguments], capture_output=True, text=True, timeout=timeout
        )
        if result.returncode != 0:
            raise ImageCheckError(f"podman {' '.join(arguments)} failed: {result.stderr.strip()}")
        return result.stdout


@dataclass(frozen=True)
class ImageConfig:
    """What a container of the image would run as: its user, environment, folder and entrypoint."""

    user: str
    env: dict[str, str]
    workdir: str
    entrypoint: tuple[str, ...]

    @classmethod
    def inspect(cls, podman: Podman, image: str) -> ImageConfig:
        config = json.loads(podman.run("image", "inspect", "--format", "{{json .Config}}", image))
        env = dict(item.split("=", 1) for item in config.get("Env") or [])
        return cls(
            user=config.get("User") or "root",
            env=env,
            workdir=config.get("WorkingDir") or "/",
            entrypoint=tuple(config.get("Entrypoint") or ()),
        )


@dataclass(frozen=True)
class Account:
    """A user of the image, from the image's own /etc/passwd."""

    uid: int
    gid: int
    home: str

    @classmethod
    def lookup(cls, root: Path, user: str) -> Account:
        name, _, group = user.partition(":")
        for line in (root / "etc" / "passwd").read_text().splitlines():
            fields = line.split(":")
            if len(fields) >= 6 and (fields[0] == name or fields[2] == name):
                gid = int(group) if group.isdigit() else int(fields[3])
                return cls(uid=int(fields[2]), gid=gid, home=fields[5])
        raise ImageCheckError(f"the image's /etc/passwd has no user {name!r}")


@dataclass(frozen=True)
class Chroot:
    """Commands run inside a mounted image as its configured user (see the module docstring)."""

    root: Path
    config: ImageConfig
    account: Account

    def command(self, argv: Sequence[str]) -> list[str]:
        unshare = shutil.which("unshare")
        if unshare is None:
            raise ImageCheckError("unshare (util-linux) is not installed")
        userspec = f"{self.account.uid}:{self.account.gid}"
        return [unshare, "--mount", "--propagation", "private", "sh", "-c", _ENTER, "sh"] + [
            str(self.root),
            self.config.workdir,
            userspec,
            *argv,
        ]

    def environment(self) -> dict[str, str]:
        """The image's environment only: nothing of the host's (its PATH, pip or Python settings) leaks in."""
        return {**self.config.env, "HOME": self.account.home}

    def run(self, argv: Sequence[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(argv), env=self.environment(), capture_output=True, text=True, timeout=timeout
        )

    def start(self, argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
        """Start ``argv`` in the background, its output to ``log``; the caller stops it."""
        with open(log, "wb") as output:
            return subprocess.Popen(
                self.command(argv), env=self.environment(), stdout=output, stderr=subprocess.STDOUT
            )


@contextmanager
def mounted_image(podman: Podman, image: str) -> Iterator[Chroot]:
    """The image's filesystem, mounted by podman for the block's duration, as a :class:`Chroot`."""
    root = Path(podman.run("image", "mount", image).strip())
    try:
        config = ImageConfig.inspect(podman, image)
        yield Chroot(root, config, Account.lookup(root, config.user))
    finally:
        podman.run("image", "unmount", image)
