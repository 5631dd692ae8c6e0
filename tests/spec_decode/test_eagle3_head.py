"""The EAGLE-3 head: OpenVINO runtime against the torch reference, loader checks, target embedding cut."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import openvino as ov
import pytest

torch = pytest.importorskip("torch")

from research.training.eagle3_torch import random_head, save_head  # noqa: E402
from tests.conftest import F32  # noqa: E402
from tests.engine.conftest import export_tiny_ir  # noqa: E402
from xpuspec.executor import eagle3_graph as graph  # noqa: E402
from xpuspec.executor.eagle3_embedding import table_embedding_model, target_embedding_model  # noqa: E402
from xpuspec.executor.eagle3_head import CACHE_GRAIN, Eagle3Head  # noqa: E402
from xpuspec.prepare.config import PrepareError  # noqa: E402
from xpuspec.prepare.eagle3 import read_source_tensors  # noqa: E402
from xpuspec.spec_decode.eagle3.config import Eagle3HeadConfig  # noqa: E402
from xpuspec.spec_decode.eagle3.head import HeadStep  # noqa: E402
from xpuspec.spec_decode.eagle3.weights import (  # noqa: E402
    check_head_tensors,
    load_head_weights,
    read_safetensors,
)

# The tiny target of tests/support/tiny_checkpoints.py: 2 layers, so the taps are named explicitly.
TARGET = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "vocab_size": 384,
    "num_hidden_layers": 2,
}
DRAFT_VOCAB = 96
ATOL = 1e-4


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    module, config = random_head(TARGET, DRAFT_VOCAB, seed=3, aux_layer_ids=(0, 1, 2))
    return save_head(module, config, tmp_path_factory.mktemp("eagle3") / "head")


@pytest.fixture(scope="module")
def reference():
    """The same head as ``head_dir`` (same seed), as the torch module."""
    return random_head(TARGET, DRAFT_VOCAB, seed=3, aux_layer_ids=(0, 1, 2))


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    return (
        np.random.default_rng(0).normal(size=(TARGET["vocab_size"], TARGET["hidden_size"])).astype(np.float32)
    )


@pytest.fixture()
def head(head_dir: Path, table: np.ndarray) -> Eagle3Head:
    config = Eagle3HeadConfig.from_folder(head_dir)
    return Eagle3Head(
        config, load_head_weights(head_dir, config), table_embedding_model(table), properties=F32
    )


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_tiny_ir(tmp_path_factory.mktemp("tiny-ir"), "llama")


class Reference:
    """The torch head with one sequence's cache, fed the same embeddings as the OpenVINO head."""

    def __init__(self, module, table: np.ndarray):
        self.module, self.table = module, torch.from_numpy(table)
        self.cache = None

    def length(self) -> int:
        return 0 if self.cache is None else self.cache[0].shape[2]

    def run(self, token_ids, hidden: np.ndarray, mask: np.ndarray | None = None, positions=None):
        n = len(token_ids)
        start = self.length()
        positions = torch.arange(start, start + n) if positions is None else torch.as_tensor(positions)
        with torch.no_grad():
            logits, out, self.cache = self.module(
                self.table[torch.as_tensor(token_ids)][None],
                torch.from_numpy(hidden)[None],
                positions[None],
                self.cache,
                None if mask is None else torch.from_numpy(mask)[None],
            )
        return logits[0].numpy(), out[0].numpy()

    def truncate(self, length: int) -> None:
        self.cache = (self.cache[0][:, :, :length], self.cache[1][:, :, :length])


