"""Train the shipped draft for SmolLM2-135M-Instruct on CPU, distilled from the target's greedy answers.

    python -m xpuspec.demo.train_smollm2 --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out DIR \
        [--data-minutes 22] [--train-minutes 35] [--layers 3] [--hidden 256]

Steps (each resumable: a cut run ships what it has):
1. convert the GGUF to OpenVINO IR (GenAI's reader, no torch) into DIR/target_ir;
2. answer the training instructions (``smollm2_instructions``) and the held-out ones with the target at f32,
   greedy, batched (``smollm2_data``) into DIR/answers.jsonl and DIR/heldout.jsonl;
3. build a small Llama with the target's tokenizer (vocabulary 49152, tied embeddings) whose embedding
   table is the target's projected onto its top principal directions, and train it with cross-entropy
   on the target's greedy answer tokens (sequence-level distillation: those tokens are the target's argmax
   at every answer position, which is what greedy acceptance asks of a draft);
4. save the Hugging Face checkpoint to DIR/draft (every few minutes, atomically) and DIR/metrics.json with
   greedy acceptance on the held-out instructions: the share of answer positions at which the draft's
   argmax equals the target's token given the target's own prefix.

Then ``xpuspec prepare DIR/draft -o DIR/draft_bundle --weights int8`` makes the IR that ships in
``xpuspec/default_draft``. Needs the ``convert`` and ``genai`` extras.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from xpuspec.demo.smollm2_data import generate_answers, read_records
from xpuspec.demo.smollm2_instructions import heldout_instructions, training_instructions

logger = logging.getLogger(__name__)

VOCAB_SIZE = 49152
BOS_ID, EOS_ID, PAD_ID = 1, 2, 2
IGNORE = -100


def convert_target(gguf_path: Path, ir_dir: Path) -> Path:
    if (ir_dir / "openvino_model.xml").is_file():
        return ir_dir
    import openvino_genai as genai

    scratch = ir_dir.with_name(ir_dir.name + ".tmp")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    shutil.copyfile(gguf_path, scratch / gguf_path.name)
    genai.LLMPipeline(str(scratch / gguf_path.name), "CPU", enable_save_ov_model=True)
    (scratch / gguf_path.name).unlink()
    scratch.rename(ir_dir)
    return ir_dir


def target_embeddings(gguf_path: Path) -> np.ndarray:
    """The target's token embedding table [vocab, hidden] in f32, dequantized from the GGUF."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    tensor = next(t for t in reader.tensors if t.name == "token_embd.weight")
    weights = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    return np.asarray(weights, dtype=np.float32).reshape(VOCAB_SIZE, -1)


def draft_config(hidden: int, layers: int, intermediate: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 128),
        head_dim=64,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        torch_dtype="float32",
    )


def build_draft(embeddings: np.ndarray, hidden: int, layers: int, intermediate: int):
    """A Llama draft whose tied embedding is the target's projected onto its top ``hidden`` directions."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(draft_config(hidden, layers, intermediate))
    # Top right-singular vectors of E from the small Gram matrix E^T E (hidden x hidden), not a full SVD.
    _, vectors = np.linalg.eigh(embeddings.T.astype(np.float64) @ embeddings.astype(np.float64))
    top = vectors[:, ::-1][:, :hidden].astype(np.float32)
    projected = embeddings @ top  # logits E' h' ~ E h when h' is h's projection
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.from_numpy(projected))
        # The fresh layers leave the final RMS norm's output at unit scale per dimension; against the
        # target's embedding rows that gives logits of a huge spread (initial loss ~34). Scale the norm so
        # the logits start at a spread of about 2, where training begins near uniform loss.
        probe = torch.randint(0, VOCAB_SIZE, (2, 64))
        spread = float(model(input_ids=probe).logits.std())
        model.model.norm.weight.mul_(2.0 / max(spread, 1e-6))
    return model


def to_examples(records: list[dict], max_len: int) -> list[tuple[list[int], list[int]]]:
    """(input ids, labels) per record; labels only on the answer, which follows the prompt."""
    examples = []
    for record in records:
        prompt, answer = record["prompt_ids"], record["answer_ids"]
        ids = (prompt + answer)[:max_len]
        labels = ([IGNORE] * (len(prompt) - 1) + answer + [IGNORE])[: len(ids)]
        # position i predicts ids[i + 1]: the last prompt position predicts the first answer token
        examples.append((ids, labels[: len(ids)]))
    return examples


def batches(examples, tokens_per_batch: int, rng: random.Random):
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    groups, current, longest = [], [], 0
    for index in order:
        longest = max(longest, len(examples[index][0]))
        if current and longest * (len(current) + 1) > tokens_per_batch:
            groups.append(current)
            current, longest = [], len(examples[index][0])
        current.append(index)
    if current:
        groups.append(current)
    while True:
        rng.shuffle(groups)
        for group in groups:
            yield collate([examples[i] for i in group])


def collate(items):
    width = max(len(ids) for ids, _ in items)
    input_ids = torch.full((len(items), width), PAD_ID, dtype=torch.long)
    labels = torch.full((len(items), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    for row, (ids, labs) in enumerate(items):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(labs)] = torch.tensor(labs)
        mask[row, : len(ids)] = 1
    return input_ids, labels, mask


def answer_loss(model, input_ids, labels, mask, candidates: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy on the answer positions only.

    With ``candidates`` (sorted token ids holding every label) the softmax runs over those columns of the
    tied embedding only: the 49152-way output layer is most of a small draft's training cost, and the
    target's answers use a few thousand distinct tokens. The candidates also hold random other tokens
    each step, so the rest of the vocabulary is pushed down too (a sampled softmax).
    """
    hidden = model.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
    wanted = labels != IGNORE
    hidden, targets = hidden[wanted], labels[wanted]
    weights = model.lm_head.weight
    if candidates is None:
        return F.cross_entropy(hidden @ weights.T, targets)
    columns = torch.searchsorted(candidates, targets)
    return F.cross_entropy(hidden @ weights[candidates].T, columns)


