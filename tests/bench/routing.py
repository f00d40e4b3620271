"""Webhooks per second through a source with 5 subscriptions vs a plain webhook, in one run.

    .venv/bin/python -m tests.bench.routing [--seconds 10] [--senders 8]

Creates a private, migrated database, starts one bin/api (2 sync workers) on loopback,
publishes 5 workflows and a source `gh` (auth github) whose 5 subscriptions all match a
push, and a workflow `plain` (auth github too, so both pay for one signature check).
Then, for each phase in turn, `--senders` threads post signed deliveries for
`--seconds` seconds and the accepted webhooks per second are printed (a routed webhook
writes 5 executions, a plain one 1). No worker runs: this measures intake only. A figure,
not a test: nothing is asserted. The database is dropped afterwards.
"""

from __future__ import annotations

import json
import uuid

import requests

from tests.bench.intake_alone import api_alone, closed_loop, closed_loop_arguments
from tests.support.webhooks import github_header

SECRET = "bench-routing-secret-0123456789"
PUSH = {"all": [{"path": "headers.x-github-event", "op": "eq", "value": "push"}]}


def definition(name: str) -> dict[str, object]:
    return {
        "name": name,
        "trigger": {"webhook": {"auth": "github"}},
        "steps": [{"id": "keep", "type": "transform", "output": {"ref": "{{ input.ref }}"}}],
    }


def phase(url: str, seconds: float, senders: int) -> tuple[float, int]:
    """Accepted webhooks per second, and how many were refused, over `seconds`."""

    def post(session: requests.Session) -> requests.Response:
        raw = json.dumps({"ref": "refs/heads/main", "n": uuid.uuid4().hex}).encode()
        headers = {
            "Content-Type": "application/json",
            "X-GitHub-Event": "push",
            "X-GitHub-Delivery": str(uuid.uuid4()),
            "X-Hub-Signature-256": github_header(SECRET, raw),
        }
        return session.post(url, data=raw, headers=headers, timeout=30)

    return closed_loop(seconds, senders, post)


def main() -> None:
    """Measure and print; see the module docstring."""
    parser = closed_loop_arguments(__doc__)
    args = parser.parse_args()
    with api_alone() as (session, base):
        names = [f"sub-{i}" for i in range(5)] + ["plain"]
        for name in names:
            r = session.post(f"{base}/api/v1/workflows/{name}/versions", json=definition(name))
            assert r.status_code == 201, r.text
        subs = [{"workflow": n, "filter": PUSH} for n in names[:5]]
        r = session.post(
            f"{base}/api/v1/sources/gh", json={"auth": "github", "subscriptions": subs}
        )
        assert r.status_code == 200, r.text
        for path in ("sources/gh", "workflows/plain"):
            r = session.post(f"{base}/api/v1/{path}/webhook-secrets", json={"value": SECRET})
            assert r.status_code == 201, r.text
        phase(f"{base}/hooks/plain", 1.0, 2)  # warm both caches
        phase(f"{base}/hooks/gh", 1.0, 2)
        plain, plain_refused = phase(f"{base}/hooks/plain", args.seconds, args.senders)
        routed, routed_refused = phase(f"{base}/hooks/gh", args.seconds, args.senders)
    print(
        json.dumps(
            {
                "plain_webhooks_per_s": round(plain, 1),
                "source_5_subscriptions_webhooks_per_s": round(routed, 1),
                "source_executions_per_s": round(routed * 5, 1),
                "ratio": round(routed / plain, 3) if plain else None,
                "refused": {"plain": plain_refused, "source": routed_refused},
                "seconds": args.seconds,
                "senders": args.senders,
            }
        )
    )


if __name__ == "__main__":
    main()
