"""The runtime text layer: tokenization, streaming detokenization, stop strings and chat templates.

Needs only openvino, openvino_tokenizers and jinja2 (no torch, no transformers).
"""

from __future__ import annotations

from xpuspec.text.chat_template import ChatTemplate
from xpuspec.text.detokenizer import IncrementalDetokenizer
from xpuspec.text.stop_strings import StopStringMatcher
from xpuspec.text.tokenizer import Tokenizer

__all__ = ["ChatTemplate", "IncrementalDetokenizer", "StopStringMatcher", "Tokenizer"]
