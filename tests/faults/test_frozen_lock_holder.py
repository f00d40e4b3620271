"""Issue 23 items 1 and 2: a worker frozen inside a unit of work stops nobody else.

Worker A reaches its checkpoint — the execution row is locked — and is frozen there
(SIGSTOP, as a VM pause would). Its step's lease runs out. Meanwhile worker B sends an
unsafe POST and is SIGKILLed. Worker C's reaper must still recover B's step within a few
seconds: the frozen execution is skipped (SKIP LOCKED) instead of being waited for until
the statement timeout, which used to abort every recovery pass for as long as A stayed
frozen. And the frozen session itself ends: the unit of work's reads end with a Sync, so
the server sees it `idle in transaction` and its timeout frees the lock, after which the
frozen execution is settled too. The timer scanner also keeps its times: the frozen
execution's deadline passes while it is locked, and the deadline pass skips it instead
of waiting out the statement timeout on every pass, so another execution's delay still
ends on time. An operator's cancel of the frozen execution is answered 202 at once
(recorded, applied when the lock is free), not 503 after the statement timeout.
"""

from __future__ import annotations

import signal
import time

import psycopg

from tests.faults.helpers import StartWorker, http, scalar, wait_logged, workflow
from tests.support.api import Api, step
from tests.support.processes import wait_for
from tests.support.target import Reply, Target

# The server-side timeouts of the worker's sessions (statement, idle in transaction).
DB_TIMEOUT_S = "4"
# Lease 2 s, reaper pass every 2 s (conftest): recovery takes a few seconds. Bounded far
# below the old behaviour (never, while A stays frozen), generous for a busy machine.
RECOVERY_BOUND_S = 12.0
DELAY_S = 3
# The frozen worker's server-side timeouts: its session (and lock) lives this long.
FROZEN_TIMEOUT_S = "10"
# The API's statement timeout is 15 s: a cancel that waited on the lock took that long.
CANCEL_BOUND_S = 5.0


def test_a_frozen_lock_holder_does_not_stop_recovery_of_the_others(
    client: Api, db: psycopg.Connection, workers: StartWorker, target: Target
) -> None:
    client.publish(
        "frozen", {**workflow(http("get", "GET", f"{target.url}/frozen")), "deadline_s": 4}
    )
    client.publish(
        "delayed",
        workflow(
            {"id": "pause", "type": "delay", "duration_s": DELAY_S},
            {"id": "after", "type": "transform", "depends_on": ["pause"], "output": {}},
        ),
    )
    client.publish("crashed", workflow(http("post", "POST", f"{target.url}/crashed", json={})))
    common = {"FLOWFORGE_DB_TIMEOUT_SECONDS": DB_TIMEOUT_S, "FLOWFORGE_WORKER_CONCURRENCY": "1"}

    # A's own sessions outlive the API's cancel attempts, so the cancel finds the lock held.
    a = workers(
        FLOWFORGE_FAULTS="inside_checkpoint=sleep:600",
        **{**common, "FLOWFORGE_DB_TIMEOUT_SECONDS": FROZEN_TIMEOUT_S},
    )
    frozen = client.start("frozen", {})
    wait_logged(a, "fault point reached")
    a.signal(signal.SIGSTOP)
    try:
        asked_at = time.monotonic()
        answer = client.post(f"/api/v1/executions/{frozen}/cancel")
        cancel_s = time.monotonic() - asked_at
        assert answer.status_code == 202, answer.text
        assert cancel_s < CANCEL_BOUND_S, f"cancel answered after {cancel_s:.1f} s"
        assert scalar(db, "SELECT count(*) FROM pending_cancels") == 1  # applied later

        b = workers(FLOWFORGE_FAULTS="after_http_response=kill", **common)
        crashed = client.start("crashed", {})
        wait_for(lambda: b.popen.poll() is not None, timeout=30, message="B killed after POST")
        killed_at = time.monotonic()
        c = workers(**common)
        delayed_at = time.monotonic()
        delayed = client.start("delayed", {})

        done = client.wait(crashed, timeout=60)
        recovered_s = time.monotonic() - killed_at
        assert done["status"] == "needs_attention", done
        assert step(done, "post")["status"] == "unknown"
        assert recovered_s < RECOVERY_BOUND_S, f"recovered after {recovered_s:.1f} s"

        assert client.wait(delayed, timeout=60)["status"] == "succeeded"
        delayed_s = time.monotonic() - delayed_at
        assert delayed_s < DELAY_S + RECOVERY_BOUND_S, f"a {DELAY_S} s delay took {delayed_s}"

        # A is still frozen; its session was ended by the server, so its execution is
        # settled too: cancelled, or failed when its deadline was applied first.
        assert client.wait(frozen, timeout=60)["status"] in {"cancelled", "failed"}
        assert scalar(db, "SELECT count(*) FROM pending_cancels") == 0
        assert a.popen.poll() is None
    finally:
        a.kill()  # still asleep inside its checkpoint: a drain would wait for it
    assert len(target.requests_to("/frozen")) == 1
    requests_succeeded = (
        "SELECT count(*) FROM attempts WHERE step_id IN ('get', 'post') AND outcome = 'succeeded'"
    )
    assert scalar(db, requests_succeeded) == 0
    print(
        f"B's POST recovered {recovered_s:.1f} s after its worker was killed (worker C "
        f"{c.pid}); a {DELAY_S} s delay took {delayed_s:.1f} s and a cancel of the frozen "
        f"execution was answered in {cancel_s:.1f} s while A stayed frozen"
    )


