"""The bare-Flask limit: a webhook endpoint that does only the transaction.

Same framework, same server settings and the same two inserts FlowForge's intake must
at least make (an execution row and its outbox row, committed together), with nothing
else: no idempotency row, no steps, no history, no validation, no pool health check.
What FlowForge's /hooks/{key} adds on top of this is the price of its guarantees.
"""

from __future__ import annotations

import atexit
import os
import uuid

import psycopg_pool
from flask import Flask, jsonify, request
from psycopg.types.json import Jsonb

INSERT_EXECUTION = """
INSERT INTO executions (id, workflow_id, version_id, status, input, idempotency_key)
VALUES (%(id)s, %(workflow_id)s, %(version_id)s, 'queued', %(input)s, %(key)s)
"""
INSERT_OUTBOX = "INSERT INTO outbox (execution_id, step_id) VALUES (%(id)s, 'a')"


def create_app() -> Flask:
    """The WSGI factory gunicorn loads, exactly as it loads flowforge.api:create_app()."""
    app = Flask("bare")
    pool = psycopg_pool.ConnectionPool(
        os.environ["FLOWFORGE_DATABASE_URL"],
        min_size=1,
        max_size=int(os.environ.get("FLOWFORGE_DB_POOL_SIZE", "4")),
        kwargs={"autocommit": True},
        open=False,
    )
    pool.open(wait=False)
    atexit.register(pool.close)
    workflow_id = int(os.environ["BENCH_WORKFLOW_ID"])
    version_id = int(os.environ["BENCH_VERSION_ID"])

    @app.post("/hooks/<key>")
    def receive(key: str) -> tuple[object, int]:
        payload = request.get_json()
        execution_id = uuid.uuid4()
        params = {
            "id": execution_id,
            "workflow_id": workflow_id,
            "version_id": version_id,
            "input": Jsonb(payload),
            "key": request.headers.get("Idempotency-Key"),
        }
        with pool.connection() as conn, conn.transaction():
            conn.execute(INSERT_EXECUTION, params)
            conn.execute(INSERT_OUTBOX, params)
        return jsonify({"execution_id": str(execution_id), "status": "queued"}), 202

    return app
