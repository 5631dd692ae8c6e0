"""The engine's phases see it through ``xpuspec.engine.view``: the view declares exactly what they use
of the engine (the rest comes to them as arguments), it stays small, and a built ``LLMEngine`` has
every name it declares (the Protocol holds structurally)."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from tests.support.faults import EXACT
from xpuspec import Pipeline
from xpuspec.engine import view
from xpuspec.engine.engine import LLMEngine

ENGINE_PACKAGE = Path(view.__file__).parent
# The modules that take the engine as ``engine: EngineView``.
PHASE_MODULES = ["bursts", "drafting", "overlap", "strategy", "verification"]
# Recovery and calibration take their arguments only.
ARGUMENT_ONLY_MODULES = ["calibration", "recovery"]
MAX_VIEW_MEMBERS = 12


def members(protocol: type) -> set[str]:
    """The names a Protocol declares: its annotated attributes, properties and methods."""
    declared = set(typing.get_type_hints(protocol))  # resolves them too: every annotation is a real type
    for name, value in vars(protocol).items():
        if not name.startswith("_") and (callable(value) or isinstance(value, property)):
            declared.add(name)
    return declared


def engine_names_used(module: str) -> set[str]:
    """The attributes ``module`` reads or calls on the engine (``engine.x`` or ``self.engine.x``)."""
    tree = ast.parse((ENGINE_PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    used = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id == "engine") or (
            isinstance(owner, ast.Attribute)
            and owner.attr == "engine"
            and isinstance(owner.value, ast.Name)
            and owner.value.id == "self"
        ):
            used.add(node.attr)
    return used


def test_the_view_declares_exactly_what_the_phases_use():
    used = set().union(*(engine_names_used(module) for module in PHASE_MODULES))
    declared = members(view.EngineView)
    assert used - declared == set(), "used by a phase but not declared in EngineView"
    assert declared - used == set(), "declared in EngineView but used by no phase"


def test_the_view_stays_small():
    assert len(members(view.EngineView)) <= MAX_VIEW_MEMBERS


def test_recovery_and_calibration_take_arguments_not_the_engine():
    for module in ARGUMENT_ONLY_MODULES:
        source = (ENGINE_PACKAGE / f"{module}.py").read_text(encoding="utf-8")
        assert "EngineView" not in source, module
        assert engine_names_used(module) <= {
            "block_manager",
            "clock",
            "config",
            "cost_model",
            "proposer",
            "target",
        }


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return Pipeline("demo", drafter="draft", properties=EXACT).engine


def test_the_engine_has_every_name_the_view_declares(engine):
    assert {name for name in members(view.EngineView) if not hasattr(engine, name)} == set()
