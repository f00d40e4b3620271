"""Failure groups in process (docs/contract.md#failure-groups): failed executions of one
step with one signature are one group, counted; a resolved group that recurs reopens and
alerts once; an ignored one stays quiet; a group is replayed or retried whole."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.support.definitions import unsigned
from tests.support.inprocess import InProcess

MARK = {"id": "mark", "type": "transform", "output": {"n": "{{ input.n }}"}}
BROKEN = {"id": "shape", "type": "transform", "depends_on": ["mark"], "output": "{{ mark.no.x }}"}
FIXED = {**BROKEN, "output": {"n": "{{ mark.n }}"}}


def _fail(in_process: InProcess, db: psycopg.Connection, n: int) -> list[str]:
    ids = [in_process.start("grouped", {"n": i}) for i in range(n)]
    for eid in ids:
        in_process.wait(eid, "failed")
    return ids


def test_failures_of_one_step_are_one_group(in_process: InProcess, db: psycopg.Connection) -> None:
    in_process.publish("grouped", unsigned([MARK, BROKEN]))
    ids = _fail(in_process, db, 3)
    r = in_process.app.get("/api/v1/failure-groups?workflow=grouped")
    assert r.status_code == 200, r.get_data(as_text=True)
    groups = r.get_json()["groups"]
    assert len(groups) == 1, groups
    print(groups)
