"""The one engine driver: only ``api/engine_driver.py`` steps an engine, nothing outside the API layer
reaches into ``pipeline.engine``, and inline runs share the engine without losing each other's steps."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import F32
from xpuspec import Pipeline, SamplingParams
from xpuspec.api.engine_driver import EngineDriver

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "xpuspec" / "api" / "engine_driver.py"
# `pipe.engine`, `self.pipeline.engine`, `pipelines[name].engine`: an attribute `engine` of a pipeline.
PIPELINE_ENGINE = re.compile(r"\b\w*pipe\w*(?:\[[^\]]*\])?\.engine\b")
# `engine.step(`, `self._engine.step(`: stepping an engine (an optimizer's step is another thing).
ENGINE_STEP = re.compile(r"\b\w*engine\w*\.step\(")


def reaches(pattern: re.Pattern[str], text: str) -> list[int]:
    """The numbers of the lines of ``text`` that ``pattern`` finds."""
    return [number for number, line in enumerate(text.splitlines(), 1) if pattern.search(line)]


def _sources(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (ROOT / folder).rglob("*.py"))


def test_the_scanners_find_what_they_look_for() -> None:
    sample = (
        "lookup = pipe.engine.prompt_lookup\n"
        "engine = self.pipeline.engine\n"
        "pipelines['draft'].engine.abort(rid)\n"
        "row.engine == XPUSPEC\n"
        "from xpuspec.engine.engine import LLMEngine\n"
        "outputs = self._engine.step(interrupt=stop)\n"
        "optimizer.step()\n"
    )
    assert reaches(PIPELINE_ENGINE, sample) == [1, 2, 3]
    assert reaches(ENGINE_STEP, sample) == [6]


def test_nothing_outside_the_api_layer_reaches_into_a_pipelines_engine() -> None:
    found = []
    for path in _sources("xpuspec", "research"):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(("xpuspec/api/", "xpuspec/engine/")):
            continue
        lines = path.read_text().splitlines()
        for number in reaches(PIPELINE_ENGINE, "\n".join(lines)):
            found.append(f"{relative}:{number}: {lines[number - 1].strip()}")
    assert not found, "use the Pipeline's own methods:\n" + "\n".join(found)


def test_only_the_engine_driver_module_steps_an_engine() -> None:
    steppers = {
        path.relative_to(ROOT).as_posix()
        for path in _sources("xpuspec", "research")
        if reaches(ENGINE_STEP, path.read_text())
    }
    assert steppers == {DRIVER.relative_to(ROOT).as_posix()}


@pytest.fixture(scope="module")
def pipe(pair_bundle) -> Pipeline:
    return Pipeline(pair_bundle, drafter="none", properties=F32)


def test_runs_sharing_the_engine_each_get_all_of_their_steps(pipe: Pipeline) -> None:
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    alone = pipe.generate(["def add(a, b):", "import os\n"], params)
    first, second = (pipe.add_request(pipe.encode(p), params) for p in ("def add(a, b):", "import os\n"))
    # Stepping for the first alone also steps the second: its steps wait for the run that asks.
    first_steps = list(pipe.steps([first]))
    second_steps = list(pipe.steps([second]))
    for steps, expected in ((first_steps, alone[0]), (second_steps, alone[1])):
        assert "".join(step.text for step in steps) == expected.text
        assert [t for step in steps for t in step.output.new_token_ids] == expected.token_ids
        assert steps[-1].output.finished and not any(step.output.finished for step in steps[:-1])
        assert [step.time for step in steps] == sorted(step.time for step in steps)


def test_closing_a_run_early_aborts_its_requests(pipe: Pipeline) -> None:
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    request_id = pipe.add_request(pipe.encode("class Point:"), params)
    steps = pipe.steps([request_id])
    next(steps)
    steps.close()
    assert not pipe.driver.has_unfinished()
    assert pipe.block_manager.num_used_blocks == 0


def test_a_driver_without_a_tokenizer_gives_tokens_and_no_text(pipe: Pipeline) -> None:
    driver = EngineDriver(pipe.engine, tokenizer=None)
    driver.add("bare", pipe.encode("def add(a, b):"), SamplingParams(max_tokens=4, ignore_eos=True))
    steps = list(driver.run(["bare"]))
    assert sum(len(step.output.new_token_ids) for step in steps) == 4
    assert all(step.text == "" for step in steps)
