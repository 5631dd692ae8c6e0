"""The plugin registry: the built-in plugins, plugins of installed packages (entry points), and
plugins registered at run time.

A third-party package declares, in its pyproject.toml::

    [project.entry-points."xpuspec.plugins"]
    fpga = "my_package.fpga:FpgaPlugin"

The entry point may name a plugin class (instantiated without arguments), a plugin instance, or a
function returning one.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Iterable
from typing import Any

from xpuspec.devices.plugin import DevicePlugin

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "xpuspec.plugins"


def _builtin_plugins() -> list[DevicePlugin]:
    from xpuspec_plugins import builtin_plugins

    return builtin_plugins()


def _instantiate(loaded: Any) -> DevicePlugin:
    # A class passes a runtime Protocol check too (its attributes are there), so test for it first.
    if isinstance(loaded, type) or (callable(loaded) and not isinstance(loaded, DevicePlugin)):
        plugin = loaded()
    else:
        plugin = loaded
    if not isinstance(plugin, DevicePlugin):
        raise TypeError(
            f"{loaded!r} gave {type(plugin).__name__}, not a DevicePlugin (needs name, executor_kind, "
            "compression_preset, matches, is_present, capabilities, compile_properties)"
        )
    return plugin


class PluginRegistry:
    """Device plugins by name; ``plugin_for(device)`` finds the one that handles a device string."""

    def __init__(self, plugins: Iterable[DevicePlugin] = ()):
        self._plugins: dict[str, DevicePlugin] = {}
        for plugin in plugins:
            self.register(plugin)

    def register(self, plugin: DevicePlugin, *, replace: bool = False) -> None:
        """Add a plugin; a second plugin of the same name needs ``replace=True``."""
        plugin = _instantiate(plugin)
        key = plugin.name.upper()
        if key in self._plugins and not replace:
            raise ValueError(
                f"a plugin named {plugin.name!r} is already registered; pass replace=True to override it"
            )
        self._plugins[key] = plugin

    def load_entry_points(self) -> None:
        """Register the plugins of installed packages; a broken one is logged and skipped."""
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                plugin = _instantiate(entry_point.load())
            except Exception as error:  # a third party's bug must not stop xpuspec
                logger.warning(
                    "skipping device plugin %s (%s: %s)", entry_point.name, type(error).__name__, error
                )
                continue
            if plugin.name.upper() in self._plugins:
                # The built-ins are also declared as entry points of xpuspec itself.
                logger.debug(
                    "plugin %s from entry point %s already registered", plugin.name, entry_point.value
                )
                continue
            self._plugins[plugin.name.upper()] = plugin

    @property
    def plugins(self) -> list[DevicePlugin]:
        return list(self._plugins.values())

    def get(self, name: str) -> DevicePlugin | None:
        return self._plugins.get(name.upper())

    def plugin_for(self, device: str) -> DevicePlugin | None:
        """The registered plugin that handles ``device``, or ``None``."""
        for plugin in self._plugins.values():
            if plugin.matches(device):
                return plugin
        return None


_default_registry: PluginRegistry | None = None


def default_registry() -> PluginRegistry:
    """The process-wide registry: built-ins plus entry points, built on first use."""
    global _default_registry
    if _default_registry is None:
        registry = PluginRegistry(_builtin_plugins())
        registry.load_entry_points()
        _default_registry = registry
    return _default_registry


def register(plugin: DevicePlugin, *, replace: bool = False) -> None:
    """Register a plugin in the process-wide registry at run time."""
    default_registry().register(plugin, replace=replace)


def reset_default_registry() -> None:
    """Forget the process-wide registry (tests; after installing a plugin package)."""
    global _default_registry
    _default_registry = None
