"""What each built-in plugin reports for a stub Core, and the compile properties it chooses per role."""

from __future__ import annotations

import pytest

from tests.devices.fake_core import FakeCore, laptop_core
from xpuspec.devices import DevicePlugin
from xpuspec.executor.properties import PER_TOKEN_KEYS
from xpuspec_plugins.cpu import CpuPlugin
from xpuspec_plugins.gpu import GpuPlugin
from xpuspec_plugins.npu import NpuPlugin
from xpuspec_plugins.pytorch import TorchPlugin, checkpoint_dir


@pytest.mark.parametrize("plugin", [CpuPlugin(), GpuPlugin(), NpuPlugin(), TorchPlugin()])
def test_builtins_satisfy_the_protocol(plugin):
    assert isinstance(plugin, DevicePlugin)


def test_cpu_capabilities_from_the_core():
    capabilities = CpuPlugin().capabilities(laptop_core())
    assert capabilities.present and capabilities.device == "CPU"
    assert capabilities.full_name == "Fake Xeon"
    assert capabilities.precisions == ("FP32", "BF16", "INT8")
    assert capabilities.paged_attention and capabilities.dynamic_shapes and not capabilities.static_only
    assert capabilities.executor_kind == "paged" and capabilities.compression_preset == "cpu"
    assert capabilities.max_streams == 8
    assert capabilities.memory_bytes is None


def test_gpu_reports_memory_and_each_indexed_device():
    core = laptop_core()
    plugin = GpuPlugin()
    assert plugin.present_devices(core) == ["GPU.0", "GPU.1"]
    assert plugin.matches("GPU") and plugin.matches("gpu.1") and not plugin.matches("CPU")
    capabilities = plugin.capabilities(core, "GPU.1")
    assert capabilities.device == "GPU.1" and capabilities.present
    assert capabilities.memory_bytes == 16 * 2**30
    assert capabilities.compute_units == 512
    assert capabilities.compression_preset == "gpu"


def test_npu_is_static_and_stateful():
    capabilities = NpuPlugin().capabilities(laptop_core())
    assert capabilities.present and capabilities.static_only and not capabilities.paged_attention
    assert capabilities.executor_kind == "stateful" and capabilities.compression_preset == "npu"
    assert capabilities.memory_bytes == 4 * 2**30 and capabilities.compute_units == 6


@pytest.mark.parametrize("plugin", [CpuPlugin(), GpuPlugin(), NpuPlugin()])
def test_absent_devices(plugin):
    core = FakeCore({"CPU": {}} if plugin.name != "CPU" else {"GPU": {}})
    assert not plugin.is_present(core)
    capabilities = plugin.capabilities(core)
    assert not capabilities.present and capabilities.device == plugin.name and capabilities.precisions == ()


def test_missing_properties_are_left_empty():
    capabilities = GpuPlugin().capabilities(FakeCore({"GPU": {}}))
    assert capabilities.present
    assert (capabilities.full_name, capabilities.memory_bytes, capabilities.compute_units) == ("", None, None)


def test_cpu_properties_per_role():
    plugin = CpuPlugin()
    for role in ("target", "draft"):
        # The target's keys are quantised per token (a block's bytes do not depend on how it was filled);
        # the draft's cache changes no answer and keeps the plugin's mode.
        keys = PER_TOKEN_KEYS if role == "target" else {}
        # Unknown or uncompressed weights: the plugin's own precisions (bf16 compute and cache here).
        assert plugin.compile_properties(role) == {"PERFORMANCE_HINT": "LATENCY", **keys}
        assert plugin.compile_properties(role, weights="fp16") == {"PERFORMANCE_HINT": "LATENCY", **keys}
        # int8/int4 weights: f32 compute with dynamic int8 activations in groups of 128, u8 cache.
        for weights in ("int8", "int4"):
            assert plugin.compile_properties(role, weights=weights) == {
                "PERFORMANCE_HINT": "LATENCY",
                **keys,
                "INFERENCE_PRECISION_HINT": "f32",
                "DYNAMIC_QUANTIZATION_GROUP_SIZE": 128,
                "KV_CACHE_PRECISION": "u8",
            }
    pinned = CpuPlugin(target_threads=6, draft_threads=2)
    assert pinned.compile_properties("target")["INFERENCE_NUM_THREADS"] == 6
    assert pinned.compile_properties("draft")["INFERENCE_NUM_THREADS"] == 2
    assert pinned.compile_properties("draft")["ENABLE_CPU_PINNING"] is True


