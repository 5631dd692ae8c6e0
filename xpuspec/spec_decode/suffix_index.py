"""A cross-request suffix index: continuations of a sequence's suffix found in other requests' tokens.

Agent loops re-send tool results and earlier turns, edits of one file re-send the file, and one user's
questions share their phrasing: spans a request has not produced yet often occur, whole, in the
prompts and outputs of the requests before it. Like SuffixDecoding, or llama.cpp's shared
``ngram-mod`` pool, this index keeps the recent requests' tokens (prompt and output, once a request
finishes) and proposes what followed the longest earlier match of the current suffix: a draft that
needs no draft-model pass. The engine weighs it beside the draft model and the sequence's own lookup
(:class:`~xpuspec.spec_decode.policy.prompt_lookup.PromptLookup`).

**Tenants.** Requests are indexed, and looked up, under their tenant: a digest of the API key they
came with (requests without one share the anonymous tenant, ``None``). A lookup reads its own
tenant's documents only, so one key's prompts never draft another key's tokens (a test proves it
through the engine). The drafts are verified, so nothing leaks into outputs either way; what the
separation prevents is a side channel: a draft's acceptance shows in the response's timing.

**Bounds.** The index holds at most ``capacity`` tokens over every tenant; adding a document beyond
that evicts the oldest documents first, of any tenant (a document longer than the capacity keeps its
last ``capacity`` tokens). Adding a document of n tokens costs O(n) dictionary writes, evicting one
O(its tokens); a lookup costs one dictionary read and a comparison of at most
:data:`MAX_CANDIDATES` x :data:`MAX_MATCH` tokens, whatever the index holds.

**The rule.** Every position of a document whose last :data:`KEY_LENGTH` tokens (within the
document) are followed by a token of that document is an *end*; the index maps each key (the
tokens ending there) to its most recent ends, at most :data:`MAX_CANDIDATES`. A lookup takes the
ends of the sequence's last ``KEY_LENGTH`` tokens, measures how far back each occurrence goes on
matching the sequence (up to :data:`MAX_MATCH` tokens, within its document), and proposes the
tokens that followed the longest one (the most recent on a tie), up to the end of its document.
Plain data and numpy-free Python: no runtime.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

# Tokens of the suffix a match starts from. One or two tokens recur everywhere across requests
# (the chat template's tail alone is several); three still find verbatim repeats at their start.
KEY_LENGTH = 3
# The most recent occurrences of a key weighed per lookup (a longer match wins among them).
MAX_CANDIDATES = 4
# How far back a match is measured: enough to tell a verbatim repeat from a shared phrase.
MAX_MATCH = 32
DEFAULT_CAPACITY = 32768  # a few dozen recent requests; its memory: docs/suffix-drafter.md
_SEPARATOR = -1  # between documents: no key spans it, no continuation runs past it
# A key is its tokens packed into one int, TOKEN_BITS each (a tuple took twice the memory). Token ids
# are below every vocabulary's size; a document with a larger one is not indexed.
TOKEN_BITS = 21


@dataclass(frozen=True)
class SuffixMatch:
    """A continuation found in the index and how many tokens of the sequence's suffix matched."""

    token_ids: list[int]
    match_length: int


@dataclass
class _TenantTokens:
    """One tenant's documents, oldest first, and their keys. Positions are absolute: ``base`` is the
    position of ``tokens[dead]``; ``tokens[:dead]`` were evicted and are dropped in bulk."""

    tokens: list[int] = field(default_factory=list)
    base: int = 0
    dead: int = 0
    keys: dict[int, list[int]] = field(default_factory=dict)  # packed key -> recent ends, oldest first

    @property
    def end(self) -> int:
        """The absolute position after the last token held."""
        return self.base + len(self.tokens) - self.dead


