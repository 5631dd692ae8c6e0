"""`xpuspec devices` on this machine, and `xpuspec plan --write` on the tiny pair bundle."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from tests.conftest import F32
from xpuspec.cli import main
from xpuspec.devices.placement import write_placement
from xpuspec.models.bundle import MANIFEST_NAME, ModelBundle
from xpuspec.sample.sampling_params import SamplingParams


def test_devices_json_lists_present_and_absent_plugins(capsys):
    assert main(["devices", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["openvino_version"]
    by_device = {entry["device"]: entry for entry in report["devices"]}
    cpu = by_device["CPU"]
    assert cpu["present"] is True and cpu["paged_attention"] is True and cpu["static_only"] is False
    assert cpu["executor_kind"] == "paged" and cpu["compression_preset"] == "cpu"
    assert "FP32" in cpu["precisions"] and cpu["full_name"]
    # This machine has neither; they are listed as known but absent, after the present ones.
    assert by_device["GPU"]["present"] is False and by_device["NPU"]["present"] is False
    assert by_device["NPU"]["static_only"] is True and by_device["NPU"]["executor_kind"] == "stateful"
    presence = [entry["present"] for entry in report["devices"]]
    assert presence == sorted(presence, reverse=True)


def test_devices_table(capsys):
    assert main(["devices"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["DEVICE", "PRESENT"]
    assert any(line.split()[:2] == ["CPU", "yes"] for line in lines)
    assert any(line.split()[:2] == ["NPU", "no"] for line in lines)


def test_plan_of_an_absent_device_is_a_usage_error(pair_bundle, capsys):
    assert main(["plan", str(pair_bundle), "--devices", "GPU"]) == 2
    assert "'GPU' is not present" in capsys.readouterr().err


@pytest.fixture(scope="module")
def planned_bundle(pair_bundle, tmp_path_factory):
    """A copy of the pair bundle (the session's bundle must stay without placement) after plan --write."""
    bundle = tmp_path_factory.mktemp("planned") / "bundle"
    shutil.copytree(pair_bundle, bundle)
    argv = ["plan", str(bundle), "--write", "--json", "--prompts", "2", "--max-tokens", "8"]
    argv += ["--draft-lengths", "2", "--devices", "CPU"]
    for key, value in F32.items():
        argv += ["--property", f"{key}={value}"]
    assert main(argv) == 0
    return bundle


def test_plan_writes_a_placement_that_verifies(planned_bundle):
    bundle = ModelBundle.open(planned_bundle, verify=True)  # the manifest is not hashed: still green
    placement = bundle.placement
    assert placement["target_device"] == "CPU" and placement["draft_device"] == "CPU"
    assert placement["drafter"] in ("none", "draft")
    candidates = placement["measured"]["candidates"]
    # none(γ=0), draft γ=2, draft adaptive (the default): every one ran in 3 to 6 interleaved rounds,
    # each round at least the floor long, so with the whole workload (2 prompts x 8 tokens) at least once.
    assert [(c["drafter"], c["num_draft_tokens"]) for c in candidates] == [
        ("none", 0),
        ("draft", 2),
        ("draft", None),
    ]
    rounds = {len(c["rounds"]) for c in candidates}
    assert len(rounds) == 1 and 3 <= rounds.pop() <= 6
    for candidate in candidates:
        assert candidate["error"] is None and candidate["num_tokens"] >= 16 * len(candidate["rounds"])
        assert candidate["seconds"] >= 0.5 * len(candidate["rounds"])
    chosen = next(
        c
        for c in candidates
        if (c["drafter"], c["num_draft_tokens"]) == (placement["drafter"], placement["num_draft_tokens"])
    )
    default = candidates[-1]
    if placement["within_noise"] or chosen is default:
        assert chosen is default
    else:  # a change is recorded only when every round beat every round of the default
        assert min(chosen["rounds"]) > max(default["rounds"])
    assert placement["decision"]
    # The user set the precision (F32), so the compile properties were not tuned.
    assert placement["target_properties"] == {} and placement["target_properties_why"] == "not tuned"
    assert placement["devices_seen"] == ["CPU"] and placement["openvino_version"]


def test_a_new_pipeline_uses_the_recorded_placement(planned_bundle):
    from xpuspec import Pipeline

    # Pin a known placement so the assertions do not depend on which candidate measured fastest.
    recorded = ModelBundle.open(planned_bundle).placement
    write_placement(planned_bundle, {**recorded, "drafter": "ngram", "num_draft_tokens": 3})
    pipe = Pipeline(planned_bundle, properties=F32)
    assert pipe.drafter == "ngram" and pipe.default_num_draft_tokens == 3
    assert pipe.target_device.device == "CPU" and pipe.draft_device is None
    submitted = []
    add_request = pipe.engine.add_request
    pipe.engine.add_request = lambda rid, ids, params, **options: (
        submitted.append(params),
        add_request(rid, ids, params, **options),
    )
    pipe.generate(["def add(a, b):", "x"], [SamplingParams(max_tokens=4), SamplingParams(num_draft_tokens=1)])
    # γ from the manifest for a request that leaves it unset; a request's own γ wins.
    assert [params.num_draft_tokens for params in submitted] == [3, 1]

    explicit = Pipeline(planned_bundle, drafter="none", properties=F32)
    assert explicit.drafter == "none" and explicit.default_num_draft_tokens == 3


def test_a_corrupted_placement_falls_back_to_cpu_defaults(planned_bundle, caplog):
    from xpuspec import Pipeline

    manifest = json.loads((planned_bundle / MANIFEST_NAME).read_text())
    manifest["placement"] = {"target_device": "NPU", "draft_device": "GPU", "drafter": "draft"}
    (planned_bundle / MANIFEST_NAME).write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING, logger="xpuspec.devices.placement"):
        pipe = Pipeline(planned_bundle, properties=F32)
    assert "ignoring the placement" in caplog.text and "'NPU' is not present" in caplog.text
    assert pipe.target_device.device == "CPU" and pipe.drafter == "draft"
    assert pipe.draft_device.device == "CPU" and pipe.default_num_draft_tokens is None


def test_pipeline_absent_device_error_names_present_devices(pair_bundle):
    from xpuspec import Pipeline

    with pytest.raises(ValueError, match=r"'GPU' is not present here; present devices: CPU"):
        Pipeline(pair_bundle, target_device="GPU")
