"""OpenVINO GenAI's EAGLE-3 on a bundle's head: the conversion, GenAI running it, and the bench rows.

The target is a tiny 4-layer Llama (GenAI taps layer *outputs*, so the head's boundaries must be >= 1 and
distinct: the 2-layer pair's (0, 1, 2) cannot run there); the random head taps boundaries (1, 2, 3),
GenAI's layers [0, 1, 2], and drafts over 96 of the target's ids.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("optimum.exporters.openvino")
genai = pytest.importorskip("openvino_genai")

import openvino as ov  # noqa: E402

from research.training.eagle3_torch import Eagle3Head  # noqa: E402
from tests.support.eagle3_bundles import tiny_eagle3_bundle  # noqa: E402
from xpuspec.bench.config import BenchConfig  # noqa: E402
from xpuspec.bench.figures import LatencyResult, RequestTiming  # noqa: E402
from xpuspec.bench.genai_eagle3 import (  # noqa: E402
    MODEL_FILE,
    convert_head,
    genai_eagle3_pipeline,
    genai_eagle3_unavailable,
    genai_layer_ids,
)
from xpuspec.bench.latency_labels import (  # noqa: E402
    ADAPTIVE,
    GENAI,
    GENAI_EAGLE3,
    GENAI_EAGLE3_KEY,
    XPUSPEC_EAGLE3,
    row_label,
)
from xpuspec.bench.latency_ratios import peer_ratios  # noqa: E402
from xpuspec.bench.latency_rows import configurations  # noqa: E402
from xpuspec.executor.eagle3_graph import quantise_int8_rows  # noqa: E402
from xpuspec.models.bundle import ModelBundle  # noqa: E402
from xpuspec.prepare.genai_eagle3_export import target_embedding_table  # noqa: E402
from xpuspec.spec_decode.eagle3.config import Eagle3HeadConfig  # noqa: E402

TAPS = (1, 2, 3)
# f32 compute and KV cache, no dynamic quantisation: GenAI's speculative output must then equal its own
# target-only output token for token.
F32 = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
PROMPT = [5, 17, 42, 99, 7, 3, 250, 11]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> ModelBundle:
    return ModelBundle.open(tiny_eagle3_bundle(tmp_path_factory.mktemp("genai_eagle3"), TAPS))


@pytest.fixture(scope="module")
def converted(bundle: ModelBundle, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert_head(bundle, tmp_path_factory.mktemp("cache"))


def _generation(num_assistant_tokens: int | None = None):  # type: ignore[no-untyped-def]
    config = genai.GenerationConfig()
    config.max_new_tokens = config.min_new_tokens = MAX_TOKENS
    config.ignore_eos, config.do_sample = True, False
    if num_assistant_tokens is not None:
        config.num_assistant_tokens = num_assistant_tokens
    return config


def _inputs():  # type: ignore[no-untyped-def]
    ids = np.array([PROMPT], dtype=np.int64)
    return genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))


def test_layer_ids_are_boundaries_minus_one() -> None:
    assert genai_layer_ids((1, 2, 3)) == [0, 1, 2]
    assert genai_layer_ids((2, 14, 25)) == [1, 13, 24]
    with pytest.raises(ValueError, match="boundary 0 is the embedding output"):
        genai_layer_ids((0, 1, 2))
    with pytest.raises(ValueError, match="three distinct layers"):
        genai_layer_ids((1, 2, 2))


def test_a_head_genai_cannot_run_says_why() -> None:
    def bundle_with(
        taps: tuple[int, ...], norm_before_residual: bool = False, gguf: bool = False
    ) -> SimpleNamespace:
        config = SimpleNamespace(norm_before_residual=norm_before_residual)
        target = SimpleNamespace(facts={"gguf": {"file_type": "MOSTLY_Q4_1"}} if gguf else {})
        return SimpleNamespace(target=target, eagle3=SimpleNamespace(tap_layers=taps, config=lambda: config))

    assert genai_eagle3_unavailable(bundle_with((1, 2, 3))) is None
    # Before any conversion: GenAI fails on such a target with a multi-line C++ exception.
    assert "converted from GGUF" in str(genai_eagle3_unavailable(bundle_with((1, 2, 3), gguf=True)))
    assert "boundary 0" in str(genai_eagle3_unavailable(bundle_with((0, 1, 2))))
    assert "norm_before_residual" in str(genai_eagle3_unavailable(bundle_with((1, 2, 3), True)))
    assert genai_eagle3_unavailable(SimpleNamespace(eagle3=None)) == "the bundle has no EAGLE-3 head"


def test_the_converted_ir_is_what_genai_loads(bundle: ModelBundle, converted: Path) -> None:
    model = ov.Core().read_model(converted / MODEL_FILE)
    inputs = {port.get_any_name() for port in model.inputs}
    assert {"input_ids", "hidden_states", "attention_mask", "position_ids", "beam_idx"} <= inputs
    assert {port.get_any_name() for port in model.outputs} == {"logits", "d2t"}
    assert model.get_rt_info("eagle3_mode").astype(str) == "True"
    assert model.get_rt_info("hidden_layers_list").astype(str) == "0 1 2"
    assert {"openvino_tokenizer.xml", "openvino_detokenizer.xml"} <= {p.name for p in converted.iterdir()}
    # The head's matrices at xpuspec's int8 (fc, q/k/v/o, the MLP, lm_head); the embedding table is not one.
    int8 = [
        n
        for n in model.get_ops()
        if n.get_type_name() == "Constant" and n.get_output_element_type(0) == ov.Type.i8
    ]
    assert len(int8) == 9
    assert sorted(len(n.get_output_partial_shape(0)) for n in int8) == [2] * 9
    # Converted once: a second call reuses the folder.
    assert convert_head(bundle, converted.parent) == converted


def test_the_converted_head_computes_the_torch_reference(bundle: ModelBundle, converted: Path) -> None:
    """The IR's logits and d2t against :class:`Eagle3Head` (xpuspec's reference of the head's math)."""
    from safetensors.torch import load_file

    config = Eagle3HeadConfig.from_folder(bundle.eagle3.path)  # type: ignore[union-attr]
    head = Eagle3Head(config).eval()
    state = load_file(str(bundle.eagle3.path / "model.safetensors"))  # type: ignore[union-attr]
    # At the int8 matrices both engines run (xpuspec.executor.eagle3_graph.quantise_int8_rows).
    weights = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    for name, value in weights.items():
        if value.ndim == 2 and name != "embed_tokens.weight":
            quantised, scale = quantise_int8_rows(value.numpy())
            weights[name] = torch.from_numpy(quantised * scale)
    head.load_state_dict(weights)
    table = target_embedding_table(bundle.target.path, config.vocab_size)

    rng = np.random.default_rng(0)
    ids = np.array([PROMPT], dtype=np.int64)  # [1, n]
    hidden = rng.standard_normal((1, len(PROMPT), 3 * config.hidden_size)).astype(np.float32)
    positions = np.arange(len(PROMPT), dtype=np.int64)[None]
    with torch.no_grad():
        fused = head.fuse(torch.from_numpy(hidden))
        expected, _, _ = head(torch.from_numpy(table[ids]), fused, torch.from_numpy(positions))

    # F32: int8 weights would otherwise have their activations quantised on the fly.
    compiled = ov.Core().compile_model(converted / MODEL_FILE, "CPU", F32)
    request = compiled.create_infer_request()
    request.reset_state()
    outputs = request.infer(
        {
            "input_ids": ids,
            "hidden_states": hidden,
            "attention_mask": np.ones_like(ids),
            "position_ids": positions,
            "beam_idx": np.zeros(1, dtype=np.int32),
        }
    )
    logits = outputs[compiled.output("logits")]
    np.testing.assert_allclose(logits, expected.numpy(), rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(outputs[compiled.output("d2t")], head.d2t.numpy())


def test_genai_runs_the_converted_head_and_keeps_its_target_output(bundle: ModelBundle) -> None:
    target_only = genai.LLMPipeline(str(bundle.target.path), "CPU", **F32)
    expected = list(target_only.generate(_inputs(), _generation()).tokens[0])
    assert len(expected) == MAX_TOKENS
    for chain in (1, 3):
        pipe = genai_eagle3_pipeline(bundle, F32, chain)
        assert pipe.get_generation_config().num_assistant_tokens == chain
        result = pipe.generate(_inputs(), _generation(chain))
        assert list(result.tokens[0]) == expected  # greedy, f32: speculation changes no token
        # It drafted (a random head's drafts are rejected, so only the draft count says it ran).
        assert result.extended_perf_metrics.get_num_draft_tokens() > 0


def _rows(tmp_path: Path, bundle: object):  # type: ignore[no-untyped-def]
    config = BenchConfig(out=tmp_path, draft_lengths=(2, 4))
    return configurations(
        config,
        bundle,  # type: ignore[arg-type]
        lambda *args: SimpleNamespace(proposer=None),
        F32,
        (None, None),
    )


def test_the_bench_shows_genai_eagle3_beside_xpuspec(bundle: ModelBundle, tmp_path: Path) -> None:
    configs, engines = _rows(tmp_path, bundle)
    rows = [c for c in configs if c.result.engine == GENAI_EAGLE3]
    assert [c.result.name for c in rows] == [
        "OpenVINO GenAI EAGLE-3 speculative (γ=2)",
        "OpenVINO GenAI EAGLE-3 speculative (γ=4)",
        "OpenVINO GenAI EAGLE-3 speculative (adaptive γ)",
    ]
    assert [c.engine_key for c in rows] == [GENAI_EAGLE3_KEY, GENAI_EAGLE3_KEY, None]
    assert engines[GENAI_EAGLE3_KEY].family == GENAI  # interleaved and compiled with GenAI's engines
    assert [c.result.engine for c in configs].count(XPUSPEC_EAGLE3) == 3

    runner = engines[GENAI_EAGLE3_KEY].build()  # the same properties as the xpuspec EAGLE-3 rows
    timing = runner.generate(PROMPT, 8, 2)
    assert len(timing.token_ids) == 8 and timing.drafted


def test_xpuspec_eagle3_is_divided_by_genai_eagle3_at_the_same_chain() -> None:
    def timed(engine: str, length: int | str, seconds: float) -> LatencyResult:
        result = LatencyResult(row_label(engine, length), engine, length)
        result.record_round([RequestTiming(3, list(range(8)), seconds, 0.01, seconds / 8)])
        return result

    results = [
        timed(XPUSPEC_EAGLE3, 2, 1.0),
        timed(XPUSPEC_EAGLE3, ADAPTIVE, 0.5),
        timed(GENAI_EAGLE3, 2, 2.0),
        timed(GENAI_EAGLE3, 4, 4.0),
    ]
    summaries = {r.name: r.summary() for r in results}
    peer_ratios(results, summaries)
    assert summaries[results[0].name]["ratio_to_peers"][GENAI] == pytest.approx(2.0)
    assert summaries[results[1].name]["ratio_to_peers"][GENAI] == pytest.approx(4.0)  # over the best fixed


def test_a_head_genai_cannot_run_gets_a_not_run_row(tmp_path: Path) -> None:
    model = SimpleNamespace(path=Path("/nowhere"))
    config = SimpleNamespace(norm_before_residual=False)
    head = SimpleNamespace(path=Path("/nowhere"), tap_layers=(0, 1, 2), config=lambda: config)
    configs, engines = _rows(tmp_path, SimpleNamespace(target=model, draft=None, eagle3=head))
    rows = [c.result for c in configs if c.result.engine == GENAI_EAGLE3]
    assert len(rows) == 1 and rows[0].name == GENAI_EAGLE3 and GENAI_EAGLE3_KEY not in engines
    assert rows[0].reason is not None and rows[0].reason.startswith("not run: the head cannot run on GenAI")
    assert "boundary 0" in rows[0].reason
