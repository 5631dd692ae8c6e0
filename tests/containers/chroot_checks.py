"""The checks of a built xpuspec image, run inside it through a chroot (see tests/containers/chroot.py).

    python -m tests.containers.chroot_checks xpuspec:cpu     (root; scripts/build-images.sh --check)

Each check raises :class:`ImageCheckError` naming what is wrong, or returns what it saw:
the version, the devices, a demo generation (token for token what this checkout's xpuspec generates
from the same bundle files), a chat completion from `xpuspec serve` through the official ``openai``
client, and the image's contents (no conversion stack, test tools or research code).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.containers.chroot import Chroot, ImageCheckError, Podman, mounted_image

PROMPT = "def add(a, b):"
MAX_TOKENS = 24
SERVE_READY_TIMEOUT_S = 240
SERVE_STOP_TIMEOUT_S = 150  # the server drains in-flight requests for up to 120 s
# Distributions and top-level packages the runtime image must not carry: the conversion stack, the
# test and lint tools (pyproject's `test` extra), and the repository's own non-package folders.
FORBIDDEN = frozenset(
    {
        "torch",
        "torchvision",
        "transformers",
        "optimum",
        "optimum_intel",
        "nncf",
        "pytest",
        "_pytest",
        "hypothesis",
        "scipy",
        "ruff",
        "schemathesis",
        "matplotlib",
        "importlinter",
        "import_linter",
        "research",
        "tests",
    }
)


def _checked(result: subprocess.CompletedProcess[str], what: str) -> str:
    if result.returncode != 0:
        raise ImageCheckError(f"{what} exited {result.returncode} in the image:\n{result.stderr[-3000:]}")
    return result.stdout


def entrypoint_bundle(chroot: Chroot) -> str:
    """The bundle folder the image serves: the entrypoint's ``--bundle`` value."""
    arguments = list(chroot.config.entrypoint)
    if "--bundle" not in arguments[:-1]:
        raise ImageCheckError(f"the entrypoint names no --bundle: {arguments}")
    return arguments[arguments.index("--bundle") + 1]


def check_version(chroot: Chroot) -> tuple[str, str]:
    """(the version the image reports, how it was asked); it must be the archive's edge.json version."""
    expected = json.loads((chroot.root / "opt/xpuspec/edge.json").read_text())["xpuspec_version"]
    result = chroot.run(["xpuspec", "--version"])
    how = "xpuspec --version"
    if result.returncode == 2 and "--version" in result.stderr:  # a CLI without the option yet
        how = "python -c 'import xpuspec; print(xpuspec.__version__)'"
        result = chroot.run(["python", "-c", "import xpuspec; print(xpuspec.__version__)"])
    reported = _checked(result, how).strip()
    if expected not in reported.split():
        raise ImageCheckError(f"{how} printed {reported!r}; the archive holds xpuspec {expected}")
    return reported, how


def check_devices(chroot: Chroot) -> list[str]:
    """The present devices `xpuspec devices --json` lists for the image's bundle; CPU must run it."""
    output = _checked(
        chroot.run(["xpuspec", "devices", "--json", "--bundle", entrypoint_bundle(chroot)]), "xpuspec devices"
    )
    devices = json.loads(output)["devices"]
    if not any(d["device"] == "CPU" and d["present"] and d["runs_bundle"] for d in devices):
        raise ImageCheckError(f"xpuspec devices lists no CPU that runs the bundle: {output[:2000]}")
    return [d["device"] for d in devices if d["present"]]


def _generate_arguments(bundle: str) -> list[str]:
    return ["generate", "--bundle", bundle, "--raw", "--json", "--max-tokens", str(MAX_TOKENS), PROMPT]


