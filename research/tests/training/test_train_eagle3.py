"""The EAGLE-3 recipe on a tiny random 4-layer Llama IR: features, draft vocabulary, the training-time
test against the OpenVINO runtime's step-by-step rollout, and a short training run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from research.training.eagle3_features import (  # noqa: E402
    choose_draft_vocabulary,
    count_ir_layers,
    embedding_table,
    extract_features,
    label_counts,
    read_features,
    vocabulary_maps,
)
from research.training.eagle3_torch import Eagle3Head as TorchHead  # noqa: E402
from research.training.eagle3_torch import random_head, save_head  # noqa: E402
from research.training.eagle3_ttt import collate, heldout_acceptance, rollout_logits, ttt_loss  # noqa: E402
from research.training.train_eagle3 import main  # noqa: E402
from tests.conftest import F32  # noqa: E402
from tests.support.tiny_checkpoints import make_tiny_checkpoint  # noqa: E402
from xpuspec.executor.eagle3_head import Eagle3Head  # noqa: E402
from xpuspec.spec_decode.eagle3.config import Eagle3HeadConfig  # noqa: E402
from xpuspec.spec_decode.eagle3.head import HeadStep  # noqa: E402
from xpuspec.spec_decode.eagle3.weights import load_head_weights  # noqa: E402

pytestmark = pytest.mark.slow

NUM_LAYERS = 4
TAPS = (1, 2, 3)  # EAGLE-3's defaults need >= 6 layers; the recipe writes explicit taps into the config
HIDDEN = 64


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A 4-layer random Llama, its IR, and a data folder of its greedy answers to random prompts."""
    from optimum.intel import OVModelForCausalLM
    from transformers import AutoModelForCausalLM

    from xpuspec.prepare.export import quiet_tracing

    torch.set_num_threads(1)
    work = tmp_path_factory.mktemp("eagle3-train")
    checkpoint = make_tiny_checkpoint(work / "checkpoint", "llama", num_layers=NUM_LAYERS)
    data = work / "data"
    ir = data / "target_ir"
    with quiet_tracing():
        exported = OVModelForCausalLM.from_pretrained(checkpoint, export=True, stateful=True, compile=False)
        exported.save_pretrained(ir)
        del exported  # its temporary export folder goes now, inside quiet_tracing
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    rng = np.random.default_rng(0)
    records = []
    for index in range(44):
        prompt = rng.integers(3, model.config.vocab_size, size=int(rng.integers(5, 12))).tolist()
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(24):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        records.append({"instruction": f"q{index}", "prompt_ids": prompt, "answer_ids": ids[len(prompt) :]})
    (data / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:40]))
    (data / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[40:]))
    return {"ir": ir, "data": data, "records": records, "vocab": model.config.vocab_size}


@pytest.fixture(scope="module")
def features(tiny: dict, tmp_path_factory: pytest.TempPathFactory) -> list:
    folder = tmp_path_factory.mktemp("features")
    extract_features(
        tiny["ir"], tiny["records"][:12], folder, TAPS, max_len=30, properties=F32, shard_tokens=100
    )
    return read_features(folder)


def test_features_hold_the_taps_and_the_targets_labels(tiny: dict, features: list, tmp_path: Path) -> None:
    assert count_ir_layers(tiny["ir"]) == NUM_LAYERS
    assert [s.record for s in features] == list(range(12))
    for sequence, record in zip(features, tiny["records"], strict=False):
        ids = (record["prompt_ids"] + record["answer_ids"])[:30]
        assert sequence.ids.tolist() == ids and sequence.prompt_length == len(record["prompt_ids"])
        assert sequence.features.shape == (len(ids), 3 * HIDDEN) and sequence.features.dtype == np.float16
        assert sequence.argmax.shape == (len(ids),)
        assert np.isfinite(sequence.features).all() and np.abs(sequence.features).max() > 0
        # The answers are the target's greedy tokens: its argmax at answer positions is the next token.
        answer = np.flatnonzero(sequence.label_mask())
        assert answer[0] == sequence.prompt_length - 1 and answer[-1] == len(ids) - 2
        assert (sequence.argmax[answer] == sequence.ids[answer + 1]).mean() >= 0.95

    # Resumable: a second run adds nothing; a token budget stops early and resumes past it later.
    folder = tmp_path / "budget"
    stats = extract_features(tiny["ir"], tiny["records"][:12], folder, TAPS, max_len=30, token_budget=50)
    assert 50 <= stats.tokens < 50 + 30 and stats.records < 12
    again = extract_features(tiny["ir"], tiny["records"][:12], folder, TAPS, max_len=30, token_budget=50)
    assert again.tokens == stats.tokens
    more = extract_features(tiny["ir"], tiny["records"][:12], folder, TAPS, max_len=30, token_budget=120)
    assert [s.record for s in read_features(folder)] == list(range(more.records))


