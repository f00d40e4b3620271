"""SSRF-safe outbound HTTP: resolve once, vet every address, connect only to a vetted one.

Connections are kept alive between requests (`KeepAlive`), each under the key (scheme,
host, port, vetted address) it was opened for: a request reuses only a connection to an
address it has itself just resolved and vetted, and a kept connection is never pointed
anywhere else.

urllib3's connection classes are used directly rather than requests: they never read proxy
variables from the environment (a proxy would bypass pinning), they connect to exactly the
host given (our vetted IP) and still take the original hostname for SNI and certificate
checks, and an explicit connect() separates "never left" from "may have arrived".
"""

from __future__ import annotations

import contextlib
import heapq
import http.client
import ipaddress
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.response import BaseHTTPResponse

from flowforge.errors import FlowForgeError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_DEFAULT_PORTS = {"http": 80, "https": 443}
_CHUNK = 65_536
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
_UNSAFE_URL = re.compile(r"[\x00-\x20\x7f]")
_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")
_DELTA_SECONDS = re.compile(r"[0-9]{1,10}")


def _table(entries: Mapping[str, str]) -> tuple[tuple[IPNetwork, str], ...]:
    """Compile a CIDR → reason table once at import."""
    return tuple((ipaddress.ip_network(cidr), reason) for cidr, reason in entries.items())


# IANA special-purpose ranges that are not globally reachable; first match names the reason.
_REFUSED_V4 = _table(
    {
        "0.0.0.0/8": "'this network' (0.0.0.0/8)",
        "10.0.0.0/8": "private (RFC 1918)",
        "100.64.0.0/10": "shared carrier-grade NAT space (100.64.0.0/10)",
        "127.0.0.0/8": "loopback",
        "169.254.0.0/16": "link-local (cloud metadata lives here)",
        "172.16.0.0/12": "private (RFC 1918)",
        "192.0.0.0/24": "IETF protocol assignments (192.0.0.0/24)",
        "192.0.2.0/24": "documentation (TEST-NET-1)",
        "192.88.99.0/24": "deprecated 6to4 relay anycast",
        "192.168.0.0/16": "private (RFC 1918)",
        "198.18.0.0/15": "benchmarking (198.18.0.0/15)",
        "198.51.100.0/24": "documentation (TEST-NET-2)",
        "203.0.113.0/24": "documentation (TEST-NET-3)",
        "224.0.0.0/4": "multicast",
        "255.255.255.255/32": "broadcast",
        "240.0.0.0/4": "reserved (240.0.0.0/4)",
    }
)
_REFUSED_V6 = _table(
    {
        "::/128": "unspecified",
        "::1/128": "loopback",
        "64:ff9b:1::/48": "local-use NAT64 (64:ff9b:1::/48)",
        "100::/64": "discard-only (100::/64)",
        "2001:2::/48": "benchmarking (2001:2::/48)",
        "2001:10::/28": "deprecated ORCHID (2001:10::/28)",
        "2001:db8::/32": "documentation (2001:db8::/32)",
        "3fff::/20": "documentation (3fff::/20)",
        "fc00::/7": "unique local (fc00::/7)",
        "fe80::/10": "link-local",
        "fec0::/10": "site-local (deprecated)",
        "ff00::/8": "multicast",
    }
)
# IPv4-compatible (::a.b.c.d) and well-known NAT64 addresses carry the IPv4 in their last 32 bits.
_LAST_32_BITS = (ipaddress.ip_network("::/96"), ipaddress.ip_network("64:ff9b::/96"))
_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")


class NotSent(FlowForgeError):
    """The request provably never left, so repeating it is always safe."""


class RequestInvalid(NotSent):
    """The rendered request cannot be sent as it is; trying again would not change that."""


class RequestRefused(NotSent):
    """The address guard said no; the request never left."""


class SentNoResponse(FlowForgeError):
    """The request may have reached the server, so its effect is unknown."""


@dataclass(frozen=True)
class HttpResult:
    """What came back, bounded in size, for the step to record."""

    status: int
    headers: dict[str, str]
    body: bytes
    truncated: bool
    duration_ms: int
    retry_after_s: float | None
    # A dated Retry-After with no usable Date header (retry_after()).
    retry_at: datetime | None = None


