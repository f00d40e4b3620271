"""docs/prometheus/alerts.yml names only metrics FlowForge exports: an alert on a series
that does not exist never fires, and nothing says so."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import REGISTRY

from flowforge.store import gauges

RULES = Path(__file__).resolve().parents[2] / "docs" / "prometheus" / "alerts.yml"
SUFFIXES = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"], "gauge": [""]}


def exported() -> set[str]:
    """Every sample name flowforge.observe.metrics can export, labelled series without children
    yet included."""
    names = set(gauges.DATABASE_GAUGES)
    for family in REGISTRY.collect():
        if family.name.startswith("flowforge_"):
            names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names


def expressions(text: str) -> list[str]:
    """The `expr:` of each rule, a one-line value or an indented block after `expr: |`."""
    found: list[str] = []
    lines = text.splitlines()
    for index, line in enumerate(lines):
        match = re.match(r"^(\s*)expr:\s*(.*)$", line)
        if not match:
            continue
        indent, value = len(match.group(1)), match.group(2).strip()
        if value not in ("|", ">"):
            found.append(value)
            continue
        block = []
        for following in lines[index + 1 :]:
            if following.strip() and len(following) - len(following.lstrip()) <= indent:
                break
            block.append(following.strip())
        found.append(" ".join(block))
    return found


def test_every_metric_an_alert_uses_is_exported() -> None:
    rules = expressions(RULES.read_text())
    assert len(rules) >= 6
    used = {name for expr in rules for name in re.findall(r"\bflowforge_\w+", expr)}
    assert used, rules
    assert used <= exported(), sorted(used - exported())


def test_the_rules_cover_what_the_issue_asks_for() -> None:
    text = " ".join(expressions(RULES.read_text()))
    for name in (
        "flowforge_oldest_ready_step_seconds",
        "flowforge_timer_lag_seconds_bucket",
        "flowforge_executions_needing_attention",
        "flowforge_dead_lettered_total",
        "flowforge_worker_heartbeat_timestamp_seconds",
        "flowforge_outbox_oldest_seconds",
        "up{",
    ):
        assert name in text, name
