"""The built-in device plugins of xpuspec: CPU, GPU and NPU through OpenVINO, and PyTorch as a
reference executor. Each is also declared as an entry point of the ``xpuspec.plugins`` group."""

from __future__ import annotations

from xpuspec.devices.plugin import DevicePlugin


def builtin_plugins() -> list[DevicePlugin]:
    from xpuspec_plugins.cpu import CpuPlugin
    from xpuspec_plugins.gpu import GpuPlugin
    from xpuspec_plugins.npu import NpuPlugin
    from xpuspec_plugins.pytorch import TorchPlugin

    return [CpuPlugin(), GpuPlugin(), NpuPlugin(), TorchPlugin()]
