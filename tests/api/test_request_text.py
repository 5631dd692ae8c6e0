"""RequestText marks the text of a step's accepted drafts (``mark``) without changing the text."""

from __future__ import annotations

import pytest

from xpuspec.api.request_text import RequestText
from xpuspec.models.demo import demo_bundle_path
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.text import Tokenizer

TEXT = "Exact speculation: é, 中文 and 🙂 keep their bytes; stop here. Not this."


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(demo_bundle_path() / "target")


@pytest.mark.parametrize("stop", [[], ["stop here"]])
@pytest.mark.parametrize("step", [1, 2, 3, 5])
def test_marking_drafts_splits_each_delta_and_changes_no_text(
    tokenizer: Tokenizer, stop: list[str], step: int
) -> None:
    token_ids = tokenizer.encode(TEXT)
    plain = RequestText(tokenizer, SamplingParams(stop=stop))
    marked = RequestText(tokenizer, SamplingParams(stop=stop))
    # The drafts' text is what pushing them alone would have released.
    apart = RequestText(tokenizer, SamplingParams(stop=stop))
    mark = step - 1
    cuts = []
    for start in range(0, len(token_ids), step):
        chunk = token_ids[start : start + step]
        finished = start + step >= len(token_ids)
        plain.push(chunk, finished)
        delta, _ = marked.push(chunk, finished, mark=mark)
        drafts, _ = apart.push(chunk[:mark], finished and mark >= len(chunk))
        rest, _ = apart.push(chunk[mark:], finished)
        assert (delta[: marked.marked_chars], delta[marked.marked_chars :]) == (drafts, rest)
        cuts.append(marked.marked_chars)
        if marked.stopped:
            break
    assert marked.text == plain.text and marked.token_ids == plain.token_ids
    if step > 1:
        assert any(cuts), "no delta had marked text"
    if stop:
        assert marked.stopped and not marked.text.endswith("Not this.")