def test_user_properties_override_plugin_defaults():
    exact = {
        "INFERENCE_PRECISION_HINT": "f32",
        "KV_CACHE_PRECISION": "f32",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
    }
    for weights in (None, "int8"):
        assert CpuPlugin().compile_properties("target", exact, weights=weights) == {
            "PERFORMANCE_HINT": "LATENCY",
            **PER_TOKEN_KEYS,
            **exact,
        }
    gpu = GpuPlugin().compile_properties("draft", {"INFERENCE_PRECISION_HINT": "f32"})
    assert gpu["INFERENCE_PRECISION_HINT"] == "f32" and gpu["KV_CACHE_PRECISION"] == "f16"
    npu = NpuPlugin().compile_properties("target", {"NPUW_LLM_MAX_PROMPT_LEN": "2048"})
    assert npu["NPUW_LLM_MAX_PROMPT_LEN"] == "2048" and npu["NPUW_LLM"] == "YES"


def test_cpu_f32_compute_brings_an_f32_cache_and_no_quantisation_unless_told_otherwise():
    f32 = CpuPlugin().compile_properties("target", {"INFERENCE_PRECISION_HINT": "f32"}, weights="int8")
    assert f32["KV_CACHE_PRECISION"] == "f32" and f32["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == 0
    explicit = CpuPlugin().compile_properties(
        "target",
        {
            "INFERENCE_PRECISION_HINT": "f32",
            "KV_CACHE_PRECISION": "u8",
            "DYNAMIC_QUANTIZATION_GROUP_SIZE": 64,
        },
        weights="int8",
    )
    assert explicit["KV_CACHE_PRECISION"] == "u8" and explicit["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == 64


def test_gpu_defaults_to_f16():
    properties = GpuPlugin().compile_properties("target")
    assert properties["INFERENCE_PRECISION_HINT"] == "f16" and properties["KV_CACHE_PRECISION"] == "f16"


def test_npu_static_lengths_and_verification_window():
    plugin = NpuPlugin(max_prompt_len=512, min_response_len=64)
    target = plugin.compile_properties("target", max_draft_tokens=5)
    draft = plugin.compile_properties("draft", max_draft_tokens=5)
    for properties in (target, draft):
        assert properties["NPU_USE_NPUW"] == "YES" and properties["NPUW_LLM"] == "YES"
        assert properties["NPUW_LLM_MAX_PROMPT_LEN"] == "512"
        assert properties["NPUW_LLM_MIN_RESPONSE_LEN"] == "64"
    # The target verifies γ drafts plus one token per call; the draft generates one at a time.
    assert target["NPUW_LLM_MAX_GENERATION_TOKEN_LEN"] == "6"
    assert "NPUW_LLM_MAX_GENERATION_TOKEN_LEN" not in draft
    with pytest.raises(ValueError, match="max_prompt_len"):
        NpuPlugin(max_prompt_len=0)


def test_unknown_role_is_refused():
    with pytest.raises(ValueError, match="role must be one of"):
        CpuPlugin().compile_properties("verifier")  # type: ignore[arg-type]


def test_torch_plugin_is_present_where_torch_imports():
    plugin = TorchPlugin()
    assert plugin.matches("TORCH") and plugin.is_present(FakeCore({}))
    capabilities = plugin.capabilities(FakeCore({}))
    assert capabilities.present and capabilities.full_name.startswith("PyTorch")
    assert capabilities.executor_kind == "reference"
    assert plugin.compile_properties("target") == {"dtype": "float32"}
    assert plugin.compile_properties("draft", {"dtype": "bfloat16"}) == {"dtype": "bfloat16"}
    with pytest.raises(ValueError, match="dtype"):
        plugin.compile_properties("target", {"dtype": "int3"})


def test_torch_needs_the_source_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="config.json and weights"):
        checkpoint_dir(tmp_path / "target", {"source": str(tmp_path / "gone")})
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"")
    assert checkpoint_dir(tmp_path / "target", {"source": str(tmp_path / "ckpt")}) == tmp_path / "ckpt"
