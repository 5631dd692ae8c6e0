"""The demo pair's recipe settings: model shapes, training phases and evaluation sizes per mode.

``full`` makes the shipped pair (at most 50 minutes on 2 CPU cores: each phase stops at its share
of the budget); ``fast`` runs the same code with toy sizes in seconds, for tests.
"""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("fast", "full")


@dataclass(frozen=True)
class ModelShape:
    """Shape of one LlamaForCausalLM; the vocabulary comes from the trained tokenizer."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} must be divisible by num_heads {self.num_heads}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads}"
            )


@dataclass(frozen=True)
class PhaseSchedule:
    """One training phase: AdamW with linear warmup and cosine decay.

    ``budget_fraction`` is the share of the run's time budget by which this phase must end
    (measured from the start of the run, so time lost earlier is taken from this phase).
    """

    steps: int
    batch_size: int
    peak_learning_rate: float
    warmup_steps: int
    budget_fraction: float
    min_learning_rate_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    log_every: int = 10

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(f"steps and batch_size must be >= 1, got {self.steps} and {self.batch_size}")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps must be in [0, steps={self.steps}), got {self.warmup_steps}")
        if not 0.0 < self.budget_fraction <= 1.0:
            raise ValueError(f"budget_fraction must be in (0, 1], got {self.budget_fraction}")


@dataclass(frozen=True)
class DistillationSettings:
    """Draft loss = kl_weight * T^2 * KL(target_T || draft_T) + (1 - kl_weight) * cross-entropy."""

    temperature: float = 2.0
    kl_weight: float = 0.8

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0.0 <= self.kl_weight <= 1.0:
            raise ValueError(f"kl_weight must be in [0, 1], got {self.kl_weight}")


@dataclass(frozen=True)
class EvaluationSettings:
    """Held-out loss over up to ``max_loss_tokens`` tokens; acceptance over greedy continuations."""

    max_loss_tokens: int | None
    contexts_per_file: int
    context_tokens: int
    generated_tokens: int
    num_draft_tokens: int = 4  # gamma of the simulated speculative steps
    max_contexts: int | None = None  # None: every context the held-out files give


@dataclass(frozen=True)
class Recipe:
    mode: str
    vocab_size: int
    sequence_length: int
    target: ModelShape
    draft: ModelShape
    target_phase: PhaseSchedule
    draft_phase: PhaseSchedule
    distillation: DistillationSettings
    evaluation: EvaluationSettings
    max_minutes: float | None  # wall-clock budget of the whole run; None: steps alone decide
    max_train_files: int | None = None  # None: the whole training split

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        evaluation = self.evaluation
        if evaluation.context_tokens + evaluation.generated_tokens > self.sequence_length:
            raise ValueError(
                f"context_tokens + generated_tokens ({evaluation.context_tokens} + "
                f"{evaluation.generated_tokens}) must fit the sequence length {self.sequence_length}"
            )
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ValueError(f"max_minutes must be > 0 or None, got {self.max_minutes}")


# Sized from measured throughput on 2 cores: ~2k tokens/s for the target's training step when the
# machine is idle, 0.5-0.8k when it is shared. On an idle machine the step counts end each phase and
# the result is reproducible; on a busy one the time shares end them and the learning rate still
# cools down, so the saved pair is usable either way.
FULL_RECIPE = Recipe(
    mode="full",
    vocab_size=4096,
    sequence_length=512,
    target=ModelShape(hidden_size=384, num_layers=6, num_heads=6, num_kv_heads=2, intermediate_size=1024),
    draft=ModelShape(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=512),
    # Batches of 4 sequences: at this small budget more optimizer steps beat larger batches.
    target_phase=PhaseSchedule(
        steps=900, batch_size=4, peak_learning_rate=2e-3, warmup_steps=40, budget_fraction=0.7
    ),
    draft_phase=PhaseSchedule(
        steps=800, batch_size=4, peak_learning_rate=3e-3, warmup_steps=30, budget_fraction=0.92
    ),
    distillation=DistillationSettings(),
    evaluation=EvaluationSettings(
        max_loss_tokens=None, contexts_per_file=2, context_tokens=192, generated_tokens=64
    ),
    max_minutes=50.0,
)

FAST_RECIPE = Recipe(
    mode="fast",
    vocab_size=320,
    sequence_length=64,
    target=ModelShape(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128),
    draft=ModelShape(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64),
    target_phase=PhaseSchedule(
        steps=4, batch_size=2, peak_learning_rate=3e-3, warmup_steps=1, budget_fraction=0.6, log_every=2
    ),
    draft_phase=PhaseSchedule(
        steps=3, batch_size=2, peak_learning_rate=3e-3, warmup_steps=1, budget_fraction=0.9, log_every=2
    ),
    distillation=DistillationSettings(),
    evaluation=EvaluationSettings(
        max_loss_tokens=256, contexts_per_file=1, context_tokens=16, generated_tokens=8, max_contexts=4
    ),
    max_minutes=None,
    max_train_files=12,
)

RECIPES = {"fast": FAST_RECIPE, "full": FULL_RECIPE}


def llama_config(shape: ModelShape, vocab_size: int, sequence_length: int, special_token_ids: dict[str, int]):
    """The ``LlamaConfig`` of ``shape``; ``special_token_ids`` has keys bos, eos and pad."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=sequence_length,
        bos_token_id=special_token_ids["bos"],
        eos_token_id=special_token_ids["eos"],
        pad_token_id=special_token_ids["pad"],
        tie_word_embeddings=False,
    )


def count_parameters(config) -> int:
    """Parameters of a ``LlamaForCausalLM`` built from ``config``, without allocating its weights."""
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return sum(parameter.numel() for parameter in model.parameters())
