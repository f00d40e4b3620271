"""The Flask application factory served by gunicorn (see bin/api)."""

from __future__ import annotations

import atexit
import logging
import os
import re

from flask import Flask, Response, has_request_context, request

from flowforge.api import (
    approvals,
    circuits,
    console,
    drafts,
    events,
    executions,
    failures,
    health,
    hooks,
    me,
    notifications,
    openapi,
    paths,
    pool,
    problems,
    resume,
    schedules,
    sources,
    workflows,
)
from flowforge.api.console import editor  # noqa: F401 - adds the editor's routes to the console
from flowforge.api.ratelimit import RateLimiter
from flowforge.api.serve import new_request_id
from flowforge.logs import configure_logging
from flowforge.observe import metrics, tracing
from flowforge.store import runs
from flowforge.store.config import Settings
from flowforge.store.db import create_pool
from flowforge.usecases import intake

# A request waits for the database at most this long (plus db.REPLY_MARGIN_S), so a stalled
# database is a 503 problem well before gunicorn's worker timeout (15 s, api/serve.py)
# kills the sync worker and the client sees a reset instead.
API_DB_TIMEOUT_S = 5.0


def create_app(settings: Settings | None = None) -> Flask:
    """Build the app; the pool is opened here, in each worker process, never at import."""
    if settings is None:
        # Served (each gunicorn worker, after its fork): traces as OTEL_* asks. An app
        # given its settings (in-process tests) leaves tracing as the caller set it.
        settings = Settings.from_env()
        tracing.configure(os.environ, service="flowforge-api")
    configure_logging()
    # What a unit of work saved is counted and traced after its COMMIT (resumes, operator
    # actions and the gated intake's pure steps save runs in the API too).
    runs.listen(metrics.saved)
    runs.listen(tracing.saved)
    intake.listen_target_reads(metrics.INTAKE_TARGET_READS.inc)
    app = Flask("flowforge")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.json.sort_keys = False  # type: ignore[attr-defined]
    connections = create_pool(
        settings.database_url,
        max_size=settings.db_pool_size,
        name="api",
        timeout_s=min(settings.db_timeout_seconds, API_DB_TIMEOUT_S),
        pooler=settings.behind_pooler,
    )
    # Do not wait for the database: the API must start (and answer 503) while it is down.
    connections.open(wait=False)
    atexit.register(connections.close)
    app.extensions["flowforge.pool"] = connections
    pool.install(app)
    app.extensions["flowforge.settings"] = settings
    if settings.webhook_rate > 0:
        rate = settings.webhook_rate
        app.extensions["flowforge.webhook_limit"] = RateLimiter(rate, burst=max(1.0, rate))
    problems.install(app)
    _install_request_ids(app)
    paths.install(app)  # its text check runs after the request id is assigned
    health.install(app)
    for blueprint in (
        hooks.bp,
        resume.bp,
        workflows.bp,
        drafts.bp,
        schedules.bp,
        executions.bp,
        circuits.bp,
        health.bp,
        openapi.bp,
        sources.bp,
        notifications.bp,
        me.bp,
        approvals.bp,
        failures.bp,
        events.bp,
    ):
        app.register_blueprint(blueprint)
    app.register_blueprint(console.bp)
    return app


class _RequestIdFilter(logging.Filter):
    """Adds the current request's id to every log line written while serving it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if has_request_context() and not hasattr(record, "request_id"):
            record.request_id = request.environ.get("flowforge.request_id")
        return True


# A request id taken from the proxy is logged and echoed: short, and nothing a log line
# or a header could be broken with.
GIVEN_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def _install_request_ids(app: Flask) -> None:
    """One id per request: in X-Request-Id, the access line (gunicorn reads it from the
    WSGI environ) and the app's own log lines. Taken from the trusted proxy's X-Request-Id
    when it sends one, never from any other client."""

    # The proxies whose X-Request-Id is believed (nginx sends its $request_id, so proxy and
    # API lines join): gunicorn's own trusted-proxy list, 127.0.0.1 unless configured.
    proxies = {
        address.strip()
        for address in os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1,::1").split(",")
    }

    @app.before_request
    def _assign() -> None:
        given = request.headers.get("X-Request-Id", "")
        trusted = request.remote_addr in proxies and GIVEN_REQUEST_ID.fullmatch(given)
        request.environ["flowforge.request_id"] = given if trusted else new_request_id()

    @app.after_request
    def _expose(response: Response) -> Response:
        request_id = request.environ.get("flowforge.request_id")
        if request_id:
            response.headers["X-Request-Id"] = request_id
        return response

    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _RequestIdFilter) for f in handler.filters):
            handler.addFilter(_RequestIdFilter())
