"""What the commands print: defaults in every help, no RST markup, the placement as a table,
devices that can run the bundle (and why another cannot), host memory for the CPU."""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import pytest

from xpuspec.cli import build_parser, main
from xpuspec.models.bundle import MANIFEST_NAME
from xpuspec.models.demo import demo_bundle_path


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_option_shows_its_default() -> None:
    missing = []
    for command, subparser in _subparsers().items():
        formatter = subparser._get_formatter()
        for action in subparser._actions:
            if (
                not action.option_strings
                or isinstance(action.default, bool)
                or action.help == argparse.SUPPRESS
            ):
                continue
            if action.default is argparse.SUPPRESS or action.nargs == 0 or action.required:
                continue  # --help, flags, store_const pairs such as --sym/--asym
            text = formatter._expand_help(action) if action.help else ""
            if "default" not in text.lower():
                missing.append(f"{command} {action.option_strings[-1]}: {text!r}")
    assert missing == []


@pytest.mark.parametrize("command", ["generate", "bench", "prepare", "inspect", "devices", "plan", "bundle"])
def test_help_is_plain_text(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert "``" not in text and not re.search(r":\w+:`", text)  # no RST literals or roles
    assert "(default 1024;" in text if command == "generate" else True  # the reply cap, said once


def test_every_bundle_option_names_the_default_model() -> None:
    """With no bundle, every command uses SmolLM2 and its draft: no help may say the demo pair."""
    for command, subparser in _subparsers().items():
        formatter = subparser._get_formatter()
        for action in subparser._actions:
            if action.dest == "bundle":
                text = formatter._expand_help(action)
                assert "SmolLM2" in text and "default: the embedded demo" not in text, (command, text)


def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["generate", "hi", "--max-tokens", "many"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("xpuspec: error: argument --max-tokens: invalid int value")


def test_inspect_prints_the_placement_as_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = Path(shutil.copytree(demo_bundle_path(), tmp_path / "bundle"))
    manifest = json.loads((bundle / MANIFEST_NAME).read_text())
    manifest["placement"] = {
        "target_device": "CPU",
        "draft_device": "CPU",
        "drafter": "draft",
        "num_draft_tokens": 4,
        "compile_properties": {"target": {"NUM_STREAMS": 1}},  # a key another component may record
        "measured": {
            "tokens_per_s": 812.5,
            "candidates": [
                {"drafter": "none", "num_draft_tokens": 0, "tokens_per_s": 700.0, "error": None},
                {"drafter": "draft", "num_draft_tokens": 4, "tokens_per_s": 812.5, "error": None},
            ],
        },
    }
    (bundle / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert main(["inspect", str(bundle)]) == 0
    out = capsys.readouterr().out
    assert "{'" not in out  # no raw Python dict
    rows = {
        line.split()[0]: line.split()[1:]
        for line in out.splitlines()
        if line.startswith("  ") and line.split()
    }
    assert rows["drafter"] == ["draft"] and rows["num_draft_tokens"] == ["4"]
    assert rows["compile_properties.target.NUM_STREAMS"] == ["1"]
    assert rows["measured.tokens_per_s"] == ["812.5"]
    candidates = out.split("measured.candidates:")[1].splitlines()
    assert candidates[1].split() == ["DRAFTER", "NUM_DRAFT_TOKENS", "TOKENS_PER_S", "ERROR"]
    assert candidates[3].split() == ["draft", "4", "812.5", "-"]


def test_devices_lists_executors_that_can_run_the_bundle(capsys: pytest.CaptureFixture[str]) -> None:
    from xpuspec_plugins.pytorch import TorchPlugin

    assert main(["devices"]) == 0
    out = capsys.readouterr().out.splitlines()
    cpu = next(line for line in out if line.startswith("CPU "))
    assert re.search(r"\d+\.\d GiB", cpu)  # the machine's memory, not "-"
    if TorchPlugin().is_present(None):  # type: ignore[arg-type]
        # the demo bundle keeps no Hugging Face checkpoint: TORCH is not a row, a reason instead
        assert not any(line.split()[:2] == ["TORCH", "yes"] for line in out)
        assert any(
            line.startswith("TORCH is present but cannot run") and "checkpoint" in line for line in out
        )
    assert main(["devices", "--json"]) == 0
    by_device = {d["device"]: d for d in json.loads(capsys.readouterr().out)["devices"]}
    assert by_device["CPU"]["runs_bundle"] is True and by_device["CPU"]["memory_bytes"] > 0
    if "TORCH" in by_device and by_device["TORCH"]["present"]:
        assert by_device["TORCH"]["runs_bundle"] is False and by_device["TORCH"]["cannot_run"]


def test_devices_with_a_bundle_torch_can_run(pair_bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The pair bundle's checkpoints are still on disk: TORCH can run it and is listed."""
    pytest.importorskip("torch")
    assert main(["devices", "--bundle", str(pair_bundle)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.split()[:2] == ["TORCH", "yes"] for line in out)


def test_a_bug_keeps_its_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An exception type no user mistake raises is a bug in xpuspec: shown in full, exit 1."""
    import xpuspec.cli.inspect as inspect_command

    def broken(args: argparse.Namespace) -> int:
        raise KeyError("target")  # injected: a bug, not a user mistake

    monkeypatch.setattr(inspect_command, "run_inspect", broken)
    assert main(["inspect"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "KeyError" in err
    assert err.splitlines()[-1] == "xpuspec: error: KeyError: 'target' (a bug in xpuspec; please report it)"


def test_the_api_docs_state_the_sampling_defaults_of_the_api_and_of_generate() -> None:
    """docs/api.md's SamplingParams table: the `SamplingParams()` and `xpuspec generate` columns are
    the defaults the code has."""
    from xpuspec.sample.sampling_params import SamplingParams

    def cells(text: str) -> list[str]:  # "1.0, 0 (`--top-p`, `--top-k`)" -> ["1.0", "0"]
        text = re.sub(r"\(.*?\)", "", text).replace("*", "")
        return [value.strip().strip("`") for value in text.split(",") if value.strip()]

    docs = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text(encoding="utf-8")
    section = docs.split("## `SamplingParams`", 1)[1].split("\n## ", 1)[0]
    generate = {action.dest: action.default for action in _subparsers()["generate"]._actions}
    api = SamplingParams()
    checked = []
    for row in re.findall(r"^\| (`\w+`.*) \|$", section, re.M):
        names_text, api_text, generate_text = row.split(" | ")[:3]
        names = [name.strip().strip("`") for name in names_text.split(",")]
        for name, documented in zip(names, cells(api_text), strict=True):
            assert documented == repr(getattr(api, name)).replace("'", '"'), (name, documented)
        if name in generate:
            for name, documented in zip(names, cells(generate_text), strict=True):
                assert documented == repr(generate[name]).replace("'", '"').replace("0.0", "0"), name
                checked.append(name)
    assert {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "ignore_eos"} <= set(checked)


def test_bench_says_no_plots_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from xpuspec.bench.plots import write_category_plot, write_plots
    from xpuspec.cli.bench import wrote_line

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the runtime install: no `bench` extra
    files = [tmp_path / "report.json", tmp_path / "report.md"]
    line = wrote_line(files, write_plots({"settings": {"mode": "latency"}}, tmp_path))
    assert line == (
        f"wrote {files[0]}, {files[1]}; no plots: matplotlib is not installed (pip install 'xpuspec[bench]')"
    )
    assert "no plots: matplotlib is not installed" in wrote_line(
        files, {"c": write_category_plot({}, tmp_path)}
    )
    assert not list(tmp_path.glob("*.png"))
    assert wrote_line(files, {"a": {"file": "a.png"}, "b": {"reason": "no data"}}).endswith(
        "and 1 plot (a.png)"
    )


def test_a_draft_that_is_the_target_is_warned_of(pair_bundle: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from xpuspec.models.bundle import DRAFT_IS_TARGET, ModelBundle

    assert not ModelBundle.open(pair_bundle).draft_is_target
    target = pair_bundle.parent / "target"  # the pair's Hugging Face checkpoint
    out = tmp_path / "self-pair"
    assert main(["prepare", str(target), "--draft", str(target), "-o", str(out), "--weights", "fp16"]) == 0
    assert ModelBundle.open(out).draft_is_target
    assert f"xpuspec: warning: {DRAFT_IS_TARGET}" in capsys.readouterr().err
    assert main(["generate", "hi", "--bundle", str(out), "--max-tokens", "2"]) == 0
    assert f"xpuspec: warning: {DRAFT_IS_TARGET}" in capsys.readouterr().err
    assert main(["generate", "hi", "--bundle", str(pair_bundle), "--max-tokens", "2"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_boolean_sampling_flag_takes_true_or_false_and_refuses_anything_else(capsys) -> None:
    from xpuspec.cli.generate import sampling_fields

    generate = _subparsers()["generate"]
    args = generate.parse_args(["hi", "--dry-include-prompt", "false"])
    assert sampling_fields(args) == {"dry_include_prompt": False}
    assert "dry_include_prompt" not in sampling_fields(generate.parse_args(["hi"]))
    with pytest.raises(SystemExit):
        generate.parse_args(["hi", "--dry-include-prompt", "maybe"])
    assert "expected true or false, got 'maybe'" in capsys.readouterr().err
