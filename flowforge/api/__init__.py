"""The Flask application factory served by gunicorn (see bin/api)."""

from __future__ import annotations

import atexit

from flask import Flask

from flowforge.api import executions, health, hooks, openapi, problems, workflows
from flowforge.api.ratelimit import RateLimiter
from flowforge.config import Settings
from flowforge.db import create_pool
from flowforge.logs import configure_logging


def create_app(settings: Settings | None = None) -> Flask:
    """Build the app; the pool is opened here, in each worker process, never at import."""
    settings = settings or Settings.from_env()
    configure_logging()
    app = Flask("flowforge")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.json.sort_keys = False  # type: ignore[attr-defined]
    pool = create_pool(
        settings.database_url,
        max_size=settings.db_pool_size,
        name="api",
        timeout_s=settings.db_timeout_seconds,
    )
    # Do not wait for the database: the API must start (and answer 503) while it is down.
    pool.open(wait=False)
    atexit.register(pool.close)
    app.extensions["flowforge.pool"] = pool
    app.extensions["flowforge.settings"] = settings
    if settings.webhook_rate > 0:
        rate = settings.webhook_rate
        app.extensions["flowforge.webhook_limit"] = RateLimiter(rate, burst=max(1.0, rate))
    problems.install(app)
    for blueprint in (hooks.bp, workflows.bp, executions.bp, health.bp, openapi.bp):
        app.register_blueprint(blueprint)
    return app
