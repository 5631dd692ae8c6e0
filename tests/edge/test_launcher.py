"""End to end: pack the pair bundle with a wheelhouse, install it offline with run.sh and serve it.

Needs the package registry once (the wheelhouse download); the launcher itself runs with pip's
configuration emptied and its index pointed at a closed local port, so it can only use wheels/.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests.edge.archive_tools import extract_what_survives, flip_one_byte, repack, truncate
from xpuspec.cli import main as cli_main
from xpuspec.edge import verify_archive
from xpuspec.edge.archive import EdgeConfig, build_edge_archive

pytestmark = pytest.mark.slow

MODEL = "bundle/target/openvino_model.bin"
INSTALL_AND_LOAD_TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _offline_env(port: int) -> dict[str, str]:
    """This environment minus anything that could let pip or Python find packages outside the archive."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(
        PIP_CONFIG_FILE=os.devnull,  # no machine-wide find-links or extra indexes
        PIP_INDEX_URL="http://127.0.0.1:9/",  # nothing listens there: any index access fails
        XPUSPEC_PYTHON=sys.executable,  # the interpreter the wheelhouse was downloaded for
        XPUSPEC_PORT=str(port),
    )
    return env


def _unpack(archive: Path, destination: Path) -> Path:
    with tarfile.open(archive) as opened:
        opened.extractall(destination, filter="data")
    return destination / "xpuspec-edge"


@pytest.fixture(scope="module")
def archives(pair_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("edge")
    with_wheels = out / "edge-wheels.tar.gz"
    without = out / "edge.tar.gz"
    build_edge_archive(EdgeConfig(output=with_wheels, bundle=pair_bundle, include_wheels=True))
    # A cache-keyed folder name (as the default model's): the archive serves the plain name.
    keyed = out / "tiny-pair-0123456789ab"
    keyed.symlink_to(pair_bundle, target_is_directory=True)
    build_edge_archive(EdgeConfig(output=without, bundle=keyed))
    return {"wheels": with_wheels, "plain": without}


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_archive_contents(archives: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["verify", str(archives["wheels"])]) == 0
    assert "OK" in capsys.readouterr().out
    manifest = verify_archive(archives["wheels"]).manifest
    files = manifest["files"]
    for name in (
        "run.sh",
        "run.ps1",
        "verify_edge.py",
        "requirements.txt",
        "README.md",
        "xpuspec-edge.service",
    ):
        assert name in files
    assert any(n.startswith("dist/xpuspec-") and n.endswith(".whl") for n in files)
    assert "bundle/xpuspec.json" in files and MODEL in files
    wheels = {n.split("/")[1].split("-")[0].lower() for n in files if n.startswith("wheels/")}
    assert {"openvino", "openvino_tokenizers", "numpy", "flask", "waitress", "pydantic"} <= wheels
    conversion = {"torch", "transformers", "optimum", "optimum_intel", "nncf"}
    assert not wheels & conversion
    assert not {r.split("==")[0] for r in manifest["requirements"]} & conversion
    assert manifest["wheelhouse"]["python_version"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    plain = verify_archive(archives["plain"]).manifest
    assert not any(n.startswith("wheels/") for n in plain["files"])
    # The names `xpuspec serve` answers for the same folder: the plain name, then the keyed one.
    assert plain["bundle"] == {"path": "bundle", "name": "tiny-pair", "aliases": ["tiny-pair-0123456789ab"]}
    assert manifest["bundle"] == {"path": "bundle", "name": "bundle", "aliases": []}  # the pair's folder
    # The served bundle ships once, under bundle/: the wheel leaves out the default draft and head it
    # would carry again; the small demo pair stays, so `--bundle demo` works on the box.
    with tarfile.open(archives["plain"]) as opened:
        wheel = next(m for m in opened.getmembers() if m.name.endswith(".whl"))
        with zipfile.ZipFile(io.BytesIO(opened.extractfile(wheel).read())) as wheel_zip:
            for folder in ("xpuspec/models/default_draft/", "xpuspec/models/default_eagle3/"):
                assert not [n for n in wheel_zip.namelist() if n.startswith(folder)]
            assert "xpuspec/edge/verify_edge.py" in wheel_zip.namelist()
            assert "xpuspec/models/demo/bundle/xpuspec.json" in wheel_zip.namelist()


def test_launcher_installs_offline_and_serves(archives: dict[str, Path], tmp_path: Path) -> None:
    folder = _unpack(archives["wheels"], tmp_path)
    port = _free_port()
    log = tmp_path / "run.log"
    with open(log, "w") as log_handle:
        server = subprocess.Popen(
            ["sh", str(folder / "run.sh")],
            env=_offline_env(port),
            stdout=log_handle,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + INSTALL_AND_LOAD_TIMEOUT_S
        health = None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    health = json.loads(response.read())
                    break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(1)
        assert health is not None, f"the server did not come up:\n{log.read_text()[-4000:]}"
        completion = _post(
            f"http://127.0.0.1:{port}/v1/completions",
            {"model": "bundle", "prompt": "hello edge", "max_tokens": 6, "temperature": 0},
        )
        assert completion["choices"][0]["finish_reason"] == "length"
        assert completion["usage"]["completion_tokens"] == 6
        # The chat page ships in the wheel the archive installs.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as response:
            assert b"/chat/chat.js" in response.read()
    finally:
        server.terminate()  # run.sh exec'd into `xpuspec serve`: this is the server's SIGTERM drain
        server.wait(timeout=60)
    output = log.read_text()
    assert "installing offline from wheels/" in output
    # The server ran from the launcher's venv, not from this checkout.
    where = subprocess.run(
        [str(folder / ".venv/bin/python"), "-I", "-c", "import xpuspec; print(xpuspec.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert str(folder / ".venv") in where.stdout


def test_tampered_archive_is_refused(
    archives: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tampered = repack(archives["plain"], tmp_path / "tampered.tar.gz", flip_one_byte(MODEL))
    assert cli_main(["verify", str(tampered)]) == 1
    assert MODEL in capsys.readouterr().err
    folder = _unpack(tampered, tmp_path / "out")
    result = subprocess.run(
        ["sh", str(folder / "run.sh")], env=_offline_env(_free_port()), capture_output=True, text=True
    )
    assert result.returncode == 1
    assert MODEL in result.stderr and "not starting" in result.stderr
    assert not (folder / ".venv").exists()


def test_truncated_archive_is_refused(
    archives: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cut = truncate(archives["plain"], tmp_path / "cut.tar.gz", 0.7)
    assert cli_main(["verify", str(cut)]) == 1
    assert "truncated" in capsys.readouterr().err
    extract_what_survives(cut, tmp_path / "out")
    folder = tmp_path / "out" / "xpuspec-edge"
    assert (folder / "run.sh").is_file()  # the launcher comes first in the archive, so a cut keeps it
    result = subprocess.run(
        ["sh", str(folder / "run.sh")], env=_offline_env(_free_port()), capture_output=True, text=True
    )
    assert result.returncode == 1
    # Where the cut falls (inside the wheel or the bundle) decides which files are named.
    assert "REFUSED" in result.stderr and "not starting" in result.stderr
    assert "missing: " in result.stderr or "changed (sha256 differs)" in result.stderr
    assert not (folder / ".venv").exists()
