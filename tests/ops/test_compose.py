"""docker-compose.yml is a valid Compose file and wires the stack as documented.

`docker compose config` validates the file without an engine; the structure checks
read the file as Compose resolves it. tests/ops/test_compose_up.py starts it for real.
"""

import json
import shutil
import subprocess
from urllib.parse import urlsplit

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


def test_compose_config_is_valid(tmp_path):
    # Beside a .env made from the example, as the README says (the services read it).
    shutil.copy(COMPOSE_FILE, tmp_path / "docker-compose.yml")
    shutil.copy(ROOT / ".env.example", tmp_path / ".env")
    result = subprocess.run(
        [
            *compose_command(),
            "-f",
            str(tmp_path / "docker-compose.yml"),
            "config",
            "-q",
        ],
        cwd=tmp_path,
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


APP_SERVICES = ("web", "worker", "beat", "provider")


def test_every_service_is_health_checked_and_restarts(stack):
    services = stack["services"]
    assert set(services) == {
        "postgres",
        "redis",
        "migrate",
        "web",
        "worker",
        "beat",
        "provider",
        "nginx",
    }
    for name, service in services.items():
        if name == "migrate":  # runs once, to completion
            assert service["restart"] == "no"
            continue
        assert service.get("healthcheck", {}).get("test"), f"{name}: no healthcheck"
        assert service.get("restart") == "unless-stopped", name


def test_app_services_read_the_env_file_and_wait_for_stores_and_migrations(stack):
    assert (ROOT / ".env.example").exists()
    for name in ("migrate", *APP_SERVICES):
        service = stack["services"][name]
        assert service["env_file"] == ".env", name  # what the README says to edit
        assert service["environment"]["DATABASE_URL"].startswith("postgres://")
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
    for name in APP_SERVICES:
        migrate = stack["services"][name]["depends_on"]["migrate"]
        assert migrate["condition"] == "service_completed_successfully", name


def test_the_services_names_they_call_each_other_by_are_allowed_hosts(stack):
    example = dict(
        line.split("=", 1)
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    allowed = example["DJANGO_ALLOWED_HOSTS"].split(",")
    environment = stack["services"]["web"]["environment"]
    for url in (
        environment["PAYMENT_PROVIDER_URL"],
        environment["PROVIDER_CALLBACK_URL"],
        example["PROVIDER_PUBLIC_URL"],
    ):
        assert urlsplit(url).hostname in allowed, url


def test_web_and_worker_share_the_metrics_directory(stack):
    directories = set()
    for name in ("web", "worker"):
        service = stack["services"][name]
        directory = service["environment"]["PROMETHEUS_MULTIPROC_DIR"]
        (volume,) = [
            v.split(":")[0] for v in service["volumes"] if v.endswith(directory)
        ]
        directories.add((volume, directory))
    assert len(directories) == 1


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
