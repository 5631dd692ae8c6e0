"""`xpuspec cluster up CONFIG` deploys deploy/ray/serve_config.yaml (with the demo bundle and this
cluster's sizes) through Serve's `serve run`, waits until it serves, and prints the URL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cluster.conftest import SETTINGS, RayCluster
from tests.server.conftest import REPO_ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20"),
]


def test_up_deploys_the_serve_config_and_waits_until_it_serves(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    config = yaml.safe_load((REPO_ROOT / "deploy" / "ray" / "serve_config.yaml").read_text())
    config["http_options"] = {"host": "127.0.0.1", "port": ray_cluster.http_port}
    (app,) = config["applications"]
    app["args"].update(SETTINGS)
    replica = next(deployment for deployment in app["deployments"] if deployment["name"] == "EngineReplica")
    del replica["autoscaling_config"]
    replica.update(num_replicas=1, ray_actor_options={"num_cpus": 1})
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, "-m", "xpuspec.cli", "cluster", "up", str(path), "--address", ray_cluster.address],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith(f"ready on http://127.0.0.1:{ray_cluster.http_port}")
    assert ray_cluster.running_replicas() == 1
    reply = ray_cluster.openai().completions.create(model="xpuspec-demo", prompt="Hi", max_tokens=4)
    assert reply.choices[0].finish_reason == "length"
