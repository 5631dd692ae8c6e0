"""From a validated request body to engine requests: prompts encoded, limits checked, params per choice."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from pydantic import BaseModel

from xpuspec.api.engine_loop import ChoiceRequest
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.server import tools
from xpuspec.server.config import ServerConfig
from xpuspec.server.errors import APIError
from xpuspec.server.schemas import SEED_LIMIT, ChatCompletionRequest, CompletionRequest, GenerationFields
from xpuspec.structured.constraint import Constraint

if TYPE_CHECKING:
    from xpuspec.api.requests import RequestPreparer

# Per-request drafter names that keep the server's drafter; "none" turns drafting off for the request.
SERVER_DRAFTER_ALIASES = ("auto",)


@dataclass
class PreparedRequest:
    choices: list[ChoiceRequest]
    num_prompt_tokens: int  # each distinct prompt once, as OpenAI counts usage
    num_choices_per_prompt: int
    tools: tools.ToolRequest | None = None  # chat with tools: calls are parsed out of the replies


def check_model(body: GenerationFields, config: ServerConfig) -> None:
    # Compared only: the name never becomes a path.
    if not config.serves(body.model):
        raise APIError(
            404,
            f"the model {body.model!r} does not exist; this server serves {config.served_model_name!r}",
            param="model",
            code="model_not_found",
        )


def resolve_num_draft_tokens(body: GenerationFields, server_drafter: str) -> int | None:
    """The per-request drafter: the server's own (by name or 'auto') or 'none'; anything else is a 400."""
    drafter = body.drafter
    if drafter is None or drafter in SERVER_DRAFTER_ALIASES or drafter == server_drafter:
        return body.num_draft_tokens
    if drafter == "none":
        if body.num_draft_tokens:
            raise APIError(
                400,
                "drafter 'none' cannot be combined with num_draft_tokens > 0",
                param="num_draft_tokens",
                code="invalid_value",
            )
        return 0
    raise APIError(
        400,
        f"drafter {drafter!r} is not available: this server runs {server_drafter!r}; "
        f"pass {server_drafter!r}, 'auto' or 'none'",
        param="drafter",
        code="invalid_value",
    )


def sampling_params(
    body: GenerationFields, max_tokens: int, num_draft_tokens: int | None, choice: int
) -> SamplingParams:
    # Choice i of a seeded request uses seed + i, wrapped into the engine's 64-bit seed range.
    seed = None if body.seed is None else (body.seed + choice) % SEED_LIMIT
    try:
        return _sampling_params(body, max_tokens, num_draft_tokens, seed)
    except ValueError as error:
        # The schema admits what SamplingParams refuses only by an oversight: still the client's 400.
        raise APIError(400, str(error), code="invalid_value") from None


def _sampling_params(
    body: GenerationFields, max_tokens: int, num_draft_tokens: int | None, seed: int | None
) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens,
        # Unset fields stay None: the engine gives them the model's defaults (xpuspec.sample.defaults).
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        min_p=body.min_p,
        repeat_penalty=body.repeat_penalty,
        repeat_last_n=body.repeat_last_n,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        dry_multiplier=body.dry_multiplier,
        dry_base=body.dry_base,
        dry_allowed_length=body.dry_allowed_length,
        dry_penalty_last_n=body.dry_penalty_last_n,
        dry_sequence_breakers=body.dry_sequence_breakers,
        dry_include_prompt=body.dry_include_prompt,
        seed=seed,
        stop=body.stop_list,
        ignore_eos=bool(body.ignore_eos),
        num_draft_tokens=num_draft_tokens,
        response_format=body.response_format.as_dict() if body.response_format is not None else None,
        guided_regex=body.guided_regex,
        guided_grammar=body.grammar_text,
        draft_tree=body.draft_tree,
    )


def _check_context(num_prompt_tokens: int, max_tokens: int, context: int, param: str) -> None:
    if num_prompt_tokens + max_tokens > context:
        raise APIError(
            400,
            f"this model's context is {context} tokens; the prompt has {num_prompt_tokens} tokens and "
            f"{param} is {max_tokens}: reduce the prompt or {param}",
            param=param,
            code="context_length_exceeded",
        )


def _check_fits_cache(num_prompt_tokens: int, requests: RequestPreparer, param: str) -> None:
    # A prompt larger than the whole KV cache can never be scheduled: 400 now, not an engine error later.
    if not requests.limits.fits_cache(num_prompt_tokens):
        raise APIError(
            400,
            f"the prompt has {num_prompt_tokens} tokens but this server's whole KV cache holds "
            f"{requests.limits.num_token_slots}",
            param=param,
            code="context_length_exceeded",
        )


def _expand(
    body: GenerationFields,
    prompts: list[list[int]],
    max_tokens_of: list[int],
    num_draft_tokens: int | None,
) -> PreparedRequest:
    n = body.n or 1
    choices = []
    for prompt_index, prompt in enumerate(prompts):
        for choice in range(n):
            params = sampling_params(body, max_tokens_of[prompt_index], num_draft_tokens, choice)
            choices.append(ChoiceRequest(prompt_index * n + choice, prompt, params))
    return PreparedRequest(choices, sum(len(p) for p in prompts), n)


