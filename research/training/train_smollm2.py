"""Train the shipped draft for SmolLM2-135M-Instruct on CPU, distilled from the target's greedy answers.

    python -m research.training.train_smollm2 --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out DIR \
        [--data-minutes 22] [--train-minutes 35] [--layers 3] [--hidden 256]

Steps (each resumable: a cut run ships what it has):
1. convert the GGUF to OpenVINO IR (GenAI's reader, no torch) into DIR/target_ir;
2. answer the training instructions (``smollm2_instructions``: ~11k template x topic pairs plus fixed
   questions) and the held-out ones with the target at f32, greedy, batched (``smollm2_data``) into
   DIR/answers.jsonl and DIR/heldout.jsonl; a separate ``--data-only`` run can keep answering while this
   one trains (the trainer re-reads the file);
3. optionally, the target's top-k next-token distributions over those answers (``smollm2_teacher``) in
   DIR/teacher/answers-*.npz: with them the loss adds the cross-entropy to the teacher's soft targets;
4. build a small Llama with the target's tokenizer (vocabulary 49152, tied embeddings) whose embedding
   table is the target's projected onto its top principal directions, and train it with cross-entropy on
   the target's greedy answer tokens (those tokens are the target's argmax at every answer position, which
   is what greedy acceptance asks of a draft), the softmax over the frequent part of the vocabulary plus
   the batch's tokens and random others (``--softmax-frequent``; the full vocabulary by default);
5. save the Hugging Face checkpoint to DIR/draft (every few minutes, atomically) and DIR/metrics.json with
   greedy acceptance on the held-out instructions, measured as training goes: the share of answer positions
   at which the draft's argmax equals the target's token given the target's own prefix.

Then ``python -m research.training.smollm2_export --checkpoint DIR/draft --metrics DIR/metrics.json --out
xpuspec/models/default_draft`` makes the int8 IR that ships. Needs the ``convert`` extra.
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from research.training.smollm2_data import EXACT_PROPERTIES, FAST_PROPERTIES, generate_answers, read_records
from research.training.smollm2_instructions import heldout_instructions, training_instructions
from research.training.smollm2_teacher import ScoredSequence, read_shards

logger = logging.getLogger(__name__)

VOCAB_SIZE = 49152
# The training answers' compile properties. "exact" labels are the target's true argmax; "fast" ones
# are its argmax at the CPU's default KV cache and activation quantisation, which is what the draft
# meets when the engine runs at its defaults (and, on a CPU without VNNI, nearly as slow to make).
DATA_PROPERTIES = {"exact": EXACT_PROPERTIES, "fast": FAST_PROPERTIES}
BOS_ID, EOS_ID, PAD_ID = 1, 2, 2


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


@dataclass
class Example:
    """One training sequence: token ids, the first position trained on, and optional teacher top-k."""

    ids: list[int]
    start: int  # position ``start`` predicts ids[start + 1]; the last prompt position predicts the answer
    top_ids: np.ndarray | None = None  # [len(ids) - 1 - start, k]
    top_logprobs: np.ndarray | None = None

    @property
    def positions(self) -> int:
        return len(self.ids) - 1 - self.start


def to_examples(records: list[dict], max_len: int) -> list[Example]:
    """One example per answer record; loss on the answer only, which follows the prompt."""
    examples = []
    for record in records:
        prompt, answer = record["prompt_ids"], record["answer_ids"]
        ids = (prompt + answer)[:max_len]
        if len(ids) > len(prompt):
            examples.append(Example(ids=ids, start=len(prompt) - 1))
    return examples


def attach_teacher(examples: list[Example], scored: list[ScoredSequence]) -> int:
    """Give ``examples[i]`` the top-k of ``scored[i]`` where both hold the same tokens; return how many."""
    attached = 0
    for example, sequence in zip(examples, scored, strict=False):
        rows = example.positions
        if sequence.start == example.start and list(sequence.ids[: len(example.ids)]) == example.ids:
            example.top_ids = sequence.top_ids[:rows]
            example.top_logprobs = sequence.top_logprobs[:rows]
            attached += 1
    return attached


def batches(examples: list[Example], tokens_per_batch: int, rng: random.Random):
    """Endless shuffled batches of examples of similar length, about ``tokens_per_batch`` tokens each."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].ids))
    groups, current, longest = [], [], 0
    for index in order:
        longest = max(longest, len(examples[index].ids))
        if current and longest * (len(current) + 1) > tokens_per_batch:
            groups.append(current)
            current, longest = [], len(examples[index].ids)
        current.append(index)
    if current:
        groups.append(current)
    while True:
        rng.shuffle(groups)
        for group in groups:
            yield [examples[i] for i in group]


