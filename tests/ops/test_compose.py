"""docker-compose.yml is a valid Compose file and wires the stack as documented.

Docker's engine does not run here; `docker compose config` validates the file without
one. The structure checks read the file as Compose resolves it.
"""

import json
import shutil
import subprocess

import pytest
import yaml

from tests.servers import ROOT

COMPOSE_FILE = ROOT / "docker-compose.yml"


def compose_command() -> list[str]:
    """`docker compose` (v2 plugin) or, failing that, Debian's `docker-compose`."""
    if shutil.which("docker") is None:
        pytest.skip("the docker binary is not installed")
    plugin = subprocess.run(
        ["docker", "compose", "version"], capture_output=True, check=False
    )
    if plugin.returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.skip("docker is installed without Compose (no plugin, no docker-compose)")


def test_compose_config_is_valid():
    result = subprocess.run(
        [*compose_command(), "-f", str(COMPOSE_FILE), "config", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


@pytest.fixture
def stack() -> dict:
    """The file with its YAML anchors and merge keys resolved."""
    return json.loads(json.dumps(yaml.safe_load(COMPOSE_FILE.read_text())))


def test_every_service_is_health_checked_and_restarts(stack):
    services = stack["services"]
    assert set(services) >= {
        "postgres",
        "redis",
        "web",
        "worker",
        "beat",
        "provider",
        "nginx",
    }
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), f"{name}: no healthcheck"
        assert service.get("restart") == "unless-stopped", name


def test_app_services_take_env_from_the_example_and_wait_for_healthy_stores(stack):
    assert (ROOT / ".env.example").exists()
    for name in ("web", "worker", "beat", "provider"):
        service = stack["services"][name]
        assert service["env_file"] == ".env.example", name
        assert service["environment"]["DATABASE_URL"].startswith("postgres://")
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "PROMETHEUS_MULTIPROC_DIR" in stack["services"]["web"]["environment"]


def test_nginx_uses_the_bundled_config_and_named_volumes_are_declared(stack):
    nginx = stack["services"]["nginx"]
    mounts = [v.split(":") for v in nginx["volumes"]]
    (conf,) = [m for m in mounts if m[0] == "./deploy/nginx.conf"]
    assert conf[1] in nginx["command"]  # the file nginx -c is given
    assert (ROOT / "deploy/nginx.conf").exists()
    assert nginx["depends_on"]["web"]["condition"] == "service_healthy"
    named = set(stack["volumes"])
    used = {
        volume.split(":")[0]
        for service in stack["services"].values()
        for volume in service.get("volumes", [])
        if not volume.startswith((".", "/"))
    }
    assert used and used <= named
    assert {"pgdata", "static"} <= named
