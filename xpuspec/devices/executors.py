"""Builds the executor (model runner) a device's plugin asks for."""

from __future__ import annotations

import logging
from typing import Any

from xpuspec.devices.placement import ResolvedDevice
from xpuspec.devices.plugin import Role
from xpuspec.model_bundle import ModelInfo

logger = logging.getLogger(__name__)


def create_runner(
    device: ResolvedDevice,
    model: ModelInfo,
    role: Role,
    user_properties: dict[str, Any] | None,
    *,
    num_blocks: int | None,
    block_size: int | None = None,
    max_draft_tokens: int,
    max_sequences: int,
    max_context: int,
    core: Any,
) -> Any:
    """The runner for ``model`` on ``device`` with the plugin's compile properties for ``role``.

    ``block_size`` is the KV block size the runner must use (the draft shares the target's block
    tables); OpenVINO runners pick it themselves and the caller checks the two agree.
    """
    plugin = device.plugin
    properties = plugin.compile_properties(role, user_properties, max_draft_tokens=max_draft_tokens)
    logger.debug("%s on %s (%s executor): %s", role, device.device, plugin.executor_kind, properties)
    if plugin.executor_kind == "paged":
        from xpuspec.engine.model_runner import PagedModelRunner

        return PagedModelRunner(
            model.path,
            device=device.device,
            properties=properties,
            num_blocks=num_blocks,
            core=core,
            capacity_tokens=max_sequences * (max_context + max_draft_tokens + 1),
        )
    if plugin.executor_kind == "stateful":
        try:
            from xpuspec.engine.stateful_runner import StatefulModelRunner
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
    if plugin.executor_kind == "reference":
        factory = getattr(plugin, "create_runner", None)
        if factory is None:
            raise ValueError(f"plugin {plugin.name} has executor_kind 'reference' but no create_runner()")
        return factory(model.path, model.facts, properties, num_blocks, block_size)
    raise ValueError(f"plugin {plugin.name}: unknown executor_kind {plugin.executor_kind!r}")
