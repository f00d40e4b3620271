"""A source's events routed (docs/contract.md#sources routing): one `/hooks/<source>` delivery
proven current against the cached source, its identity claimed, and every matching
subscription's execution started through intake.accept (or its debounce or batch group),
in one transaction, over the statements of store/sources.py.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import psycopg

from flowforge.cache import BoundedCache, Rechecks
from flowforge.domain import inputschema
from flowforge.domain.model import KeyOrigin, WebhookAuth
from flowforge.errors import Conflict
from flowforge.store import archive
from flowforge.store.db import one
from flowforge.store.sources import (
    CLAIM_DELIVERY,
    DELIVERY_ROUTED,
    DOWNGRADE,
    GET_SOURCE,
    RECORD_ROUTED,
    RECORD_UNMATCHED,
    STILL_CURRENT,
    Source,
    StaleSource,
    Subscription,
    matches,
)
from flowforge.trust import sealing, signatures
from flowforge.usecases import grouping, intake


class Sources:
    """Per-process cache of sources and of their subscribed workflows' targets; every
    entry is re-proven in the routing transaction (STILL_CURRENT, intake's own check)."""

    def __init__(self) -> None:
        self._sources: BoundedCache[tuple[str, str, bytes | None], Source] = BoundedCache(1024)
        self._targets = intake.UnsignedTargets(4096)
        self._rechecks: Rechecks[tuple[str, str, bytes | None]] = Rechecks(
            intake.RECHECK_INTERVAL_S, intake.RECHECK_BURST, 1024
        )

    def forget(self, conn: psycopg.Connection, name: str, key: bytes | None) -> None:
        """Drop a cached source after this process changed its secrets."""
        self._sources.discard((conn.info.dbname, name, key))

    def cached(self, conn: psycopg.Connection, name: str, key: bytes | None) -> Source | None:
        return self._sources.get((conn.info.dbname, name, key))

    def load(self, conn: psycopg.Connection, name: str, key: bytes | None) -> Source | None:
        """Read a source afresh (None when there is none), secrets opened with `key`."""
        row = conn.execute(GET_SOURCE, {"name": name}).fetchone()
        intake.target_read()
        if row is None:
            return None
        source_id, name, auth, subs, revision, _, _, ids, sealed = row
        secrets = tuple(
            (sid, sealing.unseal(key, value, source_id, sid, "source_secrets"))
            for sid, value in zip(ids, sealed, strict=True)
        )
        source = Source(
            source_id,
            name,
            auth,
            revision,
            tuple(Subscription(s["name"], s["workflow"], s["filter"]) for s in subs),
            secrets,
        )
        self._sources.put((conn.info.dbname, name, key), source)
        return source

    def recheck(self, conn: psycopg.Connection, source: Source, key: bytes | None) -> Source | None:
        """A fresh copy after a signature the cached secrets did not verify, or None when
        the source's re-reads are used up for now (intake.RECHECK_BURST)."""
        if not self._rechecks.allow((conn.info.dbname, source.name, key)):
            return None
        return self.load(conn, source.name, key)

    def target(self, conn: psycopg.Connection, workflow: str, *, fresh: bool) -> intake.Target:
        """A subscribed workflow's target, its secrets left sealed: the source's signature
        is what was verified, so the cache of unsigned targets serves (intake.UnsignedTargets)."""
        return self._targets.get(conn, workflow, fresh)


# This process's cache of sources (the webhook intake reads it; saving a source or its
# secrets forgets its entry after the commit).
SOURCES = Sources()


@dataclass(frozen=True)
class Routed:
    subscription: str
    workflow: str
    accepted: intake.Accepted


def route(
    conn: psycopg.Connection,
    cache: Sources,
    source: Source,
    raw: bytes,
    body: Any,
    headers: dict[str, str],
    identity: str | None,
    secret_id: int | None,
    *,
    fresh: bool,
) -> list[Routed]:
    """Start one execution per matching subscription, all in one transaction, or record
    the event as unmatched. Raises StaleSource when a cached part is out of date."""
    context = {"input": body, "headers": headers}
    chosen = [sub for sub in source.subscriptions if matches(sub.filter, context)]
    targets = [cache.target(conn, sub.workflow, fresh=fresh) for sub in chosen]
    if source.auth == WebhookAuth.NONE:
        for sub, target in zip(chosen, targets, strict=True):
            if target.webhook_auth != WebhookAuth.NONE:
                # Published signed after the source was saved: still not startable unsigned.
                raise signatures.SignatureInvalid(f"{sub.workflow!r}: {DOWNGRADE}")
    key = None if identity is None else f"source:{source.name}:{identity}"
    delivery = {
        "source_id": source.id,
        "identity": identity,
        "body_sha256": hashlib.sha256(raw).digest(),
    }
    routed = []
    try:
        with conn.transaction():
            params = {"id": source.id, "revision": source.revision, "secret_id": secret_id}
            if conn.execute(STILL_CURRENT, params).fetchone() is None:
                raise StaleSource(source.name)
            if identity is not None and conn.execute(CLAIM_DELIVERY, delivery).fetchone() is None:
                return _routed_before(conn, delivery)
            # After the claim: a redelivery answers its first routing even where this one
            # would match a subscriber whose schema refuses the body (422, nothing kept).
            for target in targets:
                if target.input_checker is not None:
                    try:
                        inputschema.check(target.input_checker, body)
                    except (inputschema.InputInvalid, inputschema.InputTooLarge):
                        if fresh:
                            raise
                        # A cached schema may be an older version's (only the publishing
                        # process forgets it): look again before refusing.
                        raise StaleSource(source.name) from None
            if not chosen:
                conn.execute(
                    RECORD_UNMATCHED,
                    {"source_id": source.id, "identity": identity, "input": raw.decode()},
                )
            for sub, target in zip(chosen, targets, strict=True):
                if grouping.is_grouped(target.definition):
                    accepted = grouping.record(conn, target, raw, key, None, KeyOrigin.SYSTEM)
                else:
                    accepted = intake.accept(
                        conn,
                        target,
                        raw,
                        key,
                        None,
                        headers=headers,
                        via=archive.Via(source.id, source.auth, secret_id),
                        origin=KeyOrigin.SYSTEM,
                    )
                routed.append(Routed(sub.name, sub.workflow, accepted))
            if identity is not None and routed:
                record = [
                    {"subscription": r.subscription, "workflow": r.workflow,
                     "execution_id": r.accepted.execution_id,
                     "grouped": r.accepted.group is not None}
                    for r in routed
                ]  # fmt: skip
                conn.execute(RECORD_ROUTED, {**delivery, "routed": json.dumps(record)})
    except intake.StaleTarget:
        raise StaleSource(source.name) from None
    return routed


def record_handshake(
    conn: psycopg.Connection, source: Source, raw: bytes, identity: str | None
) -> None:
    """A signed handshake (GitHub's ping) starts nothing, and its identity is the source's
    like any delivery's: resent with another (unsigned) event header it answers the
    routing it got, none."""
    if identity is not None:
        delivery = {
            "source_id": source.id,
            "identity": identity,
            "body_sha256": hashlib.sha256(raw).digest(),
        }
        conn.execute(CLAIM_DELIVERY, delivery)


def _routed_before(conn: psycopg.Connection, delivery: dict[str, Any]) -> list[Routed]:
    """A known delivery: the routing it got, each execution replayed (a debounced or
    batched one with its group as it stands now); another body under its identity is a
    conflict (409), as for any idempotency key."""
    row = one(conn.execute(DELIVERY_ROUTED, delivery))
    if row[0] != delivery["body_sha256"]:
        raise Conflict("this delivery id was already used with a different body")
    return [
        Routed(
            r["subscription"],
            r["workflow"],
            intake.Accepted(
                r["execution_id"],
                replayed=True,
                group=grouping.group_of(conn, r["execution_id"]) if r["grouped"] else None,
            ),
        )
        for r in row[1]
    ]
