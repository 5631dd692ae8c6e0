"""prepare_bundle / `xpuspec prepare`: atomic writes, interrupts, errors, CLI, data-aware int4."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.prepare.conftest import TINY_GROUP_SIZE
from xpuspec.cli import main
from xpuspec.models.bundle import MANIFEST_NAME, ModelBundle
from xpuspec.prepare import PrepareConfig, PrepareError, prepare_bundle
from xpuspec.prepare import pipeline as pipeline_module
from xpuspec.prepare.export import import_conversion_module

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_import_xpuspec_and_the_cli_stay_light() -> None:
    code = (
        "import sys, xpuspec, xpuspec.prepare, xpuspec.cli; xpuspec.cli.build_parser(); "
        "heavy = [m for m in ('torch', 'transformers', 'optimum', 'nncf') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )


def test_broken_conversion_stack_points_to_the_install_script() -> None:
    with pytest.raises(PrepareError, match=r"scripts/install.sh --dev"):
        import_conversion_module("xpuspec_no_such_conversion_module")


def test_missing_local_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PrepareError, match="no such folder"):
        prepare_bundle(PrepareConfig(target=str(tmp_path / "absent"), output=tmp_path / "bundle"))
    assert not (tmp_path / "bundle").exists()


@pytest.mark.slow
def test_target_only_bundle_with_awq(target_irs: dict[str, Path], tmp_path: Path) -> None:
    config = PrepareConfig(
        target=str(target_irs["mistral"]),
        output=tmp_path / "bundle",
        weights="int4",
        sym=True,
        group_size=TINY_GROUP_SIZE,
        ratio=0.5,
        awq=True,
        scale_estimation=True,
        calibration_prompts=("def add(a, b):", "The quick brown fox"),
    )
    lines: list[str] = []
    bundle = ModelBundle.open(prepare_bundle(config, progress=lines.append), verify=True)
    assert bundle.draft is None
    assert bundle.manifest["pairing"]["checked"] is False
    compression = bundle.target.facts["compression"]
    assert (
        compression["mode"],
        compression["ratio"],
        compression["awq"],
        compression["scale_estimation"],
    ) == (
        "int4_sym",
        0.5,
        True,
        True,
    )
    # ratio 0.5: some decoder linears fall back to int8 next to the embedding and head
    assert 0 < compression["int4_constants"] < 14
    assert compression["int4_constants"] + compression["int8_constants"] == 16
    assert lines[0].startswith("[1/5] reading configs") and lines[-1].startswith("[5/5] hashing files")
    assert any(
        line.startswith("[3/5] compressing target (int4 sym g32 r0.5 awq scale-estimation) ... ")
        for line in lines
    )


@pytest.mark.slow
def test_failure_midway_leaves_nothing(
    target_irs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args, **kwargs):
        raise RuntimeError("injected failure after compression")

    monkeypatch.setattr(pipeline_module, "write_openvino_tokenizer", fail)
    with pytest.raises(RuntimeError, match="injected"):
        prepare_bundle(
            PrepareConfig(target=str(target_irs["llama"]), output=tmp_path / "bundle", weights="fp16")
        )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_existing_output_needs_overwrite(target_irs: dict[str, Path], tmp_path: Path) -> None:
    output = tmp_path / "bundle"
    config = PrepareConfig(target=str(target_irs["qwen2"]), output=output, weights="fp16")
    prepare_bundle(config)
    first_created = json.loads((output / MANIFEST_NAME).read_text())["created_at"]
    with pytest.raises(PrepareError, match="already exists; pass --overwrite"):
        prepare_bundle(config)
    # in-process CLI: explicit flags, the NPU preset's symmetric int8, overwrite of the old bundle
    assert (
        main(
            [
                "prepare",
                str(target_irs["qwen2"]),
                "-o",
                str(output),
                "--for",
                "npu",
                "--weights",
                "int8",
                "--overwrite",
            ]
        )
        == 0
    )
    manifest = json.loads((output / MANIFEST_NAME).read_text())
    assert manifest["models"]["target"]["compression"]["mode"] == "int8_sym"
    assert manifest["prepared_for"] == "npu"
    assert manifest["created_at"] >= first_created
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]  # no staging or retired folders left


def test_overwrite_refuses_a_folder_that_is_not_a_bundle(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(PrepareError, match="is not an xpuspec bundle; refusing"):
        prepare_bundle(PrepareConfig(target="model", output=tmp_path, overwrite=True))
    assert (tmp_path / "precious.txt").exists()


def test_cli_reports_invalid_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["prepare", "model", "-o", str(tmp_path / "b"), "--weights", "int8", "--group-size", "64"]) == 2
    )
    assert "apply to int4 weights" in capsys.readouterr().err


@pytest.mark.slow
def test_sigint_during_prepare_leaves_nothing(target_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """The one subprocess test: Ctrl-C while the export runs removes the staging folder."""
    output = tmp_path / "bundle"
    process = subprocess.Popen(
        [sys.executable, "-m", "xpuspec.cli", "prepare", str(target_checkpoints["phi3"]), "-o", str(output)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    seen = []
    for line in process.stderr:
        seen.append(line)
        if line.startswith("[2/5] exporting target"):
            assert any(p.name.startswith(".xpuspec-staging-") for p in tmp_path.iterdir())
            process.send_signal(signal.SIGINT)
            break
    else:
        pytest.fail("prepare ended before the export step:\n" + "".join(seen))
    process.stderr.read()
    assert process.wait(timeout=120) == 130
    assert list(tmp_path.iterdir()) == []


def test_a_swallowed_interrupt_still_stops_at_the_step_boundary() -> None:
    """Ctrl-C caught by library code inside a step: the step's end raises it again."""
    from xpuspec.prepare.progress import StepProgress, interrupt_requested

    steps = StepProgress(total_steps=2, sink=lambda line: None)
    interrupt_requested.set()
    try:
        with pytest.raises(KeyboardInterrupt):
            with steps.step("exporting"):
                try:
                    raise KeyboardInterrupt
                except BaseException:  # what a broad except in an exporter does
                    pass
    finally:
        interrupt_requested.clear()
