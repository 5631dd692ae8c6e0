"""Chat messages -> prompt text with a model's Jinja chat template, as HF's apply_chat_template does.

The environment mirrors transformers' (``utils/chat_template_utils.py``): a sandboxed, immutable
Jinja environment with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension,
``raise_exception`` and ``strftime_now`` globals and a ``tojson`` filter that does not escape HTML.
The ``{% generation %}`` tag of training templates is accepted and renders its body unchanged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

if TYPE_CHECKING:
    from xpuspec.text.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

CHAT_TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text for training masks; render as is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _make_environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment


def validate_messages(messages: Any) -> None:
    """Raise ValueError unless ``messages`` is a list of {"role": str, "content": str, ...} dicts."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        raise ValueError(f"messages must be a list of dicts, got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages must not be empty")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{index}] must be a dict, got {type(message).__name__}")
        for key in ("role", "content"):
            if key not in message:
                raise ValueError(f"messages[{index}] lacks the key {key!r}")
            if not isinstance(message[key], str):
                raise ValueError(
                    f"messages[{index}][{key!r}] must be a string, got {type(message[key]).__name__}"
                )
        if not message["role"]:
            raise ValueError(f"messages[{index}]['role'] must not be empty")


class ChatTemplate:
    """A compiled chat template with the special-token strings templates refer to."""

    def __init__(self, template: str, bos_token: str | None = None, eos_token: str | None = None) -> None:
        if not isinstance(template, str) or not template.strip():
            raise ValueError("template must be a non-empty Jinja string (the model's chat_template)")
        self.template = template
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._compiled = _make_environment().from_string(template)
        except jinja2.exceptions.TemplateSyntaxError as error:
            raise ValueError(f"chat template does not parse: {error} (line {error.lineno})") from error

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> ChatTemplate:
        """Read the template and bos/eos strings a HF tokenizer saved in ``model_dir``.

        ``chat_template.jinja`` (transformers >= 4.47) wins over ``tokenizer_config.json``.
        """
        model_dir = Path(model_dir)
        config: dict[str, Any] = {}
        if (model_dir / TOKENIZER_CONFIG_FILE).is_file():
            config = json.loads((model_dir / TOKENIZER_CONFIG_FILE).read_text(encoding="utf-8"))
        template = config.get("chat_template")
        if (model_dir / CHAT_TEMPLATE_FILE).is_file():
            template = (model_dir / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
        if isinstance(template, list):
            # The older list form: [{"name": "default", "template": ...}, {"name": "tool_use", ...}].
            named = {entry["name"]: entry["template"] for entry in template}
            template = named.get("default")
        if not template:
            raise ValueError(
                f"{model_dir} has no chat template ({CHAT_TEMPLATE_FILE} or {TOKENIZER_CONFIG_FILE})"
            )
        return cls(template, _token_content(config.get("bos_token")), _token_content(config.get("eos_token")))

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> ChatTemplate:
        """The template openvino_tokenizers stored in the tokenizer IR, with its bos/eos strings."""
        if not tokenizer.chat_template:
            raise ValueError(f"the tokenizer IR in {tokenizer.model_dir} carries no chat template")
        bos_token, eos_token = (
            None if token_id is None else tokenizer.token_to_text(token_id)
            for token_id in (tokenizer.bos_token_id, tokenizer.eos_token_id)
        )
        return cls(tokenizer.chat_template, bos_token, eos_token)

    def render(
        self,
        messages: list[dict[str, str]],
        add_generation_prompt: bool = True,
        **template_variables: Any,
    ) -> str:
        """The prompt text for ``messages`` (``template_variables`` reach the template as globals)."""
        validate_messages(messages)
        variables: dict[str, Any] = {"tools": None, "documents": None}
        # Like HF, a token the tokenizer lacks stays undefined (renders as "") rather than "None".
        if self.bos_token is not None:
            variables["bos_token"] = self.bos_token
        if self.eos_token is not None:
            variables["eos_token"] = self.eos_token
        variables.update(template_variables)
        try:
            return self._compiled.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **variables
            )
        except jinja2.exceptions.TemplateError as error:
            # Templates call raise_exception() for conversations they do not support
            # (e.g. roles that do not alternate): the caller's messages are at fault.
            raise ValueError(f"chat template rejected the messages: {error}") from error


def _token_content(token: Any) -> str | None:
    # tokenizer_config.json stores a special token as a string or as an AddedToken dict.
    if isinstance(token, Mapping):
        return token.get("content")
    return token if isinstance(token, str) else None
