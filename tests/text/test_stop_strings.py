"""Stop strings found in streamed text however it is split into deltas."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xpuspec.text import StopStringMatcher


def _expected(text: str, stop: list[str]) -> tuple[str, bool]:
    """Read the text left to right; stop at the first stop string to complete."""
    for end in range(1, len(text) + 1):
        completed = [s for s in stop if text[:end].endswith(s)]
        if completed:
            return text[: end - max(len(s) for s in completed)], True
    return text, False


def _run(deltas: list[str], stop: list[str]) -> tuple[str, bool]:
    matcher = StopStringMatcher(stop)
    emitted = []
    stopped = False
    for delta in deltas:
        text, stopped = matcher.push(delta)
        emitted.append(text)
        if stopped:
            break
    emitted.append(matcher.flush())
    return "".join(emitted), stopped


def test_stop_string_split_over_deltas() -> None:
    matcher = StopStringMatcher(["<|im_end|>"])
    assert matcher.push("Hello <|") == ("Hello ", False)
    assert matcher.held_text == "<|"
    assert matcher.push("im_") == ("", False)
    assert matcher.push("end|> ignored") == ("", True)
    assert matcher.stopped
    assert matcher.push("more") == ("", True)
    assert matcher.flush() == ""


def test_false_start_is_released() -> None:
    matcher = StopStringMatcher(["STOP"])
    assert matcher.push("a ST") == ("a ", False)
    assert matcher.push("ART") == ("START", False)
    assert matcher.push("x STO") == ("x ", False)
    assert matcher.flush() == "STO"


def test_stop_inside_one_delta_and_earliest_wins() -> None:
    matcher = StopStringMatcher(["world", "lo w"])
    assert matcher.push("hello world") == ("hel", True)


def test_no_stop_strings_passes_everything_through() -> None:
    matcher = StopStringMatcher([])
    assert matcher.push("abc") == ("abc", False)
    assert matcher.flush() == ""


@pytest.mark.parametrize("stop", ["abc", [""], ["ok", 3]])
def test_bad_stop_lists_are_rejected(stop) -> None:
    with pytest.raises(ValueError, match="stop must be a list"):
        StopStringMatcher(stop)


@st.composite
def _split_text(draw: st.DrawFn) -> tuple[list[str], str, list[str]]:
    alphabet = "ab<|>é😀"
    text = draw(st.text(alphabet, max_size=30))
    stop = draw(st.lists(st.text(alphabet, min_size=1, max_size=4), max_size=3))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=8)))
    bounds = [0, *cuts, len(text)]
    deltas = [text[start:end] for start, end in zip(bounds[:-1], bounds[1:], strict=True)]
    return deltas, text, stop


@settings(max_examples=400, deadline=None)
@given(_split_text())
def test_any_split_gives_the_text_up_to_the_first_stop(case: tuple[list[str], str, list[str]]) -> None:
    deltas, text, stop = case
    assert _run(deltas, stop) == _expected(text, stop)