@dataclass
class Batch:
    input_ids: torch.Tensor  # [rows, width]
    mask: torch.Tensor  # [rows, width]
    wanted: torch.Tensor  # [rows, width] bool: positions trained on
    labels: torch.Tensor  # [positions]: the next token at each wanted position, row-major
    top_ids: torch.Tensor | None  # [positions, k], when every example has teacher top-k
    top_probs: torch.Tensor | None  # [positions, k]


def collate(items: list[Example]) -> Batch:
    width = max(len(e.ids) for e in items)
    input_ids = torch.full((len(items), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    wanted = torch.zeros((len(items), width), dtype=torch.bool)
    labels = []
    for row, example in enumerate(items):
        input_ids[row, : len(example.ids)] = torch.tensor(example.ids)
        mask[row, : len(example.ids)] = 1
        wanted[row, example.start : len(example.ids) - 1] = True
        labels.extend(example.ids[example.start + 1 :])
    with_teacher = all(e.top_ids is not None for e in items)
    top_ids = top_probs = None
    if with_teacher:
        top_ids = torch.from_numpy(np.concatenate([e.top_ids for e in items]).astype(np.int64))
        top_probs = torch.from_numpy(np.concatenate([e.top_logprobs for e in items]).astype(np.float32)).exp()
    return Batch(input_ids, mask, wanted, torch.tensor(labels, dtype=torch.long), top_ids, top_probs)


def distillation_loss(
    model, batch: Batch, kl_weight: float, columns: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, cross-entropy): CE on the target's tokens plus, with teacher top-k, CE to its soft targets.

    With ``columns`` None the output layer is the full 49152-way softmax. Otherwise the softmax runs over
    those token ids (sorted; ``softmax_columns`` makes them): every label and teacher token, the frequent
    part of the vocabulary, and fresh random others each step. On a shared 2-core machine the full output
    layer is ~3/4 of a step; the fixed frequent part keeps every token the target tends to emit competing
    in every step, which the old sampled softmax (answer tokens + 2048 random) did not. The soft term is
    the cross-entropy to the teacher's top-k probabilities (the KL up to the teacher's entropy): the
    teacher's ranking, not only its winner.
    """
    hidden = model.model(input_ids=batch.input_ids, attention_mask=batch.mask).last_hidden_state
    weights = model.lm_head.weight if columns is None else model.lm_head.weight[columns]
    logits = hidden[batch.wanted] @ weights.T  # [positions, columns]
    logprobs = F.log_softmax(logits, dim=-1)
    labels = batch.labels if columns is None else torch.searchsorted(columns, batch.labels)
    cross_entropy = F.nll_loss(logprobs, labels)
    if batch.top_ids is None or kl_weight <= 0:
        return cross_entropy, cross_entropy
    top_ids = batch.top_ids if columns is None else torch.searchsorted(columns, batch.top_ids)
    soft = -(batch.top_probs * logprobs.gather(1, top_ids)).sum(-1).mean()
    return (1 - kl_weight) * cross_entropy + kl_weight * soft, cross_entropy


def softmax_columns(
    batch: Batch, frequent: int, negatives: int, generator: torch.Generator
) -> torch.Tensor | None:
    """Sorted token ids for the output softmax: ids below ``frequent`` (byte-level BPE numbers the merges
    it learned first, the most frequent, lowest), the batch's labels and teacher tokens, and ``negatives``
    random ids. None (the full vocabulary) when ``frequent`` covers it."""
    if frequent >= VOCAB_SIZE:
        return None
    parts = [
        torch.arange(frequent),
        batch.labels,
        torch.randint(0, VOCAB_SIZE, (negatives,), generator=generator),
    ]
    if batch.top_ids is not None:
        parts.append(batch.top_ids.reshape(-1))
    return torch.unique(torch.cat(parts))


@torch.no_grad()
def greedy_acceptance(model, examples: list[Example], gamma: int = 4) -> dict[str, float]:
    """Held-out agreement of the draft's argmax with the target's greedy token, given the target's prefix.

    ``greedy_acceptance`` is the share of answer positions that agree; ``accepted_per_round`` the mean run
    of agreeing positions (at most ``gamma``) starting at each position: the tokens a round of ``gamma``
    drafted tokens would keep, before the target's own token.
    """
    model.eval()
    hits = total = 0
    runs = []
    losses = []
    for example in examples:
        batch = collate([example])
        hidden = model.model(input_ids=batch.input_ids, attention_mask=batch.mask).last_hidden_state
        logits = hidden[batch.wanted] @ model.lm_head.weight.T
        agree = (logits.argmax(-1) == batch.labels).tolist()
        hits += sum(agree)
        total += len(agree)
        for first in range(len(agree)):
            run = 0
            while run < gamma and first + run < len(agree) and agree[first + run]:
                run += 1
            runs.append(run)
        losses.append(float(F.cross_entropy(logits, batch.labels)))
    model.train()
    return {
        "greedy_acceptance": hits / max(1, total),
        "accepted_per_round": float(np.mean(runs)) if runs else 0.0,
        "gamma": gamma,
        "positions": total,
        "loss": float(np.mean(losses)),
    }


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
    swap_in(scratch, out_dir)


def swap_in(scratch: Path, out_dir: Path) -> None:
    """Replace ``out_dir`` with the finished ``scratch`` folder, so a crash never leaves half a checkpoint."""
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


def load_examples(out: Path, max_len: int) -> tuple[list[Example], int]:
    """The training answers, with the teacher's top-k attached where ``out/teacher`` has scored them."""
    examples = to_examples(read_records(out / "answers.jsonl"), max_len)
    attached = attach_teacher(examples, read_shards(out / "teacher", "answers"))
    return examples, attached


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
            properties=DATA_PROPERTIES[args.data_properties],
        )
    if args.data_only:
        return {}
    tokenizer_dir = save_tokenizer(gguf_path, out / "tokenizer")
    examples, attached = load_examples(out, args.max_len)
    heldout_records = read_records(out / "heldout.jsonl")
    heldout_set = {r["instruction"] for r in heldout_records}
    assert not heldout_set & {r["instruction"] for r in read_records(out / "answers.jsonl")}
    heldout = to_examples(heldout_records, args.max_len)
    logger.info(
        "%d training answers (%d answer tokens), %d with teacher top-k",
        len(examples),
        sum(e.positions for e in examples),
        attached,
    )

    if args.init is not None:
        # Continue from a saved checkpoint (a cut run, or one restarted with other batch settings).
        from transformers import LlamaForCausalLM

        model = LlamaForCausalLM.from_pretrained(str(args.init), dtype=torch.float32)
        config = model.config
        args.hidden, args.layers = config.hidden_size, config.num_hidden_layers
        args.intermediate = config.intermediate_size
    else:
        model = build_draft(target_embeddings(gguf_path), args.hidden, args.layers, args.intermediate)
    model.train()
    parameters = sum(p.numel() for p in model.parameters())
    logger.info("draft: %.2fM parameters", parameters / 1e6)
    embedding = model.model.embed_tokens.weight
    if args.freeze_embeddings:
        # The projected target embeddings serve as both input table and (tied) output layer; training only
        # the layers saves the 12.6M-entry embedding gradient and optimizer update every step.
        embedding.requires_grad_(False)
    layers = [p for p in model.parameters() if p.requires_grad and p is not embedding]
    groups = [{"params": layers, "lr_scale": 1.0}]
    if embedding.requires_grad:
        # The tied table starts from the target's own (projected) embeddings: a gentler rate keeps what
        # that start knows about the whole vocabulary while the layers learn.
        groups.append({"params": [embedding], "lr_scale": args.embedding_lr_scale})
    trainable = [p for group in groups for p in group["params"]]
    optimizer = torch.optim.AdamW(groups, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.98))
    rng = random.Random(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    stream = batches(examples, args.batch_tokens, rng)
    train_start = time.monotonic()
    last_reload = last_save = last_eval = train_start
    budget = args.train_minutes * 60
    step, window, window_ce = 0, [], []
    history, evaluations = [], []
    tokens_seen = 0
    while True:
        elapsed = time.monotonic() - train_start
        progress = elapsed / budget
        if progress >= 1.0:
            break
        warm = min(1.0, (step + 1) / args.warmup_steps)
        lr = args.lr * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in optimizer.param_groups:
            group["lr"] = lr * group["lr_scale"]
        if time.monotonic() - last_reload > args.reload_minutes * 60:
            # A `--data-only` run and a scorer may still be adding beside this one: train on what they add.
            fresh, fresh_attached = load_examples(out, args.max_len)
            if len(fresh) > len(examples) or fresh_attached > attached:
                examples, attached = fresh, fresh_attached
                stream = batches(examples, args.batch_tokens, rng)
                logger.info("reloaded: %d training answers, %d with teacher top-k", len(examples), attached)
            last_reload = time.monotonic()
        batch = collate(next(stream))
        columns = softmax_columns(batch, args.softmax_frequent, args.negatives, generator)
        loss, cross_entropy = distillation_loss(model, batch, args.kl_weight, columns)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        window.append(loss.item())
        window_ce.append(cross_entropy.item())
        tokens_seen += int(batch.labels.numel())
        step += 1
        if step % 20 == 0:
            logger.info(
                "step %d  loss %.3f  ce %.3f  lr %.2e  %.0fs  %.0f tokens/s",
                step,
                np.mean(window),
                np.mean(window_ce),
                lr,
                elapsed,
                tokens_seen / max(1.0, elapsed),
            )
            history.append(
                {
                    "step": step,
                    "loss": float(np.mean(window)),
                    "ce": float(np.mean(window_ce)),
                    "seconds": round(elapsed),
                }
            )
            window, window_ce = [], []
        if time.monotonic() - last_eval > args.eval_minutes * 60:
            result = greedy_acceptance(model, heldout)
            evaluations.append({"step": step, "seconds": round(elapsed), **result})
            logger.info("held-out at step %d: %s", step, result)
            last_eval = time.monotonic()
        if time.monotonic() - last_save > args.save_minutes * 60:
            save_checkpoint(model, tokenizer_dir, out / "draft")
            last_save = time.monotonic()
    save_checkpoint(model, tokenizer_dir, out / "draft")
    final = greedy_acceptance(model, heldout)
    evaluations.append({"step": step, "seconds": round(time.monotonic() - train_start), **final})
    metrics = {
        "recipe": "python -m research.training.train_smollm2 "
        + " ".join(
            f"--{k.replace('_', '-')}" + ("" if isinstance(v, bool) else f" {v}")
            for k, v in vars(args).items()
            if k not in ("gguf", "out", "data_only") and v is not False and v is not None
        ),
        "target": gguf_path.name,
        "draft": {
            "hidden": args.hidden,
            "layers": args.layers,
            "intermediate": args.intermediate,
            "parameters": parameters,
        },
        "training_answers": len(examples),
        "training_tokens": sum(e.positions for e in examples),
        "answers_with_teacher_topk": attached,
        "tokens_trained": tokens_seen,
        "heldout_instructions": len(heldout),
        "steps": step,
        "train_seconds": round(time.monotonic() - train_start),
        "heldout": final,
        "heldout_history": evaluations,
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
        "--kl-weight", type=float, default=0.5, help="weight of the teacher top-k term (where scored)"
    )
    parser.add_argument(
        "--embedding-lr-scale", type=float, default=0.3, help="the tied table's learning rate, relative"
    )
    parser.add_argument(
        "--softmax-frequent",
        type=int,
        default=VOCAB_SIZE,
        help="softmax over token ids below this, the batch's tokens and --negatives random ones "
        f"({VOCAB_SIZE}: the full vocabulary)",
    )
    parser.add_argument("--negatives", type=int, default=2048, help="random extra softmax columns a step")
    parser.add_argument("--init", type=Path, help="start from this saved draft checkpoint")
    parser.add_argument("--eval-minutes", type=float, default=5.0, help="held-out acceptance this often")
    parser.add_argument(
        "--freeze-embeddings", action="store_true", help="train the layers only (the tied table stays fixed)"
    )
    parser.add_argument("--data-only", action="store_true", help="only answer instructions, then stop")
    parser.add_argument(
        "--data-properties",
        choices=sorted(DATA_PROPERTIES),
        default="exact",
        help="compile properties of the training answers (held-out answers are always exact)",
    )
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
