"""The statements of the `resumes` table (docs/contract.md#wait): a resume kept for its wait
step, applied when the step takes it, dropped when a retry opens a new round. The tokens
that name a wait step are trust/resume_tokens.py's.

`python -m flowforge.store.waits` prints a new FLOWFORGE_RESUME_KEY.
"""

from __future__ import annotations

import sys

from flowforge.trust import sealing

# Resumes kept per wait step: the first body wins and makes the step's idempotency;
# `applied_at` is set when the step took it (at once, or when it became ready later).
FIND_RESUME = """
SELECT body_sha256, applied_at IS NOT NULL AS applied FROM resumes
WHERE execution_id = %(execution_id)s AND step_id = %(step_id)s
"""
INSERT_RESUME = """
INSERT INTO resumes (execution_id, step_id, body_sha256, body, applied_at)
VALUES (%(execution_id)s, %(step_id)s, %(body_sha256)s, %(body)s::jsonb,
        CASE WHEN %(applied)s THEN now() END)
"""
# Resumes that arrived before their step was ready; read under the execution row lock.
PENDING_RESUMES = """
SELECT step_id, body FROM resumes WHERE execution_id = %(id)s AND applied_at IS NULL
"""
# The resumes a unit of work applied, as a part of runs.SAVE_RUN (a JSON array of step ids).
APPLY_RESUMES = """
UPDATE resumes r SET applied_at = now()
FROM jsonb_array_elements_text(%(applied_resumes)s) AS a(step_id)
WHERE r.execution_id = %(execution_id)s AND r.step_id = a.step_id AND r.applied_at IS NULL
"""
# On a retry: resumes kept for waits of the last round that never began are dropped, so
# the new round opens empty (under its new URL).
DROP_KEPT_RESUMES = """
DELETE FROM resumes
WHERE execution_id = %(execution_id)s AND step_id = ANY(%(step_ids)s) AND applied_at IS NULL
"""
# The workflow's active signing secrets, for wait steps with "auth": "signature".
SIGNING_SECRETS = """
SELECT s.id, s.workflow_id, s.sealed FROM webhook_secrets s
JOIN executions e ON e.workflow_id = s.workflow_id
WHERE e.id = %(execution_id)s AND s.revoked_at IS NULL AND s.sealed IS NOT NULL
ORDER BY s.id
"""


if __name__ == "__main__":
    # python -m flowforge.store.waits: print a new key for FLOWFORGE_RESUME_KEY.
    print(sealing.new_key())
    sys.exit(0)
