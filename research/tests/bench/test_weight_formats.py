"""The weight-format study's pieces: its variants, its prompts, its step time, its bundles, its table."""

from __future__ import annotations

from research.bench import weight_formats
from xpuspec.bench.workloads import CHAT_QUESTIONS
from xpuspec.models.bundle import ModelBundle
from xpuspec.models.resolve import resolve_bundle_path


def test_head_variants_start_from_the_layers_as_they_are_and_keep_their_symmetry():
    variants = weight_formats.head_variants("int4_asym_g64")
    assert variants[0] == "int4_asym_g64"
    assert variants[1:] == (
        "int4_asym_g64+head_int8_asym",
        "int4_asym_g64+head_int4_asym_g32",
        "int4_asym_g64+head_int4_asym_g64",
        "int4_asym_g64+head_int4_asym_g128",
    )
    assert weight_formats.LAYER_VARIANTS[0] == "gguf" and len(weight_formats.LAYER_VARIANTS) == 8


def test_instructions_are_the_bench_questions_then_held_out_ones_all_different():
    messages = weight_formats.chat_instructions(12)
    texts = [m[-1]["content"] for m in messages]
    assert texts[: len(CHAT_QUESTIONS)] == list(CHAT_QUESTIONS)
    assert len(set(texts)) == 12


def test_decode_step_leaves_out_the_first_token():
    # 11 tokens in 0.5 s, the first at 0.1 s: 10 steps in 0.4 s.
    stats = {"num_output_tokens": 11, "tokens_per_s": 22.0, "ttft_s": 0.1}
    assert abs(weight_formats.decode_step_ms(stats) - 40.0) < 1e-9
    assert weight_formats.decode_step_ms({"num_output_tokens": 1, "tokens_per_s": 5.0, "ttft_s": 0.2}) is None


def test_the_reference_variant_is_a_verified_bundle_of_the_target_alone(tmp_path):
    root = weight_formats.variant_bundle(resolve_bundle_path("demo"), tmp_path, "gguf")
    bundle = ModelBundle.open(root, verify=True)
    assert bundle.draft is None and bundle.eagle3 is None
    assert weight_formats.variant_bundle(resolve_bundle_path("demo"), tmp_path, "gguf") == root  # kept


def test_the_table_has_a_row_per_variant():
    row = {
        "variant": "int4_sym_g64",
        "step_ms": 9.5,
        "ratio": 0.97,
        "vs_reference_exact": "5/12 identical",
        "vs_own_exact": "6/12 identical",
        "bin_mb": 87.5,
    }
    table = weight_formats.markdown([row])
    assert (
        table.splitlines()[-1] == "| int4_sym_g64 | 9.50 | 0.970 | 5/12 identical | 6/12 identical | 87.5 |"
    )