@dataclass(frozen=True)
class Allowlist:
    """FLOWFORGE_HTTP_ALLOW: hostnames trusted wherever they resolve, and reachable networks."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Allowlist:
        """Parse the comma list strictly, so a typo fails at start-up instead of changing access."""
        hosts: set[str] = set()
        networks: list[IPNetwork] = []
        for raw in text.split(","):
            entry = raw.strip().lower()
            if not entry:
                continue
            host = entry.removesuffix(".")
            try:
                networks.append(ipaddress.ip_network(entry))
            except ValueError as exc:
                if not _is_hostname(host):
                    raise ValueError(
                        f"FLOWFORGE_HTTP_ALLOW entry {entry!r} is not an IP address, CIDR network "
                        f"or hostname ({exc}; hostnames match exactly, no wildcards or URLs)"
                    ) from None
                hosts.add(host)
        return cls(frozenset(hosts), tuple(networks))

    def allows_host(self, host: str) -> bool:
        """Match a URL hostname exactly, ignoring case and a trailing dot."""
        return host.lower().removesuffix(".") in self.hosts

    def allows_address(self, address: IPAddress) -> bool:
        """Match an address against the networks; versions are compared first on purpose."""
        return any(address.version == net.version and address in net for net in self.networks)


def _is_hostname(host: str) -> bool:
    """Accept DNS names only; a numeric last label would be read as an IPv4 address."""
    labels = host.split(".")
    return (
        len(host) <= 253
        and all(_LABEL.fullmatch(label) for label in labels)
        and not labels[-1].isdigit()
    )


def refusal_reason(address: IPAddress, allow: Allowlist, host: str = "") -> str | None:
    """Say why an address must not be contacted, or None; pure so it is testable offline."""
    if (host and allow.allows_host(host)) or allow.allows_address(address):
        return None
    return _not_global(address)


def _not_global(address: IPAddress) -> str | None:
    """Classify without the allow list; IPv6 forms that embed an IPv4 inherit its verdict."""
    table = _REFUSED_V4 if address.version == 4 else _REFUSED_V6
    for network, reason in table:
        if address in network:
            return reason
    if isinstance(address, ipaddress.IPv4Address):
        return None
    embedded = _embedded_ipv4(address)
    for inner in embedded:
        if inner_reason := _not_global(inner):
            return f"{inner_reason} (embedded IPv4 {inner})"
    if not embedded and address not in _GLOBAL_UNICAST:
        return "outside IPv6 global unicast (2000::/3)"
    return None


def _embedded_ipv4(address: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...]:
    """IPv4 addresses a packet to this address would reach: mapped, 6to4, Teredo, NAT64."""
    if address.ipv4_mapped:
        return (address.ipv4_mapped,)
    if address.sixtofour:
        return (address.sixtofour,)
    if address.teredo:
        return address.teredo
    if any(address in network for network in _LAST_32_BITS):
        return (ipaddress.IPv4Address(int(address) & 0xFFFFFFFF),)
    return ()


@dataclass(frozen=True)
class _Target:
    """The parts of a URL that decide where a request goes and how it names its host."""

    method: str
    scheme: str
    host: str
    port: int
    path: str
    reveal: bool = True  # False when the URL holds a secret: name neither host nor scheme

    @property
    def where(self) -> str:
        """Method and origin for error messages; the path is left out as it may carry secrets,
        and the origin too when the caller says the URL holds one."""
        if not self.reveal:
            return f"{self.method} to a URL that holds a secret"
        return f"{self.method} {self.scheme}://{self._bracketed}:{self.port}"

    @property
    def host_header(self) -> str:
        """The Host header value the server would get had we let the URL drive the connection."""
        default = self.port == _DEFAULT_PORTS[self.scheme]
        return self._bracketed if default else f"{self._bracketed}:{self.port}"

    @property
    def _bracketed(self) -> str:
        """IPv6 literals need brackets wherever a port may follow."""
        return f"[{self.host}]" if ":" in self.host else self.host


def _parse_target(method: str, url: str, reveal: bool = True) -> _Target:
    """Validate method and URL up front, so nothing malformed reaches a socket. Only the
    scheme is ever quoted, and not when the URL holds a secret."""
    if not _TOKEN.fullmatch(method):
        raise RequestInvalid("invalid HTTP method")
    if _UNSAFE_URL.search(url):
        raise RequestInvalid(f"{method}: URL contains whitespace or control characters")
    try:
        parts = urlsplit(url)
        scheme = parts.scheme
        if scheme not in _DEFAULT_PORTS:
            named = f"scheme {scheme!r}" if reveal else "the URL's scheme"
            raise RequestInvalid(f"{method}: {named} is not allowed; use http or https")
        host = parts.hostname or ""
        port = parts.port if parts.port is not None else _DEFAULT_PORTS[scheme]
        host = host if host.isascii() else host.encode("idna").decode("ascii")
    except ValueError:
        raise RequestInvalid(f"{method}: URL has an invalid host or port") from None
    if not host:
        raise RequestInvalid(f"{method}: URL has no host")
    if not _valid_dns_name(host):
        named = f"host {host!r}" if reveal else "the URL's host"
        raise RequestInvalid(
            f"{method}: {named} is not a valid DNS name "
            "(an empty label, one over 63 characters, or over 253 in all)"
        )
    if parts.username is not None or parts.password is not None:
        raise RequestInvalid(f"{method}: credentials in the URL are not supported; use a header")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if not path.isascii():
        raise RequestInvalid(f"{method}: URL path must be ASCII; percent-encode it")
    return _Target(method, scheme, host, port, path, reveal)


def _valid_dns_name(host: str) -> bool:
    """Whether the (already ASCII) host is a name DNS can carry: getaddrinfo IDNA-encodes it
    first, and that raises UnicodeError, not OSError, for an empty label or one over 63
    characters; over 253 in all no resolver can look it up."""
    name = host.removesuffix(".")
    return len(name) <= 253 and all(0 < len(label) < 64 for label in name.split("."))


def _check_headers(target: _Target, headers: Mapping[str, str]) -> None:
    """Reject header injection before connecting; values are never echoed as they may be secret."""
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name):
            raise RequestInvalid(f"{target.where}: invalid header name")
        if not _FIELD_VALUE.fullmatch(value):
            raise RequestInvalid(
                f"{target.where}: header {name} has a control or non-Latin-1 character"
            )


def _resolve(target: _Target) -> list[IPAddress]:
    """Resolve exactly once; only these addresses are vetted and connected to (no rebinding)."""
    try:
        infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise NotSent(f"{target.where}: DNS resolution failed ({exc})") from None
    except UnicodeError:
        # The name could not be IDNA-encoded, so no query left; _parse_target should
        # have refused it already, and this keeps any name it missed from escaping.
        raise NotSent(f"{target.where}: DNS resolution failed (name not encodable)") from None
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))


def _why(exc: BaseException, target: _Target) -> str:
    """Name a transport failure by its root cause; only OS/TLS text, never request data.
    TLS text names the host (certificate mismatches do), so not for a secret-holding URL."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    name = type(exc).__name__
    detailed = isinstance(exc, OSError) and str(exc) and target.reveal
    return f"{name}: {exc}" if detailed else name