def check_constraint(body: GenerationFields, requests: RequestPreparer) -> None:
    """A 400 with the grammar engine's message for a constraint it cannot compile (checked once here,
    on the request's thread, rather than as a failed choice on the engine's)."""
    param = next(
        (
            name
            for name in ("response_format", "guided_regex", "guided_grammar", "grammar")
            if getattr(body, name)
        ),
        None,
    )
    if param is None:
        return
    try:
        constraint = SamplingParams(
            response_format=body.response_format.as_dict() if body.response_format is not None else None,
            guided_regex=body.guided_regex,
            guided_grammar=body.grammar_text,
        ).constraint()
        if constraint is None:
            return
        requests.compile_constraint(constraint)
    except ValueError as error:
        raise APIError(400, str(error), param=param, code="invalid_value") from None


def _check_common(body: GenerationFields) -> None:
    if body.stream_options is not None and not body.stream:
        raise APIError(
            400,
            "stream_options is only allowed with stream=true",
            param="stream_options",
            code="invalid_value",
        )


def prepare_completion(body: CompletionRequest, requests: RequestPreparer) -> PreparedRequest:
    _check_common(body)
    check_constraint(body, requests)
    num_draft_tokens = resolve_num_draft_tokens(body, requests.drafter)
    prompt = body.prompt
    vocab_size = requests.limits.vocab_size
    if isinstance(prompt, str):
        prompts = [requests.tokenizer.encode(prompt)]
    elif all(isinstance(item, str) for item in prompt):
        prompts = requests.tokenizer.encode_batch(cast(list[str], prompt))
    elif all(isinstance(item, int) for item in prompt):
        prompts = [list(cast(list[int], prompt))]
    else:  # the schema admits no other shape (CompletionRequest.prompt)
        prompts = [list(item) for item in cast(list[list[int]], prompt)]
    for index, token_ids in enumerate(prompts):
        if not token_ids:
            raise APIError(400, f"prompt {index} encodes to no tokens", param="prompt", code="invalid_value")
        if max(token_ids) >= vocab_size:
            raise APIError(
                400,
                f"prompt {index} has a token id >= the vocabulary size {vocab_size}",
                param="prompt",
                code="invalid_value",
            )
    max_tokens = 16 if body.max_tokens is None else body.max_tokens
    context = requests.max_model_len
    for token_ids in prompts:
        _check_context(len(token_ids), max_tokens, context, "max_tokens")
        _check_fits_cache(len(token_ids), requests, "prompt")
    return _expand(body, prompts, [max_tokens] * len(prompts), num_draft_tokens)


def prepare_chat(body: ChatCompletionRequest, requests: RequestPreparer) -> PreparedRequest:
    _check_common(body)
    check_constraint(body, requests)
    num_draft_tokens = resolve_num_draft_tokens(body, requests.drafter)
    if requests.chat_template is None:
        raise APIError(400, "this model has no chat template; use /v1/completions", param="messages")
    tool_request = tools.parse_tools(
        [t.model_dump(exclude_none=True) for t in body.tools] if body.tools is not None else None,
        body.tool_choice.model_dump() if isinstance(body.tool_choice, BaseModel) else body.tool_choice,
        requests.chat_template.template,
        body.parallel_tool_calls,
    )
    if tool_request is not None and tool_request.mode != "auto" and body.response_format is not None:
        message = "response_format cannot be combined with a required or named tool_choice"
        raise APIError(400, message, param="tool_choice")
    native = tools.template_uses_tools(requests.chat_template.template)
    messages = tools.prompt_messages([m.template_message() for m in body.messages], tool_request, native)
    try:
        rendered = requests.chat_template.render(
            messages,
            add_generation_prompt=True,
            **({"tools": [t.openai() for t in tool_request.tools]} if tool_request and native else {}),
        )
    except ValueError as error:  # the template itself may reject a conversation (raise_exception)
        raise APIError(400, str(error), param="messages", code="invalid_value") from None
    token_ids = requests.tokenizer.encode(rendered, add_special_tokens=False)
    if not token_ids:
        raise APIError(400, "the messages encode to no tokens", param="messages", code="invalid_value")
    context = requests.max_model_len
    _check_fits_cache(len(token_ids), requests, "messages")
    requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    if requested is None:
        if len(token_ids) >= context:
            _check_context(len(token_ids), 1, context, "max_completion_tokens")
        # No limit named: the default reply cap, within the room the context leaves.
        max_tokens = min(requests.sampling_defaults.max_tokens, context - len(token_ids))
    else:
        _check_context(len(token_ids), requested, context, param)
        max_tokens = requested
    prepared = _expand(body, [token_ids], [max_tokens], num_draft_tokens)
    grammar = tool_request.forced_grammar() if tool_request is not None else None
    if grammar is not None:
        if requests.grammar is None:
            raise APIError(400, "this model cannot force tool calls (no tokenizer.json)", param="tool_choice")
        try:
            requests.compile_constraint(Constraint("lark", grammar))
        except ValueError as error:  # a tool's parameters schema the grammar engine cannot take
            raise APIError(400, f"tools: {error}", param="tools", code="invalid_value") from None
        for choice in prepared.choices:
            choice.params.guided_grammar = grammar
    prepared.tools = tool_request
    return prepared
