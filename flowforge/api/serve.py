"""bin/api: gunicorn with FlowForge's defaults; any gunicorn option can follow.

gunicorn answers some requests itself, before Flask sees them (a request line or headers
too large, broken framing) and writes its own log lines. Both are FlowForge's here: the
worker class answers those errors as RFC 9457 problem documents, and the logger class
writes JSON lines that never hold a query string, a Basic-auth user or a header.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import ssl
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import timedelta
from http import HTTPStatus
from typing import Any

from gunicorn import glogging, util
from gunicorn.http import errors
from gunicorn.workers.sync import SyncWorker

from flowforge.api.console import live
from flowforge.api.problems import PROBLEM_JSON, problem_document
from flowforge.errors import ConfigError
from flowforge.launcher import METRICS_DIR_ENV
from flowforge.logs import JsonFormatter, configure_logging
from flowforge.observe import tracing
from flowforge.store import budget
from flowforge.store.config import Settings
from flowforge.trust import resume_tokens

# Bounds on what one connection may cost a sync worker; every request FlowForge serves
# is a few milliseconds and a few hundred bytes of head. Options given to bin/api come
# after these on the command line, and gunicorn keeps the last value of an option.
DEFAULTS = [
    "--worker-class", f"{__name__}.ProblemWorker",
    "--logger-class", f"{__name__}.JsonLogger",
    "--access-logfile", "-",
    # A sync worker silent this long (a slow client trickling its request, a hung call)
    # is killed and replaced, which bounds what a slow connection can hold.
    "--timeout", "15",
    "--graceful-timeout", "15",
    # Webhook and API paths are short; a cursor is well under 100 bytes.
    "--limit-request-line", "2048",
    "--limit-request-fields", "50",
    # Room for a Standard Webhooks signature header listing several signatures.
    "--limit-request-field_size", "8190",
]  # fmt: skip

# The longest a connection may wait in the backlog when the worker woken for it exits.
MAX_ACCEPT_WAIT_S = 1.0
# gunicorn's errors that are the client's doing, most specific first, with the answer.
CLIENT_ERRORS: list[tuple[type[BaseException], int, str]] = [
    (errors.LimitRequestLine, 414, "the request line is longer than this server accepts"),
    (
        errors.LimitRequestHeaders,
        431,
        "the request has too many header fields or one that is too large",
    ),
    (errors.ExpectationFailed, 417, "only Expect: 100-continue is supported"),
    (errors.UnsupportedTransferCoding, 501, "only the chunked transfer coding is supported"),
    (errors.ForbiddenProxyRequest, 403, "proxy requests are not accepted from this address"),
    (errors.ParseException, 400, "the request is not well-formed HTTP/1.1"),
    (ssl.SSLError, 400, "the TLS handshake failed"),
]
# Response headers the application made are its own fault, whatever their class says.
SERVER_ERRORS = (
    errors.InvalidResponseHeader,
    errors.InvalidResponseHeaderName,
    errors.ConfigurationProblem,
)


def gunicorn_argv(args: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The gunicorn command line: sync workers, no --preload (the pool is per process)."""
    argv = ["gunicorn", *DEFAULTS]
    if "--bind" not in args and not any(a.startswith(("--bind=", "-b")) for a in args):
        argv += ["--bind", f"{env.get('HOST', '127.0.0.1')}:{env.get('PORT', '8000')}"]
    if "--workers" not in args and not any(a.startswith(("--workers=", "-w")) for a in args):
        argv += ["--workers", env.get("FLOWFORGE_API_WORKERS", str(2 * (os.cpu_count() or 1) + 1))]
    # gunicorn's default control socket is one path per user, so a second bin/api would
    # take over the first one's; only an operator who names one gets one.
    if not any(a == "--control-socket" or a.startswith("--control-socket=") for a in args):
        argv.append("--no-control-socket")
    return [*argv, *args, "flowforge.api:create_app()"]


def new_request_id() -> str:
    """An opaque id for one request, shown in its access line and X-Request-Id."""
    return uuid.uuid4().hex


def log_request(
    access_log: logging.Logger,
    *,
    method: str | None,
    path: str | None,
    status: int,
    duration: timedelta,
    request_id: str,
    remote: str | None,
) -> None:
    """One access line: never the query string, headers or user, which may hold keys, nor
    the token of a resume URL."""
    access_log.info(
        "request",
        extra={
            "method": method,
            "path": resume_tokens.loggable_path(path),
            "status": status,
            "duration_ms": round(duration.total_seconds() * 1000, 3),
            "request_id": request_id,
            "remote": remote,
        },
    )


class JsonLogger(glogging.Logger):
    """gunicorn's logger writing JSON lines to stderr like the rest of FlowForge."""

    def setup(self, cfg: Any) -> None:
        """Configure as gunicorn does, then make every handler it installed speak JSON."""
        super().setup(cfg)
        configure_logging()  # the master's own root logger (and Python warnings) too
        for log in (self.error_log, self.access_log):
            for handler in log.handlers:
                if not getattr(handler, "_gunicorn", False):
                    continue
                handler.setFormatter(JsonFormatter())
                # One stream for every line, so lines cannot interleave mid-way.
                if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
                    handler.setStream(sys.stderr)

    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: timedelta) -> None:
        """The access line of a request the application answered."""
        if not self.access_log_enabled:
            return
        status = resp.status
        log_request(
            self.access_log,
            method=environ.get("REQUEST_METHOD"),
            path=environ.get("PATH_INFO"),
            status=int(str(status).split()[0]) if status else 0,
            duration=request_time,
            request_id=environ.get("flowforge.request_id") or new_request_id(),
            remote=environ.get("REMOTE_ADDR"),
        )


