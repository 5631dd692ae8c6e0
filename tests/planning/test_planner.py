"""How `xpuspec plan` decides (placements and compile properties), that its record is stable over
repeated runs, and that Pipeline applies the compile properties it recorded."""

from __future__ import annotations

import shutil

import pytest

from xpuspec.cli import main
from xpuspec.devices.placement import Placement, write_placement
from xpuspec.models.bundle import ModelBundle
from xpuspec.planning.planner import Measurement, PlanConfig, decide
from xpuspec.planning.trial import PropertyCandidate
from xpuspec.planning.tuning import choose_properties, first_stage, group_stage

DEFAULT = Placement("CPU", "CPU", "draft", None)
CONFIG = PlanConfig(min_round_seconds=0.1)


def _measured(placement: Placement, rates: list[float]) -> Measurement:
    measurement = Measurement(placement)
    for rate in rates:
        measurement.add_round(int(rate), 1.0, 0, 0)
    return measurement


def test_a_clear_winner_replaces_the_default():
    default = _measured(DEFAULT, [100, 102, 98, 101, 99])
    gamma4 = _measured(Placement("CPU", "CPU", "draft", 4), [130, 128, 131, 127, 133])
    decision = decide([gamma4, default], DEFAULT, CONFIG)
    assert decision.clear and decision.chosen is gamma4 and "every one of 5 rounds" in decision.reason


def test_overlapping_rounds_keep_the_default():
    default = _measured(DEFAULT, [100, 102, 98, 101, 99])
    noisy = _measured(Placement("CPU", "CPU", "draft", 4), [130, 128, 97, 127, 133])
    decision = decide([noisy, default], DEFAULT, CONFIG)
    assert not decision.clear and decision.chosen is default and decision.fastest is noisy
    assert decision.reason.startswith("kept the default") and "within noise" in decision.reason


def test_a_change_needs_confirm_rounds_and_the_margin():
    default = _measured(DEFAULT, [100, 101, 99])
    three_rounds = _measured(Placement("CPU", "CPU", "draft", 4), [130, 131, 129])
    assert decide([three_rounds, default], DEFAULT, CONFIG).chosen is default  # 3 < confirm_rounds
    default = _measured(DEFAULT, [100, 101, 99, 100, 100])
    small_gain = _measured(Placement("CPU", "CPU", "draft", 4), [105, 106, 104, 105, 107])
    assert decide([small_gain, default], DEFAULT, CONFIG).chosen is default  # 5% < the 10% margin


def test_drafting_goes_off_only_on_a_larger_win():
    default = _measured(DEFAULT, [100, 101, 99, 100, 100])
    none_15 = _measured(Placement("CPU", "CPU", "none", 0), [115, 116, 114, 115, 116])
    assert decide([none_15, default], DEFAULT, CONFIG).chosen is default  # < the 20% for "none"
    none_30 = _measured(Placement("CPU", "CPU", "none", 0), [130, 131, 129, 130, 131])
    assert decide([none_30, default], DEFAULT, CONFIG).chosen is none_30


def test_equally_fast_candidates_resolve_by_a_fixed_preference():
    """Noise decides which of two equal candidates comes out on top; the record must not follow it."""
    default = _measured(DEFAULT, [100, 101, 99, 100, 100])
    gamma2 = _measured(Placement("CPU", "CPU", "draft", 2), [130, 128, 131, 127, 133])
    gamma4 = _measured(Placement("CPU", "CPU", "draft", 4), [132, 129, 130, 131, 133])
    none = _measured(Placement("CPU", "CPU", "none", 0), [133, 131, 130, 129, 134])
    decision = decide([none, gamma4, gamma2, default], DEFAULT, CONFIG)
    assert decision.chosen is gamma2 and "preferred over the equally fast" in decision.reason


def test_failed_and_empty_measurements():
    broken = Measurement(DEFAULT, error="RuntimeError: no")
    with pytest.raises(ValueError, match="no placement ran"):
        decide([broken], DEFAULT, CONFIG)
    other = _measured(Placement("CPU", "CPU", "draft", 2), [100, 100, 100])
    assert decide([broken, other], DEFAULT, CONFIG).chosen is other


