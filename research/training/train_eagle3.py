"""Train an EAGLE-3 head for the default target (SmolLM2-135M-Instruct) on CPU, from its own answers.

    python -m research.training.train_eagle3 --data DIR --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out OUT \
        [--feature-tokens 300000] [--train-minutes 40] [--draft-vocab 8192] [--ttt-steps 4]

``DIR`` is a ``train_smollm2`` data folder: ``target_ir/`` (the converted target), ``answers.jsonl`` and
``heldout.jsonl`` (the target's greedy answers, ``smollm2_data``). Steps, each resumable:

1. features (:mod:`research.training.eagle3_features`): one prefill per answer on the OpenVINO target with
   hidden-state taps at EAGLE-3's layers (``(2, n // 2, n - 3)``: 2, 15, 27 of SmolLM2's 30), storing the
   tapped states (f16) and the target's argmax at every position in OUT/features/{train,heldout};
2. the draft vocabulary: the ``--draft-vocab`` most frequent trained labels (``d2t``/``t2d``);
3. training (:mod:`research.training.eagle3_ttt`): the torch head (:mod:`research.training.eagle3_torch`)
   with the target's frozen embedding, the training-time test over ``--ttt-steps`` rollout steps, AdamW on a
   cosine schedule within ``--train-minutes``;
4. OUT/head: the head in the published layout (f16, ``config.json`` + ``model.safetensors``), saved
   atomically every few minutes, and OUT/metrics.json: the recipe, data sizes, loss history and held-out
   greedy acceptance (the same quantities as ``train_smollm2``'s, so the two drafters compare).

Size: fc ``3h x h``, one decoder layer and ``lm_head`` ``h x draft_vocab``; at SmolLM2's h = 576 with
the target's intermediate size (1536) and 8192 draft tokens, 9.8M parameters, 19.7 MB in f16.

A GGUF-converted IR has no ``config.json``: ``--gguf`` gives the target's shape, written to
OUT/target_config.json (the OpenVINO runtime's ``Eagle3Head.from_folders`` wants it as the target
folder's ``config.json``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from research.training.eagle3_features import (
    FEATURE_PROPERTIES,
    choose_draft_vocabulary,
    count_ir_layers,
    embedding_table,
    extract_features,
    label_counts,
    read_features,
    target_config,
)
from research.training.eagle3_torch import Eagle3Head, save_head
from research.training.eagle3_ttt import collate, heldout_acceptance, ttt_loss
from research.training.smollm2_data import read_records
from research.training.train_smollm2 import batches, swap_in
from xpuspec.spec_decode.eagle3.config import Eagle3HeadConfig, eagle3_default_layers
from xpuspec.spec_decode.eagle3.weights import SAFETENSORS_FILE

logger = logging.getLogger(__name__)

SHIPPED_LIMIT_BYTES = 20_000_000


def head_config(
    target: dict[str, Any],
    draft_vocab: int,
    layers: tuple[int, ...],
    num_layers: int,
    intermediate: int | None = None,
) -> Eagle3HeadConfig:
    """A head shaped like one layer of the target (as published heads are), over ``draft_vocab`` tokens.

    The tap layers are written only when they differ from EAGLE-3's defaults: engines agree on the
    defaults but read explicit ids differently (see :mod:`xpuspec.executor.hidden_taps`).
    """
    heads = int(target["num_attention_heads"])
    default = num_layers >= 6 and tuple(layers) == eagle3_default_layers(num_layers)
    return Eagle3HeadConfig(
        hidden_size=int(target["hidden_size"]),
        num_attention_heads=heads,
        num_key_value_heads=int(target.get("num_key_value_heads") or heads),
        head_dim=int(target.get("head_dim") or int(target["hidden_size"]) // heads),
        intermediate_size=int(intermediate or target["intermediate_size"]),
        rms_norm_eps=float(target.get("rms_norm_eps", 1e-6)),
        rope_theta=float(target.get("rope_theta", 10000.0)),
        vocab_size=int(target["vocab_size"]),
        draft_vocab_size=draft_vocab,
        aux_layer_ids=None if default else tuple(layers),
        max_position_embeddings=int(target.get("max_position_embeddings") or 2048),
    )


def build_head(
    config: Eagle3HeadConfig, table: torch.Tensor, target_ids: np.ndarray, seed: int
) -> Eagle3Head:
    """A fresh head whose ``lm_head`` rows start as the target's embeddings of the draft tokens.

    SmolLM2 ties its output layer to this table, so the rows start with the target's own geometry of
    the vocabulary (similar tokens, similar rows) instead of noise.
    """
    torch.manual_seed(seed)
    head = Eagle3Head(config)
    with torch.no_grad():
        head.set_draft_vocabulary(target_ids)
        rows = table[torch.from_numpy(np.asarray(target_ids, np.int64))]  # [draft_vocab, hidden]
        # The final norm's output is ~unit per feature: scale the rows to logits of spread ~2.
        head.lm_head.weight.copy_(rows * (2.0 / (rows.norm(dim=-1).mean() + 1e-6)))
    return head


def save_checkpoint(head: Eagle3Head, config: Eagle3HeadConfig, out_dir: Path) -> int:
    """Write the f16 head next to ``out_dir`` and swap it in; return the weight file's size in bytes."""
    scratch = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(scratch, ignore_errors=True)
    save_head(head, config, scratch, dtype=torch.float16)
    swap_in(scratch, out_dir)
    return (out_dir / SAFETENSORS_FILE).stat().st_size