class ProblemWorker(SyncWorker):
    """gunicorn's sync worker, answering its own errors as problem+json instead of HTML,
    and woken alone for a new connection."""

    _accepted_at = 0.0
    _epoll: Any = None
    _listening: dict[int, Any]

    def wait(self, timeout: float) -> Any:
        """Wait for a connection like SyncWorker.wait, but through epoll with
        EPOLLEXCLUSIVE on the listening sockets: select() wakes every idle worker for
        each connection (all but one then find nothing to accept), which on a steady
        stream costs each request a wake-up of every other worker, in CPU and in the
        latency of the one that takes it. The signal pipe stays an ordinary event: every
        worker must see its own. Where epoll is missing, gunicorn's select()."""
        if not hasattr(select, "EPOLLEXCLUSIVE"):
            return super().wait(timeout)
        self.notify()
        if self._epoll is None:
            self._epoll = select.epoll()
            self._listening = {s.fileno(): s for s in self.sockets}
            for fd in self._listening:
                self._epoll.register(fd, select.EPOLLIN | select.EPOLLEXCLUSIVE)
            self._epoll.register(self.PIPE[0], select.EPOLLIN)
        ready = []
        # A worker woken for a connection may exit before accepting it (a signal in
        # between); nobody else is woken for it. Polling at least this often, the others
        # find it still waiting (level-triggered) within a second.
        for fd, _events in self._epoll.poll(min(timeout, MAX_ACCEPT_WAIT_S)):
            if fd == self.PIPE[0]:
                os.read(fd, 1)
                ready.append(fd)
            else:
                ready.append(self._listening[fd])
        return ready

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        """Serve one connection, noting when it began for the access line of an error."""
        self._accepted_at = time.monotonic()
        super().handle(listener, client, addr)

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        """Answer what gunicorn refused (or failed) before the application could."""
        took = timedelta(seconds=time.monotonic() - self._accepted_at)
        request_id = new_request_id()
        status, detail = 500, "an unexpected error occurred; it was logged"
        if not isinstance(exc, SERVER_ERRORS):
            for kind, code, message in CLIENT_ERRORS:
                if isinstance(exc, kind):
                    status, detail = code, message
                    break
        req = req or getattr(exc, "req", None)
        method, path = getattr(req, "method", None), getattr(req, "path", None)
        remote = addr[0] if addr else None
        # The exception's text quotes the request (query string included): log its class.
        if status == 500:
            self.log.exception(
                "error handling request",
                extra={
                    "error": type(exc).__name__,
                    "method": method,
                    "path": resume_tokens.loggable_path(path),
                },
            )
        else:
            self.log.warning(
                "refused a malformed request",
                extra={"error": type(exc).__name__, "status": status, "remote": remote},
            )
        if self.log.access_log_enabled:
            log_request(
                self.log.access_log,
                method=method,
                path=path,
                status=status,
                duration=took,
                request_id=request_id,
                remote=remote,
            )
        phrase = HTTPStatus(status).phrase
        body = problem_document(status, phrase, detail)
        encoded = json.dumps(body).encode()
        head = (
            f"HTTP/1.1 {status} {phrase}\r\n"
            "Connection: close\r\n"
            f"Content-Type: {PROBLEM_JSON}\r\n"
            f"Content-Length: {len(encoded)}\r\n"
            f"X-Request-Id: {request_id}\r\n\r\n"
        )
        try:
            util.write_nonblock(client, head.encode("latin-1") + encoded)
        except Exception:
            self.log.debug("could not send the error answer")


def _worker_exited(_server: Any, worker: Any) -> None:
    """gunicorn's child_exit hook (in the master): a dead worker's live gauges go."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def _server_exited(_server: Any) -> None:
    """gunicorn's on_exit hook (in the master): the metric files of this run go too."""
    path = os.environ.get(METRICS_DIR_ENV)
    if path:
        shutil.rmtree(path, ignore_errors=True)


def main(args: Sequence[str], env: Mapping[str, str]) -> int:
    """Run gunicorn in this process until it stops, with the metrics hooks installed."""
    from gunicorn.app.wsgiapp import WSGIApplication

    if not env.get(METRICS_DIR_ENV):
        # prometheus_client would count each worker's requests in memory, alone.
        raise RuntimeError("bin/api sets PROMETHEUS_MULTIPROC_DIR (launcher.private_metrics_dir)")
    try:
        tracing.check(env)  # each gunicorn worker configures its own (create_app)
    except ValueError as exc:
        print(f"bin/api: {exc}", file=sys.stderr)
        return 2

    class Application(WSGIApplication):
        def load_config(self) -> None:
            super().load_config()
            self.cfg.set("child_exit", _worker_exited)
            self.cfg.set("on_exit", _server_exited)
            # In the master, once: all its workers' pools together against the server.
            settings = Settings.from_env(env)
            budget.check(settings, budget.api_budget(settings, self.cfg.workers))
            # docs/contract.md#live-progress: the long-poll slots every worker shares.
            waits = live.server_slots(env[METRICS_DIR_ENV], settings.live_waits, self.cfg.workers)
            if waits < settings.live_waits:
                configure_logging()  # before gunicorn's logger is set up: still a JSON line
                logging.getLogger(__name__).warning(
                    "FLOWFORGE_LIVE_WAITS=%d cut to %d: one of %d workers stays free of long polls",
                    settings.live_waits,
                    waits,
                    self.cfg.workers,
                )

    sys.argv = gunicorn_argv(args, env)
    try:
        application = Application("%(prog)s [OPTIONS] [APP_MODULE]")
    except ConfigError as exc:
        configure_logging()
        logging.getLogger(__name__).critical("%s", exc)
        return 2
    application.run()
    return 0
