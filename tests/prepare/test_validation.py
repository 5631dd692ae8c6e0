"""`xpuspec prepare` refuses what it can know up front before exporting anything, writes only bundles
the engine runs, prints each stage once with the conversion libraries' output in a log, and gives the
bundle ordinary permissions."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support.tiny_checkpoints import make_tiny_checkpoint
from xpuspec.cli import main
from xpuspec.models.bundle import MANIFEST_NAME
from xpuspec.prepare import PrepareConfig, prepare_bundle
from xpuspec.prepare.config import PrepareError


@pytest.fixture(scope="module")
def odd_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A draft 48 wide: int4 groups of 32 do not divide its layers (the target's 64 and 128 do)."""
    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("odd") / "draft", "llama", hidden_size=48, intermediate_size=96, seed=3
    )


@pytest.fixture(scope="module")
def wide_vocab_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A draft whose config declares 600 token ids, more than the targets' (the check reads config.json,
    so the weights need not match: prepare must refuse before loading them)."""
    draft = make_tiny_checkpoint(tmp_path_factory.mktemp("wide") / "draft", "llama", hidden_size=32, seed=4)
    config = json.loads((draft / "config.json").read_text())
    config["vocab_size"] = 600
    (draft / "config.json").write_text(json.dumps(config))
    return draft


@pytest.mark.slow
def test_int4_group_size_of_the_draft_is_checked_before_any_export(
    draft_checkpoint: Path, odd_draft: Path, tmp_path: Path
) -> None:
    lines: list[str] = []
    config = PrepareConfig(
        target=str(draft_checkpoint),
        draft=str(odd_draft),
        output=tmp_path / "b",
        weights="int4",
        group_size=32,
    )
    with pytest.raises(PrepareError) as raised:
        prepare_bundle(config, progress=lines.append)
    message = str(raised.value)
    assert "does not divide the draft's layer inputs (hidden_size 48" in message
    assert "--group-size 16" in message and "--group-size-fallback" in message
    assert not any("exporting" in line for line in lines)  # refused before the target's export
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_group_size_fallback_adjust_prepares_what_error_refuses(draft_ir: Path, tmp_path: Path) -> None:
    """The 32-wide draft IR with groups of 64: refused up front, prepared with NNCF's fallback."""
    with pytest.raises(PrepareError, match="--group-size 32"):
        prepare_bundle(
            PrepareConfig(target=str(draft_ir), output=tmp_path / "a", weights="int4", group_size=64)
        )
    output = prepare_bundle(
        PrepareConfig(
            target=str(draft_ir),
            output=tmp_path / "b",
            weights="int4",
            group_size=64,
            group_size_fallback="adjust",
        )
    )
    compression = json.loads((output / MANIFEST_NAME).read_text())["models"]["target"]["compression"]
    assert compression["group_size_fallback"] == "adjust"
    assert compression["int4_constants"] > 0  # adjusted to groups of 32, still int4
    # ordinary permissions: the umask's, not mkdtemp's 0700
    mask = os.umask(0o022)
    os.umask(mask)
    for path in [output, *output.rglob("*")]:
        expected = (0o777 if path.is_dir() else 0o666) & ~mask
        assert stat.S_IMODE(path.stat().st_mode) == expected, path


def test_group_size_fallback_needs_int4(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--group-size-fallback applies to int4"):
        PrepareConfig(target="model", output=tmp_path / "b", weights="int8", group_size_fallback="adjust")
    with pytest.raises(ValueError, match="takes one of"):
        PrepareConfig(target="model", output=tmp_path / "b", weights="int4", group_size_fallback="maybe")


@pytest.mark.slow
@pytest.mark.parametrize("force_pair", [False, True], ids=["checked", "forced"])
def test_a_draft_vocabulary_larger_than_the_target_is_refused(
    draft_checkpoint: Path, wide_vocab_draft: Path, tmp_path: Path, force_pair: bool
) -> None:
    config = PrepareConfig(
        target=str(draft_checkpoint),
        draft=str(wide_vocab_draft),
        output=tmp_path / "b",
        weights="fp16",
        force_pair=force_pair,
    )
    with pytest.raises(
        PrepareError, match=r"draft's vocabulary \(600\) is larger than the target's \(\d+\)"
    ) as raised:
        prepare_bundle(config)
    assert "not even with --force-pair" in str(raised.value)  # forcing is not suggested: it cannot help
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_each_stage_prints_once_and_library_output_goes_to_the_log(
    draft_checkpoint: Path, tmp_path: Path
) -> None:
    """The real command: torch, transformers and optimum write to the process's stdout and stderr."""
    from tests.test_cli_errors import XPUSPEC, _env

    log = tmp_path / "prepare.log"
    argv = [
        "prepare",
        str(draft_checkpoint),
        "-o",
        str(tmp_path / "b"),
        "--weights",
        "fp16",
        "--log",
        str(log),
    ]
    result = subprocess.run(
        XPUSPEC + argv,
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(Path(os.environ["XPUSPEC_CACHE"])),
    )
    assert result.returncode == 0, result.stderr
    stages = result.stderr.splitlines()
    assert [line.split(" ", 1)[0] for line in stages] == [f"[{i}/5]" for i in range(1, 6)], result.stderr
    assert all(line.endswith("s") for line in stages)  # each finished line carries its time, once
    assert "Warning" not in result.stderr and "Warning" not in result.stdout
    # Libraries' own output is kept, in the log (torch's tracing warnings are silenced at the source).
    assert "Convert Huggingface Fast tokenizer pipeline" in log.read_text()
    assert result.stdout.startswith("bundle written to")


@pytest.mark.slow
def test_the_command_refuses_from_config_json_before_loading_the_toolchain(
    odd_draft: Path, draft_checkpoint: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log"
    argv = ["prepare", str(draft_checkpoint), "--draft", str(odd_draft), "-o", str(tmp_path / "b")]
    argv += ["--weights", "int4", "--group-size", "32", "--log", str(log)]
    assert main(argv) == 2  # the options do not fit the models: a usage error
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("xpuspec: error: int4 group size 32"), err
    assert not log.exists()  # refused before the conversion stage (and its log) began


def test_auto_drafter_falls_back_to_ngrams_when_the_draft_cannot_draft(
    pair_bundle: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A draft vocabulary larger than the target's (injected in the manifest): n-grams, with a warning."""
    from xpuspec import Pipeline, SamplingParams

    bundle = Path(shutil.copytree(pair_bundle, tmp_path / "bundle"))
    manifest = json.loads((bundle / MANIFEST_NAME).read_text())
    manifest["models"]["draft"]["vocab_size"] = manifest["models"]["target"]["vocab_size"] + 100
    (bundle / MANIFEST_NAME).write_text(json.dumps(manifest))
    with caplog.at_level("WARNING", logger="xpuspec.api.pipeline"):
        pipe = Pipeline(bundle, drafter="auto")
    assert pipe.drafter == "ngram"
    assert any("drafting with n-grams instead" in record.getMessage() for record in caplog.records)
    result = pipe.generate("def add(a, b):", SamplingParams(max_tokens=4, temperature=0.0))[0]
    assert len(result.token_ids) == 4
