"""EAGLE-3's training-time test (TTT): the head rolled out over its own states, every position at once.

At inference the head drafts a chain: from slot ``j`` (the target's state at ``j`` with the token at
``j + 1``) it predicts the token at ``j + 2``, then each further step feeds its own output state (before
the final norm) with the next token, one cache slot later. EAGLE-3 (SafeAILab/EAGLE
``eagle/traineagle3/cnets.py``, ``Model.forward``; SpecForge ``OnlineEagle3Model``) trains on exactly that
rollout, for all slots of a sequence in parallel. Step ``s`` at slot ``j``:

- reads the token at ``j + 1 + s`` (the true token: a drafted one differs only after a rejection, where
  nothing later is kept) and the state step ``s - 1`` produced at ``j`` (the fused target state at
  ``s = 0``);
- sits at rotary position ``j + s`` (cnets rotates with ``position_ids + len(cache)``): the cache slot a
  chain step takes at inference;
- attends to the step-0 keys of slots ``<= j`` (causal) and to its own earlier rollout keys at ``j``
  (steps ``1..s``; cnets' per-step "diagonal" keys): at inference those are the cached catch-up slots and
  the chain's earlier steps;
- is scored against the target's greedy token after position ``j + 1 + s``, with weight ``0.8 ** s``
  (cnets' ``ploss_weight``); positions whose label is outside the draft vocabulary are left out, as
  cnets' ``t2d`` mask leaves them out.

``tests/demo/test_train_eagle3.py`` checks these logits against the OpenVINO runtime's step-by-step
rollout (:class:`xpuspec.executor.eagle3_head.Eagle3Head`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from research.training.eagle3_features import FeatureSequence
from research.training.eagle3_torch import Eagle3Head

STEP_DECAY = 0.8  # EAGLE-3's weight of rollout step s: 0.8 ** s


@dataclass
class TTTBatch:
    """Right-padded sequences. Slot ``j`` of a row exists for ``j < length - 1``."""

    features: torch.Tensor  # [b, L, 3*hidden] f32: the target's tapped states
    ids: torch.Tensor  # [b, L] long: the tokens (0 past a row's end)
    labels: torch.Tensor  # [b, L] long: target id of the target's argmax at t where trained, else -1


def collate(sequences: Sequence[FeatureSequence], with_prompt: bool = False) -> TTTBatch:
    width = max(len(s) for s in sequences)
    size = sequences[0].features.shape[1]
    features = torch.zeros(len(sequences), width, size)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    labels = torch.full((len(sequences), width), -1, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        length = len(sequence)
        features[row, :length] = torch.from_numpy(sequence.features.astype(np.float32))
        ids[row, :length] = torch.from_numpy(sequence.ids.astype(np.int64))
        mask = sequence.label_mask(with_prompt)
        labels[row, :length][torch.from_numpy(mask)] = torch.from_numpy(
            sequence.argmax[mask].astype(np.int64)
        )
    return TTTBatch(features, ids, labels)


def shift_left(x: torch.Tensor, count: int, fill: int = 0) -> torch.Tensor:
    """``[b, L, ...]`` -> the same shape with ``out[:, j] = x[:, j + count]`` (``fill`` past the end)."""
    pad = torch.full_like(x[:, :count], fill)
    return torch.cat((x[:, count:], pad), dim=1)[:, : x.shape[1]]


def _rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` ``[b, heads, L, d]`` at ``positions`` ``[b, L]`` (half-split layout)."""
    angles = positions.float()[..., None] * inv_freq  # [b, L, d / 2]
    angles = torch.cat((angles, angles), dim=-1)[:, None]  # [b, 1, L, d]
    first, second = x.chunk(2, dim=-1)
    return x * angles.cos() + torch.cat((-second, first), dim=-1) * angles.sin()


def rollout_states(
    head: Eagle3Head, table: torch.Tensor, features: torch.Tensor, ids: torch.Tensor, steps: int
) -> list[torch.Tensor]:
    """The carried states (before the final norm) of rollout steps ``0..steps-1``: each ``[b, L, hidden]``.

    ``table`` ``[vocab, hidden]`` is the target's (frozen) embedding.
    """
    config = head.config
    layer, attention = head.midlayer, head.midlayer.self_attn
    batch, length, _ = features.shape
    groups, scale = config.num_groups, config.head_dim**-0.5
    slots = torch.arange(length)
    causal = slots[None, :] <= slots[:, None]  # [L query, L key]: step-0 keys of slots <= j
    hidden = head.fuse(features)  # [b, L, hidden]
    keys0 = values0 = None
    rollout_keys: list[torch.Tensor] = []  # [b, kv_heads, L, d] per rollout step: the key at the same slot
    rollout_values: list[torch.Tensor] = []
    states = []
    for step in range(steps):
        embeds = table[shift_left(ids, 1 + step)]  # [b, L, hidden]: slot j reads the token at j + 1 + step
        normed = layer.hidden_norm(hidden)
        residual = normed if layer.norm_before_residual else hidden
        x = torch.cat((layer.input_layernorm(embeds), normed), dim=-1)  # [b, L, 2*hidden]
        positions = (slots + step).expand(batch, -1)  # [b, L]
        query = attention.q_proj(x).view(batch, length, -1, config.head_dim).transpose(1, 2)
        key = attention.k_proj(x).view(batch, length, -1, config.head_dim).transpose(1, 2)
        value = attention.v_proj(x).view(batch, length, -1, config.head_dim).transpose(1, 2)
        query = _rotate(query, positions, attention.inv_freq)  # [b, heads, L, d]
        key = _rotate(key, positions, attention.inv_freq)  # [b, kv_heads, L, d]
        if keys0 is None:
            keys0, values0 = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
        else:
            rollout_keys.append(key.repeat_interleave(groups, 1))
            rollout_values.append(value.repeat_interleave(groups, 1))
        scores = (query @ keys0.transpose(2, 3)) * scale  # [b, heads, L, L]
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
        diagonal = [(query * k).sum(-1, keepdim=True) * scale for k in rollout_keys]  # each [b, heads, L, 1]
        probs = torch.softmax(torch.cat((scores, *diagonal), dim=-1).float(), dim=-1).to(query.dtype)
        attended = probs[..., :length] @ values0  # [b, heads, L, d]
        for index, v in enumerate(rollout_values):
            attended = attended + probs[..., length + index, None] * v
        attended = attended.transpose(1, 2).reshape(batch, length, -1)
        hidden = residual + attention.o_proj(attended)
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        states.append(hidden)
    return states