def recipe_command(args: argparse.Namespace) -> str:
    parts = ["python -m research.training.train_eagle3"]
    for key, value in vars(args).items():
        if value is None or value is False:
            continue
        flag = f"--{key.replace('_', '-')}"
        if value is True:
            parts.append(flag)
        elif isinstance(value, list | tuple):
            parts.append(f"{flag} {' '.join(str(v) for v in value)}")
        else:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


def prepare_features(args: argparse.Namespace, layers: tuple[int, ...]) -> dict[str, Any]:
    """Extract (or resume) the held-out and training features; return their statistics."""
    # The target shares the machine with training jobs: it gets --threads cores, no more.
    properties = {**FEATURE_PROPERTIES[args.feature_properties], "INFERENCE_NUM_THREADS": args.threads}
    features = args.out / "features"
    heldout = extract_features(
        args.target_ir,
        read_records(args.heldout),
        features / "heldout",
        layers,
        max_len=args.max_len,
        properties=properties,
        tokens_per_pass=args.tokens_per_pass,
    )
    train = extract_features(
        args.target_ir,
        read_records(args.answers),
        features / "train",
        layers,
        max_len=args.max_len,
        token_budget=args.feature_tokens,
        properties=properties,
        tokens_per_pass=args.tokens_per_pass,
    )
    logger.info("training features: %s", train.to_dict())
    return {"train": train.to_dict(), "heldout": heldout.to_dict()}


