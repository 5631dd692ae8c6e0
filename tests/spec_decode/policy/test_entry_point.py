"""The speculation policy has one entry point, ``xpuspec.spec_decode.policy.SpeculationPolicy``: a
contract of ``.importlinter`` forbids every other module of ``xpuspec`` to import the package's
modules (``tests/test_architecture.py`` runs ``lint-imports``), and the contract names them all."""

from __future__ import annotations

import configparser
import pkgutil
from pathlib import Path

import xpuspec
import xpuspec.spec_decode
import xpuspec.spec_decode.policy as policy
from xpuspec.core.sequence import Sequence
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.spec_decode.policy import SpeculationPolicy

ROOT = Path(__file__).resolve().parents[3]
CONTRACT = "importlinter:contract:speculation-policy-one-entry-point"


def _contract() -> configparser.SectionProxy:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter", encoding="utf-8")
    return config[CONTRACT]


def _names(value: str) -> set[str]:
    return {line.strip() for line in value.splitlines() if line.strip()}


def test_the_contract_forbids_every_module_of_the_policy():
    modules = {f"{policy.__name__}.{info.name}" for info in pkgutil.iter_modules(policy.__path__)}
    assert _names(_contract()["forbidden_modules"]) == modules


def test_the_contract_holds_every_other_module_of_xpuspec_to_it():
    top = {f"xpuspec.{info.name}" for info in pkgutil.iter_modules(xpuspec.__path__)}
    spec_decode = {
        f"xpuspec.spec_decode.{info.name}" for info in pkgutil.iter_modules(xpuspec.spec_decode.__path__)
    }
    expected = (top - {"xpuspec.spec_decode"}) | (spec_decode - {policy.__name__})
    assert _names(_contract()["source_modules"]) == expected
    assert _contract()["type"] == "forbidden"


def _decoding(request_id: str, **params: object) -> Sequence:
    sequence = Sequence(request_id, [1, 2, 3], SamplingParams(max_tokens=16, **params))  # type: ignore[arg-type]
    sequence.append_tokens([4])
    return sequence


def test_without_a_drafter_nothing_drafts_and_bursts_always_may_continue():
    speculation = SpeculationPolicy(max_draft_tokens=4, max_model_len=64, has_drafter=False)
    assert speculation.draft_lengths([_decoding("a", num_draft_tokens=3)], 1, set()) == {}
    assert speculation.burst_may_continue([_decoding("a")])
    assert speculation.trees == {} and speculation.lookups == {} and speculation.prompt_lookup is None


def test_the_draft_lengths_are_the_policys_per_sequence_in_order():
    speculation = SpeculationPolicy(max_draft_tokens=4, max_model_len=64, has_drafter=True)
    sequences = [_decoding("fixed", num_draft_tokens=3), _decoding("capped", num_draft_tokens=9)]
    lengths = speculation.draft_lengths(sequences, 2, set())
    assert list(lengths.items()) == [("fixed", 3), ("capped", 4)]  # capped at max_draft_tokens
    # A fixed γ > 0 drafts: a burst stops for it, and counts no step without drafting.
    assert not speculation.burst_may_continue(sequences[:1])
