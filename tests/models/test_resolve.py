"""xpuspec.models.resolve: the names a served bundle answers, alike for `xpuspec serve` and edge archives."""

from __future__ import annotations

from xpuspec.models.default_model import SMOLLM2
from xpuspec.models.resolve import model_names


def test_the_default_model_answers_its_plain_name_and_its_cache_folder_name() -> None:
    assert model_names(None) == (SMOLLM2.name, f"{SMOLLM2.name}-{SMOLLM2.cache_key()}")
    assert model_names(None)[0] == "SmolLM2-135M-Instruct"


def test_the_demo_pair_keeps_its_name() -> None:
    assert model_names("demo") == ("xpuspec-demo", "demo")


def test_a_folder_answers_its_name_without_a_cache_key() -> None:
    assert model_names("/x/SmolLM2-135M-Instruct-d853b4072332") == (
        "SmolLM2-135M-Instruct",
        "SmolLM2-135M-Instruct-d853b4072332",
    )
    assert model_names("/x/my-bundle/") == ("my-bundle",)
    assert model_names("/x/model-v2-12") == ("model-v2-12",)  # not a 12-digit key