def _fused(reference, rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    target_hidden = (
        np.random.default_rng(seed).normal(size=(rows, 3 * TARGET["hidden_size"])).astype(np.float32)
    )
    with torch.no_grad():
        fused = reference[0].fuse(torch.from_numpy(target_hidden)).numpy()
    return target_hidden, fused


def test_first_pass_then_rollout_matches_torch(head: Eagle3Head, reference, table: np.ndarray):
    ref = Reference(reference[0], table)
    target_hidden, fused_ref = _fused(reference, 7, seed=1)
    fused = head.fuse(target_hidden)
    np.testing.assert_allclose(fused, fused_ref, atol=ATOL)

    tokens = [5, 17, 200, 3, 99, 42, 7]
    (result,) = head.run([HeadStep("a", tokens, fused, logits_rows=range(7))])
    logits_ref, hidden_ref = ref.run(tokens, fused_ref)
    np.testing.assert_allclose(result.logits, logits_ref, atol=ATOL)
    np.testing.assert_allclose(result.hidden, hidden_ref, atol=ATOL)

    # Greedy rollout: each step feeds the drafted token (as a target id) and the carried state.
    carried = result.hidden[-1:]
    for _ in range(3):
        token = int(head.draft_to_target(int(np.argmax(result.logits[-1]))))
        (result,) = head.run([HeadStep("a", [token], carried)])
        logits_ref, hidden_ref = ref.run([token], hidden_ref[-1:])
        np.testing.assert_allclose(result.logits, logits_ref, atol=ATOL)
        np.testing.assert_allclose(result.hidden, hidden_ref, atol=ATOL)
        carried = result.hidden
    assert head.kv_length("a") == 10

    # Rejection keeps 8 positions: the next pass continues from there.
    head.truncate("a", 8)
    ref.truncate(8)
    (result,) = head.run([HeadStep("a", [11, 12], fused[:2], logits_rows=[0, 1])])
    logits_ref, hidden_ref = ref.run([11, 12], fused_ref[:2])
    np.testing.assert_allclose(result.logits, logits_ref, atol=ATOL)
    np.testing.assert_allclose(result.hidden, hidden_ref, atol=ATOL)
    assert head.kv_length("a") == 10
    head.release("a")
    assert head.kv_length("a") == 0


def test_padded_batch_matches_each_sequence_alone(head: Eagle3Head, reference, table: np.ndarray):
    refs = {"b": Reference(reference[0], table), "c": Reference(reference[0], table)}
    _, hidden_b = _fused(reference, 5, seed=2)
    _, hidden_c = _fused(reference, 2, seed=3)
    passes = [
        {"b": ([1, 2, 3, 4, 5], hidden_b), "c": ([9, 8], hidden_c)},  # different lengths, no past
        {"b": ([6], hidden_b[:1]), "c": ([7, 6, 5], hidden_b[2:])},  # different pasts and lengths
    ]
    for batch in passes:
        steps = [
            HeadStep(sid, ids, hidden, logits_rows=range(len(ids))) for sid, (ids, hidden) in batch.items()
        ]
        results = head.run(steps)
        for (sid, (ids, hidden)), result in zip(batch.items(), results, strict=True):
            logits_ref, hidden_ref = refs[sid].run(ids, hidden)
            np.testing.assert_allclose(result.logits, logits_ref, atol=ATOL, err_msg=sid)
            np.testing.assert_allclose(result.hidden, hidden_ref, atol=ATOL, err_msg=sid)
    assert head.sequences == {"b": 6, "c": 5}


def test_a_cache_grown_past_its_capacity_and_cut_back_matches_torch(
    head: Eagle3Head, reference, table: np.ndarray
):
    """A lone sequence's cache is the pass's past input at a capacity of CACHE_GRAIN slots: crossing it
    grows the cache, and a truncated slot (here first filled with NaN) is never read again."""
    ref = Reference(reference[0], table)
    rows = CACHE_GRAIN + 3
    _, fused = _fused(reference, rows, seed=6)
    tokens = np.random.default_rng(6).integers(0, TARGET["vocab_size"], rows)
    first = CACHE_GRAIN - 2
    head.run([HeadStep("g", tokens[:first], fused[:first])])
    ref.run(tokens[:first], fused[:first])
    # Two rollout-like slots of garbage, then rejected: they must not reach any later row.
    poisoned = np.full((2, TARGET["hidden_size"]), np.nan, np.float32)
    head.run([HeadStep("g", [1, 2], poisoned)])
    head.truncate("g", first)
    (result,) = head.run([HeadStep("g", tokens[first:], fused[first:], logits_rows=range(rows - first))])
    logits_ref, hidden_ref = ref.run(tokens[first:], fused[first:])
    assert head.kv_length("g") == rows
    np.testing.assert_allclose(result.logits, logits_ref, atol=ATOL)
    np.testing.assert_allclose(result.hidden, hidden_ref, atol=ATOL)


def test_tree_mask_and_positions(head: Eagle3Head, reference, table: np.ndarray):
    ref = Reference(reference[0], table)
    _, fused = _fused(reference, 4, seed=4)
    head.run([HeadStep("t", [1, 2, 3, 4], fused)])
    ref.run([1, 2, 3, 4], fused)
    # Two siblings at depth 1 (both position 4), a child of the second at depth 2 (position 5).
    mask = np.ones((3, 7), np.bool_)
    mask[:, 4:] = [[1, 0, 0], [0, 1, 0], [0, 1, 1]]
    hidden = np.random.default_rng(5).normal(size=(3, TARGET["hidden_size"])).astype(np.float32)
    step = HeadStep(
        "t", [10, 20, 30], hidden, positions=[4, 4, 5], attention_mask=mask, logits_rows=[0, 1, 2]
    )
    (result,) = head.run([step])
    logits_ref, hidden_ref = ref.run([10, 20, 30], hidden, mask=mask, positions=[4, 4, 5])
    np.testing.assert_allclose(result.logits, logits_ref, atol=ATOL)
    np.testing.assert_allclose(result.hidden, hidden_ref, atol=ATOL)


def test_draft_ids_map_to_target_vocabulary(head: Eagle3Head, reference):
    module = reference[0]
    target_ids = (torch.arange(DRAFT_VOCAB) + module.d2t).numpy()
    assert np.array_equal(head.draft_to_target(np.arange(DRAFT_VOCAB)), target_ids)
    assert np.array_equal(np.flatnonzero(module.t2d.numpy()), np.sort(target_ids))
    assert len(set(target_ids.tolist())) == DRAFT_VOCAB and target_ids.max() < TARGET["vocab_size"]

    draft_logits = np.random.default_rng(6).normal(size=(2, DRAFT_VOCAB)).astype(np.float32)
    full = head.target_logits(draft_logits)
    assert full.shape == (2, TARGET["vocab_size"])
    assert np.array_equal(full[:, target_ids], draft_logits)
    others = np.setdiff1d(np.arange(TARGET["vocab_size"]), target_ids)
    assert np.all(np.isneginf(full[:, others]))
    # The softmax over the target vocabulary is the draft distribution, zero elsewhere.
    probs = np.exp(full - full.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    draft_probs = np.exp(draft_logits - draft_logits.max(-1, keepdims=True))
    draft_probs /= draft_probs.sum(-1, keepdims=True)
    np.testing.assert_allclose(probs[:, target_ids], draft_probs, rtol=1e-6)
    assert np.all(probs[:, others] == 0)
    with pytest.raises(ValueError, match="draft vocabulary"):
        head.target_logits(np.zeros((1, TARGET["vocab_size"])))


def test_target_embedding_model_reads_the_target_table(tiny_target: Path):
    checkpoint = read_safetensors(tiny_target.parent / "llama-checkpoint" / "model.safetensors")
    table = checkpoint["model.embed_tokens.weight"]  # [vocab, hidden]
    import openvino as ov

    compiled = ov.Core().compile_model(target_embedding_model(tiny_target), "CPU", F32)
    ids = np.array([[0, 5, 17, table.shape[0] - 1]], np.int64)
    embeddings = compiled({"input_ids": ids})["embeddings"]  # [1, 4, hidden]
    np.testing.assert_allclose(embeddings[0], table[ids[0]], atol=1e-3)

    # An int8-compressed target: the cut keeps the u8 table and its dequantisation, not a f32 copy.
    import nncf

    compressed = nncf.compress_weights(ov.Core().read_model(tiny_target / "openvino_model.xml"))
    cut = target_embedding_model(compressed)
    constants = [op.get_element_type() for op in cut.get_ordered_ops() if op.get_type_name() == "Constant"]
    assert ov.Type.u8 in constants and ov.Type.f32 not in constants
    embeddings = ov.Core().compile_model(cut, "CPU", F32)({"input_ids": ids})["embeddings"]
    step = np.abs(table).max(axis=1, keepdims=True) * 2 / 255  # one int8 step per row, about
    assert np.all(np.abs(embeddings[0] - table[ids[0]]) <= step[ids[0]])


def test_head_from_folders_against_the_tiny_target(tiny_target: Path, tmp_path: Path):
    target_config = json.loads((tiny_target / "config.json").read_text())
    module, config = random_head(target_config, 64, seed=5, aux_layer_ids=(0, 1, 2))
    head_dir = save_head(module, config, tmp_path / "head")
    head = Eagle3Head.from_folders(head_dir, tiny_target, properties="exact")
    assert config.check_target(tiny_target) == (0, 1, 2)

    table = read_safetensors(tiny_target.parent / "llama-checkpoint" / "model.safetensors")[
        "model.embed_tokens.weight"
    ]
    ref = Reference(module, table)
    target_hidden = np.random.default_rng(7).normal(size=(3, 3 * config.hidden_size)).astype(np.float32)
    with torch.no_grad():
        fused_ref = module.fuse(torch.from_numpy(target_hidden)).numpy()
    (result,) = head.run([HeadStep("s", [4, 5, 6], head.fuse(target_hidden), logits_rows=[0, 1, 2])])
    logits_ref, hidden_ref = ref.run([4, 5, 6], fused_ref)
    np.testing.assert_allclose(result.logits, logits_ref, atol=1e-3)
    np.testing.assert_allclose(result.hidden, hidden_ref, atol=1e-3)


def test_safetensors_reader_matches_the_package(head_dir: Path, tmp_path: Path):
    from safetensors.numpy import load_file
    from safetensors.torch import save_file

    ours, theirs = read_safetensors(head_dir / "model.safetensors"), load_file(head_dir / "model.safetensors")
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        assert ours[name].dtype == theirs[name].dtype and np.array_equal(ours[name], theirs[name]), name
    # bf16, which numpy (and so the package's numpy API) cannot hold: widened to f32 exactly.
    values = torch.randn(3, 5).to(torch.bfloat16)
    save_file({"w": values}, str(tmp_path / "bf16.safetensors"))
    np.testing.assert_array_equal(
        read_safetensors(tmp_path / "bf16.safetensors")["w"], values.float().numpy()
    )


def _copy_head(head_dir: Path, folder: Path, edit_tensors=None, edit_config=None) -> Path:
    from safetensors.numpy import save_file

    folder.mkdir()
    config = json.loads((head_dir / "config.json").read_text())
    tensors = read_safetensors(head_dir / "model.safetensors")
    if edit_tensors:
        edit_tensors(tensors)
    if edit_config:
        edit_config(config)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_weight_errors_name_the_problem(head_dir: Path, tmp_path: Path):
    missing = _copy_head(
        head_dir, tmp_path / "missing", edit_tensors=lambda t: t.pop("midlayer.hidden_norm.weight")
    )
    with pytest.raises(ValueError, match=r"missing midlayer\.hidden_norm\.weight \[64\]"):
        load_head_weights(missing)

    def reshape(tensors):
        tensors["midlayer.self_attn.q_proj.weight"] = tensors["midlayer.self_attn.q_proj.weight"][
            :, :64
        ].copy()

    wrong = _copy_head(head_dir, tmp_path / "wrong", edit_tensors=reshape)
    with pytest.raises(ValueError, match=r"q_proj\.weight is \[64, 64\], expected \[64, 128\]"):
        load_head_weights(wrong)

    def collide(tensors):
        tensors["d2t"][1] = tensors["d2t"][0] - 1  # draft ids 0 and 1 -> one target id

    with pytest.raises(ValueError, match="two draft ids to one target id"):
        load_head_weights(_copy_head(head_dir, tmp_path / "collide", edit_tensors=collide))

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text((head_dir / "config.json").read_text())
    with pytest.raises(ValueError, match=r"no model\.safetensors"):
        load_head_weights(empty)


def test_config_errors_name_the_problem(head_dir: Path, tmp_path: Path):
    config = Eagle3HeadConfig.from_folder(head_dir)
    with pytest.raises(
        ValueError, match="vocab_size is 500, the head maps draft ids into a vocabulary of 384"
    ):
        config.check_target({**TARGET, "vocab_size": 500})
    with pytest.raises(ValueError, match="hidden_size is 128"):
        config.check_target({**TARGET, "hidden_size": 128})
    with pytest.raises(ValueError, match="name layers past the target's 1"):
        config.check_target({**TARGET, "num_hidden_layers": 1})
    assert config.check_target(TARGET) == (0, 1, 2)

    data = json.loads((head_dir / "config.json").read_text())
    with pytest.raises(ValueError, match="missing rms_norm_eps"):
        Eagle3HeadConfig.from_dict({k: v for k, v in data.items() if k != "rms_norm_eps"})
    with pytest.raises(ValueError, match="only one decoder layer"):
        Eagle3HeadConfig.from_dict({**data, "num_hidden_layers": 2})
    with pytest.raises(ValueError, match="rope scaling 'yarn' is not supported"):
        Eagle3HeadConfig.from_dict({**data, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    defaults = Eagle3HeadConfig.from_dict({k: v for k, v in data.items() if k != "eagle_config"})
    assert defaults.aux_layer_ids is None and defaults.tap_layers(32) == (2, 16, 29)


def test_torch_bin_and_sharded_safetensors_read_the_same(head_dir: Path, tmp_path: Path, monkeypatch):
    from safetensors.numpy import save_file

    expected = load_head_weights(head_dir)
    tensors = read_safetensors(head_dir / "model.safetensors")
    config_text = (head_dir / "config.json").read_text()

    as_bin = tmp_path / "bin"
    as_bin.mkdir()
    (as_bin / "config.json").write_text(config_text)
    torch.save(
        {name: torch.from_numpy(array) for name, array in tensors.items()}, as_bin / "pytorch_model.bin"
    )
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text(config_text)
    names = sorted(tensors)
    weight_map = {}
    for shard, part in (("a.safetensors", names[::2]), ("b.safetensors", names[1::2])):
        save_file({name: tensors[name] for name in part}, str(sharded / shard))
        weight_map.update(dict.fromkeys(part, shard))
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    config = Eagle3HeadConfig.from_folder(head_dir)
    from_bin = check_head_tensors(read_source_tensors(as_bin), config)  # prepare's reader: torch
    for loaded in (from_bin, load_head_weights(sharded)):
        assert sorted(loaded.tensors) == sorted(expected.tensors)
        assert all(np.array_equal(loaded.tensors[name], expected.tensors[name]) for name in expected.tensors)
        assert np.array_equal(loaded.d2t, expected.d2t) and np.array_equal(loaded.t2d, expected.t2d)

    # The runtime reads no torch pickle, torch installed or not: prepare converts it once.
    with pytest.raises(ValueError, match="torch pickle, which xpuspec reads only when preparing"):
        load_head_weights(as_bin)
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # as on a runtime-only install
    with pytest.raises(PrepareError, match="torch pickle and torch is not installed"):
        read_source_tensors(as_bin)


def test_f16_weights_stay_close(head_dir: Path, reference, table: np.ndarray):
    config = Eagle3HeadConfig.from_folder(head_dir)
    weights = load_head_weights(head_dir, config)
    head = Eagle3Head(config, weights, table_embedding_model(table), properties=F32, weight_type="f16")
    _, fused = _fused(reference, 4, seed=8)
    (result,) = head.run([HeadStep("h", [1, 2, 3, 4], fused, logits_rows=range(4))])
    logits_ref, _ = Reference(reference[0], table).run([1, 2, 3, 4], fused)
    np.testing.assert_allclose(result.logits, logits_ref, atol=2e-2)


def test_int8_weights_are_int8_in_the_graph_and_stay_close(head_dir: Path, reference, table: np.ndarray):
    config = Eagle3HeadConfig.from_folder(head_dir)
    weights = load_head_weights(head_dir, config)
    model = graph.build_head_model(config, weights, "int8")
    int8_names = {
        node.get_friendly_name()
        for node in model.get_ops()
        if node.get_type_name() == "Constant" and node.get_output_element_type(0) == ov.Type.i8
    }
    # Every matrix of the layer and the LM head; norms stay f32.
    assert "lm_head.weight" in int8_names and "midlayer.mlp.down_proj.weight" in int8_names
    assert not any("norm" in name for name in int8_names)

    head = Eagle3Head(config, weights, table_embedding_model(table), properties=F32, weight_type="int8")
    _, fused = _fused(reference, 4, seed=8)
    (result,) = head.run([HeadStep("h", [1, 2, 3, 4], fused, logits_rows=range(4))])
    logits_ref, _ = Reference(reference[0], table).run([1, 2, 3, 4], fused)
    scale = np.abs(logits_ref).max()
    assert 0 < np.abs(result.logits - logits_ref).max() < 0.05 * scale  # quantised, and close


def test_int8_weight_rounds_each_row_to_its_own_step():
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((5, 7)).astype(np.float32)
    weight[2] = 0.0  # an all-zero row must stay zero, not divide by zero
    weight[4] *= 1000.0  # rows of very different magnitudes get their own scales
    model = ov.Model([ov.opset13.result(graph.int8_weight(weight, "w"))], [], "w")
    (dequantised,) = ov.Core().compile_model(model, "CPU", F32)({}).values()
    quantised, scale = graph.quantise_int8_rows(weight)
    assert quantised.dtype == np.int8 and np.array_equal(dequantised, quantised * scale)
    step = np.abs(weight).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(dequantised - weight) <= step / 2 + 1e-6 * np.abs(weight))
    assert np.array_equal(dequantised[2], np.zeros(7, np.float32))
    with pytest.raises(ValueError, match=r"matrices \[out, in\]"):
        graph.int8_weight(np.ones(3), "bias")


def _step_by_step_chain(head: Eagle3Head, sequence_id: str, step: HeadStep, count: int):
    """Greedy drafts as the proposer's chain loop makes them: run, argmax, feed back; cut back after."""
    start = head.kv_length(sequence_id)
    (result,) = head.run([step])
    position = int(step.positions[-1]) if step.positions is not None else start + len(step.token_ids) - 1
    drafted, sums = [], []
    for k in range(count):
        drafted.append(int(head.target_ids[int(np.argmax(result.logits[0]))]))
        sums.append(float(result.logits[0].sum()))
        if k < count - 1:
            (result,) = head.run(
                [HeadStep(sequence_id, drafted[-1:], result.hidden[-1:], positions=[position + k + 1])]
            )
    head.truncate(sequence_id, start + len(step.token_ids))
    return drafted, np.array(sums)


@pytest.mark.parametrize("count", [1, 2, 4])
def test_a_greedy_chain_in_one_call_drafts_what_the_step_by_step_chain_does(
    head: Eagle3Head, reference, count: int
):
    """The rollout graph against the proposer's pass-by-pass loop on the same cache, over rounds that
    read the earlier rounds' slots and cross a cache grain (a second static compile)."""
    head.compile_chains_inline = True
    _, fused = _fused(reference, CACHE_GRAIN + 40, seed=11)
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, TARGET["vocab_size"], size=fused.shape[0])
    done = CACHE_GRAIN - 2 * count - 2
    for sequence_id in ("chain", "loop"):  # the same prompt in two sequences: one per way of drafting
        head.run([HeadStep(sequence_id, tokens[:done], fused[:done])])
    for new in (count + 1, 1, count + 1, 1, count + 1):  # the last rounds cross the cache's first grain
        ids, rows = tokens[done : done + new], fused[done : done + new]
        chain, chain_sums = head.draft_greedy_chain(HeadStep("chain", ids, rows), count)
        loop, loop_sums = _step_by_step_chain(head, "loop", HeadStep("loop", ids, rows), count)
        assert chain.tolist() == loop
        np.testing.assert_allclose(chain_sums, loop_sums, rtol=1e-4, atol=1e-3)
        done += new
        assert head.kv_length("chain") == head.kv_length("loop") == done
        chain_cache, loop_cache = head._caches["chain"], head._caches["loop"]
        np.testing.assert_allclose(chain_cache.key[0, :, :done], loop_cache.key[0, :, :done], atol=1e-5)
    assert head._caches["chain"].capacity == 2 * CACHE_GRAIN
    # NaN in the carried state reaches every pass's logits: the caller sees it in the sums.
    poisoned = np.full((1, TARGET["hidden_size"]), np.nan, np.float32)
    _, sums = head.draft_greedy_chain(HeadStep("chain", [1], poisoned), count)
    assert not np.isfinite(sums).any()


def test_a_greedy_chain_compiles_in_the_background_and_drafts_once_ready(head: Eagle3Head):
    hidden = np.zeros((2, TARGET["hidden_size"]), np.float32)
    head.run([HeadStep("a", [1, 2, 3], np.zeros((3, TARGET["hidden_size"]), np.float32))])
    assert head.draft_greedy_chain(HeadStep("a", [4, 5], hidden), 3) is None  # compiling: pass by pass
    assert head.kv_length("a") == 3  # nothing ran
    assert len(head.chains.keys()) == 1
    head.chains.wait(timeout=120)
    token_ids, sums = head.draft_greedy_chain(HeadStep("a", [4, 5], hidden), 3)
    assert token_ids.shape == (3,) and np.isfinite(sums).all() and head.kv_length("a") == 5
    # A first pass wider than count + 1 (the round after a prefill) is drafted pass by pass.
    wide = np.zeros((5, TARGET["hidden_size"]), np.float32)
    assert head.draft_greedy_chain(HeadStep("a", [1] * 5, wide), 3) is None


def test_a_greedy_chain_takes_only_a_default_pass(head: Eagle3Head):
    hidden = np.zeros((2, TARGET["hidden_size"]), np.float32)
    with pytest.raises(ValueError, match="default mask and the last position"):
        head.draft_greedy_chain(HeadStep("a", [1, 2], hidden, logits_rows=[0, 1]), 2)
    with pytest.raises(ValueError, match="at least one token"):
        head.draft_greedy_chain(HeadStep("a", [1, 2], hidden), 0)


def test_a_chain_that_does_not_compile_leaves_drafting_pass_by_pass(head: Eagle3Head, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("injected compile failure")

    monkeypatch.setattr(graph, "build_greedy_rollout_model", broken)
    hidden = np.zeros((2, TARGET["hidden_size"]), np.float32)
    for inline in (True, False):
        head.compile_chains_inline = inline
        head.chains.clear()
        assert head.draft_greedy_chain(HeadStep("a", [1, 2], hidden), 2) is None
        head.chains.wait(timeout=60)
        with caplog.at_level("WARNING"):
            assert head.draft_greedy_chain(HeadStep("a", [1, 2], hidden), 2) is None
            assert head.draft_greedy_chain(HeadStep("a", [1, 2], hidden), 2) is None
        assert caplog.text.count("injected compile failure") == 1  # said once per chain
        caplog.clear()
    assert head.kv_length("a") == 0  # nothing ran


def test_prepared_chains_are_ready_for_every_capacity_a_context_reaches(head: Eagle3Head):
    head.prepare_chains(3, CACHE_GRAIN + 1)  # two capacities: 256 and 512
    assert sorted(head.chains.keys()) == [(3, CACHE_GRAIN), (3, 2 * CACHE_GRAIN)]
    assert all(head.chains.request(*key) is not None for key in head.chains.keys())  # compiled
    assert not head.compile_chains_inline  # left as it was
    hidden = np.zeros((2, TARGET["hidden_size"]), np.float32)
    assert head.draft_greedy_chain(HeadStep("a", [1, 2], hidden), 3) is not None  # no background wait
