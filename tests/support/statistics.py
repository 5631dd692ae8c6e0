"""Goodness of fit of sampled token sequences against an exact joint distribution."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from pathlib import Path

import numpy as np
from scipy.stats import chisquare

from xpuspec.engine.engine import EngineConfig
from xpuspec.models.bundle import ModelBundle

# Thousands of requests of a few tokens each: 64 in flight rather than the default 16 take a third
# less time (27 s -> 18 s for 6,000 on the pair), and the sampled output must not depend on the batch.
SAMPLING_BATCH = 64


def sampling_engine_config(bundle: Path) -> EngineConfig:
    """The engine of the statistical tests: :data:`SAMPLING_BATCH` requests in flight."""
    return EngineConfig(
        max_model_len=ModelBundle.open(bundle).max_context,
        max_num_seqs=SAMPLING_BATCH,
        max_num_batched_tokens=16 * SAMPLING_BATCH,  # every waiting prompt's prefill in one step
    )


def goodness_of_fit(samples: Iterable[Hashable], joint: Mapping[Hashable, float]) -> float:
    """Chi-square p-value of ``samples`` against ``joint`` (cell -> probability).

    A sample outside the joint's support gives 0: the sampler produced what the distribution cannot.
    Cells expected below 5 times are pooled into one, as the chi-square approximation needs.
    """
    samples = list(samples)
    cells = sorted(joint)
    counts = {cell: 0 for cell in cells}
    for sample in samples:
        if sample not in counts:
            return 0.0
        counts[sample] += 1
    expected = np.array([joint[c] for c in cells]) * len(samples)
    observed = np.array([counts[c] for c in cells], dtype=float)
    small = expected < 5
    if small.any():
        expected = np.append(expected[~small], expected[small].sum())
        observed = np.append(observed[~small], observed[small].sum())
    return float(chisquare(observed, expected * observed.sum() / expected.sum()).pvalue)


def target_joint(
    bundle: Path, prompt: str, fields: Mapping[str, object]
) -> dict[tuple[int, int, int], float]:
    """p(t1, t2, t3) of ``bundle``'s target alone after ``prompt``, under the transform of the sampling
    ``fields``: penalties (each position's row penalised with the prompt and the tokens before it), then
    top-k, top-p, min-p and temperature; exact compute (f32)."""
    from xpuspec import Pipeline, SamplingParams
    from xpuspec.core.chunks import SequenceChunk
    from xpuspec.executor.properties import EXACT_PROPERTIES
    from xpuspec.sample.penalties import penalize
    from xpuspec.sample.sampler import probabilities

    pipe = Pipeline(bundle, drafter="none", properties=dict(EXACT_PROPERTIES))
    runner, params = pipe.target_runner, SamplingParams(**fields)  # type: ignore[arg-type]
    prompt_ids = pipe.tokenizer.encode(prompt)
    blocks = list(range(runner.num_blocks))

    def next_probs(prefix: list[int]) -> np.ndarray:  # [vocab]
        logits = np.array(runner.forward([SequenceChunk(prefix, 0, blocks, 1)]))
        if params.penalized:
            logits = penalize(logits, prefix, len(prefix) - len(prompt_ids), [[]], params)
        return probabilities(logits, params)[0]

    joint = {}
    first = next_probs(prompt_ids)
    for t1 in np.flatnonzero(first):
        second = next_probs(prompt_ids + [int(t1)])
        for t2 in np.flatnonzero(second):
            third = next_probs(prompt_ids + [int(t1), int(t2)])
            for t3 in np.flatnonzero(third):
                joint[(int(t1), int(t2), int(t3))] = first[t1] * second[t2] * third[t3]
    return joint
