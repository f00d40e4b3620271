"""Webhooks per second into a debounced and a batched workflow vs a plain one, in one run.

    .venv/bin/python -m tests.bench.debounce [--seconds 10] [--senders 8] [--keys 100]

Creates a private, migrated database, starts one bin/api (2 sync workers) on loopback and
publishes three workflows behind unsigned webhooks: `plain`, `debounced` (debounce keyed
by `input.customer`, a 60 s window: every event updates its key's open group) and
`batched` (batch of 100, a 60 s window: a group closes every 100 events). Each event
carries an Idempotency-Key and one of `--keys` customers. For each phase in turn,
`--senders` threads post for `--seconds` seconds and the accepted webhooks per second are
printed. No worker runs: this measures intake only (a plain webhook writes an execution,
a grouped one an event row and its group's update). A figure, not a test: nothing is
asserted. The database is dropped afterwards.
"""

from __future__ import annotations

import json
import random
import uuid
from typing import Any

import requests

from tests.bench.intake_alone import api_alone, closed_loop, closed_loop_arguments

STEPS = [{"id": "keep", "type": "transform", "output": {"c": "{{ input.customer }}"}}]


def definition(name: str, webhook: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "trigger": {"webhook": {"auth": "none", **webhook}}, "steps": STEPS}


WORKFLOWS = {
    "plain": definition("plain", {}),
    "debounced": definition(
        "debounced", {"debounce": {"key": "{{ input.customer }}", "window_s": 60}}
    ),
    "batched": definition("batched", {"batch": {"max_items": 100, "window_s": 60}}),
}


def phase(url: str, seconds: float, senders: int, keys: int) -> tuple[float, int]:
    """Accepted webhooks per second, and how many were refused, over `seconds`."""

    def post(session: requests.Session) -> requests.Response:
        body = {"customer": f"c{random.randrange(keys)}", "n": uuid.uuid4().hex}
        headers = {"Idempotency-Key": str(uuid.uuid4())}
        return session.post(url, json=body, headers=headers, timeout=30)

    return closed_loop(seconds, senders, post)


def main() -> None:
    """Measure and print; see the module docstring."""
    parser = closed_loop_arguments(__doc__)
    parser.add_argument("--keys", type=int, default=100)
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    with api_alone() as (session, base):
        for name, document in WORKFLOWS.items():
            r = session.post(f"{base}/api/v1/workflows/{name}/versions", json=document)
            assert r.status_code == 201, r.text
        for name in WORKFLOWS:  # warm every cache
            phase(f"{base}/hooks/{name}", 1.0, 2, args.keys)
        for name in WORKFLOWS:
            rate, refused = phase(f"{base}/hooks/{name}", args.seconds, args.senders, args.keys)
            figures[f"{name}_webhooks_per_s"] = round(rate, 1)
            figures[f"{name}_refused"] = refused
    plain = figures["plain_webhooks_per_s"]
    for name in ("debounced", "batched"):
        rate = figures[f"{name}_webhooks_per_s"]
        figures[f"{name}_ratio"] = round(rate / plain, 3) if plain else None
    print(
        json.dumps({**figures, "seconds": args.seconds, "senders": args.senders, "keys": args.keys})
    )


if __name__ == "__main__":
    main()
