"""Builds the executor (model runner) a device's plugin asks for."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from xpuspec.devices.placement import ResolvedDevice
from xpuspec.devices.plugin import DevicePlugin, OpenVINODevicePlugin, Role, RunnerFactory
from xpuspec.executor.properties import PropertiesArg, layer_tuned, resolve_properties
from xpuspec.models.bundle import ModelInfo

logger = logging.getLogger(__name__)


def create_runner(
    device: ResolvedDevice,
    model: ModelInfo,
    role: Role,
    user_properties: PropertiesArg,
    *,
    tuned_properties: dict[str, Any] | None = None,
    num_blocks: int | None,
    cache_bytes: int | None = None,
    block_size: int | None = None,
    max_draft_tokens: int,
    max_sequences: int,
    max_context: int,
    core: Any,
    hidden_state_layers: Sequence[int] | None = None,
    logits_vocab: int | None = None,
    hidden_state_projection: Any = None,
    precompiled: Any = None,
    decode_lane: bool = False,
) -> Any:
    """The runner for ``model`` on ``device`` with the plugin's compile properties for ``role``.

    ``cache_bytes``: without ``num_blocks``, the paged executor's KV cache takes as many blocks as
    this many bytes hold (default: its own budget); the other executors size their caches themselves.
    ``block_size`` is the KV block size the runner must use (the draft shares the target's block
    tables); OpenVINO runners pick it themselves and the caller checks the two agree.
    ``user_properties`` may name a preset ("exact"); ``tuned_properties`` are what `xpuspec plan`
    recorded for this role and device (see :mod:`xpuspec.executor.properties` for the layering).
    ``hidden_state_layers``: tap the residual stream entering these layers (an EAGLE-3 target); only
    the paged executor has taps; ``hidden_state_projection`` maps them in the graph (the head's ``fc``).
    ``logits_vocab``: a draft proposing only the first ids of the shared
    vocabulary (:func:`xpuspec.executor.graph_edits.cut_logits_vocab`); the other executors keep the
    whole LM head and draft from every id (output is exact either way; only the cost differs).
    ``decode_lane``: a paged target's second compiled copy for steps of one token per sequence
    (a draft always has one); the other executors have none.
    ``precompiled``: what :func:`compile_ahead` returned for the same arguments (a paged executor's
    compiled models), so only the KV cache is left to build.
    """
    plugin = device.plugin
    properties = _role_properties(device, model, role, user_properties, tuned_properties, max_draft_tokens)
    logger.debug("%s on %s (%s executor): %s", role, device.device, plugin.executor_kind, properties)
    if hidden_state_layers is not None and plugin.executor_kind != "paged":
        raise ValueError(
            f"EAGLE-3 drafting reads the target's hidden states, which only the paged executor taps; "
            f"{device.device} runs the {plugin.executor_kind} executor"
        )
    if plugin.executor_kind == "paged":
        from xpuspec.executor.paged_runner import PagedModelRunner

        return PagedModelRunner(
            model.path,
            device=device.device,
            properties=properties,
            num_blocks=num_blocks,
            cache_bytes=cache_bytes if num_blocks is None else None,
            core=core,
            capacity_tokens=max_sequences * (max_context + max_draft_tokens + 1),
            # A draft alternates catch-up passes with one-token passes every step; a second compiled
            # copy for the latter spares the plugin a change of shapes twice a step (see the runner).
            # The draft is small; the target's copy is the caller's choice (target_build).
            decode_lane=role == "draft" or decode_lane,
            hidden_state_layers=hidden_state_layers,
            hidden_state_projection=hidden_state_projection,
            logits_vocab=logits_vocab,
            compiled=precompiled,
        )
    if logits_vocab is not None:
        logger.debug(
            "the %s executor keeps the whole LM head (logits_vocab=%d ignored)",
            plugin.executor_kind,
            logits_vocab,
        )
    if plugin.executor_kind == "stateful":
        return _stateful_runner(device, model, properties, max_sequences, max_context, core)
    if plugin.executor_kind == "reference":
        if not isinstance(plugin, RunnerFactory):
            raise ValueError(f"plugin {plugin.name} has executor_kind 'reference' but no create_runner()")
        return plugin.create_runner(model.path, model.facts, properties, num_blocks, block_size)
    raise ValueError(f"plugin {plugin.name}: unknown executor_kind {plugin.executor_kind!r}")


def compile_ahead(
    device: ResolvedDevice,
    model: ModelInfo,
    role: Role,
    user_properties: PropertiesArg,
    *,
    tuned_properties: dict[str, Any] | None = None,
    max_draft_tokens: int,
    core: Any,
    logits_vocab: int | None = None,
    max_sequences: int | None = None,
    max_context: int | None = None,
) -> Future[Any] | None:
    """Start compiling ``model`` for a paged executor in a thread, as :func:`create_runner` would with
    the same arguments (a draft: with its decode lane); pass the result as its ``precompiled``. None
    where the device's executor is not the paged one (those compile in :func:`create_runner`).
    With ``max_context``, the thread also runs the compiled graphs' first passes at that context
    (:func:`~xpuspec.executor.paged_runner.warm_up_compiled`), the slow ones, so that the runner's own
    warm-up finds them done. ``max_sequences`` sizes the KV cache, which :func:`create_runner`
    allocates: taken here only so that one set of options can go to both."""
    if device.plugin.executor_kind != "paged":
        return None
    from xpuspec.executor.paged_compile import compile_in_background, compile_paged
    from xpuspec.executor.paged_runner import warm_up_compiled

    properties = _role_properties(device, model, role, user_properties, tuned_properties, max_draft_tokens)

    def work() -> Any:
        compiled = compile_paged(
            model.path,
            device.device,
            properties,
            core,
            decode_lane=role == "draft",
            logits_vocab=logits_vocab,
        )
        if max_context is not None:
            warm_up_compiled(compiled, max_context)
        return compiled

    return compile_in_background(work)


def _role_properties(
    device: ResolvedDevice,
    model: ModelInfo,
    role: Role,
    user_properties: PropertiesArg,
    tuned_properties: dict[str, Any] | None,
    max_draft_tokens: int,
) -> dict[str, Any]:
    """The compile properties for ``role``: the user's over the tuned ones, through the plugin."""
    user = layer_tuned(tuned_properties, resolve_properties(user_properties))
    return _compile_properties(device.plugin, role, user, model, max_draft_tokens)


def _compile_properties(
    plugin: DevicePlugin, role: Role, user: dict[str, Any] | None, model: ModelInfo, max_draft_tokens: int
) -> dict[str, Any]:
    """The plugin's compile properties for ``role``; an OpenVINO plugin also weighs the model's weights."""
    if isinstance(plugin, OpenVINODevicePlugin):
        return plugin.compile_properties(
            role, user, max_draft_tokens=max_draft_tokens, weights=model_weights(model)
        )
    return plugin.compile_properties(role, user, max_draft_tokens=max_draft_tokens)


def _stateful_runner(
    device: ResolvedDevice,
    model: ModelInfo,
    properties: dict[str, Any],
    max_sequences: int,
    max_context: int,
    core: Any,
) -> Any:
    """The stateful executor (a device whose plugin has no PagedAttention), where this build has it."""
    try:
        from xpuspec.executor.stateful_runner import StatefulModelRunner
    except ImportError as error:
        raise ValueError(
            f"{device.device} needs the stateful executor, which this build lacks ({error})"
        ) from error
    return StatefulModelRunner(
        model.path,
        device=device.device,
        properties=properties,
        max_sequences=max_sequences,
        max_context=max_context,
        core=core,
    )


def model_weights(model: ModelInfo) -> str | None:
    """The weight format the manifest records for ``model`` ("int8", "int4", "fp16"), or ``None``."""
    compression = model.facts.get("compression")
    weights = compression.get("weights") if isinstance(compression, dict) else None
    return str(weights) if weights else None


def quantized_weights(model: ModelInfo) -> str | None:
    """ "int4" or "int8" when ``model``'s matrix weights are quantised so, whatever put them there:
    NNCF (the recorded format), a GGUF's Q4/Q8 blocks or an int8 IR taken as it is (the recorded
    count of int4 / int8 weight constants); else None."""
    weights = model_weights(model)
    if weights in ("int4", "int8"):
        return weights
    compression = model.facts.get("compression")
    if not isinstance(compression, dict):
        return None
    for kind in ("int4", "int8"):
        count = compression.get(f"{kind}_constants")
        if isinstance(count, int) and count > 0:
            return kind
    return None
