"""The built-in device plugins of xpuspec: CPU, GPU and NPU through OpenVINO, and PyTorch as a
reference executor. Each is also declared as an entry point of the ``xpuspec.plugins`` group."""

from __future__ import annotations

from xpuspec.devices.plugin import DevicePlugin


def builtin_plugins() -> list[DevicePlugin]:
    # Relative: this folder is `plugins/` in the repository and `xpuspec_plugins` once installed, and
    # mypy, which checks the folder, can follow only an import that holds under both names.
    from .cpu import CpuPlugin
    from .gpu import GpuPlugin
    from .npu import NpuPlugin
    from .pytorch import TorchPlugin

    return [CpuPlugin(), GpuPlugin(), NpuPlugin(), TorchPlugin()]
