"""The pure engine stays pure: importing it loads no database, HTTP or broker client."""

from __future__ import annotations

import json
import subprocess
import sys

IO_MODULES = ("psycopg", "psycopg_pool", "urllib3", "requests", "pika")


def test_engine_imports_no_io_library() -> None:
    script = (
        "import json, sys\n"
        "import flowforge.domain.engine, flowforge.domain.model, flowforge.domain.jsonvalues\n"
        f"print(json.dumps(sorted(m for m in {IO_MODULES!r} if m in sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout) == []
