"""`flowforge test`: run definitions against fixture files offline, with the production
engine (flowforge/steps/offline.py), and say what passed in a line per case, an exit
status and, for CI, JUnit XML (docs/reference/testing.md). Needs neither the API nor the
database."""

from __future__ import annotations

import argparse
import json
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from flowforge.cli.arguments import UsageError
from flowforge.domain.definitions import Definition, DefinitionInvalid, parse_definition
from flowforge.domain.model import WORKFLOW_KEY
from flowforge.steps.fixtures import Case, FixtureInvalid, differences, read_cases
from flowforge.steps.offline import run_case

FAILED = 1
USAGE = 2


@dataclass
class Verdict:
    """One case's outcome: what differs from its expectations (empty: it passed)."""

    workflow: str
    case: str
    differences: list[str]
    seconds: float


def fixtures_of(definition: Path) -> list[Path]:
    """The fixture files of a definition when none is named: fixtures/<name>.json beside it."""
    found = definition.parent / "fixtures" / definition.name
    return [found] if found.is_file() else []


def _definition(path: Path) -> Definition:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read a definition from {path}: {exc}") from None
    return parse_definition(document)


def check(
    definition: Definition, workflow: str, cases: list[Case], version: int = 1
) -> list[Verdict]:
    """Run each case and compare; the fixture's unanswered requests count as differences."""
    verdicts = []
    for case in cases:
        started = time.perf_counter()
        result = run_case(definition, case, workflow=workflow, version=version)
        found = [*result.problems, *differences(case.expect, result.as_dict())]
        verdicts.append(Verdict(workflow, case.name, found, time.perf_counter() - started))
    return verdicts


def junit(verdicts: list[Verdict]) -> ET.ElementTree:
    """JUnit XML: a test suite per workflow, a test case per fixture case."""
    root = ET.Element("testsuites", name="flowforge test")
    suites: dict[str, ET.Element] = {}
    for verdict in verdicts:
        suite = suites.get(verdict.workflow)
        if suite is None:
            suite = suites[verdict.workflow] = ET.SubElement(
                root, "testsuite", name=verdict.workflow
            )
        case = ET.SubElement(
            suite,
            "testcase",
            classname=verdict.workflow,
            name=verdict.case,
            time=f"{verdict.seconds:.4f}",
        )
        if verdict.differences:
            failure = ET.SubElement(
                case, "failure", message=f"{len(verdict.differences)} difference(s)"
            )
            failure.text = "\n".join(verdict.differences)
    for name, suite in suites.items():
        mine = [v for v in verdicts if v.workflow == name]
        suite.set("tests", str(len(mine)))
        suite.set("failures", str(sum(1 for v in mine if v.differences)))
    ET.indent(root)
    return ET.ElementTree(root)


def run_tests(_ops: None, args: argparse.Namespace) -> int:
    """The `flowforge test` command; its exit status (0 all passed, 1 a case failed, 2 a
    definition or fixture is not valid)."""
    started = time.perf_counter()
    verdicts: list[Verdict] = []
    try:
        for name in args.definitions:
            path = Path(name)
            key = args.key or path.stem.replace(".", "-").lower()
            if not WORKFLOW_KEY.fullmatch(key):
                raise UsageError(f"invalid workflow key {key!r}: use --key")
            definition = _definition(path)
            files = [Path(f) for f in args.fixture] if args.fixture else fixtures_of(path)
            if not files:
                raise UsageError(
                    f"{path}: no fixture (name one with --fixture, or write fixtures/{path.name})"
                )
            for file in files:
                verdicts.extend(check(definition, key, read_cases(file)))
    except (DefinitionInvalid, FixtureInvalid) as exc:
        print(f"flowforge: {exc.title}: {len(exc.errors or [])} problem(s):", file=sys.stderr)
        for problem in exc.errors or []:
            print(f"  {problem['path']}: {problem['message']}", file=sys.stderr)
        return USAGE
    except UsageError as exc:
        print(f"flowforge: usage: {exc}", file=sys.stderr)
        return USAGE
    for verdict in verdicts:
        print(f"{'FAIL' if verdict.differences else 'ok  '} {verdict.workflow}: {verdict.case}")
        for difference in verdict.differences:
            print(f"       {difference}")
    failed = sum(1 for v in verdicts if v.differences)
    print(
        f"{len(verdicts)} case(s): {len(verdicts) - failed} passed, {failed} failed "
        f"in {time.perf_counter() - started:.3f} s"
    )
    if args.junit:
        junit(verdicts).write(args.junit, encoding="utf-8", xml_declaration=True)
    return FAILED if failed else 0
