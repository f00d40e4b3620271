"""The deployment files: docker-compose.yml and the Dockerfile, and the systemd units.

systemd-analyze (Debian's systemd package; .ci/run installs it where missing) checks the
units as systemd would load them and scores their hardening. No Docker daemon runs in CI:
compose is parsed and checked for what the deployment promises, and `docker compose
config` (or Debian's docker-compose, which .ci/run installs) validates the file.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from flowforge.store.config import Settings

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "docs" / "systemd"
UNITS = ("flowforge-migrate.service", "flowforge-api.service", "flowforge-worker.service")
APP_SERVICES = ("migrate", "api", "worker")
MAX_EXPOSURE = 2.0  # systemd-analyze security: 0 best, 10 worst; "OK" is below 4


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    assert found, "systemd-analyze is missing: apt-get install -y systemd (as .ci/run does)"
    return found


@pytest.fixture
def installed_units(tmp_path: Path) -> Path:
    """The units as installed: /opt/flowforge is this checkout, the env file exists."""
    env_file = tmp_path / "flowforge.env"
    env_file.write_text("")
    for source in [*SYSTEMD.glob("*.service"), *SYSTEMD.glob("*.service.d/*.conf")]:
        target = tmp_path / source.relative_to(SYSTEMD)
        target.parent.mkdir(exist_ok=True)
        text = source.read_text().replace("/etc/flowforge/flowforge.env", str(env_file))
        target.write_text(text.replace("/opt/flowforge", str(ROOT)))
    return tmp_path


def test_the_units_verify_cleanly_with_their_drop_in(installed_units: Path) -> None:
    result = subprocess.run(
        [systemd_analyze(), "verify", "--man=no", *(str(installed_units / u) for u in UNITS)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert (installed_units / "flowforge-worker.service.d" / "credentials.conf").exists()


@pytest.mark.parametrize("unit", UNITS)
def test_each_unit_is_hardened(installed_units: Path, unit: str) -> None:
    result = subprocess.run(
        [systemd_analyze(), "security", "--offline=yes", str(installed_units / unit)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    exposure = float(re.findall(r"Overall exposure level for \S+: ([\d.]+)", result.stdout)[0])
    assert exposure <= MAX_EXPOSURE, result.stdout


def unit_settings(name: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in (SYSTEMD / name).read_text().splitlines():
        if "=" in line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def test_migrations_run_first_and_credentials_are_optional() -> None:
    migrate = unit_settings("flowforge-migrate.service")
    assert migrate["Type"] == ["oneshot"] and migrate["RemainAfterExit"] == ["yes"]
    for unit in ("flowforge-api.service", "flowforge-worker.service"):
        settings = unit_settings(unit)
        assert "flowforge-migrate.service" in settings["Requires"][0]
        assert "flowforge-migrate.service" in settings["After"][0]
        # A missing credential file would stop the unit from starting at all: credentials
        # live in the drop-in, to install together with the files it names.
        assert "LoadCredential" not in settings


# ---- docker compose -------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_builds_one_image_and_runs_each_command_in_exec_form(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    images = {services[name]["image"] for name in APP_SERVICES}
    assert len(images) == 1
    for name in APP_SERVICES:
        app = services[name]
        assert app["build"] == "." and app["init"] is True
        assert isinstance(app["command"], list) and app["command"][0].startswith("bin/")
    for name, service in services.items():
        command = service.get("command", [])
        assert isinstance(command, list), f"{name}: a shell string runs as sh -c"
        assert "sh" not in command[:1] and "pip" not in " ".join(command), name
    assert "volumes" not in services["api"]  # the image, not a bind-mounted checkout
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^RUN .*pip install", dockerfile, re.MULTILINE)  # at build time
    assert re.search(r'^CMD \["bin/api"', dockerfile, re.MULTILINE)  # exec form
    assert re.search(r"^USER (?!root)\w+", dockerfile, re.MULTILINE)


def test_compose_health_restarts_ordering_and_loopback_ports(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("postgres", "rabbitmq", "api", "worker", "proxy"):
        assert services[name]["healthcheck"]["test"][0] == "CMD", name
        assert services[name]["restart"] == "unless-stopped", name
    assert services["migrate"]["restart"] == "no"
    for name in ("api", "worker"):
        assert services[name]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"
        }
    assert services["migrate"]["depends_on"]["postgres"] == {"condition": "service_healthy"}
    assert services["proxy"]["depends_on"]["api"] == {"condition": "service_healthy"}
    # pg_isready over TCP: the image's init server listens on the Unix socket only.
    assert services["postgres"]["healthcheck"]["test"][1:4] == ["pg_isready", "-h", "127.0.0.1"]
    published = [port for s in services.values() for port in s.get("ports", [])]
    assert published and all(str(port).startswith("127.0.0.1:") for port in published)
    assert [name for name, s in services.items() if "ports" in s] == ["proxy"]


def test_compose_puts_the_repositorys_nginx_site_in_front_with_matching_limits(
    compose: dict[str, Any],
) -> None:
    proxy = compose["services"]["proxy"]
    mounts = {volume.split(":")[0]: volume.split(":")[1] for volume in proxy["volumes"]}
    assert mounts["./docs/nginx/flowforge.conf"] == "/etc/nginx/conf.d/default.conf"
    for source in mounts:
        assert (ROOT / source).is_file(), source
    upstream = (ROOT / "docs/nginx/flowforge-upstream-compose.conf").read_text()
    assert "server api:8000;" in upstream
    assert "0.0.0.0:8000" in compose["services"]["api"]["command"]
    env = compose["x-app"]["environment"]
    assert int(env["FLOWFORGE_MAX_BODY_BYTES"]) == Settings().max_body_bytes
    assert "FLOWFORGE_HTTP_ALLOW" in env
    compose_text = (ROOT / "docker-compose.yml").read_text()
    assert "FLOWFORGE_HTTP_ALLOW" in compose_text.split("FLOWFORGE_HTTP_ALLOW:")[0]  # explained


def _compose_command() -> list[str] | None:
    """`docker compose` (the plugin) where it exists, else Debian's `docker-compose`
    (which .ci/run installs); both validate without a Docker daemon."""
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    ):
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_docker_compose_config_accepts_the_file() -> None:
    """Compose itself parses the file: interpolation, anchors, the depends_on conditions."""
    command = _compose_command()
    if command is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no docker compose nor docker-compose: .ci/run installs docker-compose")
        pytest.skip("docker compose is not installed here (apt-get install docker-compose)")
    result = subprocess.run(
        [*command, "-f", "docker-compose.yml", "config", "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_the_proxy_and_unit_comments_state_the_limits_bin_api_sets() -> None:
    """The numbers the nginx site and the API unit quote for gunicorn are serve.py's."""
    from flowforge.api.serve import DEFAULTS

    option = dict(zip(DEFAULTS[::2], DEFAULTS[1::2], strict=True))
    nginx = (ROOT / "docs/nginx/flowforge.conf").read_text()
    assert f"--timeout ({option['--timeout']} s)" in nginx
    line, field = option["--limit-request-line"], option["--limit-request-field_size"]
    assert f"--limit-request-field_size, set by bin/api, are {line} / {field})" in nginx
    unit = (ROOT / "docs/systemd/flowforge-api.service").read_text()
    assert f"--graceful-timeout, {option['--graceful-timeout']} s)" in unit
    assert "by default" not in unit.split("KillSignal")[0].split("ExecStart")[1]
