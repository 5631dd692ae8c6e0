"""The demo-pair recipe: fast mode end to end, the full-mode sizes, and the acceptance measures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from research.training.acceptance import iid_tokens_per_step, measure_acceptance  # noqa: E402
from research.training.data import HELDOUT_FILES, split_corpus  # noqa: E402
from research.training.recipe import FULL_RECIPE, PhaseSchedule, count_parameters, llama_config  # noqa: E402
from research.training.train import main  # noqa: E402
from research.training.trainer import learning_rate_at  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fast_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out_dir = tmp_path_factory.mktemp("demo_fast")
    assert main(["--mode", "fast", "--out", str(out_dir), "--seed", "0"]) == 0
    return out_dir


def test_fast_mode_writes_every_output(fast_run: Path) -> None:
    for name in ("target", "draft"):
        for file_name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
            assert (fast_run / name / file_name).is_file(), f"{name}/{file_name} missing"
    metrics = json.loads((fast_run / "metrics.json").read_text())
    assert metrics["mode"] == "fast"
    assert metrics["parameters"]["target"] > metrics["parameters"]["draft"] > 0
    acceptance = metrics["acceptance"]
    assert 0.0 <= acceptance["greedy_match_rate"] <= 1.0
    assert 1.0 <= acceptance["simulated_tokens_per_step"] <= acceptance["num_draft_tokens"] + 1
    for model_name in ("target", "draft"):
        assert metrics["heldout"][model_name]["perplexity"] > 1.0


def test_both_models_load_and_generate_with_eos(fast_run: Path) -> None:
    for name in ("target", "draft"):
        model = transformers.AutoModelForCausalLM.from_pretrained(fast_run / name)
        assert isinstance(model, transformers.LlamaForCausalLM)
        tokenizer = transformers.AutoTokenizer.from_pretrained(fast_run / name)
        assert model.generation_config.eos_token_id == tokenizer.eos_token_id
        assert model.config.vocab_size == len(tokenizer)
        prompt = tokenizer("def add(a, b):", return_tensors="pt")
        output = model.generate(**prompt, max_new_tokens=3, do_sample=False)
        assert output.shape[1] == prompt["input_ids"].shape[1] + 3


def test_target_and_draft_share_one_tokenizer(fast_run: Path) -> None:
    target_tokenizer = transformers.AutoTokenizer.from_pretrained(fast_run / "target")
    draft_tokenizer = transformers.AutoTokenizer.from_pretrained(fast_run / "draft")
    assert (fast_run / "target" / "tokenizer.json").read_bytes() == (
        fast_run / "draft" / "tokenizer.json"
    ).read_bytes()
    assert target_tokenizer.get_vocab() == draft_tokenizer.get_vocab()
    assert target_tokenizer.eos_token == "<|endoftext|>"
    assert target_tokenizer.bos_token == "<|bos|>"
    assert target_tokenizer.pad_token == "<|pad|>"
    chat = target_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|user|>\nhi<|end|>\n<|assistant|>\n"
    text = "import os\n\n    return x  # done\n"
    assert target_tokenizer.decode(target_tokenizer(text)["input_ids"]) == text


def test_heldout_files_are_never_trained_on(fast_run: Path) -> None:
    heldout = json.loads((fast_run / "heldout.json").read_text())
    train_files = json.loads((fast_run / "train_files.json").read_text())
    assert heldout and train_files
    assert set(heldout) <= set(HELDOUT_FILES)
    assert not set(heldout) & set(train_files)


def test_corpus_split_is_deterministic_and_skips_test_suites() -> None:
    first, second = split_corpus(seed=0), split_corpus(seed=0)
    assert first.train_files == second.train_files
    assert split_corpus(seed=1).train_files != first.train_files
    assert not set(first.heldout_files) & set(first.train_files)
    for name in first.train_files:
        parts = Path(name).parts
        assert not {"test", "tests", "idlelib", "site-packages"} & set(parts), name


def test_full_mode_sizes_fall_in_the_intended_ranges() -> None:
    # The BPE trainer puts the special tokens first: eos, bos, pad.
    special_ids = {"eos": 0, "bos": 1, "pad": 2}
    target = llama_config(
        FULL_RECIPE.target, FULL_RECIPE.vocab_size, FULL_RECIPE.sequence_length, special_ids
    )
    draft = llama_config(FULL_RECIPE.draft, FULL_RECIPE.vocab_size, FULL_RECIPE.sequence_length, special_ids)
    assert 10_000_000 <= count_parameters(target) <= 25_000_000
    assert 1_000_000 <= count_parameters(draft) <= 3_000_000


def test_iid_formula() -> None:
    assert iid_tokens_per_step(0.0, 4) == 1.0
    assert iid_tokens_per_step(1.0, 4) == 5.0
    assert iid_tokens_per_step(0.5, 4) == pytest.approx(1.9375)


def test_learning_rate_warms_up_then_decays_to_the_floor() -> None:
    schedule = PhaseSchedule(
        steps=100, batch_size=1, peak_learning_rate=1.0, warmup_steps=10, budget_fraction=1.0
    )
    assert learning_rate_at(0.0, schedule) == 0.0
    assert learning_rate_at(0.1, schedule) == pytest.approx(1.0)
    assert learning_rate_at(1.0, schedule) == pytest.approx(schedule.min_learning_rate_ratio)
    assert learning_rate_at(0.3, schedule) > learning_rate_at(0.6, schedule)


def test_a_draft_identical_to_the_target_is_always_accepted(fast_run: Path) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(fast_run / "target").eval()
    with torch.no_grad():
        # A decisive argmax, so float noise between batched and cached passes cannot flip ties.
        model.lm_head.weight.mul_(8.0)
    generator = torch.Generator().manual_seed(0)
    contexts = torch.randint(3, model.config.vocab_size, (2, 12), generator=generator)
    report = measure_acceptance(
        model, model, contexts, generated_tokens=10, num_draft_tokens=4, eos_token_id=-1
    )
    assert report.greedy_match_rate == 1.0
    # 10 tokens in steps of gamma + 1 = 5: exactly 2 steps per context.
    assert report.simulated_steps == 4
    assert report.simulated_tokens_per_step == 5.0
    assert report.simulated_accepted_drafts_per_step == 4.0