def _candidate(
    properties: dict, rounds: list[float], agreement: int, default: bool = False, verified: int = 4
) -> PropertyCandidate:
    return PropertyCandidate(
        properties, is_default=default, round_ms=rounds, agreement=agreement, verified=verified
    )


def test_properties_need_agreement_and_a_clear_gain():
    default = _candidate({}, [10.0, 10.2, 9.9, 10.1, 10.0], 3, default=True)
    fast_unfaithful = _candidate({"INFERENCE_PRECISION_HINT": "bf16"}, [6.0, 6.1, 5.9, 6.0, 6.0], 2)
    fast_faithful = _candidate({"INFERENCE_PRECISION_HINT": "f32"}, [8.0, 8.1, 7.9, 8.0, 8.0], 3)
    noisy = _candidate({"KV_CACHE_PRECISION": "f32"}, [7.0, 11.0, 7.0, 7.0, 7.0], 4)
    chosen, reason = choose_properties([default, fast_unfaithful, fast_faithful], default, 0.05, 5)
    assert chosen == {"INFERENCE_PRECISION_HINT": "f32"}
    assert "same as exact 3, verified = decoded 4 (the default: same as exact 3" in reason
    # Fewer rounds than confirm_rounds: not yet a change.
    chosen, reason = choose_properties([default, fast_unfaithful, fast_faithful], default, 0.05, 6)
    assert chosen == {} and "within noise" in reason
    chosen, reason = choose_properties([default, noisy], default, 0.05, 5)
    assert chosen == {} and "within noise" in reason
    chosen, reason = choose_properties([default, fast_unfaithful], default, 0.05, 5, num_prompts=4)
    assert chosen == {} and reason == (
        "kept the plugin default: no candidate as faithful as the default "
        "(same as exact 3/4, verified = decoded 4/4) was faster"
    )


def test_speculation_that_changes_answers_is_replaced_whatever_the_speed():
    """A default whose verified tokens differ from its decoded ones gives way to the fastest candidate
    that keeps more of them, even a somewhat slower one; candidates that change answers are never chosen
    for speed."""
    default = _candidate({}, [10.0, 10.1, 9.9, 10.0, 10.0], 3, default=True, verified=1)
    slower_stable = _candidate({"KV_CACHE_PRECISION": "f32"}, [11.0, 11.1, 10.9, 11.0, 11.0], 3, verified=4)
    slowest_stable = _candidate({"KV_CACHE_PRECISION": "bf16"}, [12.0, 12.1, 11.9, 12.0, 12.0], 4, verified=4)
    chosen, reason = choose_properties([default, slowest_stable, slower_stable], default, 0.05, 5, 4)
    assert chosen == {"KV_CACHE_PRECISION": "f32"} and "1.10x its step time" in reason
    assert "speculation changes the plugin default's greedy answers" in reason
    # ... but not at any price: a stable candidate far slower is named, and the default kept.
    chosen, reason = choose_properties([default, slowest_stable], default, 0.05, 5, 4, stability_cost=0.1)
    assert (
        chosen == {} and reason.startswith("kept the plugin default") and "above the 1.10x allowed" in reason
    )
    # A faster candidate whose speculation changes more answers than the default's is not eligible.
    stable_default = _candidate({}, [10.0, 10.1, 9.9, 10.0, 10.0], 3, default=True, verified=4)
    fast_unstable = _candidate(
        {"KEY_CACHE_QUANT_MODE": "BY_CHANNEL"}, [6.0, 6.1, 5.9, 6.0, 6.0], 4, verified=2
    )
    assert choose_properties([stable_default, fast_unstable], stable_default, 0.05, 5)[0] == {}


