"""The cross-request suffix index: its proposals against a brute-force rule, tenants, bounds, documents."""

from __future__ import annotations

import random

import pytest

from xpuspec.spec_decode.suffix_index import (
    MAX_CANDIDATES,
    MAX_MATCH,
    TOKEN_BITS,
    SharedSuffixIndex,
    SuffixMatch,
)


def _brute_force(
    documents: list[list[int]], tokens: list[int], num_tokens: int, key: int
) -> SuffixMatch | None:
    """The module's rule, read literally: among the MAX_CANDIDATES most recent ends of the last
    ``key`` tokens, the longest match (most recent on a tie), its continuation to the document's end."""
    ends = []  # (document, end), oldest first
    for number, document in enumerate(documents):
        for end in range(key - 1, len(document) - 1):
            if document[end - key + 1 : end + 1] == tokens[-key:]:
                ends.append((number, end))
    if not ends or num_tokens == 0:
        return None
    best, best_length = None, -1
    for number, end in reversed(ends[-MAX_CANDIDATES:]):
        document, length = documents[number], key
        while length < min(MAX_MATCH, len(tokens)) and end - length >= 0:
            if document[end - length] != tokens[-1 - length]:
                break
            length += 1
        if length > best_length:
            best, best_length = (number, end), length
    number, end = best
    return SuffixMatch(documents[number][end + 1 : end + 1 + num_tokens], best_length)


def test_proposals_equal_the_brute_force_rule_on_random_documents() -> None:
    rng = random.Random(0)
    for trial in range(30):
        vocab = rng.choice([3, 5, 20])  # small vocabularies: many keys recur, many candidates
        documents = [
            [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))] for _ in range(rng.randrange(1, 6))
        ]
        index = SharedSuffixIndex(capacity=10_000)
        for document in documents:
            index.add("t", document)
        kept = [d for d in documents if len(d) > index.key_length]  # shorter ones hold no key
        for _ in range(20):
            tokens = [rng.randrange(vocab) for _ in range(rng.randrange(3, 50))]
            num_tokens = rng.randrange(0, 9)
            assert index.lookup("t", tokens, num_tokens) == _brute_force(kept, tokens, num_tokens, 3), trial


def test_a_verbatim_repeat_is_proposed_to_its_documents_end() -> None:
    index = SharedSuffixIndex()
    index.add(None, list(range(100, 140)))
    match = index.lookup(None, [7, 8, 100, 101, 102, 103], 8)
    assert match == SuffixMatch([104, 105, 106, 107, 108, 109, 110, 111], 4)
    near_end = index.lookup(None, [135, 136, 137], 8)
    assert near_end == SuffixMatch([138, 139], 3)  # no continuation past the document
    assert index.lookup(None, [137, 138, 139], 8) is None  # the document's last tokens have no continuation
    index.add(None, [1, 2, 3])
    assert index.lookup(None, [138, 139, 1], 4) is None  # no key spans two documents


def test_the_longest_match_wins_over_a_more_recent_one() -> None:
    index = SharedSuffixIndex()
    index.add(None, [9, 9, 9, 5, 6, 7, 1])  # "5 6 7" after "9 9 9"
    index.add(None, [4, 4, 5, 6, 7, 2])  # more recent, but after "4 4"
    assert index.lookup(None, [9, 9, 5, 6, 7], 1) == SuffixMatch([1], 5)
    assert index.lookup(None, [4, 4, 5, 6, 7], 1) == SuffixMatch([2], 5)
    assert index.lookup(None, [3, 5, 6, 7], 1) == SuffixMatch([2], 3)  # a tie: the most recent


def test_tenants_read_their_own_documents_only() -> None:
    index = SharedSuffixIndex()
    index.add("key-a", [1, 2, 3, 4, 5, 6])
    assert index.lookup("key-a", [1, 2, 3], 2) == SuffixMatch([4, 5], 3)
    assert index.lookup("key-b", [1, 2, 3], 2) is None
    assert index.lookup(None, [1, 2, 3], 2) is None  # the anonymous tenant is a tenant of its own
    index.add(None, [1, 2, 3, 9])
    assert index.lookup(None, [1, 2, 3], 2) == SuffixMatch([9], 3)
    assert index.lookup("key-a", [1, 2, 3], 2) == SuffixMatch([4, 5], 3)


def test_the_oldest_documents_are_evicted_over_the_capacity() -> None:
    index = SharedSuffixIndex(capacity=20)
    index.add("a", [1, 2, 3, 4, 5, 6, 7, 8])
    index.add("b", [11, 12, 13, 14, 15, 16, 17, 18])
    assert index.num_tokens == 16
    index.add("a", [21, 22, 23, 24, 25, 26])  # 22 > 20: the first document goes
    assert index.num_tokens == 14 and index.num_documents == 2
    assert index.lookup("a", [1, 2, 3], 4) is None
    assert index.lookup("a", [21, 22, 23], 2) == SuffixMatch([24, 25], 3)
    assert index.lookup("b", [11, 12, 13], 2) == SuffixMatch([14, 15], 3)
    index.add("c", list(range(40, 65)))  # longer than the capacity: its last 20 tokens, alone
    assert index.num_tokens == 20 and index.tenants() == ["c"]
    assert index.lookup("c", [44, 45, 46], 2) is None  # cut
    assert index.lookup("c", [45, 46, 47], 2) == SuffixMatch([48, 49], 3)


def test_eviction_keeps_the_index_bounded_and_equal_to_a_fresh_one() -> None:
    rng = random.Random(1)
    index = SharedSuffixIndex(capacity=300)
    documents = []
    for _ in range(200):
        document = [rng.randrange(6) for _ in range(rng.randrange(4, 80))]
        documents.append(document)
        index.add(None, document)
        assert index.num_tokens <= 300
    held, total = [], 0  # the most recent documents that fit
    for document in reversed(documents):
        if total + len(document) > 300:
            break
        held.insert(0, document)
        total += len(document)
    fresh = SharedSuffixIndex(capacity=300)
    for document in held:
        fresh.add(None, document)
    assert index.num_documents == len(held)
    # Every key of an evicted document is gone: no key table keeps growing.
    assert sum(map(len, index._tenants[None].keys.values())) == sum(
        map(len, fresh._tenants[None].keys.values())
    )
    for _ in range(200):
        tokens = [rng.randrange(6) for _ in range(rng.randrange(3, 40))]
        assert index.lookup(None, tokens, 6) == fresh.lookup(None, tokens, 6)


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="capacity"):
        SharedSuffixIndex(capacity=0)
    with pytest.raises(ValueError, match="key_length"):
        SharedSuffixIndex(key_length=0)


def test_a_document_with_a_token_id_no_key_holds_is_not_indexed() -> None:
    index = SharedSuffixIndex()
    index.add(None, [1, 2, 3, 1 << TOKEN_BITS, 5])
    index.add(None, [1, 2, 3, -1, 5])
    assert index.num_documents == 0
    index.add(None, [(1 << TOKEN_BITS) - 1] * 3 + [7])
    assert index.lookup(None, [(1 << TOKEN_BITS) - 1] * 3, 1) == SuffixMatch([7], 3)