def train(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    args.target_ir = args.target_ir or args.data / "target_ir"
    args.answers = args.answers or args.data / "answers.jsonl"
    args.heldout = args.heldout or args.data / "heldout.jsonl"
    target = target_config(args.target_ir, args.gguf)
    num_layers = count_ir_layers(args.target_ir)
    if int(target.get("num_hidden_layers", num_layers)) != num_layers:
        raise ValueError(
            f"the target config says {target['num_hidden_layers']} layers, the IR has {num_layers}"
        )
    layers = tuple(args.tap_layers) if args.tap_layers else eagle3_default_layers(num_layers)
    (args.out / "target_config.json").write_text(json.dumps(target, indent=2) + "\n")
    feature_info = prepare_features(args, layers)
    if args.features_only:
        return {"features": feature_info}

    sequences = read_features(args.out / "features" / "train")
    heldout = read_features(args.out / "features" / "heldout")
    counts = label_counts(sequences, int(target["vocab_size"]), args.train_prompt)
    target_ids = choose_draft_vocabulary(counts, args.draft_vocab)
    coverage = float(counts[target_ids].sum() / max(1, counts.sum()))
    logger.info(
        "draft vocabulary of %d covers %.2f%% of the trained labels", args.draft_vocab, 100 * coverage
    )
    config = head_config(target, args.draft_vocab, layers, num_layers, args.intermediate)
    table = torch.from_numpy(
        embedding_table(args.target_ir, properties={"INFERENCE_NUM_THREADS": args.threads})
    )  # [vocab, hidden], frozen
    if table.shape != (config.vocab_size, config.hidden_size):
        raise ValueError(f"the IR's embedding is {list(table.shape)}, the target config's shape differs")
    head = build_head(config, table, target_ids, args.seed)
    head.train()
    parameters = sum(p.numel() for p in head.parameters())
    logger.info("head: %.2fM parameters, tap layers %s of %d", parameters / 1e6, layers, num_layers)
    target_to_draft = torch.full((config.vocab_size,), -1, dtype=torch.long)
    target_to_draft[torch.from_numpy(target_ids)] = torch.arange(config.draft_vocab_size)

    optimizer = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    stream = batches(sequences, args.batch_tokens, random.Random(args.seed))
    evaluations = [{"step": 0, "seconds": 0, **heldout_acceptance(head, table, heldout, args.gamma)}]
    logger.info("held-out before training: %s", evaluations[0])
    train_start = time.monotonic()
    last_save = last_eval = train_start
    budget = args.train_minutes * 60
    step, tokens_seen = 0, 0
    window: list[tuple[float, list[float], list[float]]] = []
    history: list[dict[str, Any]] = []
    size = 0
    while True:
        elapsed = time.monotonic() - train_start
        progress = elapsed / budget
        if args.train_steps:  # the schedule ends with whichever budget runs out first
            progress = max(progress, step / args.train_steps)
        if progress >= 1.0:
            break
        warm = min(1.0, (step + 1) / args.warmup_steps)
        lr = args.lr * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = collate(next(stream), args.train_prompt)
        loss, step_losses, step_accuracies = ttt_loss(head, table, batch, args.ttt_steps, target_to_draft)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        optimizer.step()
        window.append((float(loss.detach()), step_losses, step_accuracies))
        tokens_seen += int(batch.ids.ne(0).sum())
        step += 1
        if step % args.log_steps == 0:
            entry = {
                "step": step,
                "seconds": round(elapsed),
                "loss": float(np.mean([w[0] for w in window])),
                "step_ce": [round(float(v), 4) for v in np.nanmean([w[1] for w in window], axis=0)],
                "step_accuracy": [round(float(v), 4) for v in np.nanmean([w[2] for w in window], axis=0)],
            }
            history.append(entry)
            window = []
            logger.info("%s  lr %.2e  %.0f tokens/s", entry, lr, tokens_seen / max(1.0, elapsed))
        if time.monotonic() - last_eval > args.eval_minutes * 60:
            result = heldout_acceptance(head, table, heldout, args.gamma)
            evaluations.append({"step": step, "seconds": round(elapsed), **result})
            logger.info("held-out at step %d: %s", step, result)
            last_eval = time.monotonic()
        if time.monotonic() - last_save > args.save_minutes * 60:
            size = save_checkpoint(head, config, args.out / "head")
            last_save = time.monotonic()
    train_seconds = time.monotonic() - train_start
    size = save_checkpoint(head, config, args.out / "head")
    if size > SHIPPED_LIMIT_BYTES:
        logger.warning("the head is %d bytes, over the %d shipped limit", size, SHIPPED_LIMIT_BYTES)
    final = heldout_acceptance(head, table, heldout, args.gamma)
    evaluations.append({"step": step, "seconds": round(train_seconds), **final})
    metrics = {
        "recipe": recipe_command(args),
        "argv": sys.argv,
        "target": str(args.gguf.name if args.gguf else args.target_ir),
        "tap_layers": list(layers),
        "target_layers": num_layers,
        "head": {
            **config.to_dict(),
            "parameters": parameters,
            "safetensors_bytes": size,
            "dtype": "float16",
        },
        "draft_vocabulary": {"size": args.draft_vocab, "label_coverage": round(coverage, 5)},
        "features": feature_info,
        "training_records": len(sequences),
        "training_tokens": sum(len(s) for s in sequences),
        "tokens_trained": tokens_seen,
        "ttt_steps": args.ttt_steps,
        "steps": step,
        "train_seconds": round(train_seconds),
        "heldout_instructions": len(heldout),
        "heldout": final,
        "heldout_history": evaluations,
        "loss_history": history,
    }
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    logger.info("held-out after training: %s", final)
    return metrics


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--data", type=Path, default=Path("."), help="folder of target_ir/, answers.jsonl, heldout.jsonl"
    )
    p.add_argument("--target-ir", type=Path, help="the target's IR (default DATA/target_ir)")
    p.add_argument("--answers", type=Path, help="training answers (default DATA/answers.jsonl)")
    p.add_argument("--heldout", type=Path, help="held-out answers (default DATA/heldout.jsonl)")
    p.add_argument("--gguf", type=Path, help="the target's GGUF: its shape, when the IR has no config.json")
    p.add_argument("--max-len", type=int, default=256, help="prompt + answer tokens kept per record")
    p.add_argument("--feature-tokens", type=int, default=300_000, help="stop extracting after this many")
    p.add_argument("--feature-properties", choices=sorted(FEATURE_PROPERTIES), default="fast")
    p.add_argument("--tokens-per-pass", type=int, default=1024, help="tokens per target prefill pass")
    p.add_argument("--tap-layers", type=int, nargs=3, help="target boundaries to tap (default EAGLE-3's)")
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--intermediate", type=int, help="the head's MLP width (default the target's)")
    p.add_argument("--ttt-steps", type=int, default=4, help="rollout steps of the training-time test")
    p.add_argument("--train-prompt", action="store_true", help="also train on prompt positions")
    p.add_argument("--train-minutes", type=float, default=40.0)
    p.add_argument("--train-steps", type=int, default=0, help="stop after this many steps (0: time only)")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--gamma", type=int, default=4, help="draft length of the held-out acceptance")
    p.add_argument("--eval-minutes", type=float, default=5.0)
    p.add_argument("--save-minutes", type=float, default=5.0)
    p.add_argument("--log-steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--features-only", action="store_true", help="extract the features, then stop")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    train(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
