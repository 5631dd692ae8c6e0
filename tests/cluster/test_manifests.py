"""The deployment files agree with each other: the KubeRay manifest embeds the Serve config unchanged,
names the image docker/ builds, and the Serve config is one Ray Serve accepts."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVE_CONFIG = REPO_ROOT / "deploy" / "ray" / "serve_config.yaml"
MANIFEST = REPO_ROOT / "deploy" / "kubernetes" / "rayservice.yaml"
COMPOSE = REPO_ROOT / "docker" / "compose.yaml"


def manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))


def test_the_manifest_is_a_rayservice_embedding_the_serve_config_unchanged() -> None:
    service = manifest()
    assert service["apiVersion"] == "ray.io/v1" and service["kind"] == "RayService"
    embedded = yaml.safe_load(service["spec"]["serveConfigV2"])
    assert embedded == yaml.safe_load(SERVE_CONFIG.read_text(encoding="utf-8"))


def test_every_container_runs_the_cpu_image_docker_builds() -> None:
    import ray

    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    image = compose["services"]["xpuspec-cpu"]["image"]
    cluster = manifest()["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == ray.__version__  # the version the application is built against
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    containers = [container for group in groups for container in group["template"]["spec"]["containers"]]
    assert len(containers) == 2
    assert {container["image"] for container in containers} == {image}
    for container in containers:
        assert {"name": "XPUSPEC_BUNDLE", "value": "/opt/xpuspec/bundle"} in container["env"]


def test_the_serve_config_is_valid_and_names_this_packages_classes() -> None:
    from ray.serve.schema import ServeDeploySchema

    from xpuspec.cluster import application

    config = ServeDeploySchema.model_validate(yaml.safe_load(SERVE_CONFIG.read_text(encoding="utf-8")))
    (app,) = config.applications
    assert app.import_path == "xpuspec.cluster.application:build_app"
    deployments = {deployment.name: deployment for deployment in app.deployments}
    assert set(deployments) == {application.INGRESS_NAME, application.REPLICA_NAME}
    router = deployments[application.REPLICA_NAME].request_router_config
    assert router["request_router_class"] == application.ROUTER_CLASS
    assert application.build_app(app.args) is not None  # the args are ClusterSettings fields
