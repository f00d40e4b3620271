"""The SSRF guard on the full worker path: webhook → bin/worker → http_request step.

Safety rule: every URL here is a loopback address, and every refused one is outside the
worker's allow list (FLOWFORGE_HTTP_ALLOW=127.0.0.1): 127.0.0.2, [::1] and spellings of
them. A recording server listens on each refused address, so a broken guard could only
ever reach this machine — and would be caught there. Decisions for private, link-local,
CGNAT and public addresses are tested as pure functions in tests/unit/test_netguard.py.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.faults.helpers import queue_depth
from tests.support.api import Api, step
from tests.support.definitions import http, workflow
from tests.support.processes import Process
from tests.support.target import Received, Reply, Target, serving

REFUSED = re.compile(r"^GET https?://\S+: refused, \S+ is .*loopback.*FLOWFORGE_HTTP_ALLOW")

BY_INPUT = workflow(
    # Refusals must fail on the first attempt by themselves; one try keeps the other
    # cases (not-sent errors, which are retried) short.
    http("fetch", "GET", "{{ input.url }}", timeout_s=5, retry={"max_attempts": 1}),
    name="Fetch what the event names",
)


@dataclass
class Recorder:
    """A server on one refused loopback address that records anything that reaches it."""

    host: str
    port: int = 0
    hits: list[str] = field(default_factory=list)

    def url(self, path: str, host: str | None = None) -> str:
        return f"http://{host or self.host}:{self.port}{path}"


@contextlib.contextmanager
def recording_server(host: str, family: socket.AddressFamily) -> Iterator[Recorder]:
    """Bind host:0 (IPv6 too) and answer 200 to anything, writing down the path."""
    recorder = Recorder(host.strip("[]"))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            recorder.hits.append(self.path)
            body = json.dumps({"reached": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_PUT = do_DELETE = do_HEAD = do_GET

    server_class = type("Server", (ThreadingHTTPServer,), {"address_family": family})
    try:
        server = server_class((recorder.host, 0), Handler)
    except OSError as exc:  # pragma: no cover - depends on the host's loopback setup
        pytest.fail(f"cannot bind a recorder on {host}: {exc}")
    server.daemon_threads = True
    recorder.port = server.server_address[1]
    with serving(server):
        yield recorder


@pytest.fixture
def on_127_0_0_2() -> Iterator[Recorder]:
    with recording_server("127.0.0.2", socket.AF_INET) as recorder:
        yield recorder


@pytest.fixture
def on_ipv6_loopback() -> Iterator[Recorder]:
    with recording_server("::1", socket.AF_INET6) as recorder:
        yield recorder


Fetcher = Callable[..., Api]


@pytest.fixture
def fetcher(api: str, api_key: str, workers: Callable[..., Process]) -> Fetcher:
    """Starts the worker (`env` overrides its settings) and publishes BY_INPUT: every
    fetch case runs that one workflow, only the worker's allow list changes."""

    def start(**env: str) -> Api:
        workers(**env)
        client = Api(api, api_key)
        client.publish("fetch", BY_INPUT)
        return client

    return start


def run_each(client: Api, urls: list[str]) -> dict[str, dict[str, Any]]:
    """One execution per URL (a failure cancels sibling steps), all run to the end."""
    started = {url: client.start("fetch", {"url": url}) for url in urls}
    return {url: client.wait(eid) for url, eid in started.items()}


def assert_refused(execution: dict[str, Any]) -> str:
    """Failed at once, with one recorded attempt that says why and that nothing was sent."""
    assert execution["status"] == "failed", execution
    fetch = step(execution, "fetch")
    assert fetch["status"] == "failed"
    assert REFUSED.match(fetch["error"]), fetch["error"]
    [attempt] = fetch["attempts"]
    assert attempt["outcome"] == "failed"
    assert attempt["error"] == fetch["error"]
    assert attempt["http_status"] is None
    assert fetch["output"] is None
    return fetch["error"]


def test_loopback_outside_the_allow_list_is_refused(
    fetcher: Fetcher, target: Target, on_127_0_0_2: Recorder, on_ipv6_loopback: Recorder
) -> None:
    client = fetcher()  # FLOWFORGE_HTTP_ALLOW=127.0.0.1 from the env fixture
    v4, v6 = on_127_0_0_2, on_ipv6_loopback
    urls = {
        v4.url("/plain"): "127.0.0.2 is loopback",
        v6.url("/ipv6", "[::1]"): "::1 is loopback",
        v4.url("/mapped", "[::ffff:127.0.0.2]"): "(embedded IPv4 127.0.0.2)",
        v4.url("/mapped-hex", "[::ffff:7f00:2]"): "(embedded IPv4 127.0.0.2)",
        v4.url("/decimal", "2130706434"): "127.0.0.2 is loopback",
        v4.url("/hex", "0x7f.0.0.2"): "127.0.0.2 is loopback",
        v4.url("/octal", "0177.0.0.2"): "127.0.0.2 is loopback",
        v4.url("/short", "127.2"): "127.0.0.2 is loopback",
        # The allowed address in IPv4-mapped form is still refused: the allow entry is
        # for 127.0.0.1 exactly, and a broken guard would reach the target below.
        f"http://[::ffff:127.0.0.1]:{target.port}/mapped-allowed": "(embedded IPv4 127.0.0.1)",
    }
    results = run_each(client, list(urls))
    for url, reason in urls.items():
        error = assert_refused(results[url])
        assert reason in error, (url, error)
    assert v4.hits == [] and v6.hits == [] and target.received == []