def test_the_draft_vocabulary_maps_are_consistent(tiny: dict, features: list, tmp_path: Path) -> None:
    vocab = tiny["vocab"]
    counts = label_counts(features, vocab)
    assert counts.sum() == sum(int(s.label_mask().sum()) for s in features)
    target_ids = choose_draft_vocabulary(counts, 32)
    assert np.all(np.diff(target_ids) > 0)  # increasing, as EAGLE builds d2t
    assert int(np.argmax(counts)) in target_ids
    assert counts[target_ids].min() >= np.delete(counts, target_ids).max()
    d2t, t2d = vocabulary_maps(target_ids, vocab)
    assert np.array_equal(np.arange(32) + d2t, target_ids) and t2d.sum() == 32 and t2d[target_ids].all()
    # More draft tokens than distinct labels: the rest are the lowest unseen ids.
    seen = int((counts > 0).sum())
    wide = choose_draft_vocabulary(counts, seen + 5)
    unseen = np.setdiff1d(wide, np.flatnonzero(counts))
    assert np.array_equal(unseen, np.setdiff1d(np.arange(vocab), np.flatnonzero(counts))[:5])
    # The torch head stores the same maps, and the published-layout loader accepts them.
    module, config = random_head(json.loads((tiny["ir"] / "config.json").read_text()), 32, aux_layer_ids=TAPS)
    module.set_draft_vocabulary(target_ids)
    assert np.array_equal(module.d2t.numpy(), d2t) and np.array_equal(module.t2d.numpy(), t2d)
    weights = load_head_weights(save_head(module, config, tmp_path / "head"))
    assert np.array_equal(weights.d2t, d2t) and np.array_equal(weights.t2d, t2d)