def test_candidate_pruning_order():
    stage1 = first_stage(("BF16", "FP32", "INT8"), compressed=True)
    f32_u8 = {
        "INFERENCE_PRECISION_HINT": "f32",
        "KV_CACHE_PRECISION": "u8",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 128,
    }
    assert stage1 == [
        f32_u8,
        {**f32_u8, "KEY_CACHE_QUANT_MODE": "BY_CHANNEL"},  # the plugin's own key mode, for its speed
        {**f32_u8, "KV_CACHE_PRECISION": "f32"},
        {"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "u8"},
        {"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "bf16"},
        {"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "f32"},
    ]
    # No group sizes for uncompressed weights, no bf16 where the device lacks it.
    assert first_stage(("FP32",), compressed=False) == [
        {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "u8"},
        {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "u8", "KEY_CACHE_QUANT_MODE": "BY_CHANNEL"},
        {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"},
    ]
    # Quick: each compute precision with its own cache and an f32 one.
    assert first_stage(("BF16", "FP32"), compressed=True, quick=True) == [
        {**f32_u8, "KV_CACHE_PRECISION": "f32"},
        {"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "bf16"},
        {"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "f32"},
    ]
    assert [c["DYNAMIC_QUANTIZATION_GROUP_SIZE"] for c in group_stage("u8")] == [0, 32, 64, 256]


def _measured_candidate(record: dict, drafter: str, num_draft_tokens: int | None) -> dict:
    (found,) = [
        c
        for c in record["measured"]["candidates"]
        if (c["drafter"], c["num_draft_tokens"]) == (drafter, num_draft_tokens)
    ]
    return found


def test_plan_write_twice_records_what_its_measurements_show(tmp_path, capsys):
    """`plan --write` twice on the demo bundle, the second over the first's record (reduced workload,
    compile properties tuned).
    Which placement wins is a timing (on this shared machine two runs have recorded two different
    clear winners), so the test asserts that each record follows from its own measurements: a
    record within noise keeps the default placement; a change is backed by every round of the
    chosen placement beating every round of the default."""
    from xpuspec.models.demo import demo_bundle_path

    bundle = tmp_path / "demo"
    shutil.copytree(demo_bundle_path(), bundle)
    records = []
    for _ in range(2):
        assert main(["plan", str(bundle), "--write", "--quick", "--devices", "CPU"]) == 0
        records.append(ModelBundle.open(bundle, verify=True).placement)
        assert "recorded the placement" in capsys.readouterr().err
    # Without --write nothing is recorded, and the output does not say otherwise.
    assert main(["plan", str(bundle), "--quick", "--devices", "CPU"]) == 0
    shown = capsys.readouterr()
    assert "recorded" not in shown.out and " chosen" in shown.out
    assert "not recorded: run plan again with --write" in shown.err
    assert ModelBundle.open(bundle, verify=True).placement == records[-1]
    for record in records:
        chosen = (record["drafter"], record["num_draft_tokens"])
        default = _measured_candidate(record, "draft", None)
        if record["within_noise"] or chosen == ("draft", None):
            assert chosen == ("draft", None), record["decision"]
        else:
            winner = _measured_candidate(record, *chosen)
            assert len(winner["rounds"]) >= 3 and min(winner["rounds"]) > max(default["rounds"]), record
        measured = record["measured"]
        # Every figure behind the record comes from rounds of at least the floor (0.25 s with --quick).
        for candidate in measured["candidates"]:
            assert len(candidate["rounds"]) >= 3 and candidate["seconds"] >= 0.25 * len(candidate["rounds"])
        tuned = measured["compile_properties"]
        assert set(tuned) == {"target@CPU"}  # --quick: the draft's properties change no answer
        for result in tuned.values():
            # int8 weights; keys quantised per token.
            assert result["plugin_default"] == "compute=f32, kv=u8, dq_group=128, keys=BY_TOKEN"
            assert result["agreement_check"] == "2 prompts x 16 greedy tokens vs exact"
            (default,) = [c for c in result["candidates"] if c["properties"] == "plugin default"]
            # The default's speculation changes no answer (on the demo pair; measured, not assumed).
            assert default["agreement"] is not None and default["verified_equals_decoded"] == 2
        assert record["target_properties_why"] and record["draft_properties_why"] == "not tuned"
        # Every drafting candidate's greedy text equals the target-only text.
        for candidate in measured["candidates"]:
            if candidate["drafter"] != "none":
                assert candidate["same_as_target_only"]["same"] == 2, candidate


def test_pipeline_applies_recorded_properties_unless_the_user_sets_precision(pair_bundle, tmp_path):
    from xpuspec import Pipeline

    bundle = tmp_path / "bundle"
    shutil.copytree(pair_bundle, bundle)
    tuned = {
        "INFERENCE_PRECISION_HINT": "f32",
        "KV_CACHE_PRECISION": "u8",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
    }
    write_placement(
        bundle,
        {**DEFAULT.as_dict(), "target_properties": tuned, "draft_properties": {}, "decision": "test"},
    )

    def cache_type(pipe) -> str:
        return pipe.target_runner.cache_tensors["value_cache.0"].get_element_type().get_type_name()

    planned = Pipeline(bundle, drafter="none")
    assert planned.tuned_properties["target"] == tuned and cache_type(planned) == "u8"
    # The user's precision wins over the record (exact: f32 cache); so does use_placement=False.
    assert cache_type(Pipeline(bundle, drafter="none", properties="exact")) == "f32"
    assert Pipeline(bundle, drafter="none", use_placement=False).tuned_properties["target"] is None
    # fp16 weights, no record: the plugin's own cache precision (bf16 on this CPU, not u8).
    assert cache_type(Pipeline(pair_bundle, drafter="none")) in ("bf16", "f16", "f32")


def test_generate_says_when_the_recorded_plan_turns_drafting_off(pair_bundle, tmp_path, capsys):
    bundle = tmp_path / "bundle"
    shutil.copytree(pair_bundle, bundle)
    write_placement(bundle, {**Placement("CPU", "CPU", "none", 0).as_dict(), "decision": "test"})
    argv = ["generate", "--bundle", str(bundle), "def", "--max-tokens", "2", "--exact"]
    assert main(argv) == 0
    assert "the recorded plan turns drafting off" in capsys.readouterr().err
    assert main([*argv, "--drafter", "draft"]) == 0  # an explicit drafter: nothing to say
    assert "turns drafting off" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("compression", "expected"),
    [
        ({"weights": "int8"}, "int8"),
        ({"weights": "int4", "int4_constants": 0}, "int4"),
        # The default model's GGUF: its format names the GGUF blocks, its constants are int4.
        ({"weights": "Q4_1+Q8_0", "int8_constants": 1, "int4_constants": 210}, "int4"),
        ({"weights": "as given", "int8_constants": 22, "int4_constants": 0}, "int8"),
        ({"weights": "fp16", "int8_constants": 0, "int4_constants": 0}, None),
        (None, None),
    ],
)
def test_quantized_weights_are_known_by_their_constants_whatever_the_format(compression, expected):
    from pathlib import Path

    from xpuspec.devices.executors import model_weights, quantized_weights
    from xpuspec.models.bundle import ModelInfo

    facts = {} if compression is None else {"compression": compression}
    model = ModelInfo("target", Path("."), facts)
    assert quantized_weights(model) == expected
    # The plugin's defaults keep going by the recorded format name.
    assert model_weights(model) == (None if compression is None else compression["weights"])


@pytest.mark.smollm2
@pytest.mark.slow
def test_quick_plan_on_the_default_model_is_small_and_says_each_candidate_once(smollm2_gguf, tmp_path):
    """`xpuspec plan --quick` on the default model: peak RSS within 4 GB, no raw exception, a refused
    candidate skipped in one line, and the agreement columns explained under their tables."""
    import os
    import sys

    from tests.support.peak_memory import run_with_peak_rss

    done, peak_kib = run_with_peak_rss(
        [sys.executable, "-m", "xpuspec.cli", "plan", "--quick", "--devices", "CPU"],
        tmp_path / "peak-rss",
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert peak_kib < 4 * 1024 * 1024, f"peak RSS {peak_kib / 1024 / 1024:.1f} GB"
    output = done.stdout + done.stderr
    assert "Traceback" not in output and "Exception from" not in output
    skipped = [line for line in done.stderr.splitlines() if "skipped, refused by the device" in line]
    assert len(skipped) == len(set(skipped))  # each refused candidate once
    assert "SAME AS EXACT:" in done.stdout and "SAME AS TARGET-ONLY:" in done.stdout


def test_plan_quality_shows_the_figures_of_what_it_chose(pair_bundle, tmp_path, capsys):
    bundle = tmp_path / "pair"
    shutil.copytree(pair_bundle, bundle)
    assert main(["plan", str(bundle), "--quick", "--devices", "CPU", "--quality"]) == 0
    printed = capsys.readouterr().out
    assert "budget: llama.cpp arithmetic, emulated" in printed
    assert "| exact (reference) |" in printed and "| default |" in printed
    chosen = ModelBundle.open(bundle).placement  # not written: --quality alone records nothing
    assert chosen is None
