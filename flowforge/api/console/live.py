"""Live progress in the console (docs/contract.md#live-progress): the execution page's long
poll for its next change, and the list's count of what changed since it was loaded.

bin/api's gunicorn workers are sync: a request holds its whole process until it answers,
so a long poll (like a server-sent-events stream) holds a worker. How many may wait at
once is therefore bounded across the workers of one bin/api (FLOWFORGE_LIVE_WAITS), by
slots that are files locked with flock(2) in the server's private directory: the kernel
releases a slot when its holder answers or dies (a worker killed by gunicorn's timeout
holds nothing). Beyond the bound a poll is answered at once, with `Retry-After`, and the
page asks again that much later: slower, never wrong.

A wait reads the change version every CHECK_S on a pooled connection, given back while
it sleeps (timeline.CHANGE_VERSION: three index lookups). LISTEN would wake it sooner but
needs every change to NOTIFY: a cost on every execution of every workflow, watched or
not. A wait ends LONGEST_WAIT_S after its request began at most, so that even a last read
on a stalled database answers inside the 15 s after which gunicorn kills a silent worker
(serve.DEFAULTS).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from flask import Response, current_app, g, jsonify, request

from flowforge.api.auth import requires
from flowforge.api.console import forms
from flowforge.api.console.session import require, signed_in
from flowforge.api.console.site import bp
from flowforge.api.pool import connection, release_early
from flowforge.domain.model import TERMINAL_EXECUTION
from flowforge.domain.roles import Access
from flowforge.errors import NotFound
from flowforge.launcher import METRICS_DIR_ENV
from flowforge.store import search, timeline

# gunicorn's worker timeout (serve.DEFAULTS), and the longest one read of the version can
# take on a stalled database: the API's statement bound plus the margin its reply is
# awaited beyond it (api.API_DB_TIMEOUT_S + db.REPLY_MARGIN_S; test_live_slots holds both).
WORKER_TIMEOUT_S = 15.0
SLOWEST_READ_S = 10.0
# The longest a poll waits for a change, counted from the request's start (a client may ask
# less with `wait`): a read begun at its very end still answers inside the worker timeout.
LONGEST_WAIT_S = WORKER_TIMEOUT_S - SLOWEST_READ_S
# How often a waiting poll reads the version.
CHECK_S = 0.5
# What a poll beyond FLOWFORGE_LIVE_WAITS is told: ask again no sooner than this. The
# cost of open pages is nearly all these at-once answers, pages / RETRY_AFTER_S a second
# (bin/bench --phase live: 500 pages cost bin/api 7.7-9.2 % of a CPU at 15 s; 20 s keeps
# them clear of the 10 % target on a busy host).
RETRY_AFTER_S = 20
# The list's "N changed" stops counting here ("100+").
CHANGED_CAP = 100
VERSION = re.compile(r"\d{1,19}\.-?\d{1,19}")
# The slot files' directory, in bin/api's private one.
SLOTS_DIR = "live-waits"


class Slots:
    """At most one holder per slot file among every process that opens the directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.size = len(list(directory.glob("slot-*")))

    @classmethod
    def prepare(cls, directory: Path, size: int) -> Slots:
        """Make `size` slot files in a new directory (bin/api's master, before it forks)."""
        directory.mkdir(parents=True, exist_ok=True)
        for n in range(size):
            (directory / f"slot-{n}").touch()
        return cls(directory)

    @contextlib.contextmanager
    def taken(self) -> Iterator[bool]:
        """Yields whether a slot was free (and is held until the block ends)."""
        held: IO[bytes] | None = None
        for n in range(self.size):
            handle = open(self.directory / f"slot-{n}", "ab")  # noqa: SIM115 - held below
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            held = handle
            break
        try:
            yield held is not None
        finally:
            if held is not None:
                held.close()  # closing the descriptor releases the lock


