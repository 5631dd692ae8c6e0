"""The training loop of both demo models: AdamW, warmup + cosine decay, a wall-clock deadline.

The schedule follows whichever is further along, the step count or the clock: on a normal run the
steps decide (reproducible); on a slow, shared machine the learning rate still anneals before the
deadline, and the phase stops there with a usable model instead of overrunning.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from research.training.recipe import DistillationSettings, PhaseSchedule

logger = logging.getLogger(__name__)

# Loss of one batch of token ids [batch, sequence_length]; returns (loss to minimise, its cross-entropy part).
LossFunction = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class PhaseResult:
    steps_done: int
    tokens_seen: int
    final_loss: float  # mean training loss of the last logged window
    final_cross_entropy: float
    seconds: float
    stopped_by_deadline: bool


def learning_rate_at(progress: float, schedule: PhaseSchedule) -> float:
    """Learning rate at ``progress`` in [0, 1] of the phase (warmup is a share of the steps)."""
    warmup_share = schedule.warmup_steps / schedule.steps
    peak = schedule.peak_learning_rate
    if progress < warmup_share:
        return peak * (progress / warmup_share)
    decay_progress = min(1.0, (progress - warmup_share) / max(1e-9, 1.0 - warmup_share))
    floor = peak * schedule.min_learning_rate_ratio
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * decay_progress))


def causal_lm_loss(model: torch.nn.Module) -> LossFunction:
    def loss(input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cross_entropy = model(input_ids=input_ids, labels=input_ids).loss
        return cross_entropy, cross_entropy

    return loss


def distillation_loss(
    draft: torch.nn.Module, target: torch.nn.Module, settings: DistillationSettings
) -> LossFunction:
    """KL from the target's softened distribution to the draft's, plus next-token cross-entropy."""
    temperature = settings.temperature

    def loss(input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            target_logits = target(input_ids=input_ids).logits[:, :-1]  # [batch, length - 1, vocab]
        draft_logits = draft(input_ids=input_ids).logits[:, :-1]  # [batch, length - 1, vocab]
        vocab_size = draft_logits.shape[-1]
        cross_entropy = F.cross_entropy(draft_logits.reshape(-1, vocab_size), input_ids[:, 1:].reshape(-1))
        kl = F.kl_div(
            F.log_softmax(draft_logits / temperature, dim=-1).reshape(-1, vocab_size),
            F.log_softmax(target_logits / temperature, dim=-1).reshape(-1, vocab_size),
            log_target=True,
            reduction="batchmean",
        )
        # T^2 keeps the soft term's gradient scale independent of the temperature (Hinton et al.).
        total = settings.kl_weight * temperature**2 * kl + (1.0 - settings.kl_weight) * cross_entropy
        return total, cross_entropy

    return loss


def train_phase(
    name: str,
    model: torch.nn.Module,
    batches: Iterator[torch.Tensor],
    loss_function: LossFunction,
    schedule: PhaseSchedule,
    deadline: float | None,
) -> PhaseResult:
    """Run up to ``schedule.steps`` optimiser steps, or until ``time.monotonic()`` passes ``deadline``."""
    decay, no_decay = [], []
    for parameter_name, parameter in model.named_parameters():
        # Norm gains stay undecayed: shrinking them only fights the normalisation.
        (no_decay if parameter.ndim < 2 or "norm" in parameter_name else decay).append(parameter)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": schedule.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=schedule.peak_learning_rate,
        betas=(0.9, 0.95),
    )
    model.train()
    start = time.monotonic()
    seconds_allowed = None if deadline is None else max(1.0, deadline - start)
    tokens_seen = 0
    window_loss, window_cross_entropy, window_steps = 0.0, 0.0, 0
    final_loss, final_cross_entropy = float("nan"), float("nan")
    stopped_by_deadline = False
    step = 0
    while step < schedule.steps:
        elapsed = time.monotonic() - start
        if seconds_allowed is not None and elapsed >= seconds_allowed:
            stopped_by_deadline = True
            logger.warning(
                "%s: time budget reached after %d of %d steps; stopping", name, step, schedule.steps
            )
            break
        progress = step / schedule.steps
        if seconds_allowed is not None:
            progress = max(progress, elapsed / seconds_allowed)
        learning_rate = learning_rate_at(progress, schedule)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate
        input_ids = next(batches)  # [batch, sequence_length]
        loss, cross_entropy = loss_function(input_ids)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), schedule.grad_clip)
        optimizer.step()
        step += 1
        tokens_seen += input_ids.numel()
        window_loss += loss.item()
        window_cross_entropy += cross_entropy.item()
        window_steps += 1
        if step % schedule.log_every == 0 or step == schedule.steps:
            final_loss = window_loss / window_steps
            final_cross_entropy = window_cross_entropy / window_steps
            window_loss, window_cross_entropy, window_steps = 0.0, 0.0, 0
            elapsed = time.monotonic() - start
            remaining = elapsed / step * (schedule.steps - step)
            if seconds_allowed is not None:
                remaining = min(remaining, max(0.0, seconds_allowed - elapsed))
            logger.info(
                "%s step %d/%d loss %.4f ce %.4f lr %.2e %.0f tokens/s ETA %.1f min",
                name,
                step,
                schedule.steps,
                final_loss,
                final_cross_entropy,
                learning_rate,
                tokens_seen / elapsed,
                remaining / 60,
            )
    if window_steps:
        final_loss = window_loss / window_steps
        final_cross_entropy = window_cross_entropy / window_steps
    model.eval()
    return PhaseResult(
        steps_done=step,
        tokens_seen=tokens_seen,
        final_loss=final_loss,
        final_cross_entropy=final_cross_entropy,
        seconds=time.monotonic() - start,
        stopped_by_deadline=stopped_by_deadline,
    )