def candidate_columns(label_vocab: torch.Tensor, extra: int, generator: torch.Generator) -> torch.Tensor:
    """The label vocabulary plus ``extra`` random token ids, sorted and unique."""
    sampled = torch.randint(0, VOCAB_SIZE, (extra,), generator=generator)
    return torch.unique(torch.cat([label_vocab, sampled]))


@torch.no_grad()
def greedy_acceptance(model, examples) -> dict[str, float]:
    """Share of answer positions where the draft's argmax is the target's greedy token, given its prefix."""
    model.eval()
    hits = total = 0
    losses = []
    for ids, labels in examples:
        input_ids, label_tensor, mask = collate([(ids, labels)])
        logits = model(input_ids=input_ids, attention_mask=mask).logits[0]
        wanted = label_tensor[0] != IGNORE
        hits += int((logits.argmax(-1)[wanted] == label_tensor[0][wanted]).sum())
        total += int(wanted.sum())
        losses.append(float(F.cross_entropy(logits[wanted], label_tensor[0][wanted])))
    model.train()
    return {"greedy_acceptance": hits / max(1, total), "positions": total, "loss": float(np.mean(losses))}


def save_checkpoint(model, tokenizer_dir: Path, out_dir: Path) -> None:
    """Write the HF checkpoint next to ``out_dir`` and swap it in, so a crash never leaves half of one."""
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, do_sample=False
    )
    scratch = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(scratch, ignore_errors=True)
    model.save_pretrained(scratch)
    for path in tokenizer_dir.iterdir():
        if path.is_file():
            shutil.copy2(path, scratch / path.name)
    old = out_dir.with_name(out_dir.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out_dir.exists():
        out_dir.rename(old)
    scratch.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)