def check_generate(chroot: Chroot) -> str:
    """A greedy generation with the demo pair the package ships (``--bundle demo``), in the image,
    equal token for token to this checkout's on the same files."""
    inside = json.loads(_checked(chroot.run(["xpuspec", *_generate_arguments("demo")]), "xpuspec generate"))
    here_command = [sys.executable, "-m", "xpuspec.cli", *_generate_arguments("demo")]
    here = json.loads(
        _checked(subprocess.run(here_command, capture_output=True, text=True, timeout=300), "generate here")
    )
    if not inside["token_ids"] or inside["token_ids"] != here["token_ids"]:
        raise ImageCheckError(
            f"the image generated {inside['token_ids']} ({inside['text']!r}); this checkout generates "
            f"{here['token_ids']} ({here['text']!r}) from the same bundle"
        )
    return inside["text"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_healthy(server: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + SERVE_READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise ImageCheckError(f"xpuspec serve exited {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass  # not listening yet, or 503 while the model loads
        time.sleep(0.5)
    raise ImageCheckError(
        f"xpuspec serve was not healthy after {SERVE_READY_TIMEOUT_S} s:\n{log.read_text()[-3000:]}"
    )


@dataclass(frozen=True)
class ServedChat:
    """What the served image answered, and how its server ended."""

    model: str
    content: str
    finish_reason: str
    completion_tokens: int
    exit_code: int


def check_serve(chroot: Chroot, log: Path) -> ServedChat:
    """The image's entrypoint on a loopback port (appended arguments, as `docker run IMAGE ARGS` would);
    a chat completion through the openai client; then SIGTERM, after which the server must exit 0."""
    try:
        from openai import OpenAI
    except ImportError as error:  # a runtime-only install: the client comes with the test extra
        raise ImageCheckError("the served check needs the openai client: scripts/install.sh --dev") from error

    port = _free_port()
    server = chroot.start([*chroot.config.entrypoint, "--host", "127.0.0.1", "--port", str(port)], log)
    try:
        _wait_healthy(server, f"http://127.0.0.1:{port}/health", log)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
        model = client.models.list().data[0].id
        completion = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=MAX_TOKENS,
            temperature=0.0,
        )
        server.send_signal(signal.SIGTERM)
        exit_code = server.wait(timeout=SERVE_STOP_TIMEOUT_S)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    choice = completion.choices[0]
    chat = ServedChat(
        model=model,
        content=choice.message.content or "",
        finish_reason=choice.finish_reason,
        completion_tokens=completion.usage.completion_tokens if completion.usage else 0,
        exit_code=exit_code,
    )
    if not chat.content or chat.completion_tokens <= 0 or chat.exit_code != 0:
        raise ImageCheckError(f"the served chat completion is not right: {chat}\n{log.read_text()[-3000:]}")
    return chat


def forbidden_contents(root: Path) -> list[str]:
    """Paths in the image of anything in FORBIDDEN: installed packages, their metadata, loose folders."""
    found: list[str] = []
    package_folders = [
        *root.glob("opt/venv/lib/python3*/site-packages"),
        *root.glob("usr/lib/python3*/*-packages"),
    ]
    package_folders += [*root.glob("usr/local/lib/python3*/site-packages")]
    for folder in package_folders:
        for entry in folder.iterdir():
            name = entry.name.split("-", 1)[0] if entry.name.endswith(".dist-info") else entry.name
            if name.lower().replace(".py", "") in FORBIDDEN:
                found.append("/" + str(entry.relative_to(root)))
    for folder in ("opt/xpuspec", "opt"):
        found += ["/" + str(p.relative_to(root)) for p in (root / folder).glob("*") if p.name in FORBIDDEN]
    return sorted(set(found))


def check_contents(root: Path) -> None:
    found = forbidden_contents(root)
    if found:
        raise ImageCheckError(f"the image carries what a runtime image must not: {found}")


def image_size(podman: Podman, image: str) -> int:
    return int(podman.run("image", "inspect", "--format", "{{.Size}}", image).strip())


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.containers.chroot_checks IMAGE", file=sys.stderr)
        return 2
    image, podman = argv[0], Podman.from_environment()
    try:
        with mounted_image(podman, image) as chroot, tempfile.TemporaryDirectory() as scratch:
            check_contents(chroot.root)
            version, how = check_version(chroot)
            print(f"{image}: version {version} ({how})")
            print(f"{image}: present devices {', '.join(check_devices(chroot))}")
            print(f"{image}: generated {check_generate(chroot)!r}")
            chat = check_serve(chroot, Path(scratch) / "serve.log")
            print(f"{image}: served {chat.model!r}, answered {chat.content!r}, exit {chat.exit_code}")
        print(f"{image}: {image_size(podman, image) / 1e6:.0f} MB; no torch, test tools or research code")
    except ImageCheckError as error:
        print(f"{image}: FAILED: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