def rollout_logits(
    head: Eagle3Head, table: torch.Tensor, features: torch.Tensor, ids: torch.Tensor, steps: int
) -> torch.Tensor:
    """``[steps, b, L, draft_vocab]``: the head's logits at every slot and rollout step."""
    states = rollout_states(head, table, features, ids, steps)
    return torch.stack([head.lm_head(head.norm(state)) for state in states])


def step_labels(labels: torch.Tensor, step: int) -> torch.Tensor:
    """``[b, L]`` target ids step ``step`` at slot ``j`` is scored on (the argmax at ``j + 1 + step``)."""
    return shift_left(labels, 1 + step, fill=-1)


def ttt_loss(
    head: Eagle3Head,
    table: torch.Tensor,
    batch: TTTBatch,
    steps: int,
    target_to_draft: torch.Tensor,
    decay: float = STEP_DECAY,
) -> tuple[torch.Tensor, list[float], list[float]]:
    """(loss, cross-entropy per step, draft-argmax accuracy per step) over the trained, in-vocabulary slots.

    ``target_to_draft`` ``[vocab]`` long: each target id's draft id, -1 outside the draft vocabulary.
    """
    states = rollout_states(head, table, batch.features, batch.ids, steps)
    loss = torch.zeros(())
    losses, accuracies = [], []
    for step, state in enumerate(states):
        labels = step_labels(batch.labels, step)
        draft = target_to_draft[labels.clamp(min=0)]
        valid = (labels >= 0) & (draft >= 0)
        if not bool(valid.any()):
            losses.append(float("nan"))
            accuracies.append(float("nan"))
            continue
        # The LM head only on the scored slots: it is the largest matmul of a step.
        logits = head.lm_head(head.norm(state[valid]))  # [n, draft_vocab]
        cross_entropy = F.cross_entropy(logits, draft[valid])
        loss = loss + decay**step * cross_entropy
        losses.append(cross_entropy.item())
        accuracies.append(float((logits.argmax(-1) == draft[valid]).float().mean()))
    return loss, losses, accuracies


@torch.no_grad()
def heldout_acceptance(
    head: Eagle3Head, table: torch.Tensor, sequences: Sequence[FeatureSequence], gamma: int = 4
) -> dict[str, float | int | list[float]]:
    """Greedy acceptance on held-out answers, comparable with ``train_smollm2.greedy_acceptance``.

    Over the answer tokens (the labels of answer positions): ``greedy_acceptance`` is the share the head's
    step-0 prediction gets right given the target's prefix; ``accepted_per_round`` the mean run of right
    predictions (at most ``gamma``) of the rollout from each slot, which is what a greedy round of ``gamma``
    drafted tokens keeps (the rollout reads the true tokens, which are the drafted ones up to the first
    miss). ``step_acceptance``: the share right at each rollout step.
    """
    was_training = head.training
    head.eval()
    draft_to_target = torch.arange(head.config.draft_vocab_size) + head.d2t
    hits = total = 0
    runs: list[torch.Tensor] = []
    step_hits = torch.zeros(gamma)
    step_total = torch.zeros(gamma)
    losses = []
    target_to_draft = torch.full((head.config.vocab_size,), -1, dtype=torch.long)
    target_to_draft[draft_to_target] = torch.arange(head.config.draft_vocab_size)
    for sequence in sequences:
        batch = collate([sequence])
        logits = rollout_logits(head, table, batch.features, batch.ids, gamma)  # [gamma, 1, L, draft]
        predicted = draft_to_target[logits.argmax(-1)][:, 0]  # [gamma, L] target ids
        labels = torch.stack([step_labels(batch.labels, step)[0] for step in range(gamma)])  # [gamma, L]
        scored = labels >= 0
        right = (predicted == labels) & scored
        first = scored[0]
        hits += int(right[0].sum())
        total += int(first.sum())
        # A round from slot j keeps the leading right predictions, cut where the answer ends.
        runs.append(right[:, first].int().cumprod(0).sum(0))
        step_hits += right.sum(1)
        step_total += scored.sum(1)
        draft_labels = target_to_draft[labels[0].clamp(min=0)]
        in_vocab = first & (draft_labels >= 0)
        if bool(in_vocab.any()):
            losses.append(float(F.cross_entropy(logits[0, 0][in_vocab], draft_labels[in_vocab])))
    head.train(was_training)
    all_runs = torch.cat(runs) if runs else torch.zeros(0)
    return {
        "greedy_acceptance": hits / max(1, total),
        "accepted_per_round": float(all_runs.float().mean()) if all_runs.numel() else 0.0,
        "gamma": gamma,
        "positions": total,
        "step_acceptance": [
            round(float(h / max(t, 1)), 4) for h, t in zip(step_hits, step_total, strict=True)
        ],
        "loss": float(np.mean(losses)) if losses else float("nan"),
    }