def test_sanity_the_recorders_are_reachable_when_allowed(
    fetcher: Fetcher, on_127_0_0_2: Recorder
) -> None:
    """Proves the refusal test's recorders would have seen a request the guard let through."""
    client = fetcher(FLOWFORGE_HTTP_ALLOW="127.0.0.2")
    done = run_each(client, [on_127_0_0_2.url("/allowed", "2130706434")])
    [execution] = done.values()
    assert execution["status"] == "succeeded", execution
    assert step(execution, "fetch")["output"]["body"] == {"reached": "/allowed"}
    assert on_127_0_0_2.hits == ["/allowed"]


def test_with_an_empty_allow_list_even_localhost_is_refused(
    fetcher: Fetcher, target: Target
) -> None:
    """The default: a DNS name that resolves to loopback is resolved, then refused."""
    client = fetcher(FLOWFORGE_HTTP_ALLOW="")
    urls = [
        f"http://localhost:{target.port}/name",
        f"http://127.0.0.1:{target.port}/literal",
        f"http://LocalHost:{target.port}/mixed-case",
    ]
    for execution in run_each(client, urls).values():
        assert_refused(execution)
    assert target.received == []


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("file:///etc/passwd", "scheme 'file' is not allowed"),
        ("gopher://127.0.0.1:{port}/x", "scheme 'gopher' is not allowed"),
        ("http://user:pw@127.0.0.1:{port}/x", "credentials in the URL"),
    ],
)
def test_other_schemes_and_userinfo_are_not_sent(
    fetcher: Fetcher, target: Target, url: str, message: str
) -> None:
    client = fetcher()
    [execution] = run_each(client, [url.format(port=target.port)]).values()
    assert execution["status"] == "failed", execution
    assert message in step(execution, "fetch")["error"]
    assert target.received == []


def test_redirects_are_returned_never_followed(
    fetcher: Fetcher, target: Target, on_127_0_0_2: Recorder, on_ipv6_loopback: Recorder
) -> None:
    """A 3xx from the allowed target is the step's result; the next hop is never taken."""
    locations = {
        "/to-internal": on_127_0_0_2.url("/internal"),
        "/to-ipv6": on_ipv6_loopback.url("/internal", "[::1]"),
        "/to-self": f"{target.url}/followed",  # allowed, and still not followed
    }
    statuses = {"/to-internal": 302, "/to-ipv6": 307, "/to-self": 301}

    def redirect(request: Received) -> Reply:
        if request.path in locations:
            return Reply(
                status=statuses[request.path], headers={"Location": locations[request.path]}
            )
        return Reply(json={"followed": request.path})

    target.script = redirect
    client = fetcher()
    results = run_each(client, [f"{target.url}{path}" for path in locations])
    for path, status in statuses.items():
        execution = results[f"{target.url}{path}"]
        assert execution["status"] == "failed", execution
        fetch = step(execution, "fetch")
        assert fetch["error"] == f"HTTP {status} from GET request"
        [attempt] = fetch["attempts"]
        assert (attempt["outcome"], attempt["http_status"]) == ("failed", status)
    assert sorted(r.path for r in target.received) == sorted(locations)
    assert on_127_0_0_2.hits == [] and on_ipv6_loopback.hits == []


def post_to(url: str) -> dict[str, Any]:
    """A workflow of one POST with no idempotency key: not safe to repeat, so a request
    that may have left would be `unknown`."""
    return workflow(http("notify", "POST", url, json={}, retry={"max_attempts": 3}), name="Notify")


def assert_failed_at_once(execution: dict[str, Any], error: str) -> None:
    """Failed on its first attempt, which says it sent nothing; never left for the reaper."""
    assert execution["status"] == "failed", execution
    notify = step(execution, "notify")
    assert notify["status"] == "failed", notify
    assert error in notify["error"], notify["error"]
    [attempt] = notify["attempts"]
    assert attempt["outcome"] == "failed" and attempt["error"] == notify["error"]


def test_a_host_dns_cannot_carry_fails_the_step_at_once(
    api: str, api_key: str, workers: Callable[..., Process], amqp_url: str, amqp_prefix: str
) -> None:
    """`a..example.com` once made getaddrinfo raise UnicodeError, which nothing caught: the
    step stayed running, its wake-up was dead-lettered, and the reaper then called the POST
    `unknown` though it never left. Nothing here resolves a name: the check comes first."""
    worker = workers()
    client = Api(api, api_key)
    client.publish("notify", post_to("http://{{ input.host }}/hook"))
    hosts = ["a..example.com", "x" * 64 + ".example.com"]
    started = {host: client.start("notify", {"host": host}) for host in hosts}
    for host, eid in started.items():
        execution = client.wait(eid)
        assert_failed_at_once(execution, f"POST: host {host!r} is not a valid DNS name")
    assert queue_depth(amqp_url, f"{amqp_prefix}.dead") == 0
    assert "dead-lettered" not in worker.log()


def test_an_unexpected_error_before_the_request_leaves_fails_the_step(
    api: str, api_key: str, workers: Callable[..., Process], target: Target
) -> None:
    """Defence in depth: whatever escapes the step code before the lease fence passes is a
    failed attempt that names its class, recorded at once; the request was never sent."""
    worker = workers(FLOWFORGE_FAULTS="before_request_send=raise")
    client = Api(api, api_key)
    client.publish("notify", post_to(f"{target.url}/hook"))
    execution = client.wait(client.start("notify", {}))
    assert_failed_at_once(execution, "not sent: internal error: InjectedFault")
    assert target.received == []
    assert "dead-lettered" not in worker.log()
