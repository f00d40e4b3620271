"""The fault proxy itself: a broker-outage test is only as good as the outage it makes.

An echo server on 127.0.0.1 stands in for the broker, so these checks are fast and say
exactly what each mode does to a connection.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.faultproxy import FaultProxy
from tests.support.processes import wait_for


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """A loopback echo server."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # a reset from the proxy ends the echo
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()
    server.close()


@pytest.fixture
def proxy(echo: tuple[str, int]) -> Iterator[FaultProxy]:
    p = FaultProxy(*echo)
    yield p
    p.close()


def _connect(proxy: FaultProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=2)


def _dead(sock: socket.socket) -> bool:
    """The peer closed or reset the connection."""
    try:
        sock.sendall(b"x")
        return sock.recv(1) == b""
    except OSError:
        return True


def _refused(proxy: FaultProxy) -> bool:
    """A new connection fails, during the handshake or at its first use."""
    try:
        late = _connect(proxy)
    except OSError:
        return True
    with late:
        return _dead(late)


def _echoes(sock: socket.socket, data: bytes) -> bool:
    """The echo server behind the proxy sent `data` back."""
    sock.sendall(data)
    return sock.recv(len(data)) == data


def test_pass_forwards_both_ways(proxy: FaultProxy) -> None:
    with _connect(proxy) as s:
        assert _echoes(s, b"hello")


def test_cut_resets_current_connections_and_refuses_new_ones(proxy: FaultProxy) -> None:
    with _connect(proxy) as s:
        assert _echoes(s, b"ping")
        proxy.cut()
        assert _dead(s)
    assert _refused(proxy)
    assert proxy.refused >= 1
    proxy.restore()
    with _connect(proxy) as s:
        assert _echoes(s, b"back")


def test_blackhole_holds_bytes_until_restore(proxy: FaultProxy) -> None:
    with _connect(proxy) as s:
        assert _echoes(s, b"one")
        proxy.blackhole()
        s.sendall(b"two")
        s.settimeout(0.5)
        with pytest.raises(TimeoutError):
            s.recv(3)
        with _connect(proxy) as fresh:  # accepted, open, silent
            fresh.sendall(b"new")
            fresh.settimeout(0.5)
            with pytest.raises(TimeoutError):
                fresh.recv(3)
            proxy.restore()
            fresh.settimeout(2)
            assert fresh.recv(3) == b"new"
        s.settimeout(2)
        assert s.recv(3) == b"two"  # the stream is intact, as after a healed partition


def test_drop_replies_after_a_marker_discards_answers_instead_of_holding_them(
    proxy: FaultProxy,
) -> None:
    with _connect(proxy) as s:
        proxy.drop_replies(after=b"COMMIT")
        assert _echoes(s, b"BEGIN")  # answers flow until the marker was sent
        s.sendall(b"COMMIT")
        s.settimeout(0.5)
        with pytest.raises(TimeoutError):
            s.recv(6)
        proxy.restore()
        s.sendall(b"kept")
        s.settimeout(2)
        assert s.recv(16) == b"kept"  # the echo of COMMIT is gone, not delivered late


def test_url_points_at_the_proxy(proxy: FaultProxy) -> None:
    url = proxy.url("amqp://guest:guest@127.0.0.1:5672/%2F")
    assert url == f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2F"


def test_cut_ends_both_sides_even_when_neither_is_talking() -> None:
    """A PostgreSQL session idle in a transaction sends nothing: a cut must still end it
    on the server side (or it keeps its locks), and the client must see it without
    writing first."""
    server = socket.create_server(("127.0.0.1", 0))
    ended = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        with conn, contextlib.suppress(OSError):
            while conn.recv(4096):
                pass
        ended.set()

    threading.Thread(target=serve, daemon=True).start()
    proxy = FaultProxy(*server.getsockname())
    try:
        with _connect(proxy) as s:
            s.sendall(b"BEGIN")
            time.sleep(0.3)  # both pumps are now blocked in recv
            proxy.cut()
            assert ended.wait(3), "the upstream never saw the cut"
            s.settimeout(3)
            with contextlib.suppress(OSError):
                assert s.recv(1) == b""
    finally:
        proxy.close()
        server.close()


def test_strand_silences_current_connections_for_good_but_not_new_ones(
    proxy: FaultProxy,
) -> None:
    with _connect(proxy) as old:
        assert _echoes(old, b"one")
        proxy.strand()
        old.sendall(b"lost")
        old.settimeout(0.5)
        with pytest.raises(TimeoutError):
            old.recv(4)
        with _connect(proxy) as new:
            assert _echoes(new, b"new")
        proxy.restore()
        with pytest.raises(TimeoutError):
            old.recv(4)


def test_a_stranded_connection_ends_when_its_client_gives_up(proxy: FaultProxy) -> None:
    old = _connect(proxy)
    assert _echoes(old, b"one")
    proxy.strand()
    old.sendall(b"dropped")
    assert proxy.stranded_links == 1
    old.close()
    wait_for(lambda: proxy.open_links == 0, timeout=3, message="the proxy to forget the link")