class SharedSuffixIndex:
    """Recent requests' tokens per tenant, bounded by ``capacity`` tokens (module docstring)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, key_length: int = KEY_LENGTH) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an integer >= 1, got {capacity!r}")
        if not isinstance(key_length, int) or key_length < 1:
            raise ValueError(f"key_length must be an integer >= 1, got {key_length!r}")
        self.capacity = capacity
        self.key_length = key_length
        self._key_mask = (1 << (TOKEN_BITS * key_length)) - 1
        self._tenants: dict[str | None, _TenantTokens] = {}
        # Every tenant's documents in the order added: (tenant, first position, length).
        self._documents: deque[tuple[str | None, int, int]] = deque()
        self.num_tokens = 0  # tokens held, over every tenant (separators not counted)

    @property
    def num_documents(self) -> int:
        return len(self._documents)

    def tenants(self) -> list[str | None]:
        return list(self._tenants)

    def add(self, tenant: str | None, token_ids: Sequence[int]) -> None:
        """Index one finished request's tokens (prompt and output) under ``tenant``; evict the oldest
        documents while the index holds more than its capacity."""
        tokens = list(token_ids[-self.capacity :])
        if len(tokens) <= self.key_length or min(tokens) < 0 or max(tokens) >> TOKEN_BITS:
            return  # no key with a continuation, or a token id no key can hold
        while self._documents and self.num_tokens + len(tokens) > self.capacity:
            self._evict_oldest()
        store = self._tenants.get(tenant)
        if store is None:
            store = self._tenants[tenant] = _TenantTokens()
        start = store.end
        store.tokens.extend(tokens)
        store.tokens.append(_SEPARATOR)
        keys, key_length, mask = store.keys, self.key_length, self._key_mask
        key = self._pack(tokens[: key_length - 1])
        # Ends are the positions start + i for i in [key_length - 1, len - 2]: a key inside the
        # document, followed by one of its tokens.
        for i in range(key_length - 1, len(tokens) - 1):
            key = ((key << TOKEN_BITS) | tokens[i]) & mask
            ends = keys.get(key)
            if ends is None:
                keys[key] = [start + i]
            else:
                ends.append(start + i)
                if len(ends) > MAX_CANDIDATES:
                    del ends[0]
        self._documents.append((tenant, start, len(tokens)))
        self.num_tokens += len(tokens)

    def lookup(self, tenant: str | None, token_ids: Sequence[int], num_tokens: int) -> SuffixMatch | None:
        """What followed the longest earlier match of ``token_ids``' suffix among ``tenant``'s
        documents, at most ``num_tokens`` tokens; None when its last ``key_length`` tokens never
        occurred there (or ``num_tokens`` is 0)."""
        store = self._tenants.get(tenant)
        key_length = self.key_length
        if store is None or num_tokens <= 0 or len(token_ids) < key_length:
            return None
        ends = store.keys.get(self._pack(token_ids[-key_length:]))
        if not ends:
            return None
        best_end, best_length = -1, -1
        limit = min(MAX_MATCH, len(token_ids))
        tokens, offset = store.tokens, store.dead - store.base  # tokens[position + offset]
        suffix = list(token_ids[-limit:])
        for end in reversed(ends):  # most recent first: it wins a tie
            start = end - limit + 1 + offset
            if start >= store.dead and tokens[start : end + 1 + offset] == suffix:
                length = limit  # a verbatim repeat as long as measured: one list comparison
                if best_length < length:
                    best_end, best_length = end, length
                break  # nothing older can match further
            length = key_length
            while length < limit:
                index = end - length + offset
                if index < store.dead or tokens[index] != token_ids[-1 - length]:
                    break  # an evicted position, the separator or a different token
                length += 1
            if length > best_length:
                best_end, best_length = end, length
        first = best_end + 1 + offset
        continuation = tokens[first : first + num_tokens]
        if _SEPARATOR in continuation:
            continuation = continuation[: continuation.index(_SEPARATOR)]
        return SuffixMatch(continuation, best_length)

    @staticmethod
    def _pack(tokens: Sequence[int]) -> int:
        key = 0
        for token in tokens:
            key = (key << TOKEN_BITS) | token
        return key

    def _evict_oldest(self) -> None:
        tenant, start, length = self._documents.popleft()
        store = self._tenants[tenant]
        assert store.base == start  # a tenant's documents leave in the order they came
        keys, key_length, mask = store.keys, self.key_length, self._key_mask
        first = start - store.base + store.dead  # the document's first token in store.tokens
        tokens = store.tokens[first : first + length]
        key = self._pack(tokens[: key_length - 1])
        for i in range(key_length - 1, length - 1):
            position = start + i
            key = ((key << TOKEN_BITS) | tokens[i]) & mask
            ends = keys.get(key)
            if ends and ends[0] == position:  # the oldest end of its key, if not pushed out already
                del ends[0]
                if not ends:
                    del keys[key]
        store.base += length + 1  # and its separator
        store.dead += length + 1
        self.num_tokens -= length
        if store.dead == len(store.tokens):
            del self._tenants[tenant]
        elif store.dead > len(store.tokens) // 2:  # drop evicted tokens in bulk: O(1) a token
            del store.tokens[: store.dead]
            store.dead = 0
