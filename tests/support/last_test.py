"""A pytest plugin that keeps the id of the test now running in a file, for CI's post-mortem.

A CI run once ended mid-suite with an exit status no pytest outcome gives and nothing printed after
the last dot: the process was gone before it could report. With ``XPUSPEC_LAST_TEST`` naming a file,
each test's id (and the process's resident memory then) replaces the file's content as the test
starts, so ``.ci/run`` can say which test was running when the process ended. Without the variable
the plugin does nothing.
"""

from __future__ import annotations

import os
import resource

import pytest

_PATH = os.environ.get("XPUSPEC_LAST_TEST")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if not _PATH:
        return
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    with open(_PATH, "w", encoding="utf-8") as trace:
        trace.write(f"{nodeid} (pytest's peak RSS so far {peak_mb} MB)\n")