# An idle kept-alive connection is closed after this long. Shorter than the idle timeout of
# common servers (Node.js and gunicorn 5 s, nginx 75 s, Apache 5 s): reusing one the server
# is closing at that moment would make a request that never reached it look "sent, no
# response", which for a step that is not repeat-safe means `unknown`.
IDLE_SECONDS = 4.0
# How often idle connections of every key are swept for expiry (besides their own key's
# turn), so connections to a host no longer called do not stay open.
_SWEEP_SECONDS = 1.0

_Key = tuple[str, str, int, IPAddress]


class KeepAlive:
    """Idle outbound connections by (scheme, host, port, vetted address), shared by the
    process's threads. A connection goes back only after a complete response on a
    connection the server keeps open; one found readable while idle (the server closed it,
    or sent something unasked) or idle longer than IDLE_SECONDS is closed, not reused."""

    def __init__(self, idle_s: float = IDLE_SECONDS) -> None:
        self.idle_s = idle_s
        self._idle: dict[_Key, list[tuple[float, HTTPConnection]]] = {}
        self._lock = threading.Lock()
        self._swept = time.monotonic()
        #: Connections opened so far: the count a bench reports per request.
        self.opened = 0

    def take(self, key: _Key) -> HTTPConnection | None:
        """The most recently used live idle connection for `key`, or None."""
        now = time.monotonic()
        while True:
            with self._lock:
                entries = self._idle.get(key)
                if not entries:
                    return None
                returned, conn = entries.pop()
                if not entries:
                    del self._idle[key]
            if now - returned < self.idle_s and conn.is_connected:
                return conn
            conn.close()

    def give_back(self, key: _Key, conn: HTTPConnection) -> None:
        """Keep `conn` for the next request to `key`; sweep expired ones now and then."""
        now = time.monotonic()
        expired: list[HTTPConnection] = []
        with self._lock:
            self._idle.setdefault(key, []).append((now, conn))
            if now - self._swept >= _SWEEP_SECONDS:
                self._swept = now
                for other, entries in list(self._idle.items()):
                    fresh = [(at, c) for at, c in entries if now - at < self.idle_s]
                    expired += [c for at, c in entries if now - at >= self.idle_s]
                    if fresh:
                        self._idle[other] = fresh
                    else:
                        del self._idle[other]
        for stale in expired:
            stale.close()

    def counted(self, conn: HTTPConnection) -> HTTPConnection:
        with self._lock:
            self.opened += 1
        return conn

    def close(self) -> None:
        """Close every idle connection (tests, and a process that stops)."""
        with self._lock:
            entries = [conn for kept in self._idle.values() for _, conn in kept]
            self._idle.clear()
        for conn in entries:
            conn.close()


