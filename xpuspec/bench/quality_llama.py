"""llama.cpp's next-token distributions on the quality text, through ``llama-server``'s token probabilities.

``llama-server`` returns, per generated token, the top ``n_probs`` tokens' log-probabilities: a plain
softmax of its logits, before any sampler (without ``post_sampling_probs``), and the sampled token's own.
It has no route for a prompt's teacher-forced distributions, so the measure asks for one token per
position: the chunk's first ``i + 1`` tokens as the prompt (token ids, nothing added), one token to
predict, and a logit bias that makes the sampled token the text's actual next one, so its log-probability
(perplexity) comes back whatever its rank. The bias changes the sampling, not the reported probabilities.
A token that ends inside a UTF-8 character (byte tokens of CJK text) is never sent on its own, and its
probabilities with it; for those positions a whole token is forced instead and the actual token's
log-probability read from the whole vocabulary's (:func:`_position`).
With the prompt cache on, each request evaluates one new token: llama.cpp's own decode path with its
default f16 KV cache. Four chunks run at once, each in a slot of its own, so the server decodes four
sequences' tokens in one batch (a fourth of the time on a small model).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True)
class Position:
    top: list[tuple[int, float]]  # the peer's top-n ids and log-probabilities, most likely first
    actual_logprob: float


def _ask(client: httpx.Client, prompt: list[int], forced: int, n_probs: int) -> dict[str, Any] | None:
    """One token after ``prompt``, ``forced`` to be sampled; its probabilities, or None where the server
    withheld them (a token that ends inside a UTF-8 character is not sent on its own)."""
    body = {
        "prompt": prompt,
        "n_predict": 1,
        "n_probs": n_probs,
        "temperature": 0,
        "cache_prompt": True,
        "logit_bias": [[forced, FORCE_BIAS]],
    }
    response = client.post("/completion", json=body)
    response.raise_for_status()
    found = response.json().get("completion_probabilities")
    if not found:
        return None
    if int(found[0]["id"]) != forced:
        raise RuntimeError(f"llama-server sampled {found[0]['id']}, not the forced token {forced}")
    return dict(found[0])


def _position(
    client: httpx.Client, prompt: list[int], actual: int, top_n: int, safe: int, vocab: int
) -> Position:
    """The peer's top-n and the actual next token's log-probability after ``prompt``. Where the actual
    token is a piece of a UTF-8 character (the server then withholds the probabilities), a whole
    token (``safe``) is forced instead, and the actual token's log-probability is read from the top
    ``vocab`` (the whole vocabulary) when it is not among the top-n."""
    found = _ask(client, prompt, actual, top_n)
    if found is not None:
        top = [(int(entry["id"]), float(entry["logprob"])) for entry in found["top_logprobs"][:top_n]]
        return Position(top, float(found["logprob"]))
    found = _ask(client, prompt, safe, top_n)
    if found is None:
        raise RuntimeError(f"llama-server withheld the probabilities of the whole token {safe}")
    top = [(int(entry["id"]), float(entry["logprob"])) for entry in found["top_logprobs"][:top_n]]
    known = dict(top)
    if actual not in known:
        every = _ask(client, prompt, safe, vocab)
        assert every is not None  # the same request as the one above, with more probabilities
        known = {int(entry["id"]): float(entry["logprob"]) for entry in every["top_logprobs"]}
    return Position(top, known[actual])


def peer_chunk(client: httpx.Client, tokens: Sequence[int], top_n: int, safe: int, vocab: int) -> PeerChunk:
    """The peer's distributions at every position of ``tokens`` but the last (whose next token the text
    does not give)."""
    positions = len(tokens) - 1
    support = np.full((positions, top_n + 1), -1, dtype=np.int64)
    logprobs = np.full((positions, top_n + 1), -np.inf)
    top1 = np.zeros(positions, dtype=np.int64)
    actual_logprob = np.zeros(positions)
    for index in range(positions):
        actual = int(tokens[index + 1])
        found = _position(client, list(tokens[: index + 1]), actual, top_n, safe, vocab)
        ids = [token for token, _ in found.top]
        support[index, : len(ids)] = ids
        logprobs[index, : len(ids)] = [logprob for _, logprob in found.top]
        if actual not in ids:
            support[index, top_n] = actual
            logprobs[index, top_n] = found.actual_logprob
        top1[index] = ids[0]
        actual_logprob[index] = found.actual_logprob
    return PeerChunk(support, logprobs, top1, actual_logprob)


def llama_distributions(
    binary: Path,
    gguf: Path,
    chunks: Sequence[Sequence[int]],
    top_n: int,
    threads: int,
    log_path: Path,
    advance: Callable[[str], None],
    vocab: int,
    slots: int = 4,
) -> list[PeerChunk]:
    """Every chunk's :class:`PeerChunk`, from one ``llama-server -t THREADS -np SLOTS`` on ``gguf``:
    ``slots`` chunks at a time, each in a slot of its own (whose prompt cache holds that chunk), so that
    the server decodes their positions in one batch."""
    from concurrent.futures import ThreadPoolExecutor

    context = max(len(chunk) for chunk in chunks) + 8
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per position drowns the progress
    row = Row("llama.cpp", f"llama.cpp -t {threads}", ("-t", str(threads)))
    with LlamaServer(binary, gguf, row, context, log_path, slots=slots) as server:
        safe = int(httpx.post(f"{server.base_url}/tokenize", json={"content": " the"}).json()["tokens"][0])

        def one(chunk: Sequence[int]) -> PeerChunk:
            with httpx.Client(base_url=server.base_url, timeout=300) as client:
                found = peer_chunk(client, chunk, top_n, safe, vocab)
            advance(f"llama.cpp: {len(chunk)} tokens")
            return found

        with ThreadPoolExecutor(max_workers=slots) as pool:
            return list(pool.map(one, chunks))


def compare_peer(reference: np.ndarray, peer: PeerChunk, deviation: Deviation) -> None:
    """Add one chunk's positions of the peer to ``deviation`` (no full KL: the peer gives only top-n)."""
    lumped = lumped_kl(reference, peer.support, peer.logprobs)
    same = int(np.sum(reference.argmax(axis=-1) == peer.top1))
    deviation.add(None, lumped, same, float(-peer.actual_logprob.sum()))
