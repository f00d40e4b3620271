"""`flowforge apply DIR`: make the published workflows what a folder of definitions says
(docs/howto/authoring-loop.md), as a CI job does it.

Each `*.json` file directly in DIR is one workflow, keyed by its file name. Every file is
read and checked by the publish checker first, here and then by the dry-run publish of the
side it goes to (POST /api/v1/workflows/KEY/check: secret bindings, the key's rights); one
refused file refuses the whole folder before anything is published. Then each is compared
with its workflow's newest version (flowforge/domain/defdiff.py), and only the new and
changed ones are published, each as a new version. Workflows published but absent from
the folder are reported, never archived. A second run over the same folder publishes
nothing. Secrets stay names (`{{ secrets.NAME }}`): a definition never carries a value, so
neither does apply.

Exit status: 0 in step (or, without --dry-run, brought in step); 1 refused or failed; 2 a
file is not valid; 3 with --dry-run, something would be published (drift).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowforge.cli.arguments import UsageError
from flowforge.cli.ops import Ops
from flowforge.cli.output import emit
from flowforge.domain import defdiff
from flowforge.domain.definitions import DefinitionInvalid, parse_definition
from flowforge.domain.model import WORKFLOW_KEY
from flowforge.errors import FlowForgeError

DRIFT = 3


@dataclass
class Plan:
    """What apply found: per workflow key, what it does."""

    new: list[str] = field(default_factory=list)
    changed: dict[str, tuple[int, list[str]]] = field(default_factory=dict)  # key -> (v, diff)
    unchanged: list[str] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)
    published: dict[str, int] = field(default_factory=dict)  # key -> version made

    @property
    def drift(self) -> bool:
        return bool(self.new or self.changed)


def read_folder(folder: Path) -> dict[str, Any]:
    """Every definition in the folder by key, each checked; DefinitionInvalid naming every
    problem of every file (path `file.json: $.steps[0]...`) when any is not valid."""
    if not folder.is_dir():
        raise UsageError(f"{folder} is not a folder")
    documents: dict[str, Any] = {}
    problems: list[dict[str, str]] = []
    for path in sorted(folder.glob("*.json")):
        key = path.stem.replace(".", "-").lower()
        if not WORKFLOW_KEY.fullmatch(key):
            problems.append({"path": path.name, "message": f"{key!r} is not a workflow key"})
            continue
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
            parse_definition(document)
        except (OSError, ValueError) as exc:
            problems.append({"path": path.name, "message": f"not a JSON file: {exc}"})
            continue
        except DefinitionInvalid as exc:
            problems.extend(
                {"path": f"{path.name}: {e['path']}", "message": e["message"]} for e in exc.errors
            )
            continue
        documents[key] = document
    if problems:
        raise DefinitionInvalid(problems)
    if not documents:
        raise UsageError(f"{folder} holds no definition (*.json)")
    return documents


def check_on_the_server(ops: Ops, documents: dict[str, Any]) -> None:
    """Every definition through the publish checks of the side it goes to (the dry-run
    publish: secret bindings, the key's rights), before any is published; DefinitionInvalid
    naming every refusal. A side that cannot be reached is no refusal: it is raised."""
    problems: list[dict[str, str]] = []
    for key, document in documents.items():
        try:
            ops.check_draft(key, document)
        except FlowForgeError as exc:
            status = getattr(exc, "status", 0)
            if not 400 <= status < 500:
                raise
            found = getattr(exc, "errors", None) or [{"path": "$", "message": str(exc)}]
            problems.extend(
                {"path": f"{key}.json: {e.get('path')}", "message": str(e.get("message"))}
                for e in found
            )
    if problems:
        raise DefinitionInvalid(problems)


def plan(ops: Ops, documents: dict[str, Any]) -> Plan:
    """Compare each definition with its workflow's newest version."""
    found = Plan()
    latest = {w["workflow"]: w["latest_version"] for w in ops.workflows()}
    for key, document in documents.items():
        if key not in latest:
            found.new.append(key)
            continue
        version = latest[key]
        published = ops.version(key, version)["definition"]
        lines = defdiff.diff(published, document).lines(f"{key} version {version}", f"{key}.json")
        if lines:
            found.changed[key] = (version, lines)
        else:
            found.unchanged.append(key)
    found.absent = sorted(set(latest) - set(documents))
    return found


def _text(found: Plan, dry_run: bool) -> str:
    lines = [f"+ {key}: new workflow" for key in found.new]
    for key, (version, diff) in found.changed.items():
        lines.append(f"~ {key}: changed since version {version}")
        lines.extend(f"    {line}" for line in diff)
    lines += [f"= {key}: unchanged" for key in found.unchanged]
    lines += [f"? {key}: published, but absent from the folder" for key in found.absent]
    done = (
        "dry run: nothing published"
        if dry_run
        else ", ".join(f"{k} version {v}" for k, v in found.published.items()) or "nothing to do"
    )
    lines.append(
        f"apply: {len(found.new)} new, {len(found.changed)} changed, {len(found.unchanged)} "
        f"unchanged, {len(found.absent)} absent; {done}"
    )
    return "\n".join(lines)


def apply_folder(ops: Ops, args: argparse.Namespace) -> int:
    """The `flowforge apply` command; its exit status."""
    documents = read_folder(Path(args.folder))
    check_on_the_server(ops, documents)
    found = plan(ops, documents)
    if not args.dry_run:
        for key in [*found.new, *found.changed]:
            found.published[key] = ops.publish(key, documents[key])["version"]
    summary = {
        "new": found.new,
        "changed": {k: v for k, (v, _) in found.changed.items()},
        "unchanged": found.unchanged,
        "absent": found.absent,
        "published": found.published,
        "dry_run": args.dry_run,
    }
    emit(args, summary, _text(found, args.dry_run))
    return DRIFT if args.dry_run and found.drift else 0