def save_tokenizer(gguf_path: Path, out_dir: Path) -> Path:
    """The target's tokenizer as Hugging Face files (read from the GGUF by transformers)."""
    if (out_dir / "tokenizer.json").is_file():
        return out_dir
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def train(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    gguf_path: Path = args.gguf.resolve()
    target_ir = convert_target(gguf_path, out / "target_ir")
    started = time.monotonic()
    generate_answers(target_ir, heldout_instructions(), out / "heldout.jsonl", in_flight=args.in_flight)
    if args.data_minutes > 0:
        generate_answers(
            target_ir,
            training_instructions(args.seed),
            out / "answers.jsonl",
            in_flight=args.in_flight,
            deadline=started + args.data_minutes * 60,
        )
    if args.data_only:
        return {}
    tokenizer_dir = save_tokenizer(gguf_path, out / "tokenizer")
    train_records = read_records(out / "answers.jsonl")
    heldout_records = read_records(out / "heldout.jsonl")
    heldout_set = {r["instruction"] for r in heldout_records}
    assert not heldout_set & {r["instruction"] for r in train_records}
    examples = to_examples(train_records, args.max_len)
    heldout = to_examples(heldout_records, args.max_len)
    logger.info("%d training answers (%d tokens)", len(examples), sum(len(i) for i, _ in examples))

    model = build_draft(target_embeddings(gguf_path), args.hidden, args.layers, args.intermediate)
    parameters = sum(p.numel() for p in model.parameters())
    logger.info("draft: %.2fM parameters", parameters / 1e6)
    if args.freeze_embeddings:
        # The projected target embeddings serve as both input table and (tied) output layer; training only
        # the layers saves the 12.6M-entry embedding gradient and optimizer update every step.
        model.model.embed_tokens.weight.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    rng = random.Random(args.seed)
    generator = torch.Generator().manual_seed(args.seed)

    def label_vocabulary(items) -> torch.Tensor:
        return torch.tensor(sorted({t for _, labs in items for t in labs if t != IGNORE}), dtype=torch.long)

    label_vocab = label_vocabulary(examples)
    logger.info("%d distinct answer tokens; %d sampled negatives a step", len(label_vocab), args.negatives)
    stream = batches(examples, args.batch_tokens, rng)
    train_start = time.monotonic()
    last_reload = train_start
    budget = args.train_minutes * 60
    last_save = train_start
    step, window = 0, []
    history = []
    while True:
        elapsed = time.monotonic() - train_start
        progress = elapsed / budget
        if progress >= 1.0:
            break
        warm = min(1.0, (step + 1) / args.warmup_steps)
        lr = args.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        if time.monotonic() - last_reload > args.reload_minutes * 60:
            # A `--data-only` run may still be answering beside this one: train on what it added.
            fresh = read_records(out / "answers.jsonl")
            if len(fresh) > len(train_records):
                train_records = fresh
                examples = to_examples(train_records, args.max_len)
                stream = batches(examples, args.batch_tokens, rng)
                label_vocab = label_vocabulary(examples)
                logger.info("reloaded: %d training answers", len(examples))
            last_reload = time.monotonic()
        input_ids, labels, mask = next(stream)
        candidates = (
            candidate_columns(label_vocab, args.negatives, generator) if args.negatives >= 0 else None
        )
        loss = answer_loss(model, input_ids, labels, mask, candidates)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        window.append(loss.item())
        step += 1
        if step % 10 == 0:
            logger.info("step %d  loss %.3f  lr %.2e  %.0fs", step, np.mean(window), lr, elapsed)
            history.append({"step": step, "loss": float(np.mean(window)), "seconds": round(elapsed)})
            window = []
        if time.monotonic() - last_save > args.save_minutes * 60:
            save_checkpoint(model, tokenizer_dir, out / "draft")
            last_save = time.monotonic()
    save_checkpoint(model, tokenizer_dir, out / "draft")
    final = greedy_acceptance(model, heldout)
    metrics = {
        "recipe": "python -m xpuspec.demo.train_smollm2 "
        + " ".join(
            f"--{k.replace('_', '-')}" + ("" if isinstance(v, bool) else f" {v}")
            for k, v in vars(args).items()
            if k not in ("gguf", "out", "data_only") and v is not False
        ),
        "target": gguf_path.name,
        "draft": {
            "hidden": args.hidden,
            "layers": args.layers,
            "intermediate": args.intermediate,
            "parameters": parameters,
        },
        "training_answers": len(examples),
        "training_tokens": sum(sum(1 for x in labels if x != IGNORE) for _, labels in examples),
        "heldout_instructions": len(heldout),
        "steps": step,
        "train_seconds": round(time.monotonic() - train_start),
        "heldout": final,
        "loss_history": history,
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    logger.info("held-out after training: %s", final)
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gguf", type=Path, required=True, help="SmolLM2-135M-Instruct GGUF file")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data-minutes", type=float, default=22.0)
    parser.add_argument("--train-minutes", type=float, default=35.0)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--intermediate", type=int, default=768)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup-steps", type=int, default=50)
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--max-len", type=int, default=200)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--save-minutes", type=float, default=5.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--negatives", type=int, default=2048, help="sampled softmax: random extra tokens a step (-1: full)"
    )
    parser.add_argument(
        "--freeze-embeddings", action="store_true", help="train the layers only (the tied table stays fixed)"
    )
    parser.add_argument("--data-only", action="store_true", help="only answer instructions, then stop")
    parser.add_argument(
        "--reload-minutes", type=float, default=3.0, help="re-read answers.jsonl this often while training"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    train(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
