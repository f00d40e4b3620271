"""A real bin/worker given FLOWFORGE_FAULTS without FLOWFORGE_TEST_MODE=1 refuses to start,
saying why, instead of running with a kill switch armed."""

from __future__ import annotations

import subprocess

from tests.support.processes import WORKER


def test_worker_with_faults_outside_test_mode_exits_at_start(env: dict[str, str]) -> None:
    production = {k: v for k, v in env.items() if k != "FLOWFORGE_TEST_MODE"}
    production["FLOWFORGE_FAULTS"] = "before_ack=kill"
    done = subprocess.run(
        WORKER,
        env=production,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "FLOWFORGE_TEST_MODE" in output
    assert '"consuming"' not in output