#: The process's kept-alive connections (bin/worker's executors share them).
CONNECTIONS = KeepAlive()


def _connect(
    target: _Target, addresses: list[IPAddress], timeout_s: float, kept: KeepAlive
) -> tuple[HTTPConnection, _Key]:
    """A connection to a vetted address, nothing sent on it yet: a kept-alive one to one of
    `addresses` if there is one, else TCP (and TLS) to the first address that answers."""
    for address in addresses:
        key = (target.scheme, target.host, target.port, address)
        if (reused := kept.take(key)) is not None:
            return reused, key
    failure = ""
    for address in addresses:
        if target.scheme == "https":
            name = target.host.removesuffix(".")
            conn: HTTPConnection = HTTPSConnection(
                str(address),
                target.port,
                timeout=timeout_s,
                server_hostname=name,
                assert_hostname=name,
                cert_reqs="CERT_REQUIRED",
            )
        else:
            conn = HTTPConnection(str(address), target.port, timeout=timeout_s)
        try:
            conn.connect()
            return kept.counted(conn), (target.scheme, target.host, target.port, address)
        except (OSError, ValueError, Urllib3Error) as exc:
            conn.close()
            failure = f"connect to {address} failed: {_why(exc, target)}"
    raise NotSent(f"{target.where}: {failure}")


def _abort(sock: socket.socket) -> None:
    """Unblock a read stuck past the deadline; the plain-socket shutdown leaves TLS state alone."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class Watchdog:
    """One thread that aborts the reads of requests past their deadline.

    A threading.Timer per request started, cancelled and joined a thread for every
    request: 10-15 % of a worker's CPU on a steady backlog of fast https steps (py-spy
    --gil, tests/bench/outbound.py), where this is a heap push and a dict delete."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._armed: dict[int, socket.socket] = {}
        self._numbers = 0
        self._thread: threading.Thread | None = None

    def arm(self, timeout_s: float, sock: socket.socket) -> int:
        """Abort `sock`'s reads in `timeout_s` unless disarmed first; returns the token."""
        with self._lock:
            self._numbers += 1
            self._armed[self._numbers] = sock
            heapq.heappush(self._heap, (time.monotonic() + timeout_s, self._numbers))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
                self._thread.start()
            elif self._heap[0][1] == self._numbers:
                self._lock.notify()
            return self._numbers

    def disarm(self, token: int) -> None:
        """From its return on, the socket of `token` is never aborted (the abort happens
        under the same lock)."""
        with self._lock:
            self._armed.pop(token, None)

    def _run(self) -> None:
        with self._lock:
            while True:
                now = time.monotonic()
                # Due, or disarmed already (dropped as it comes up to the head).
                while self._heap and (
                    self._heap[0][0] <= now or self._heap[0][1] not in self._armed
                ):
                    _at, token = heapq.heappop(self._heap)
                    sock = self._armed.pop(token, None)
                    if sock is not None:
                        _abort(sock)
                self._lock.wait(self._heap[0][0] - now if self._heap else None)


WATCHDOG = Watchdog()


def _read_capped(response: BaseHTTPResponse, limit: int) -> tuple[bytes, bool]:
    """Read at most limit bytes, plus one to learn whether there was more."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = response.read1(min(_CHUNK, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)[:limit], size > limit


def retry_after(value: str | None, date: str | None) -> float | datetime | None:
    """Read Retry-After so a 429/503 back-off can be honoured (docs/contract.md, "Outbound
    limits"): delta-seconds as they are; an HTTP-date against the response's own Date, so
    both readings are the target's clock and the worker's decides nothing; with no usable
    Date, the instant itself, for the checkpoint to read against the database's clock."""
    if value is None:
        return None
    value = value.strip()
    if _DELTA_SECONDS.fullmatch(value):
        return float(value)
    when = _http_date(value)
    if when is None:
        return None
    sent = _http_date(date) if date is not None else None
    if sent is None:
        return when
    return max(0.0, (when - sent).total_seconds())


def _http_date(value: str) -> datetime | None:
    """An HTTP-date (or None when it is not one), in UTC."""
    try:
        when = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when


# Linux only. A kept-alive connection leaves the kernel's quick-ACK start: it then
# delays the ACK of what it receives by up to 40 ms, waiting for data of its own to carry
# it. A server that writes its headers and its body in two sends without TCP_NODELAY
# (Python's http.server, many small frameworks) holds the body back under Nagle's
# algorithm until the headers are ACKed: every request on a reused connection took 44 ms
# against such a server instead of 0.8 ms on a fresh one (the bench's fan stub: 244/s
# with a connection per request, 141-151/s once connections were kept).
_QUICKACK = getattr(socket, "TCP_QUICKACK", None)


def _ack_at_once(sock: socket.socket | None) -> None:
    """ACK the response as it is read rather than after the delayed-ACK timer. Set again
    for every request: sending the request put the socket back into delayed ACKs."""
    if _QUICKACK is None or sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)


