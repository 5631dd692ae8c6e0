"""llama.cpp's next-token distributions on the quality text, through ``llama-server``'s token probabilities.

``llama-server`` returns, per generated token, the top ``n_probs`` tokens' log-probabilities: a plain
softmax of its logits, before any sampler (without ``post_sampling_probs``), and the sampled token's own.
It has no route for a prompt's teacher-forced distributions, so the measure asks for one token per
position: the chunk's first ``i + 1`` tokens as the prompt (token ids, nothing added), one token to
predict, and a logit bias that makes the sampled token the text's actual next one, so its log-probability
(perplexity) comes back whatever its rank. The bias changes the sampling, not the reported probabilities.
With the prompt cache on, each request evaluates one new token: llama.cpp's own decode path, one token at
a time, with its default f16 KV cache.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from xpuspec.bench.llama_cpp import LlamaServer, Row
from xpuspec.bench.quality_math import Deviation, lumped_kl

logger = logging.getLogger(__name__)

FORCE_BIAS = 1000.0  # a logit bias no other token's logit can overcome


@dataclass
class PeerChunk:
    """One chunk's positions as the peer gave them: per position its top-n ids and the actual next token
    (-1: an unused column), their log-probabilities (-inf where unused) and the peer's top-1 id."""

    support: np.ndarray  # [positions, top_n + 1]
    logprobs: np.ndarray  # [positions, top_n + 1]
    top1: np.ndarray  # [positions]
    actual_logprob: np.ndarray  # [positions]

    def rows(self, part: slice) -> PeerChunk:
        return PeerChunk(self.support[part], self.logprobs[part], self.top1[part], self.actual_logprob[part])


def _position(client: httpx.Client, prompt: list[int], actual: int, top_n: int) -> dict:
    body = {
        "prompt": prompt,
        "n_predict": 1,
        "n_probs": top_n,
        "temperature": 0,
        "cache_prompt": True,
        "logit_bias": [[actual, FORCE_BIAS]],
    }
    response = client.post("/completion", json=body)
    response.raise_for_status()
    probabilities = response.json()["completion_probabilities"][0]
    if int(probabilities["id"]) != actual:
        raise RuntimeError(f"llama-server sampled {probabilities['id']}, not the forced token {actual}")
    return dict(probabilities)


def peer_chunk(client: httpx.Client, tokens: Sequence[int], top_n: int) -> PeerChunk:
    """The peer's distributions at every position of ``tokens`` but the last (whose next token the text
    does not give)."""
    positions = len(tokens) - 1
    support = np.full((positions, top_n + 1), -1, dtype=np.int64)
    logprobs = np.full((positions, top_n + 1), -np.inf)
    top1 = np.zeros(positions, dtype=np.int64)
    actual_logprob = np.zeros(positions)
    for index in range(positions):
        actual = int(tokens[index + 1])
        found = _position(client, list(tokens[: index + 1]), actual, top_n)
        top = found["top_logprobs"][:top_n]
        ids = [int(entry["id"]) for entry in top]
        support[index, : len(ids)] = ids
        logprobs[index, : len(ids)] = [float(entry["logprob"]) for entry in top]
        if actual not in ids:
            support[index, top_n] = actual
            logprobs[index, top_n] = float(found["logprob"])
        top1[index] = ids[0]
        actual_logprob[index] = float(found["logprob"])
    return PeerChunk(support, logprobs, top1, actual_logprob)


def llama_distributions(
    binary: Path,
    gguf: Path,
    chunks: Sequence[Sequence[int]],
    top_n: int,
    threads: int,
    log_path: Path,
    advance: Callable[[str], None],
) -> list[PeerChunk]:
    """Every chunk's :class:`PeerChunk`, from one ``llama-server -t THREADS`` on ``gguf``."""
    context = max(len(chunk) for chunk in chunks) + 8
    row = Row("llama.cpp", f"llama.cpp -t {threads}", ("-t", str(threads)))
    found = []
    with LlamaServer(binary, gguf, row, context, log_path) as server:
        with httpx.Client(base_url=server.base_url, timeout=120) as client:
            for chunk in chunks:
                found.append(peer_chunk(client, chunk, top_n))
                advance(f"llama.cpp: {len(chunk)} tokens")
    return found


def compare_peer(reference: np.ndarray, peer: PeerChunk, deviation: Deviation) -> None:
    """Add one chunk's positions of the peer to ``deviation`` (no full KL: the peer gives only top-n)."""
    lumped = lumped_kl(reference, peer.support, peer.logprobs)
    same = int(np.sum(reference.argmax(axis=-1) == peer.top1))
    deviation.add(None, lumped, same, float(-peer.actual_logprob.sum()))
