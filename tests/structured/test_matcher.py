"""The per-request matcher on the demo bundle's vocabulary: masks, lookahead and rollback, forced tokens."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.demo_grammar import demo_grammar_compiler
from xpuspec.models.bundle import ModelBundle
from xpuspec.models.demo import demo_bundle_path
from xpuspec.structured import constraint_of
from xpuspec.structured.grammar_tokenizer import byte_level_vocabulary


@pytest.fixture(scope="module")
def setup():
    return demo_grammar_compiler()


def test_vocabulary_bytes_match_the_openvino_detokenizer(setup):
    tokenizer, _ = setup
    tokens, special = byte_level_vocabulary(
        ModelBundle.open(demo_bundle_path()).target.path / "tokenizer.json"
    )
    ids = [i for i in range(0, len(tokens), 7) if i not in special]
    text = "".join(tokenizer.decode([i], skip_special_tokens=False) for i in ids)
    assert text == b"".join(tokens[i] for i in ids).decode("utf-8", errors="replace")


def test_masks_rollback_and_forced_tokens(setup):
    tokenizer, compiler = setup
    guide = compiler.compile(constraint_of(guided_regex="(yes|no), done"))
    yes = tokenizer.encode("yes, done", add_special_tokens=False)
    first = guide.allowed()
    assert first[yes[0]] and first.sum() < 50  # only the starts of "yes" and "no"
    masks = guide.verification_masks(yes)  # consumes the drafts and rolls back
    assert masks.shape == (len(yes) + 1, compiler.vocab_size)
    assert all(masks[i][yes[i]] for i in range(len(yes)))
    assert np.array_equal(guide.allowed(), first)  # back to the committed state
    bad = tokenizer.encode("maybe", add_special_tokens=False)
    assert guide.valid_prefix(bad) == 0 and guide.valid_prefix(yes) == len(yes)
    guide.advance(yes[:1])
    forced = guide.forced_tokens(8)
    assert tokenizer.decode(yes[:1] + forced).startswith("yes")
    assert np.array_equal(guide.allowed(), guide.allowed())
    guide.advance(yes[1:])
    assert guide.is_accepting()
    end = guide.allowed()
    assert all(end[eos] for eos in compiler.eos_token_ids) and end.sum() == len(set(compiler.eos_token_ids))
    eos = compiler.eos_token_ids[0]
    guide.verification_masks([eos, eos])  # end-of-sequence after completion: not in the history
    assert guide.is_accepting()


def test_draft_lookahead_is_rolled_back(setup):
    tokenizer, compiler = setup
    guide = compiler.compile(constraint_of(guided_regex="abc[0-9]"))
    drafted = tokenizer.encode("abc", add_special_tokens=False)
    before = guide.allowed()
    logits = np.zeros((1, compiler.vocab_size), dtype=np.float32)
    masked = guide.mask_draft_logits(drafted, logits)
    assert np.isfinite(masked).sum() == 10  # the ten digits only, after "abc"
    guide.end_drafting()
    assert np.array_equal(guide.allowed(), before)


def test_bad_constraints_name_the_problem(setup):
    _, compiler = setup
    with pytest.raises(ValueError, match="invalid regular expression"):
        compiler.compile(constraint_of(guided_regex="[unclosed"))
    with pytest.raises(ValueError, match="response_format type"):
        constraint_of(response_format={"type": "yaml"})
    with pytest.raises(ValueError, match="json_schema"):
        constraint_of(response_format={"type": "json_schema"})
    assert constraint_of(response_format={"type": "text"}) is None


def _accepts(setup, schema, text: str) -> bool:
    tokenizer, compiler = setup
    guide = compiler.compile(
        constraint_of(response_format={"type": "json_schema", "json_schema": {"schema": schema}})
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    if guide.valid_prefix(ids) < len(ids):
        return False
    guide.advance(ids)
    return guide.is_accepting()


@pytest.mark.parametrize(
    ("schema", "written", "not_written"),
    [
        # A sampled reply stuck on digits must be made to end its number.
        (
            {"type": "number"},
            ["12", "-12.5", "0.0000000001", "9007199254740991"],
            ["0.00000000001", "90071992547409911"],
        ),
        ({"type": "integer"}, ["0", "-9007199254740991"], ["-90071992547409911", "1.5"]),
        # The schema's own bounds and multipleOf stay as they are.
        ({"type": "number", "minimum": 0}, ["3.25"], ["-1", "0.00000000001"]),
        ({"type": "number", "multipleOf": 0.5}, ["2.5"], ["2.25"]),
        ({"type": "integer", "minimum": 2**53}, ["90071992547409920"], ["1"]),
        ({"type": ["number", "null"]}, ["null", "1.5"], ["1.00000000001"]),
        ({"type": "number", "enum": [0.123456789012]}, ["0.123456789012"], ["1"]),
        # Nested positions: object properties, array items, anyOf branches.
        (
            {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]},
            ['{"x": 1.5}'],
            ['{"x": 1.00000000001}'],
        ),
        (
            {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "string"}]}},
            ['[1, "a"]'],
            ["[90071992547409911]"],
        ),
    ],
)
def test_json_numbers_are_finite(setup, schema, written, not_written):
    for text in written:
        assert _accepts(setup, schema, text), text
    for text in not_written:
        assert not _accepts(setup, schema, text), text


def test_finite_numbers_leaves_negations_alone():
    from xpuspec.structured.constraint import finite_numbers

    schema = {"not": {"type": "number"}, "if": {"type": "integer"}, "then": {"type": "integer"}}
    bounded = finite_numbers(schema)
    assert bounded["not"] == schema["not"] and bounded["if"] == schema["if"]
    assert bounded["then"]["maximum"] == 2**53 - 1
    assert schema["then"] == {"type": "integer"}  # the caller's schema is not changed
