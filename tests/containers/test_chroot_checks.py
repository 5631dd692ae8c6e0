"""The parts of the image checks that need no image: the contents scan, the account lookup, the
chroot command, and the reason the image tests give when they cannot run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.containers import test_images
from tests.containers.chroot import Account, Chroot, ImageCheckError, ImageConfig
from tests.containers.chroot_checks import entrypoint_bundle, forbidden_contents

SITE = "opt/venv/lib/python3.11/site-packages"


def _tree(root: Path, *paths: str) -> Path:
    for path in paths:
        (root / path).mkdir(parents=True, exist_ok=True)
    return root


def test_a_runtime_tree_has_nothing_forbidden(tmp_path: Path) -> None:
    root = _tree(
        tmp_path, f"{SITE}/openvino", f"{SITE}/xpuspec", f"{SITE}/numpy-2.4.6.dist-info", "opt/xpuspec/bundle"
    )
    assert forbidden_contents(root) == []


@pytest.mark.parametrize(
    "path",
    [
        f"{SITE}/torch",
        f"{SITE}/torch-2.13.0.dist-info",
        f"{SITE}/_pytest",
        f"{SITE}/hypothesis-6.100.0.dist-info",
        f"{SITE}/research",
        "usr/lib/python3/dist-packages/scipy",
        "opt/xpuspec/tests",
        "opt/research",
    ],
)
def test_the_conversion_stack_test_tools_and_research_code_are_found(tmp_path: Path, path: str) -> None:
    root = _tree(tmp_path, f"{SITE}/openvino", path)
    assert forbidden_contents(root) == ["/" + path]


def test_the_images_user_comes_from_its_own_passwd(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\nxpuspec:x:10001:999::/home/xpuspec:/usr/sbin/nologin\n"
    )
    assert Account.lookup(tmp_path, "xpuspec") == Account(10001, 999, "/home/xpuspec")
    assert Account.lookup(tmp_path, "10001:44") == Account(10001, 44, "/home/xpuspec")
    with pytest.raises(ImageCheckError, match="nobody"):
        Account.lookup(tmp_path, "nobody")


@pytest.mark.skipif(shutil.which("unshare") is None, reason="unshare (util-linux) is not installed")
def test_the_chroot_command_enters_a_private_namespace_as_the_images_user(tmp_path: Path) -> None:
    config = ImageConfig(
        user="xpuspec",
        env={"PATH": "/opt/venv/bin:/usr/bin"},
        workdir="/opt/xpuspec",
        entrypoint=("xpuspec", "serve", "--bundle", "/opt/xpuspec/bundle", "--port", "8000"),
    )
    chroot = Chroot(tmp_path, config, Account(10001, 999, "/home/xpuspec"))
    command = chroot.command(["xpuspec", "devices"])
    assert command[1:4] == ["--mount", "--propagation", "private"]
    assert command[-5:] == [str(tmp_path), "/opt/xpuspec", "10001:999", "xpuspec", "devices"]
    assert chroot.environment() == {"PATH": "/opt/venv/bin:/usr/bin", "HOME": "/home/xpuspec"}
    assert entrypoint_bundle(chroot) == "/opt/xpuspec/bundle"


def test_without_podman_the_image_tests_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(test_images.os, "geteuid", lambda: 0)
    monkeypatch.setattr(
        test_images.shutil, "which", lambda tool: None if tool == "podman" else f"/usr/bin/{tool}"
    )
    monkeypatch.setenv(
        "XPUSPEC_CONTAINER_TOOLS_MISSING", "apt-get install podman debootstrap failed: E: no net"
    )
    assert test_images.missing_prerequisite() == (
        "podman is not installed: apt-get install podman debootstrap failed: E: no net"
    )
    monkeypatch.setattr(test_images.os, "geteuid", lambda: 1000)
    assert "root" in (test_images.missing_prerequisite() or "")
