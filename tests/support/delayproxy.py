"""A TCP proxy on 127.0.0.1 that delays every chunk by `delay_s` in each direction: a
one-way network delay without netem (which needs privileges this machine's tests lack).

Each direction has a reader that stamps what it reads and a writer that sends it once
its time has come, so the delay adds latency without limiting throughput — as a longer
wire does. `delay_s` may be changed while connections are open; it applies to chunks read
from then on. Threads and the standard library only.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time

CHUNK = 65_536


class DelayProxy:
    """Forward 127.0.0.1:<port> to 127.0.0.1:`upstream_port`, `delay_s` late each way."""

    def __init__(self, upstream_port: int, delay_s: float = 0.0) -> None:
        self.upstream_port = upstream_port
        self.delay_s = delay_s
        self._stopped = threading.Event()
        self._sockets: list[socket.socket] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept_loop, name="delayproxy", daemon=True).start()

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._sockets.append(sock)
            for source, sink in ((client, upstream), (upstream, client)):
                pending: queue.Queue[tuple[float, bytes]] = queue.Queue()
                threading.Thread(target=self._read, args=(source, pending), daemon=True).start()
                threading.Thread(target=self._write, args=(sink, pending), daemon=True).start()

    def _read(self, source: socket.socket, pending: queue.Queue[tuple[float, bytes]]) -> None:
        while True:
            try:
                data = source.recv(CHUNK)
            except OSError:
                data = b""
            pending.put((time.monotonic() + self.delay_s, data))
            if not data:
                return

    def _write(self, sink: socket.socket, pending: queue.Queue[tuple[float, bytes]]) -> None:
        while True:
            due, data = pending.get()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if not data:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)
                return
            try:
                sink.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
