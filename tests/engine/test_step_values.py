"""``LLMEngine.step`` composes the values its phases return: no phase writes an output list of the
engine's, a request's failure comes back as an output while the batch goes on, and a step that
fails midway still reports what it produced before the failure."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.faults import EXACT, FaultyRunner
from xpuspec import Pipeline, SamplingParams
from xpuspec.engine import engine as engine_module
from xpuspec.engine.engine import EngineConfig, LLMEngine

ENGINE_PACKAGE = Path(engine_module.__file__).parent
WRITES = {"append", "extend", "insert", "update", "setdefault"}
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def _rooted_at_engine(node: ast.expr) -> bool:
    """Whether ``node`` is an attribute of the engine: ``engine.x...`` or ``self.engine.x...``."""
    while isinstance(node, ast.Attribute):
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id == "engine":
            return True
        if isinstance(owner, ast.Attribute) and owner.attr == "engine":
            return isinstance(owner.value, ast.Name) and owner.value.id == "self"
        node = owner
    return False


def engine_list_writes(source: str) -> list[str]:
    """The places in ``source`` that name ``step_outputs`` or add to a list held by the engine."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "step_outputs":
            found.append(f"line {node.lineno}: step_outputs")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in WRITES and _rooted_at_engine(node.func.value):
                found.append(f"line {node.lineno}: {ast.unparse(node.func)}")
        elif isinstance(node, ast.AugAssign) and _rooted_at_engine(node.target):
            if not isinstance(node.value, ast.Constant):  # counters (num_engine_failures += 1) are fine
                found.append(f"line {node.lineno}: {ast.unparse(node.target)} +=")
    return found


def test_the_check_finds_a_phase_writing_the_engines_outputs():
    """The control: the writes the step used to rely on are found."""
    assert engine_list_writes("engine.step_outputs.append(output)")
    assert engine_list_writes("self.engine.outputs.extend(outputs)")
    assert engine_list_writes("engine.outputs += failed")
    assert not engine_list_writes("outputs.append(engine.fail(sequence, message))")


@pytest.mark.parametrize("module", sorted(path.name for path in ENGINE_PACKAGE.glob("*.py")))
def test_no_engine_module_writes_an_output_list_of_the_engine(module):
    assert engine_list_writes((ENGINE_PACKAGE / module).read_text(encoding="utf-8")) == []


def test_the_engine_keeps_no_step_outputs():
    engine = Pipeline("demo", drafter="none", properties=EXACT).engine
    assert not hasattr(engine, "step_outputs")


@pytest.fixture(scope="module")
def pipe() -> Pipeline:
    return Pipeline("demo", drafter="draft", properties=EXACT)


def test_a_failing_request_comes_back_as_an_output_while_the_others_continue(pipe, monkeypatch):
    engine = pipe.engine
    prompts = ["def add(a, b):", "class Stack:", "import os"]
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{index}", pipe.encode(prompt), GREEDY)
    engine.step()  # the prefills
    accept = engine.verifier.accept

    def failing_for_r1(sequence, rows, proposal):
        if sequence.request_id == "r1":
            raise ValueError("injected sampling failure")
        return accept(sequence, rows, proposal)

    monkeypatch.setattr(engine.verifier, "accept", failing_for_r1)
    outputs = {output.request_id: output for output in engine.step()}
    monkeypatch.undo()
    assert outputs["r1"].finish_reason == "error" and "injected sampling failure" in outputs["r1"].error
    assert all(outputs[rid].new_token_ids and not outputs[rid].finished for rid in ("r0", "r2"))
    assert engine.num_engine_failures == 0 and "r1" not in engine.sequences
    while engine.has_unfinished():
        engine.step()


def test_a_step_failing_in_a_burst_reports_the_tokens_it_produced_before():
    """A burst's second pass fails: the step's outputs still hold the tokens of its verification and
    of the pass before, then each request's "error"."""
    config = EngineConfig(max_model_len=256, decode_burst_steps=8, decode_burst_seconds=60.0)
    pipe = Pipeline("demo", drafter="none", properties=EXACT, engine_config=config)
    engine: LLMEngine = pipe.engine
    target = FaultyRunner(engine.target)
    engine.target = target
    engine.add_request("r", pipe.encode("def add(a, b):"), GREEDY)
    engine.step()  # the prefill: inference 1
    engine.step()  # the second token, alone (a first burst waits for it): inference 2
    target.fail_at = target.num_inferences + 3  # the step's pass, a burst pass, then the failure
    outputs = engine.step()
    engine.target = target._runner
    assert [output.request_id for output in outputs] == ["r", "r"]
    assert len(outputs[0].new_token_ids) == 2 and not outputs[0].finished
    assert outputs[1].finish_reason == "error" and engine.num_engine_failures == 1
    assert not engine.has_unfinished()


def test_the_burst_interrupt_is_an_argument_of_the_step():
    config = EngineConfig(max_model_len=256, decode_burst_steps=8, decode_burst_seconds=60.0)
    pipe = Pipeline("demo", drafter="none", properties=EXACT, engine_config=config)
    engine = pipe.engine
    engine.add_request("r", pipe.encode("def add(a, b):"), GREEDY)
    engine.step()
    engine.step()
    asked = []
    interrupted = engine.step(interrupt=lambda: asked.append(True) or True)
    assert asked and [len(output.new_token_ids) for output in interrupted] == [1]
    assert len(engine.step()[0].new_token_ids) > 1  # the next step, without one, bursts
