"""One log line per broker reconnect: pika's own ERRORs and tracebacks about a failed
connection are not written; FlowForge's loop reports the attempt itself, once."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import logging
from flowforge.logs import configure_logging
from flowforge.worker.loop import report
from flowforge.errors import BrokerUnavailable
configure_logging()
try:
    raise ConnectionRefusedError(111, "Connection refused")
except OSError:
    for name in ("pika.adapters.utils.connection_workflow", "pika.adapters.blocking_connection"):
        logging.getLogger(name).exception("Connection workflow failed")
lost = "broker connection lost; %(name)s will reconnect"
report("consumer", BrokerUnavailable("connection refused"), 1, lost)
"""


def test_a_failed_reconnect_is_one_line_not_pikas_tracebacks() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert "broker connection lost; consumer will reconnect" in lines[0]
