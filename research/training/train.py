"""Train the embedded demo pair from scratch on the Python standard library, on CPU.

    python -m research.training.train --mode fast|full --out DIR [--seed 0] [--max-minutes M]

Writes DIR/target and DIR/draft (Hugging Face checkpoints sharing one tokenizer), DIR/heldout.json,
DIR/train_files.json and DIR/metrics.json. The target is a ~12.6M-parameter Llama trained on the
corpus; the draft, a ~1.5M-parameter Llama, is then distilled from it. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path

import torch

from research.training.acceptance import acceptance_contexts, loss_report, mean_loss, measure_acceptance
from research.training.data import (
    PackedBatches,
    encode_files,
    evaluation_windows,
    pack_stream,
    split_corpus,
    train_tokenizer,
)
from research.training.recipe import MODES, RECIPES, Recipe, count_parameters, llama_config
from research.training.trainer import causal_lm_loss, distillation_loss, train_phase

logger = logging.getLogger(__name__)

NUM_THREADS = 2


def _save_model(model, tokenizer, out_dir: Path) -> None:
    from transformers import GenerationConfig

    config = model.config
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=False,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _write_json(path: Path, payload: object) -> None:
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def run(recipe: Recipe, out_dir: Path, seed: int = 0, corpus_root: Path | None = None) -> dict:
    """Train, evaluate and save the pair into ``out_dir``; returns the metrics written to metrics.json."""
    from transformers import LlamaForCausalLM

    run_start = time.monotonic()
    deadline_base = None if recipe.max_minutes is None else run_start
    torch.set_num_threads(NUM_THREADS)
    torch.manual_seed(seed)
    out_dir.mkdir(parents=True, exist_ok=True)

    split = split_corpus(corpus_root, seed=seed, max_train_files=recipe.max_train_files)
    _write_json(out_dir / "heldout.json", list(split.heldout_files))
    _write_json(out_dir / "train_files.json", list(split.train_files))
    train_texts = [split.read(name) for name in split.train_files]
    heldout_texts = [split.read(name) for name in split.heldout_files]

    phase_start = time.monotonic()
    tokenizer = train_tokenizer(train_texts, recipe.vocab_size)
    special_ids = {
        "bos": tokenizer.bos_token_id,
        "eos": tokenizer.eos_token_id,
        "pad": tokenizer.pad_token_id,
    }
    train_stream = pack_stream(encode_files(tokenizer, train_texts), special_ids["eos"])  # [num_tokens]
    heldout_token_lists = encode_files(tokenizer, heldout_texts)
    heldout_stream = pack_stream(heldout_token_lists, special_ids["eos"])
    logger.info(
        "tokenizer: vocab %d; corpus %d training tokens (%.2f bytes/token), %d held-out tokens (%.1fs)",
        len(tokenizer),
        train_stream.numel(),
        sum(len(text.encode()) for text in train_texts) / train_stream.numel(),
        heldout_stream.numel(),
        time.monotonic() - phase_start,
    )

    def deadline(fraction: float) -> float | None:
        return None if deadline_base is None else deadline_base + fraction * recipe.max_minutes * 60

    vocab_size = len(tokenizer)
    target_config = llama_config(recipe.target, vocab_size, recipe.sequence_length, special_ids)
    draft_config = llama_config(recipe.draft, vocab_size, recipe.sequence_length, special_ids)
    torch.manual_seed(seed)
    target = LlamaForCausalLM(target_config)
    torch.manual_seed(seed + 1)
    draft = LlamaForCausalLM(draft_config)
    logger.info(
        "target %.2fM parameters, draft %.2fM parameters",
        count_parameters(target_config) / 1e6,
        count_parameters(draft_config) / 1e6,
    )

    target_batches = PackedBatches(train_stream, recipe.sequence_length, recipe.target_phase.batch_size, seed)
    target_result = train_phase(
        "target",
        target,
        iter(target_batches),
        causal_lm_loss(target),
        recipe.target_phase,
        deadline(recipe.target_phase.budget_fraction),
    )
    _save_model(target, tokenizer, out_dir / "target")

    target.requires_grad_(False)
    draft_batches = PackedBatches(
        train_stream, recipe.sequence_length, recipe.draft_phase.batch_size, seed + 1
    )
    draft_result = train_phase(
        "draft",
        draft,
        iter(draft_batches),
        distillation_loss(draft, target, recipe.distillation),
        recipe.draft_phase,
        deadline(recipe.draft_phase.budget_fraction),
    )
    _save_model(draft, tokenizer, out_dir / "draft")

    phase_start = time.monotonic()
    evaluation = recipe.evaluation
    windows = evaluation_windows(heldout_stream, recipe.sequence_length, evaluation.max_loss_tokens)
    heldout = {
        "target": loss_report(mean_loss(target, windows)),
        "draft": loss_report(mean_loss(draft, windows)),
    }
    heldout["tokens"] = sum(window.numel() - 1 for window in windows)
    logger.info(
        "held-out loss: target %.4f (ppl %.2f), draft %.4f (ppl %.2f)",
        heldout["target"]["loss"],
        heldout["target"]["perplexity"],
        heldout["draft"]["loss"],
        heldout["draft"]["perplexity"],
    )
    contexts = acceptance_contexts(
        heldout_token_lists, evaluation.contexts_per_file, evaluation.context_tokens
    )
    contexts = contexts[: evaluation.max_contexts]  # [num_contexts, context_tokens]
    acceptance = measure_acceptance(
        target, draft, contexts, evaluation.generated_tokens, evaluation.num_draft_tokens, special_ids["eos"]
    )
    logger.info(
        "acceptance: alpha %.3f, tokens/step gamma=%d: i.i.d. %.2f, simulated %.2f (%.1fs)",
        acceptance.greedy_match_rate,
        acceptance.num_draft_tokens,
        acceptance.iid_tokens_per_step,
        acceptance.simulated_tokens_per_step,
        time.monotonic() - phase_start,
    )

    metrics = {
        "mode": recipe.mode,
        "seed": seed,
        "torch_threads": NUM_THREADS,
        "python": sys.version.split()[0],
        "corpus": {
            "root": str(split.root),
            "train_files": len(split.train_files),
            "heldout_files": len(split.heldout_files),
            "train_tokens_available": train_stream.numel(),
            "heldout_tokens": heldout_stream.numel(),
        },
        "vocab_size": vocab_size,
        "sequence_length": recipe.sequence_length,
        "parameters": {"target": count_parameters(target_config), "draft": count_parameters(draft_config)},
        "shapes": {"target": dataclasses.asdict(recipe.target), "draft": dataclasses.asdict(recipe.draft)},
        "training": {
            "target": dataclasses.asdict(target_result),
            "draft": dataclasses.asdict(draft_result),
            "distillation": dataclasses.asdict(recipe.distillation),
        },
        "heldout": heldout,
        "acceptance": acceptance.to_json(),
        "wall_seconds": time.monotonic() - run_start,
    }
    _write_json(out_dir / "metrics.json", metrics)
    logger.info("done in %.1f min; outputs in %s", metrics["wall_seconds"] / 60, out_dir)
    return metrics


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m research.training.train", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--mode", choices=MODES, required=True, help="fast: seconds, toy sizes; full: the demo pair"
    )
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="wall-clock budget of the whole run; training phases stop early (and still save) to meet it "
        "(default: 30 in full mode, none in fast mode)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    recipe = RECIPES[args.mode]
    if args.max_minutes is not None:
        recipe = dataclasses.replace(recipe, max_minutes=args.max_minutes)
    run(recipe, args.out, seed=args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
