"""Kept-alive outbound connections (netguard.KeepAlive) against real servers on 127.0.0.1:
reused while they live, vetted on every request, expired when idle, never reused after
the server closed them."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3.util.connection

from flowforge.steps.netguard import Allowlist, KeepAlive, RequestRefused, send
from tests.support.target import Reply, Target
from tests.support.tls import make_test_ca

LOOPBACK = Allowlist.parse("127.0.0.1")


def get(url: str, kept: KeepAlive, allow: Allowlist = LOOPBACK) -> int:
    return send("GET", url, headers={}, body=None, timeout_s=5, allow=allow, kept=kept).status


@pytest.fixture
def kept() -> Iterator[KeepAlive]:
    connections = KeepAlive()
    yield connections
    connections.close()


def test_sequential_requests_share_one_connection(target: Target, kept: KeepAlive) -> None:
    for _ in range(50):
        assert get(f"{target.url}/a", kept) == 200
    assert (target.connections, kept.opened) == (1, 1)


def test_a_kept_connection_is_no_way_around_the_guard(target: Target, kept: KeepAlive) -> None:
    assert get(f"{target.url}/a", kept) == 200
    with pytest.raises(RequestRefused):
        get(f"{target.url}/b", kept, allow=Allowlist.parse(""))
    assert [r.path for r in target.received] == ["/a"]


def test_an_idle_connection_expires(target: Target) -> None:
    kept = KeepAlive(idle_s=0.2)
    try:
        assert get(f"{target.url}/a", kept) == 200
        time.sleep(0.4)
        assert get(f"{target.url}/b", kept) == 200
        assert target.connections == 2
    finally:
        kept.close()


def test_a_connection_the_server_closes_is_not_reused(target: Target, kept: KeepAlive) -> None:
    target.script = lambda _r: Reply(json={"ok": True}, headers={"Connection": "close"})
    for _ in range(3):
        assert get(f"{target.url}/a", kept) == 200
    assert target.connections == 3


def test_a_connection_closed_while_idle_is_replaced_before_anything_is_sent(
    kept: KeepAlive,
) -> None:
    """A server that closes a kept-alive connection after its idle timeout (here 0.1 s,
    without saying so in the response): the next request sees the EOF before it writes,
    opens a new connection and is answered, instead of failing as sent with no response."""
    accepted: list[socket.socket] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            time.sleep(0.1)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/"
    try:
        assert get(url, kept) == 200
        time.sleep(0.3)
        assert get(url, kept) == 200
        assert len(accepted) == 2
    finally:
        listener.close()


def test_https_connections_are_kept_with_their_certificate_checked(
    tmp_path: Path, kept: KeepAlive, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, context = make_test_ca(tmp_path)
    secure = Target(tls=context)
    try:
        # Not trusted yet: the certificate check fails, nothing is kept.
        with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
            get(f"{secure.url}/a", kept)
        monkeypatch.setenv("SSL_CERT_FILE", str(ca))
        for _ in range(20):
            assert get(f"{secure.url}/a", kept) == 200
        assert kept.opened == 1
    finally:
        secure.close()


class _Recording(socket.socket):
    """A client socket that notes its writes, its reads and quick-ACK requests in order."""

    events: list[str] = []

    def sendall(self, data: Any, *args: Any) -> None:
        self.events.append("send")
        super().sendall(data, *args)

    def recv_into(self, buffer: Any, *args: Any) -> int:
        self.events.append("read")
        return super().recv_into(buffer, *args)

    def setsockopt(self, level: int, option: int, *args: Any) -> None:
        if (level, option) == (socket.IPPROTO_TCP, getattr(socket, "TCP_QUICKACK", None)):
            self.events.append("quickack")
        super().setsockopt(level, option, *args)


@pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="Linux's TCP_QUICKACK")
def test_a_kept_connection_acks_each_response_at_once(
    kept: KeepAlive, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that writes headers and body in two sends with Nagle's algorithm on (as
    Python's http.server does) sends the body only once the headers are ACKed. A reused
    connection is out of the kernel's quick-ACK start, so each of its requests waited for
    the 40 ms delayed-ACK timer (the bench's fan stub: 44 ms a request instead of 0.8 ms).
    So every request, once written, asks for quick ACKs before its response is read."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            while conn.recv(65536):
                conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
                conn.send(b"ok")

    threading.Thread(target=serve, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/"
    monkeypatch.setattr(_Recording, "events", [])
    monkeypatch.setattr(urllib3.util.connection.socket, "socket", _Recording)
    try:
        for _ in range(5):
            assert get(url, kept) == 200
    finally:
        listener.close()
    assert kept.opened == 1
    # Per request: its writes, then the quick-ACK request, then the reads of its response.
    requests = "".join(
        "S" if e == "send" else "Q" if e == "quickack" else "R" for e in _Recording.events
    )
    assert re.fullmatch(r"(S+QR+){5}", requests), requests
