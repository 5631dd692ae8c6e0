"""The `containers` marker: tests that build container images (.ci/run may run them on their own)."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "containers: builds a container image with podman (root, podman and debootstrap)"
    )
