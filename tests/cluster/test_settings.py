"""The application's arguments: strict keys, the image's bundle from the environment, and the
custom resources a replica on an Intel GPU or NPU asks for."""

from __future__ import annotations

import pytest

from xpuspec.cluster.application import device_resources
from xpuspec.cluster.settings import BUNDLE_ENV, ClusterSettings


def test_an_unknown_argument_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="bundel"):
        ClusterSettings.from_args({"bundel": "demo"})


def test_the_bundle_comes_from_the_environment_when_the_args_name_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(BUNDLE_ENV, "/opt/xpuspec/bundle")
    assert ClusterSettings.from_args({}).bundle == "/opt/xpuspec/bundle"
    assert ClusterSettings.from_args({"bundle": "demo"}).bundle == "demo"
    assert ClusterSettings.from_args({}).server_config().served_model_name == "bundle"
    monkeypatch.delenv(BUNDLE_ENV)
    assert ClusterSettings.from_args({"bundle": "demo"}).server_config().served_model_name == "xpuspec-demo"


def test_replicas_on_intel_gpus_or_npus_ask_for_their_custom_resource() -> None:
    assert device_resources(ClusterSettings()) == {}
    assert device_resources(ClusterSettings(target_device="GPU.1", draft_device="CPU")) == {"intel_gpu": 1.0}
    both = ClusterSettings(target_device="GPU", draft_device="NPU")
    assert device_resources(both) == {"intel_gpu": 1.0, "intel_npu": 1.0}


def test_the_ingress_answers_any_host_unless_told_and_takes_origin_lists() -> None:
    # Behind Serve's proxy the ingress is reached under names it cannot know.
    assert ClusterSettings.from_args({}).server_config().allowed_hosts == ("*",)
    config = ClusterSettings.from_args(
        {"allowed_hosts": ["llm.internal"], "allowed_origins": ["https://app.example"]}
    ).server_config()
    assert config.allowed_hosts == ("llm.internal",) and config.allowed_origins == ("https://app.example",)
    with pytest.raises(ValueError, match="allowed origin"):
        ClusterSettings.from_args({"allowed_origins": ["app.example"]}).server_config()
