"""The `flowforge` operator command.

Remote, the way operators use it: `--api URL` (or FLOWFORGE_API_URL) with the key in
FLOWFORGE_API_KEY runs every read and operator command as one call to the HTTP API, with
the key's scope and read-only rules, and the key named in the history. No database
access is needed.

On the box: `--db`, or no API URL at all, talks to PostgreSQL directly (like bin/migrate),
so an operator can act while the API is down; the history names `cli@<host>`. `apikey`
exists only there: the API has no endpoint that makes keys.

`--output json|table` on every command. Exit codes: 0 done; 1 refused or failed (403,
404, 409, a server or connection failure); 2 a usage error (bad arguments, or the API
said 400/422).
"""

# Adding a command: a handler `name(ops, args)` in the module of its group (apikeys,
# workflows, webhook_secrets, circuits, executions, actions, bulk, schedules) that calls
# one method, present with the same name and answer on `ApiClient` (apiclient.py) and on
# `Database` (direct.py), and prints with `output.emit`; then one `command(...)` line in
# parser.build_parser naming it as "module.name", and its example in parser.EXAMPLES. A
# command with no API endpoint takes `ops.on_the_box(ops, args)` instead. This package
# imports only the parser: `flowforge --help` loads nothing a command does not need.

from flowforge.cli.completion import completion_script
from flowforge.cli.parser import build_parser
from flowforge.cli.run import console, main

__all__ = ["build_parser", "completion_script", "console", "main"]
