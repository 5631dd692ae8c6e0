"""Every command's common mistakes through the real `xpuspec` process: one line on stderr, no traceback,
the documented exit code (2: the command line or its input was wrong, 1: the work failed).

Also: a closed stdout pipe ends quietly, `--debug` brings the traceback back, and a damaged bundle is
refused by `generate` and by the Python API.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from xpuspec.api.errors import EXIT_FAILED, EXIT_USAGE
from xpuspec.models.bundle import MANIFEST_NAME, BundleError, ModelBundle
from xpuspec.models.demo import demo_bundle_path

REPO = Path(__file__).resolve().parents[1]
_SCRIPT = Path(sys.executable).parent / "xpuspec"
XPUSPEC = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "xpuspec.cli"]
TIMEOUT_S = 300


def _env(cache: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "XPUSPEC_DEBUG"}
    # This checkout first, in the child process too (the venv may hold another editable install).
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["XPUSPEC_CACHE"] = str(cache)
    env.update(extra)
    return env


def run_command(
    argv: list[str], cache: Path, *, program: list[str] | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        (program or XPUSPEC) + argv,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=cache.parent / "cwd",
        env=_env(cache, **env),
    )


# What `generate` says before a failure can come: it is loading the model, how it reads the prompt.
PROGRESS_PREFIX = "xpuspec generate: "


def assert_one_line_error(
    result: subprocess.CompletedProcess[str], code: int, needle: str, prefix: str = "xpuspec: error: "
) -> None:
    """One error line, last; before it at most `generate`'s own progress lines (never for an argument
    that the manifest alone can refuse: those fail before the loading line)."""
    lines = result.stderr.splitlines()
    context = f"argv {result.args}\nstderr:\n{result.stderr}"
    assert result.returncode == code, context
    assert "Traceback" not in result.stderr, context
    assert lines and lines[-1].startswith(prefix), context
    assert all(line.startswith(PROGRESS_PREFIX) for line in lines[:-1]), context
    assert needle.lower() in lines[-1].lower(), context


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli_errors")
    (root / "cwd").mkdir()  # the commands' working folder: relative paths in MISTAKES resolve here
    return root


@pytest.fixture(scope="module")
def cache(work: Path) -> Path:
    """The verified-state cache of this process (tests/conftest.py sets it), shared with the commands."""
    path = Path(os.environ["XPUSPEC_CACHE"])
    (path.parent / "cwd").mkdir(exist_ok=True)
    return path


def _copy_demo(destination: Path) -> Path:
    return Path(shutil.copytree(demo_bundle_path(), destination))


@pytest.fixture(scope="module")
def no_chat_bundle(work: Path) -> Path:
    """The demo pair without a chat template (the manifest is not hashed, so it still verifies)."""
    root = _copy_demo(work / "no-chat")
    manifest = json.loads((root / MANIFEST_NAME).read_text())
    manifest["tokenizer"]["chat_template"] = None
    (root / MANIFEST_NAME).write_text(json.dumps(manifest))
    ModelBundle.open(root, verify=True)
    return root


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


CORRUPTIONS = {
    "flipped-target-byte": (
        lambda root: _flip_byte(root / "target" / "openvino_model.bin"),
        "changed: target",
    ),
    "deleted-draft-tokenizer": (
        lambda root: (root / "draft" / "openvino_tokenizer.xml").unlink(),
        "missing: draft/openvino_tokenizer.xml",
    ),
    "truncated-bin": (
        lambda root: _truncate(root / "target" / "openvino_model.bin"),
        "changed: target/openvino_model.bin",
    ),
}


@pytest.fixture(scope="module", params=sorted(CORRUPTIONS))
def corrupt_bundle(request: pytest.FixtureRequest, work: Path, cache: Path) -> tuple[Path, str]:
    """A copy of the demo pair, loaded once (so its verified state is remembered), then damaged."""
    tamper, expected = CORRUPTIONS[request.param]
    root = _copy_demo(work / f"corrupt-{request.param}")
    ModelBundle.open(root)  # first load: hashes every file and remembers the verified state
    tamper(root)
    return root, expected


GENERATE_DEMO = ["generate", "--bundle", "demo"]  # small and quick: the mistakes do not depend on the model
# (argv, exit code, a word of the message); BUNDLE stands for the fixture path given by `bundle`.
MISTAKES = {
    "max-tokens-over-context": ([*GENERATE_DEMO, "hi", "--max-tokens", "100000"], EXIT_USAGE, "--max-tokens"),
    "prompt-over-context": ([*GENERATE_DEMO, "word " * 600], EXIT_USAGE, "context of"),
    "property-not-key-value": ([*GENERATE_DEMO, "hi", "--property", "FOO"], EXIT_USAGE, "KEY=VALUE"),
    "unknown-property": (
        [*GENERATE_DEMO, "hi", "--property", "FOO=bar"],
        EXIT_USAGE,
        "Unsupported property FOO",
    ),
    "bad-property-value": (
        [*GENERATE_DEMO, "hi", "--property", "KV_CACHE_PRECISION=i64"],
        EXIT_USAGE,
        "Wrong value i64 for property key KV_CACHE_PRECISION",
    ),
    "unknown-device": ([*GENERATE_DEMO, "hi", "--target-device", "XPU"], EXIT_USAGE, "not present"),
    "bad-choice": ([*GENERATE_DEMO, "hi", "--drafter", "fast"], EXIT_USAGE, "invalid choice"),
    "generate-missing-bundle": (["generate", "hi", "--bundle", "no/such/bundle"], EXIT_USAGE, "no such"),
    "bench-not-a-bundle": (["bench", "--bundle", "notabundle", "--quick"], EXIT_USAGE, "no such bundle"),
    "inspect-missing-path": (["inspect", "no/such/bundle"], EXIT_USAGE, "no such bundle"),
    "plan-missing-path": (["plan", "no/such/bundle"], EXIT_USAGE, "no such bundle"),
    "plan-unknown-device": (["plan", "demo", "--devices", "XPU"], EXIT_USAGE, "not present"),
    "plan-bad-property": (["plan", "demo", "--property", "FOO"], EXIT_USAGE, "KEY=VALUE"),
    "devices-missing-bundle": (["devices", "--bundle", "no/such/bundle"], EXIT_USAGE, "no such bundle"),
    "prepare-missing-checkpoint": (["prepare", "./no-such-checkpoint", "-o", "out"], EXIT_USAGE, "no such"),
    "prepare-a-bundle": (
        ["prepare", str(demo_bundle_path()), "-o", "out"],
        EXIT_USAGE,
        "already an xpuspec bundle",
    ),
    "bundle-missing-bundle": (["bundle", "no/such/bundle", "-o", "edge.tar.gz"], EXIT_USAGE, "no such"),
    "verify-missing-archive": (["verify", "no-such-edge.tar.gz"], EXIT_USAGE, "no-such-edge.tar.gz"),
    # waitress would take 99999 modulo 65536 and listen on 34463
    "serve-port-out-of-range": (["serve", "--bundle", "demo", "--port", "99999"], EXIT_USAGE, "0-65535"),
    "serve-bad-host": (
        ["serve", "--bundle", "demo", "--host", "999.1.1.1", "--port", "0"],
        EXIT_USAGE,
        "--host",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_common_mistakes_are_one_line(case: str, cache: Path) -> None:
    argv, code, needle = MISTAKES[case]
    assert_one_line_error(run_command(argv, cache), code, needle)


@pytest.mark.slow
def test_hetero_with_an_unloadable_gpu_plugin_is_one_line(cache: Path) -> None:
    import openvino as ov

    if "GPU" in ov.Core().available_devices:
        pytest.skip("this machine has a GPU: HETERO:GPU,CPU runs here")
    # Without an Intel GPU runtime the GPU plugin cannot load (libOpenCL.so.1): an environment problem.
    result = run_command([*GENERATE_DEMO, "hi", "--target-device", "HETERO:GPU,CPU"], cache)
    assert_one_line_error(result, EXIT_FAILED, "GPU")


@pytest.mark.slow
def test_non_bundle_folders_are_one_line(work: Path, cache: Path) -> None:
    folder = work / "not-a-bundle"
    folder.mkdir(exist_ok=True)
    (folder / "notes.txt").write_text("no manifest here")
    for argv in (["generate", "hi", "--bundle", str(folder)], ["inspect", str(folder)]):
        assert_one_line_error(run_command(argv, cache), EXIT_USAGE, "not an xpuspec bundle")


@pytest.mark.slow
def test_chat_without_a_template_is_one_line(no_chat_bundle: Path, cache: Path) -> None:
    result = run_command(["generate", "--chat", "hi", "--bundle", str(no_chat_bundle)], cache)
    assert_one_line_error(result, EXIT_USAGE, "no chat template")
    sample = [sys.executable, str(REPO / "samples" / "stream_chat.py")]
    result = run_command(["hi", str(no_chat_bundle)], cache, program=sample)
    assert_one_line_error(result, 1, "no chat template", prefix="stream_chat.py: error: ")


@pytest.mark.slow
def test_existing_edge_archive_needs_overwrite(work: Path, cache: Path) -> None:
    archive = cache.parent / "cwd" / "existing.tar.gz"
    archive.write_bytes(b"an older archive")
    result = run_command(["bundle", "-o", str(archive)], cache)
    assert_one_line_error(result, EXIT_USAGE, "--overwrite")
    assert archive.read_bytes() == b"an older archive"


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv", [["inspect", "demo"], ["devices", "--json", "--bundle", "demo"], ["--help"]], ids=" ".join
)
def test_a_closed_stdout_pipe_ends_quietly(argv: list[str], cache: Path) -> None:
    process = subprocess.Popen(
        XPUSPEC + argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(cache),
        cwd=cache.parent / "cwd",
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before the command writes (`xpuspec inspect | head -0`)
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=TIMEOUT_S) == 0, stderr
    assert stderr == ""


@pytest.mark.slow
def test_debug_shows_the_traceback(cache: Path) -> None:
    argv = ["generate", "hi", "--bundle", "no/such/bundle"]
    for result in (run_command(["--debug", *argv], cache), run_command(argv, cache, XPUSPEC_DEBUG="1")):
        assert result.returncode == EXIT_USAGE
        assert "Traceback" in result.stderr
        assert result.stderr.splitlines()[-1].startswith("xpuspec: error: ")


@pytest.mark.slow
def test_generate_refuses_a_damaged_bundle(corrupt_bundle: tuple[Path, str], cache: Path) -> None:
    root, expected = corrupt_bundle
    result = run_command(["generate", "hi", "--bundle", str(root), "--max-tokens", "4"], cache)
    assert_one_line_error(result, EXIT_USAGE, "damaged")
    assert expected in result.stderr


def test_the_python_api_refuses_a_damaged_bundle(corrupt_bundle: tuple[Path, str]) -> None:
    from xpuspec import Pipeline

    root, expected = corrupt_bundle
    with pytest.raises(BundleError, match="damaged") as raised:
        ModelBundle.open(root)
    assert expected in str(raised.value)
    with pytest.raises(BundleError, match="damaged"):
        Pipeline(root)


@pytest.mark.slow
def test_serve_refuses_a_damaged_bundle(corrupt_bundle: tuple[Path, str], cache: Path) -> None:
    import socket

    with socket.socket() as probe:  # a free port; serve binds it before loading the bundle
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    root, expected = corrupt_bundle
    result = run_command(["serve", "--bundle", str(root), "--port", str(port)], cache)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "damaged" in lines[0] and expected in lines[0], result.stderr
    assert "ready" not in result.stdout


def test_openvino_messages_lose_their_frames_and_check_conditions() -> None:
    # What the AVX2-only CPU plugin says to a bf16 KV cache (OpenVINO 2026.4): the user needs the last part.
    from xpuspec.api.errors import describe_error

    error = RuntimeError(
        "Exception from src/inference/src/cpp/core.cpp:117:\n"
        "Exception from src/inference/src/dev/plugin.cpp:54:\n"
        "Check 'all_of(ov::element::f32, key_cache_type, value_cache_type)' failed at "
        "/home/jenkins/b/build/dldt/src/plugins/intel_cpu/cross-compiled/AVX2/executor_pa.cpp:2938:\n"
        "expect kvcache type f32, current: bf16 , bf16\n"
    )
    assert describe_error(error) == ("OpenVINO: expect kvcache type f32, current: bf16 , bf16", EXIT_FAILED)


def test_every_command_module_registers_its_subcommands_in_order() -> None:
    from xpuspec.cli import COMMANDS, build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    assert list(action.choices) == [
        "prepare", "inspect", "generate", "devices", "plan", "quality", "serve", "bench", "bundle", "verify",
        "cluster",
    ]  # fmt: skip
    assert all(module.__name__.startswith("xpuspec.cli.") for module in COMMANDS)


def test_a_subcommand_that_cannot_import_fails_loudly(tmp_path: Path) -> None:
    """A broken import in a subcommand's module stops `xpuspec` with its traceback: the subcommand
    never just goes missing from the list."""
    code = (
        "import importlib.abc, sys\n"
        "class Broken(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'xpuspec.bench.suite':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Broken())\n"
        "from xpuspec.cli import main\n"
        "sys.exit(main(['--help']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=_env(tmp_path / "cache"),
    )
    assert result.returncode != 0, result.stdout
    assert "ModuleNotFoundError" in result.stderr and "xpuspec.bench.suite" in result.stderr, result.stderr
    assert "usage:" not in result.stdout  # no help printed without the subcommand