def test_cancel_oldest_never_answers_5xx_when_the_oldest_is_locked(
    client: Api, db: psycopg.Connection, workers: StartWorker, target: Target
) -> None:
    """Issue 23 item 3: the intake commits the new execution, then stops the oldest holder;
    that stop waited on the frozen holder's lock and answered 503 for an accepted event.
    Now the webhook is 202 at once and the reconciler stops the surplus holder later."""
    client.publish(
        "latest",
        {
            **workflow(http("get", "GET", f"{target.url}/latest/{{{{ input.n }}}}")),
            "concurrency": {"limit": 1, "key": "{{ input.k }}", "on_full": "cancel_oldest"},
        },
    )
    # The newest one's request outlasts the frozen session: when the lock frees, the
    # oldest is a surplus holder, and it must be stopped rather than run again.
    target.script = lambda r: Reply(json={}, delay_s=15.0 if r.path.endswith("/2") else 0.0)
    common = {"FLOWFORGE_DB_TIMEOUT_SECONDS": DB_TIMEOUT_S, "FLOWFORGE_WORKER_CONCURRENCY": "1"}
    a = workers(
        FLOWFORGE_FAULTS="inside_checkpoint=sleep:600",
        **{**common, "FLOWFORGE_DB_TIMEOUT_SECONDS": FROZEN_TIMEOUT_S},
    )
    oldest = client.start("latest", {"k": "x", "n": 1})
    wait_logged(a, "fault point reached")
    a.signal(signal.SIGSTOP)
    try:
        asked_at = time.monotonic()
        answer = client.hook("latest", {"k": "x", "n": 2})
        answer_s = time.monotonic() - asked_at
        assert answer.status_code == 202, answer.text
        assert answer_s < CANCEL_BOUND_S, f"answered after {answer_s:.1f} s"
        newest = answer.json()["execution_id"]
        workers(**common)
        # Once the frozen session is gone, the reconciler stops the surplus holder.
        stopped = client.wait(oldest, timeout=60)
        assert stopped["status"] == "cancelled", stopped
        assert client.wait(newest, timeout=60)["status"] == "succeeded"
        assert a.popen.poll() is None
    finally:
        a.kill()  # still asleep inside its checkpoint: a drain would wait for it
    assert scalar(db, "SELECT count(*) FROM executions") == 2
    assert len(target.requests_to("/latest/1")) == 1
    print(f"the replacing webhook was answered 202 in {answer_s:.1f} s")
