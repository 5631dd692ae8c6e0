"""From engine outputs to a request's text: detokenizing, stop strings, and the end of a request.

The engine's one driver (:class:`~xpuspec.api.engine_driver.EngineDriver`, run inline by ``Pipeline``
and in the server's loop thread) feeds every :class:`~xpuspec.engine.engine.StepOutput` of a request
through :func:`apply_output`, so the rules below hold the same way for the Python API and the server:

* **Exact stops.** A step may emit several tokens (accepted drafts). When a stop string ends inside
  them, the tokens after the one that completes it are dropped: from the output's token ids, from
  the request's stats (usage and metrics count ``num_output_tokens``) and from the engine's
  sequence. "The token that completes it" is the one after which streaming one token at a time
  would have seen the stop string, so the result equals the target-only run, which emits one
  token per step. finish_reason "stop" wins over "length" and over an end-of-sequence token in
  the same step.
* **Isolation.** An exception while detokenizing or matching stop strings ends that request alone
  with finish_reason "error" (and the message in ``StepOutput.error``); its KV is freed.

It also says how a plain prompt is read where a front end chooses (:func:`chat_by_default`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from xpuspec.models.bundle import ModelBundle
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.text import IncrementalDetokenizer, StopStringMatcher, Tokenizer

if TYPE_CHECKING:
    from xpuspec.engine.engine import LLMEngine, StepOutput

logger = logging.getLogger(__name__)

# The manifest's tokenizer section may record what the model was trained on: "chat" (the default
# wherever there is a chat template) or "text" (plain text; a template there only lets chat clients
# of the server talk to it, as with the demo pair, trained on code).
PROMPT_FORMAT_KEY = "prompt_format"


def chat_by_default(bundle: ModelBundle) -> bool:
    """Whether a plain prompt (``xpuspec generate "..."``) goes in as a chat user message: only where
    the bundle has a chat template and does not record that its model was trained on plain text."""
    if bundle.chat_template is None:
        return False
    return bundle.tokenizer_facts.get(PROMPT_FORMAT_KEY, "chat") != "text"


class RequestText:
    """Turns one request's tokens into text: incremental detokenizing and stop strings."""

    def __init__(self, tokenizer: Tokenizer, params: SamplingParams):
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.stops = StopStringMatcher(params.stop) if params.stop else None
        self.token_ids: list[int] = []
        self.text = ""
        self.stopped = False
        # Of the latest delta: how many characters the first ``mark`` tokens of its push released.
        self.marked_chars = 0

    def push(self, token_ids: list[int], finished: bool, mark: int = 0) -> tuple[str, int]:
        """Add the tokens of one step; return (new text that may be shown, tokens used).

        Fewer tokens than given are used when a stop string completes before the last of them
        (``stopped`` is then set); the rest belong after the stop and are not part of the output.
        ``mark`` > 0: the first ``mark`` tokens are detokenized apart, and ``marked_chars`` says how
        much of the delta they released (text held back, an unfinished character or a possible stop
        string, counts with the token that releases it).
        """
        self.marked_chars = 0
        if self.stopped:
            return "", 0
        if self.stops is None:
            if 0 < mark < len(token_ids):
                marked = self.detokenizer.push(token_ids[:mark])
                self.marked_chars = len(marked)
                delta = marked + self.detokenizer.push(token_ids[mark:])
            else:
                delta = self.detokenizer.push(token_ids) if token_ids else ""
                self.marked_chars = len(delta) if mark and token_ids else 0
            if finished:
                delta += self.detokenizer.flush()  # a character cut short by the end still shows
            self.token_ids.extend(token_ids)
            self.text += delta
            return delta, len(token_ids)
        # With stop strings, one token at a time: the stop is located at the token completing it.
        # Only the steps that emit several tokens (accepted drafts) pay for the extra decodes.
        pieces: list[str] = []
        used = 0
        for token in token_ids:
            used += 1
            piece, self.stopped = self.stops.push(self.detokenizer.push([token]))
            pieces.append(piece)
            if used == mark:
                self.marked_chars = sum(len(piece) for piece in pieces)
            if self.stopped:
                break
        if 0 < used < mark:  # stopped within the drafts: all of the text is theirs
            self.marked_chars = sum(len(piece) for piece in pieces)
        if finished and not self.stopped:
            piece, self.stopped = self.stops.push(self.detokenizer.flush())
            pieces.append(piece)
            if not self.stopped:
                pieces.append(self.stops.flush())
        delta = "".join(pieces)
        self.token_ids.extend(token_ids[:used])
        self.text += delta
        return delta, used


def apply_output(engine: LLMEngine, text: RequestText, output: StepOutput, mark_drafts: bool = False) -> str:
    """Turn one engine output of a request into its new text; end the request if its text ends it.

    Updates ``output`` in place to what the caller reports: ``new_token_ids`` cut after a stop
    string (and ``num_accepted_drafts`` with them), ``finished`` / ``finish_reason`` / ``error``.
    Ends the request in the engine (freeing its KV) when a stop string completed or the text side
    failed. Returns the text to show; with ``mark_drafts``, ``text.marked_chars`` says how much of it
    the accepted drafts released.
    """
    if output.finish_reason == "error":
        return ""
    try:
        mark = output.num_accepted_drafts if mark_drafts else 0
        delta, used = text.push(output.new_token_ids, output.finished, mark)
    except Exception as error:
        logger.exception("making the text of %s failed", output.request_id)
        if not output.finished:
            engine.abort(output.request_id, finish_reason="error")
        output.finished, output.finish_reason = True, "error"
        output.error = f"detokenizing or stop-string matching failed: {type(error).__name__}: {error}"
        return ""
    if text.stopped:
        dropped = len(output.new_token_ids) - used
        if dropped:
            output.stats.drop_output_tokens(dropped)
            output.new_token_ids = output.new_token_ids[:used]
            output.num_accepted_drafts = min(output.num_accepted_drafts, used)
        if not output.finished:
            engine.abort(output.request_id, finish_reason="stop", num_dropped_tokens=dropped)
        output.finished, output.finish_reason = True, "stop"
    return delta
