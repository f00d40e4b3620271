"""docs/nginx/: the buffering proxy that bin/api's sync workers belong behind.

The shipped files are used as they are, with only the listen address and the upstream's
port changed to free loopback ports. Debian's nginx is installed by .ci/run; a machine
without it fails here with the command to run (a skipped test would prove nothing).
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from flowforge.api.console import live
from flowforge.store.config import Settings
from tests.support.api import Api
from tests.support.definitions import unsigned, wait
from tests.support.processes import Process, free_port, start_api, wait_answering, wait_for

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "docs" / "nginx" / "flowforge.conf"
UPSTREAM = ROOT / "docs" / "nginx" / "flowforge-upstream.conf"
SLOW_CLIENTS = 6  # three times the API's two sync workers


CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def nginx_binary() -> str:
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    assert found, "nginx is missing: apt-get install -y nginx (as .ci/run does)"
    return found


def main_config(workdir: Path, listen_port: int, api_port: int) -> Path:
    """An nginx.conf around the shipped site and upstream, in a private directory."""
    site = SITE.read_text().replace("listen 80;", f"listen 127.0.0.1:{listen_port};")
    upstream = UPSTREAM.read_text().replace("127.0.0.1:8000", f"127.0.0.1:{api_port}")
    assert str(listen_port) in site and str(api_port) in upstream
    (workdir / "site.conf").write_text(site)
    (workdir / "upstream.conf").write_text(upstream)
    temp = " ".join(
        f"{kind}_temp_path {workdir};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    config = workdir / "nginx.conf"
    config.write_text(
        f"daemon off;\npid {workdir}/nginx.pid;\nerror_log stderr;\nevents {{}}\n"
        f"http {{ access_log off; {temp}\n"
        f"include {workdir}/site.conf;\ninclude {workdir}/upstream.conf;\n}}\n"
    )
    return config


@pytest.fixture
def workdir() -> Iterator[Path]:
    # nginx's workers drop to an unprivileged user: they need a directory they may write.
    path = Path(tempfile.mkdtemp(prefix="ff-nginx-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def api_behind_nginx(
    env: dict[str, str], tmp_path: Path, workdir: Path
) -> Iterator[tuple[str, str]]:
    """(direct URL of bin/api, URL through nginx)."""
    api, direct = start_api(env, tmp_path / "api.log", workers=2)
    listen = free_port()
    config = main_config(workdir, listen, int(direct.rsplit(":", 1)[1]))
    nginx = Process(
        [nginx_binary(), "-e", "stderr", "-p", str(workdir), "-c", str(config)],
        env,
        tmp_path / "nginx.log",
    )
    proxied = f"http://127.0.0.1:{listen}"
    wait_answering(nginx, f"{proxied}/healthz", "nginx", timeout=15)
    yield direct, proxied
    nginx.stop()
    api.stop()


def test_the_shipped_configuration_passes_nginx_t_and_matches_the_body_limit(
    workdir: Path,
) -> None:
    config = main_config(workdir, free_port(), free_port())
    check = subprocess.run(
        [nginx_binary(), "-e", "stderr", "-t", "-p", str(workdir), "-c", str(config)],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    site = SITE.read_text()
    assert re.search(r"^\s*proxy_request_buffering on;", site, re.MULTILINE)
    (limit,) = re.findall(r"^\s*client_max_body_size (\d+)m;", site, re.MULTILINE)
    assert int(limit) * 1024 * 1024 == Settings().max_body_bytes
    assert f"{Settings().max_body_bytes} bytes" in site  # the 413 problem's detail
    # A live page's long poll answers before nginx gives up on the upstream.
    (read_timeout,) = re.findall(r"^\s*proxy_read_timeout (\d+)s;", site, re.MULTILINE)
    assert int(read_timeout) > live.LONGEST_WAIT_S


HALF_HEADERS = b"POST /hooks/orders HTTP/1.1\r\nHost: x\r\nContent-Type: applica"
HALF_BODY = (
    b"POST /hooks/orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b'Content-Length: 100\r\n\r\n{"order": '
)


def slow_clients(base: str, count: int) -> list[socket.socket]:
    """Connections that have sent half a request — half of them all their headers and the
    start of a body — and then go quiet."""
    host, port = base.removeprefix("http://").split(":")
    held = []
    for n in range(count):
        sock = socket.create_connection((host, int(port)), timeout=5)
        sock.sendall(HALF_BODY if n % 2 else HALF_HEADERS)
        held.append(sock)
    return held


def healthz_answers(base: str, timeout: float) -> bool:
    try:
        return requests.get(f"{base}/healthz", timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


def test_slow_clients_starve_bare_gunicorn_but_not_the_api_behind_nginx(
    api_behind_nginx: tuple[str, str],
) -> None:
    direct, proxied = api_behind_nginx
    held = slow_clients(proxied, SLOW_CLIENTS)
    try:
        time.sleep(0.5)  # let nginx accept them all
        # Well inside client_body_timeout (10 s): the slow clients still hold their sockets.
        assert healthz_answers(proxied, timeout=5)
        # The proxy answers webhooks too, while the slow clients still hold their sockets.
        hook = requests.post(f"{proxied}/hooks/nope", json={}, timeout=5)
        assert hook.status_code == 404 and hook.headers["Content-Type"].startswith(
            "application/problem+json"
        )
    finally:
        for sock in held:
            sock.close()
    # The premise: the same clients straight at gunicorn hold both sync workers.
    held = slow_clients(direct, SLOW_CLIENTS)
    try:
        assert not healthz_answers(direct, timeout=3)
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: healthz_answers(direct, timeout=1), timeout=15, message="gunicorn back")


def test_what_nginx_refuses_itself_is_problem_details(api_behind_nginx: tuple[str, str]) -> None:
    _direct, proxied = api_behind_nginx
    too_big = requests.post(
        f"{proxied}/hooks/orders",
        data=b"[" + b"0," * Settings().max_body_bytes + b"0]",
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    huge_header = requests.get(f"{proxied}/healthz", headers={"X-Big": "a" * 9000}, timeout=10)
    for answer, status in ((too_big, 413), (huge_header, 431)):
        assert answer.status_code == status
        assert answer.headers["Content-Type"] == "application/problem+json"
        assert answer.json()["status"] == status


def test_a_console_long_poll_waits_behind_nginx_and_answers_with_the_change(
    api_behind_nginx: tuple[str, str], api_key: str
) -> None:
    """docs/contract.md#live-progress through the shipped configuration: a signed-in page's
    poll waits in bin/api behind nginx (neither answered at once nor cut by the proxy) and
    answers with the change an operator made meanwhile."""
    direct, proxied = api_behind_nginx
    client = Api(direct, api_key)
    client.publish("watched", unsigned([wait("hold", 300)]))
    execution_id = client.start("watched", {})  # no worker: it stays queued
    page = requests.Session()
    form = page.get(f"{proxied}/ui/signin", timeout=10).text
    token = CSRF.search(form)
    assert token is not None
    signed = page.post(
        f"{proxied}/ui/signin",
        data={"csrf": token.group(1), "api_key": api_key},
        allow_redirects=False,
        timeout=10,
    )
    assert signed.status_code == 303, signed.text
    changes = f"{proxied}/ui/executions/{execution_id}/changes"
    version = page.get(changes, timeout=10).json()["version"]
    answers: list[tuple[float, requests.Response]] = []

    def wait_for_the_change() -> None:
        answer = page.get(f"{changes}?since={version}&wait=5", timeout=20)
        answers.append((time.monotonic(), answer))

    poll = threading.Thread(target=wait_for_the_change)
    poll.start()
    time.sleep(1)  # the poll is waiting in bin/api
    cancelled_at = time.monotonic()
    cancelled = client.post(f"/api/v1/executions/{execution_id}/cancel", {})
    assert cancelled.status_code == 202, cancelled.text
    poll.join()
    ((answered_at, answer),) = answers
    assert answer.status_code == 200, answer.text
    assert "Retry-After" not in answer.headers  # it waited in a slot, not refused one
    assert answer.json()["changed"] is True and answer.json()["status"] == "cancelled"
    assert answered_at > cancelled_at
