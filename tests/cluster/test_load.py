"""`xpuspec cluster load --url` against a real `xpuspec serve`: every request answered, and one engine
holds every conversation's first turn, so every second turn finds its prefix cached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.server.conftest import REPO_ROOT, LiveServer


def test_the_load_command_reports_requests_latency_and_second_turn_hits(
    demo_live_server: LiveServer, tmp_path: Path
) -> None:
    out = tmp_path / "load.json"
    command = [
        sys.executable, "-m", "xpuspec.cli", "cluster", "load", "--url", demo_live_server.base_url,
        "--clients", "1,2", "--conversations", "2", "--max-tokens", "8", "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(
        command,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    reports = json.loads(out.read_text())
    assert [report["clients"] for report in reports] == [1, 2]
    for report in reports:
        assert report["requests"] == 2 * 2 * report["clients"] and report["errors"] == 0
        assert report["requests_per_s"] > 0 and report["latency_p50_ms"] <= report["latency_p99_ms"]
        assert report["second_turn_hit_rate"] == 1.0
        assert report["router"] == {}  # a plain server routes nothing
    assert "2 clients: 8 requests (0 failed)" in done.stdout
