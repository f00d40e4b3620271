"""A TCP fault proxy on 127.0.0.1 that tests put between bin/worker and RabbitMQ.

Point a worker's FLOWFORGE_AMQP_URL at `proxy.url(amqp_url)` and the test decides what the
network does:

- pass: bytes flow both ways (the default);
- cut: every current connection is reset and new ones are reset as soon as they are
  accepted — the broker looks gone, the way a crashed broker or a dropped link looks;
- blackhole: connections are accepted and kept open, but nothing is forwarded in either
  direction — a partition, where reads hang instead of failing;
- restore: back to pass; bytes held by a blackhole are then delivered, like TCP does
  when a partition heals, so the AMQP stream is intact;
- drop_replies: client bytes still reach the server, but once a connection has sent a
  chunk containing the given bytes (b"COMMIT", say) the server's answers on it are thrown
  away — a link that fails right after a request got through; follow it with cut() to
  make the client see the failure.
- strand: every current connection goes silent for good (a middlebox lost its state and
  drops their packets without a reset) while new connections pass — only a client that
  notices on its own (heartbeats, timeouts) gets out of it, by closing its end.

Threads and the standard library only, so it runs wherever the tests do.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from urllib.parse import urlsplit, urlunsplit

CHUNK = 65_536
POLL = 0.05


def _reset(sock: socket.socket) -> None:
    """Close with RST instead of FIN, so the peer sees a hard failure at once.

    shutdown(SHUT_RD) first: it sends nothing, but wakes a pump blocked in recv() on this
    socket. Without it close() only drops our file descriptor, the blocked recv keeps the
    socket alive, and a peer that is not talking (PostgreSQL idle in a transaction) never
    hears of the reset and keeps its locks.
    """
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()


class _Link:
    """One client connection and its upstream twin."""

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.upstream: socket.socket | None = None
        self.closed = threading.Event()
        self.deaf = False  # drop_replies: the server's answers are discarded
        self.stranded = False
        self._lock = threading.Lock()

    def close(self, *, reset: bool = False) -> None:
        with self._lock:
            if self.closed.is_set():
                return
            self.closed.set()
            for sock in (self.client, self.upstream):
                if sock is None:
                    continue
                if reset:
                    _reset(sock)
                else:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    with contextlib.suppress(OSError):
                        sock.close()


class FaultProxy:
    """Forward 127.0.0.1:<port> to an upstream address, with switchable faults."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.mode = "pass"
        self._reply_marker: bytes | None = None
        self.accepted = 0
        self.refused = 0
        self.accept_errors = 0
        self._flowing = threading.Event()
        self._flowing.set()
        self._links: set[_Link] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._listener.settimeout(POLL * 4)
        self.port: int = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept_loop, name="faultproxy", daemon=True)
        self._acceptor.start()

    @classmethod
    def for_url(cls, url: str) -> FaultProxy:
        """A proxy in front of the host and port of an amqp:// (or any) URL."""
        parts = urlsplit(url)
        return cls(parts.hostname or "127.0.0.1", parts.port or 5672)

    def url(self, url: str) -> str:
        """`url` with its host and port replaced by this proxy's."""
        parts = urlsplit(url)
        userinfo, _, _ = parts.netloc.rpartition("@")
        netloc = f"{userinfo}@127.0.0.1:{self.port}" if userinfo else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    @property
    def open_links(self) -> int:
        """How many client connections are currently open through the proxy."""
        with self._lock:
            return len(self._links)

    @property
    def stranded_links(self) -> int:
        """Stranded connections their client has not given up on yet."""
        with self._lock:
            return sum(1 for link in self._links if link.stranded)

    @property
    def deaf_links(self) -> int:
        """Links that sent drop_replies' marker: their answers are discarded from then on."""
        with self._lock:
            return sum(1 for link in self._links if link.deaf)

    def upstream_ports(self) -> set[int]:
        """Local ports of the open upstream connections: what the server sees as each
        client's port (PostgreSQL's pg_stat_activity.client_port), to tell whose it is."""
        with self._lock:
            links = list(self._links)
        ports = set()
        for link in links:
            with contextlib.suppress(OSError, AttributeError):
                ports.add(link.upstream.getsockname()[1])  # type: ignore[union-attr]
        return ports

    # ---- modes ---------------------------------------------------------------------

    def cut(self) -> None:
        """Reset every current connection (but stranded ones: they are out of reach) and
        every new one until restore()."""
        with self._lock:
            self.mode = "cut"
            links = [link for link in self._links if not link.stranded]
        self._flowing.set()  # let blocked pumps notice the reset and exit
        for link in links:
            link.close(reset=True)

    def blackhole(self) -> None:
        """Keep connections open but forward nothing until restore()."""
        with self._lock:
            self.mode = "blackhole"
            self._flowing.clear()

    def drop_replies(self, after: bytes = b"") -> None:
        """Until restore(), discard what the server answers on each connection from the
        first chunk its client sends that contains `after` (any chunk when empty)."""
        with self._lock:
            self.mode = "drop_replies"
            self._reply_marker = after
            self._flowing.set()

    def strand(self) -> None:
        """Silence every current connection for good; new ones are not affected."""
        with self._lock:
            links = list(self._links)
        for link in links:
            link.stranded = True

    def restore(self) -> None:
        """Forward again; whatever a blackhole held back is delivered now."""
        with self._lock:
            self.mode = "pass"
            self._reply_marker = None
            for link in self._links:
                link.deaf = False
            self._flowing.set()

    def close(self) -> None:
        """Stop accepting and close every connection."""
        self._stopped.set()
        self._flowing.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()
        self._acceptor.join(timeout=5)

    # ---- machinery -----------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stopped.is_set():
                    return
                # ECONNABORTED and friends: one client's trouble must not stop the proxy.
                self.accept_errors += 1
                time.sleep(POLL)
                continue
            with self._lock:
                mode = self.mode
                if mode != "cut":
                    link = _Link(client)
                    self._links.add(link)
                    self.accepted += 1
                else:
                    self.refused += 1
            if mode == "cut":
                _reset(client)
                continue
            threading.Thread(
                target=self._open_upstream, args=(link,), name="faultproxy-link", daemon=True
            ).start()

    def _wait_flowing(self, link: _Link) -> bool:
        """Block while blackholed; False once the link or the proxy is closed."""
        while not self._flowing.wait(POLL):
            if link.closed.is_set() or self._stopped.is_set():
                return False
        return not link.closed.is_set()

    def _open_upstream(self, link: _Link) -> None:
        # A connection accepted during a blackhole does not reach the broker until the
        # partition heals: the client sees an open socket that never answers.
        if not self._wait_flowing(link):
            self._forget(link)
            return
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
            upstream.settimeout(None)
        except OSError:
            link.close(reset=True)
            self._forget(link)
            return
        with link._lock:
            if link.closed.is_set():
                _reset(upstream)
                self._forget(link)
                return
            link.upstream = upstream
        pumps = [
            threading.Thread(
                target=self._pump, args=(link, link.client, upstream, False), daemon=True
            ),
            threading.Thread(
                target=self._pump, args=(link, upstream, link.client, True), daemon=True
            ),
        ]
        for pump in pumps:
            pump.start()
        for pump in pumps:
            pump.join()
        self._forget(link)

    def _pump(self, link: _Link, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        try:
            while True:
                data = source.recv(CHUNK)
                if not data:
                    break
                if not self._wait_flowing(link):
                    return
                marker = self._reply_marker
                if not replies and marker is not None and marker in data:
                    link.deaf = True  # before forwarding: the answer may come back at once
                if replies and link.deaf:
                    continue
                if link.stranded:
                    continue  # dropped, like the packets of a flow a middlebox forgot
                sink.sendall(data)
        except OSError:
            pass
        finally:
            link.close()

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)
