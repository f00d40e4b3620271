"""One definition of "needs an operator", used by the API's and the CLI's
`status=needs_attention` filter, the console's chip and filter, the
`flowforge_executions_needing_attention` gauge and the FlowForgeNeedsAttention alert.

An execution needs an operator when at least one of its steps is `unknown` — whatever
the execution's own status: a cancelled execution can keep an unknown step, and nobody
but an operator can settle it — or when it is in status `needs_attention` (which, while
the invariants hold, implies such a step). Each part is read through a partial or status
index (steps_unknown, executions_by_status), so no query here scans a table.
"""

from __future__ import annotations

# The ids of every execution that needs an operator.
NEEDING_OPERATOR = """
SELECT execution_id FROM steps WHERE status = 'unknown'
UNION
SELECT id FROM executions WHERE status = 'needs_attention'
"""
COUNT_NEEDING_OPERATOR = f"SELECT count(*) FROM ({NEEDING_OPERATOR}) needing"
# Those not in status needs_attention (a cancelled execution with an unknown step, say):
# what a filter by that status alone would miss.
BEYOND_THE_STATUS = """
SELECT DISTINCT s.execution_id FROM steps s JOIN executions e ON e.id = s.execution_id
WHERE s.status = 'unknown' AND e.status <> 'needs_attention'
"""