def _exchange(
    conn: HTTPConnection,
    target: _Target,
    headers: Mapping[str, str],
    body: bytes | None,
    timeout_s: float,
    max_response_bytes: int,
) -> tuple[int, dict[str, str], bytes, bool, bool]:
    """Send and read under one deadline; from the first byte written the outcome is uncertain.
    The last value says whether the connection may be kept: the whole response was read
    in time and the server keeps the connection open. Otherwise it is closed here."""
    deadline = time.monotonic() + timeout_s
    slow = f"response too slow (timeout {timeout_s:g} s)"
    watchdog = WATCHDOG.arm(timeout_s, conn.sock)
    conn.timeout = timeout_s
    reusable = False
    try:
        conn.request(target.method, target.path, body=body, headers=headers, preload_content=False)
        _ack_at_once(conn.sock)
        with conn.getresponse() as response:
            data, truncated = _read_capped(response, max_response_bytes)
            status = response.status
            found = {name.lower(): response.headers[name] for name in response.headers}
        # http.client drops the socket itself when the server says it will close.
        reusable = not truncated and not conn.is_closed
    except (OSError, ValueError, http.client.HTTPException, Urllib3Error) as exc:
        reason = slow if time.monotonic() >= deadline else _why(exc, target)
        raise SentNoResponse(f"{target.where}: {reason}") from None
    finally:
        WATCHDOG.disarm(watchdog)
        in_time = time.monotonic() < deadline
        if not (reusable and in_time):
            conn.close()
    if not in_time:
        raise SentNoResponse(f"{target.where}: {slow}")
    return status, found, data, truncated, reusable


def send(
    method: str,
    url: str,
    *,
    headers: Mapping[str, str],
    body: bytes | None,
    timeout_s: float,
    allow: Allowlist,
    max_response_bytes: int = 262_144,
    connect_timeout_s: float = 5.0,
    reveal_origin: bool = True,
    before_send: Callable[[], None] | None = None,
    kept: KeepAlive = CONNECTIONS,
) -> HttpResult:
    """Send one request to a vetted address; a 3xx is returned unfollowed so each hop is vetted.

    reveal_origin=False keeps the URL's scheme and host out of every error message, for a
    URL rendered from a secret. `before_send` is called once connected, right before the
    first byte is written: the caller's last chance to keep the request home by raising
    (NotSent, so it is safe to repeat); the connection is closed and nothing is sent.
    The connection comes from, and after a complete response goes back to, `kept`.
    """
    started = time.monotonic()
    target = _parse_target(method, url, reveal_origin)
    _check_headers(target, headers)
    addresses = _resolve(target)
    for address in addresses:
        if reason := refusal_reason(address, allow, target.host):
            raise RequestRefused(
                f"{target.where}: refused, {address} is {reason}; "
                "FLOWFORGE_HTTP_ALLOW can permit it"
            )
    sent_headers = dict(headers)  # a caller's Host wins: virtual hosts behind an IP-literal URL
    if not any(name.lower() == "host" for name in headers):
        sent_headers["Host"] = target.host_header
    conn, key = _connect(target, addresses, connect_timeout_s, kept)
    if before_send is not None:
        try:
            before_send()
        except BaseException:
            conn.close()
            raise
    status, found, data, truncated, reusable = _exchange(
        conn, target, sent_headers, body, timeout_s, max_response_bytes
    )
    if reusable:
        kept.give_back(key, conn)
    wait = retry_after(found.get("retry-after"), found.get("date"))
    return HttpResult(
        status=status,
        headers=found,
        body=data,
        truncated=truncated,
        duration_ms=round((time.monotonic() - started) * 1000),
        retry_after_s=wait if not isinstance(wait, datetime) else None,
        retry_at=wait if isinstance(wait, datetime) else None,
    )