def test_the_training_rollout_is_what_the_openvino_runtime_computes(
    tiny: dict, features: list, tmp_path: Path
) -> None:
    """Step s at slot j of the batched training-time test == the runtime's catch-up over slots 0..j, then
    s one-token chain steps carrying the head's own state: same mask, positions and inputs."""
    target = json.loads((tiny["ir"] / "config.json").read_text())
    module, config = random_head(target, 48, aux_layer_ids=TAPS, seed=3)
    with torch.no_grad():  # a larger fc makes the fused states matter against the embeddings
        module.fc.weight.mul_(4.0)
    runtime = Eagle3Head.from_folders(
        save_head(module, config, tmp_path / "head"), tiny["ir"], properties=F32
    )
    table = torch.from_numpy(embedding_table(tiny["ir"]))
    assert np.allclose(table[:5].numpy(), runtime.embed(np.arange(5)), atol=1e-6)
    steps = 4
    sequences = features[:2]
    batch = collate(sequences)  # two rows of different lengths: padding must not leak in
    with torch.no_grad():
        logits = rollout_logits(module, table, batch.features, batch.ids, steps).numpy()  # [s, b, L, draft]
    for row, sequence in enumerate(sequences):
        length = len(sequence)
        fused = runtime.fuse(sequence.features.astype(np.float32))  # [L, hidden]
        for slot in (0, 3, length // 2, length - 2 - steps):
            name = f"{row}-{slot}"
            result = runtime.run(
                [HeadStep(name, sequence.ids[1 : slot + 2], fused[: slot + 1], logits_rows=[slot])]
            )[0]
            np.testing.assert_allclose(result.logits[0], logits[0, row, slot], rtol=1e-4, atol=1e-3)
            for step in range(1, steps):
                token = sequence.ids[slot + 1 + step]
                result = runtime.run([HeadStep(name, [token], result.hidden[-1:])])[0]
                np.testing.assert_allclose(result.logits[0], logits[step, row, slot], rtol=1e-4, atol=1e-3)
            runtime.release(name)
    # The steps differ (a mask or position slip would make later steps copy earlier ones).
    assert np.abs(logits[1] - logits[0]).max() > 1e-2

    # The loss reads the labels of the right slots: at step s slot j, the argmax at j + 1 + s.
    target_to_draft = torch.full((config.vocab_size,), -1, dtype=torch.long)
    target_to_draft[torch.arange(48) + module.d2t] = torch.arange(48)
    _, losses, _ = ttt_loss(module, table, batch, steps, target_to_draft)
    labels = batch.labels[0, 2:]  # step 1, row 0
    draft = target_to_draft[labels.clamp(min=0)]
    valid = (labels >= 0) & (draft >= 0)
    manual = torch.nn.functional.cross_entropy(
        torch.from_numpy(logits[1, 0, : labels.shape[0]])[valid], draft[valid], reduction="sum"
    )
    labels1 = batch.labels[1, 2:]
    draft1 = target_to_draft[labels1.clamp(min=0)]
    valid1 = (labels1 >= 0) & (draft1 >= 0)
    manual += torch.nn.functional.cross_entropy(
        torch.from_numpy(logits[1, 1, : labels1.shape[0]])[valid1], draft1[valid1], reduction="sum"
    )
    assert losses[1] == pytest.approx(float(manual) / int(valid.sum() + valid1.sum()), rel=1e-4)


def test_a_short_training_run_learns_and_writes_a_loadable_head(tiny: dict, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [
        "--data", str(tiny["data"]), "--out", str(out), "--max-len", "40", "--feature-properties", "exact",
        "--tap-layers", *map(str, TAPS), "--draft-vocab", "96", "--ttt-steps", "3", "--train-steps", "150",
        "--train-minutes", "10", "--lr", "3e-3", "--warmup-steps", "10", "--batch-tokens", "256",
        "--log-steps", "10", "--threads", "1",
    ]  # fmt: skip
    assert main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["recipe"].startswith("python -m research.training.train_eagle3 ")
    assert "--ttt-steps 3" in metrics["recipe"] and "--tap-layers 1 2 3" in metrics["recipe"]
    assert metrics["steps"] == 150 and metrics["training_records"] == 40
    assert metrics["features"]["train"]["answer_label_agreement"] >= 0.95
    history = metrics["loss_history"]
    assert len(history) == 15 and len(history[0]["step_ce"]) == 3
    assert history[-1]["loss"] < 0.6 * history[0]["loss"]
    # 40 answers of a random target teach the training set, hardly the held-out answers: their loss falls
    # a little (the label frequencies); the acceptance of the training answers shows what was learned.
    before, after = metrics["heldout_history"][0], metrics["heldout"]
    assert after["loss"] < before["loss"] and after["positions"] == 4 * 24
    assert 0 <= after["greedy_acceptance"] <= after["accepted_per_round"] <= 4
    saved = TorchHead(Eagle3HeadConfig.from_folder(out / "head"))
    state = load_file(str(out / "head" / "model.safetensors"))
    assert state["fc.weight"].dtype == torch.float16
    saved.load_state_dict({name: t.float() if t.is_floating_point() else t for name, t in state.items()})
    table = torch.from_numpy(embedding_table(tiny["ir"]))
    learned = heldout_acceptance(saved, table, read_features(out / "features" / "train")[:10], gamma=4)
    assert learned["greedy_acceptance"] > 0.8 and learned["accepted_per_round"] > 2.0
    # The shipped layout: f16 weights, the explicit taps, loadable by the OpenVINO runtime.
    config = json.loads((out / "head" / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(TAPS)
    assert config["draft_vocab_size"] == 96 and metrics["head"]["safetensors_bytes"] > 0
    head = Eagle3Head.from_folders(out / "head", tiny["ir"], properties=F32)
    sequence = read_features(out / "features" / "heldout")[0]
    result = head.run(
        [HeadStep("s", sequence.ids[1:], head.fuse(sequence.features[:-1].astype(np.float32)))]
    )[0]
    assert result.logits.shape == (1, 96)
    # A resumed run reuses the stored features.
    stats = json.loads((out / "features" / "train" / "extraction.json").read_text())
    assert main([*argv[:-2], "--threads", "1", "--features-only"]) == 0
    assert json.loads((out / "features" / "train" / "extraction.json").read_text()) == stats
