"""How well the demo pair works together: held-out loss and greedy draft acceptance, in torch.

Greedy speculative decoding emits exactly the target's greedy continuation, so one greedy run of
the target is the reference; the draft is then measured against it two ways: per position (the
acceptance rate alpha of the usual i.i.d. model) and by replaying real speculative steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F


@torch.no_grad()
def mean_loss(model: torch.nn.Module, windows: Sequence[torch.Tensor]) -> float:
    """Token-weighted mean next-token cross-entropy over ``windows`` (each [length])."""
    total, count = 0.0, 0
    for window in windows:
        logits = model(input_ids=window[None]).logits[0, :-1]  # [length - 1, vocab]
        total += F.cross_entropy(logits, window[1:], reduction="sum").item()
        count += window.numel() - 1
    return total / count


def loss_report(loss: float) -> dict[str, float]:
    return {"loss": loss, "perplexity": math.exp(loss)}


def acceptance_contexts(
    token_lists: Sequence[Sequence[int]], contexts_per_file: int, context_tokens: int
) -> torch.Tensor:
    """Prompts of ``context_tokens`` tokens at evenly spaced points of each long-enough file.

    Returns # [num_contexts, context_tokens]
    """
    contexts = []
    for ids in token_lists:
        if len(ids) < context_tokens * 2:
            continue
        for index in range(contexts_per_file):
            # Ends spread over the file's body, never at its very start.
            end = context_tokens + (len(ids) - context_tokens) * index // contexts_per_file
            contexts.append(torch.tensor(ids[end - context_tokens : end], dtype=torch.long))
    if not contexts:
        raise ValueError(f"no held-out file has at least {context_tokens * 2} tokens for acceptance contexts")
    return torch.stack(contexts)


@torch.no_grad()
def greedy_generate(model: torch.nn.Module, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuations of equal-length ``prompts`` [batch, prompt_length] -> [batch, new_tokens]."""
    output = model(input_ids=prompts, use_cache=True)
    cache = output.past_key_values
    generated = []
    next_tokens = output.logits[:, -1].argmax(dim=-1)  # [batch]
    for _ in range(new_tokens):
        generated.append(next_tokens)
        if len(generated) == new_tokens:
            break
        output = model(input_ids=next_tokens[:, None], past_key_values=cache, use_cache=True)
        cache = output.past_key_values
        next_tokens = output.logits[:, -1].argmax(dim=-1)
    return torch.stack(generated, dim=1)


def _length_through_eos(tokens: torch.Tensor, eos_token_id: int) -> int:
    """Tokens a real decode would emit from ``tokens`` [n]: up to and including the first eos."""
    hits = (tokens == eos_token_id).nonzero()
    return int(hits[0]) + 1 if hits.numel() else tokens.numel()


@dataclass
class AcceptanceReport:
    num_contexts: int
    context_tokens: int
    target_tokens: int  # greedy target tokens measured, over all contexts
    greedy_match_rate: float  # alpha: draft argmax == target token, given the target's prefix
    num_draft_tokens: int  # gamma
    iid_tokens_per_step: float  # (1 - alpha^(gamma+1)) / (1 - alpha)
    simulated_tokens_per_step: float  # emitted tokens per target verification, replayed
    simulated_accepted_drafts_per_step: float
    simulated_steps: int

    def to_json(self) -> dict:
        return asdict(self)


def iid_tokens_per_step(alpha: float, num_draft_tokens: int) -> float:
    """Expected tokens per verification when each draft token is accepted independently with ``alpha``."""
    if alpha >= 1.0:
        return float(num_draft_tokens + 1)
    return (1.0 - alpha ** (num_draft_tokens + 1)) / (1.0 - alpha)


@torch.no_grad()
def _draft_proposal(draft: torch.nn.Module, prefix: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The draft's greedy ``num_tokens`` after ``prefix`` [length] -> [num_tokens]."""
    return greedy_generate(draft, prefix[None], num_tokens)[0]


@torch.no_grad()
def measure_acceptance(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    contexts: torch.Tensor,
    generated_tokens: int,
    num_draft_tokens: int,
    eos_token_id: int,
) -> AcceptanceReport:
    """Greedy acceptance of ``draft`` against ``target`` on ``contexts`` [num_contexts, context_tokens]."""
    num_contexts, context_tokens = contexts.shape
    continuations = greedy_generate(target, contexts, generated_tokens)  # [num_contexts, generated_tokens]
    lengths = [_length_through_eos(row, eos_token_id) for row in continuations]

    # Per position: the draft sees the target's own prefix, as in a verification pass.
    sequences = torch.cat([contexts, continuations], dim=1)  # [num_contexts, context + generated]
    draft_logits = draft(input_ids=sequences[:, :-1]).logits[:, context_tokens - 1 :]
    draft_choices = draft_logits.argmax(dim=-1)  # [num_contexts, generated_tokens]
    matches = sum(
        int((draft_choices[row, :n] == continuations[row, :n]).sum()) for row, n in enumerate(lengths)
    )
    total = sum(lengths)
    alpha = matches / total

    # Replayed speculative steps: the draft proposes gamma tokens from the accepted prefix; the target
    # accepts the longest agreeing run and adds its own next token (the correction or the bonus).
    steps, emitted_total, accepted_total = 0, 0, 0
    for row, length in enumerate(lengths):
        position = 0
        while position < length:
            proposal_length = min(num_draft_tokens, length - position)
            prefix = torch.cat([contexts[row], continuations[row, :position]])
            proposal = _draft_proposal(draft, prefix, proposal_length)
            agree = (proposal == continuations[row, position : position + proposal_length]).long()
            accepted = int(agree.cumprod(dim=0).sum())
            emitted = min(accepted + 1, length - position)
            steps += 1
            accepted_total += accepted
            emitted_total += emitted
            position += emitted
    return AcceptanceReport(
        num_contexts=num_contexts,
        context_tokens=context_tokens,
        target_tokens=total,
        greedy_match_rate=alpha,
        num_draft_tokens=num_draft_tokens,
        iid_tokens_per_step=iid_tokens_per_step(alpha, num_draft_tokens),
        simulated_tokens_per_step=emitted_total / steps,
        simulated_accepted_drafts_per_step=accepted_total / steps,
        simulated_steps=steps,
    )