def server_slots(private_dir: str, live_waits: int, workers: int) -> int:
    """bin/api's master: the slots all its workers share, in its private directory
    (launcher.private_metrics_dir); at most workers - 1, so one worker is always free for
    webhooks and the API. Returns how many."""
    size = max(0, min(live_waits, workers - 1))
    Slots.prepare(Path(private_dir) / SLOTS_DIR, size)
    return size


def wait_slots() -> Slots:
    """This server's slots: those bin/api's master made; an app without them (in-process)
    makes its own, FLOWFORGE_LIVE_WAITS of them."""
    found = current_app.extensions.get("flowforge.live_slots")
    if found is None:
        shared = os.environ.get(METRICS_DIR_ENV)
        if shared and (Path(shared) / SLOTS_DIR).is_dir():
            found = Slots(Path(shared) / SLOTS_DIR)
        else:
            size = current_app.extensions["flowforge.settings"].live_waits
            own = Path(tempfile.mkdtemp(prefix="flowforge-live-")) / SLOTS_DIR
            found = Slots.prepare(own, size)
        current_app.extensions["flowforge.live_slots"] = found
    return found


def _version_now(execution_id: str) -> timeline.ChangeVersion:
    with connection() as conn:
        found = timeline.change_version(conn, execution_id)
    if found is None:
        raise NotFound(f"execution {execution_id} does not exist")
    return found


def _answer(now: timeline.ChangeVersion, since: str | None, retry: bool) -> Response:
    response = jsonify(
        version=now.version,
        changed=now.version != since,
        status=now.status,
        live=now.status not in TERMINAL_EXECUTION,
    )
    if retry:
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


def _wait_s() -> float:
    raw = request.args.get("wait")
    if raw is None:
        return LONGEST_WAIT_S
    try:
        wait = float(raw)
    except ValueError:
        raise forms.bad("wait", "seconds, a number") from None
    if not 0 <= wait <= LONGEST_WAIT_S:
        raise forms.bad("wait", f"from 0 to {LONGEST_WAIT_S:g} seconds")
    return wait


@bp.get("/executions/<execution_id:execution_id>/changes")
@signed_in
@requires(Access.READ)
def execution_changes(execution_id: str) -> Response:
    """`?since=<version>[&wait=<s>]`: the execution's version, at once when it is not
    `since` (or the execution is over), else when it moves, or after `wait` seconds
    unchanged; at once with Retry-After when FLOWFORGE_LIVE_WAITS polls already wait."""
    started = time.monotonic()
    since = request.args.get("since") or None  # none yet: answered at once
    if since is not None and not VERSION.fullmatch(since):
        raise forms.bad("since", "a version this page was given")
    wait = _wait_s()
    now = _version_now(execution_id)
    require(now.workflow, write=False)
    if now.version != since or now.status in TERMINAL_EXECUTION or wait == 0:
        return _answer(now, since, retry=False)
    with wait_slots().taken() as waiting:
        if not waiting:
            return _answer(now, since, retry=True)
        deadline = started + wait
        while now.version == since and time.monotonic() < deadline:
            release_early()  # no connection held while asleep (a threaded server's pool)
            time.sleep(min(CHECK_S, max(0.0, deadline - time.monotonic())))
            now = _version_now(execution_id)
    return _answer(now, since, retry=False)


@bp.get("/executions/changed")
@signed_in
@requires(Access.READ)
def executions_changed() -> Response:
    """`?since=<ISO 8601>` and the list's own filter: how many of its executions changed
    after `since` (the page's load time), counting to CHANGED_CAP."""
    raw = request.args.get("since", "")
    try:
        since = datetime.fromisoformat(raw)
    except ValueError:
        raise forms.bad("since", "the page's load time, ISO 8601") from None
    if since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    with connection() as conn:
        query = forms.parse_query(conn, request.args, g.api_key)
        with search.bounded(conn):
            n, capped = search.changed_since(conn, query.filter, since, CHANGED_CAP)
    return jsonify(changed=n, capped=capped)
