"""`steps`: each step's id, parents, condition and type, the graph they form, and the steps a
map's items run (docs/contract.md#map). A type's own fields are its section's
(http_request, retry, delays, waits, maps, children); this one asks for them by type."""

from __future__ import annotations

from typing import Any

from flowforge.domain import templating
from flowforge.domain.definitions.bounds import MAX_PARENTS
from flowforge.domain.definitions.checker import Checker
from flowforge.domain.definitions.graph import closure, cycles, topological
from flowforge.domain.definitions.shapes import (
    EVENT_WAIT_KEYS,
    ITEM_NAMES,
    ITEM_STEP_TYPES,
    OPS,
    RESERVED_NAMES,
    STEP_ID,
    STEP_TYPES,
    RetryPolicy,
    Step,
)
from flowforge.domain.jsonvalues import is_number
from flowforge.domain.model import OnTimeout, ResumeAuth, StepType

_COMMON_KEYS = frozenset({"id", "type", "depends_on", "when"})
_TYPE_KEYS = {
    "http_request": frozenset({"request", "retry", "budget_s", "limit"}),
    "delay": frozenset({"duration_s", "until"}),
    "transform": frozenset({"output"}),
    "wait": frozenset({"timeout_s", "on_timeout", "auth", "form", "assignees"}) | EVENT_WAIT_KEYS,
    "map": frozenset({"items", "steps", "max_parallel", "on_item_failure"}),
    "workflow": frozenset({"workflow", "input"}),
}


class StepsSection(Checker):
    """`steps`, and a map's `steps`."""

    def parse_steps(
        self, steps: list[Any], base: str = "$.steps", outer: frozenset[str] | None = None
    ) -> tuple[Step, ...]:
        """Check every step and the graph they form; return them in topological order.

        `outer` is given for a map's item steps (docs/contract.md#map): what they may read besides
        their siblings — the map's own ancestors, and the item and its index."""
        first_at: dict[str, int] = {}
        for index, raw in enumerate(steps):
            if isinstance(raw, dict) and isinstance(raw.get("id"), str):
                first_at.setdefault(raw["id"], index)
        parents: dict[str, list[str]] = {step_id: [] for step_id in first_at}
        if outer is None:
            # {{ waits.<id>.url }} may name any wait step of the workflow, not only ancestors.
            self.wait_ids = frozenset(
                raw["id"]
                for raw in steps
                if isinstance(raw, dict)
                and raw.get("type") == "wait"
                and isinstance(raw.get("id"), str)
            )
            self.top_ids = frozenset(first_at)
        edges: list[list[str]] = []
        for index, raw in enumerate(steps):
            if not isinstance(raw, dict):
                self.error(f"{base}[{index}]", "a step must be an object")
                edges.append([])
                continue
            edges.append(self.depends_on(raw, f"{base}[{index}]", first_at))
            if self.step_id(raw, index, first_at, base, item=outer is not None):
                parents[raw["id"]] = edges[index]
        ordered = topological(parents)
        for loop in cycles(parents, set(ordered)):
            self.error(
                f"{base}[{first_at[loop[0]]}].depends_on",
                "cycle: " + " -> ".join([*loop, loop[0]]),
            )
        parsed: dict[str, Step] = {}
        for index, raw in enumerate(steps):
            if isinstance(raw, dict):
                ancestors = closure(parents, edges[index])
                if outer is not None:
                    ancestors |= outer
                step = self.parse_step(raw, f"{base}[{index}]", ancestors, item=outer is not None)
                if step is not None:
                    parsed[step.id] = step
        return tuple(parsed[step_id] for step_id in ordered if step_id in parsed)

    def step_id(
        self, raw: dict[str, Any], index: int, first_at: dict[str, int], base: str, *, item: bool
    ) -> bool:
        """Check a step's id; a duplicate is reported where it repeats. An item step's id
        may not shadow a name its templates read: item, index or a step of the workflow."""
        step_id = raw.get("id")
        path = f"{base}[{index}].id"
        if not isinstance(step_id, str) or not STEP_ID.fullmatch(step_id):
            self.error(path, "id is required: a letter or '_' then up to 63 letters, digits or '_'")
        elif step_id in RESERVED_NAMES or (item and step_id in ITEM_NAMES):
            self.error(path, f"{step_id!r} is reserved for the template context")
        elif item and step_id in self.top_ids:
            self.error(path, f"{step_id!r} is also a step of the workflow: give it another id")
        elif first_at[step_id] != index:
            self.error(
                path, f"duplicate step id {step_id!r} (first at {base}[{first_at[step_id]}])"
            )
        else:
            return True
        return False

    def depends_on(self, raw: dict[str, Any], path: str, first_at: dict[str, int]) -> list[str]:
        """Check a step's parents and return the valid ones as graph edges."""
        if "depends_on" not in raw:
            return []
        deps = raw["depends_on"]
        path = f"{path}.depends_on"
        if not isinstance(deps, list):
            self.error(path, "depends_on must be an array of step ids")
            return []
        if len(deps) > MAX_PARENTS:
            self.error(path, f"{len(deps)} parents exceed the limit of {MAX_PARENTS} per step")
        edges: list[str] = []
        for index, dep in enumerate(deps):
            where = f"{path}[{index}]"
            if not isinstance(dep, str) or dep not in first_at:
                self.error(where, f"{dep!r} is not the id of a step in this workflow")
            elif dep == raw.get("id"):
                self.error(where, "a step cannot depend on itself")
            elif dep in edges:
                self.error(where, f"{dep!r} is listed twice")
            else:
                edges.append(dep)
        return edges

    def parse_step(
        self, raw: dict[str, Any], path: str, ancestors: frozenset[str], *, item: bool = False
    ) -> Step | None:
        """Check one step's type-specific fields, its condition and its templates."""
        step_type = raw.get("type")
        when = self.when(raw, path, ancestors)
        if item and step_type == "map":
            self.error(f"{path}.type", "a map cannot run inside a map's items")
            return None
        if item and step_type == "wait":
            self.error(f"{path}.type", "a wait step cannot run inside a map's items")
            return None
        allowed = ITEM_STEP_TYPES if item else STEP_TYPES
        if step_type not in allowed:
            self.error(f"{path}.type", f"type must be one of {', '.join(allowed)}")
            return None
        step_type = str(step_type)
        self.unknown_keys(raw, _COMMON_KEYS | _TYPE_KEYS[step_type], path)
        request, retry = None, RetryPolicy(max_attempts=1)
        duration_s, until, output, budget_s = None, None, None, None
        timeout_s, on_timeout, resume_auth = None, OnTimeout.FAIL, ResumeAuth.TOKEN
        form = None
        limit: Any = None
        mapped: dict[str, Any] = {}
        event = None
        if step_type == StepType.MAP:
            items, parallel, policy = self.map(raw, path, ancestors)
            mapped = {
                "items": items,
                "body": self.item_steps(raw, path, ancestors),
                "max_parallel": parallel,
                "on_item_failure": policy,
            }
        elif step_type == StepType.WORKFLOW:
            mapped = self.child(raw, path, ancestors)
        elif step_type == StepType.WAIT:
            timeout_s, on_timeout, resume_auth = self.wait(raw, path)
            form = self.approval(raw, path)
            event = self.event_wait(raw, path, ancestors)
            if form is not None and "event" in raw:
                # docs/contract.md#approvals: an event's payload would decide it, unchecked
                # and by no one, around the form and the assignees.
                self.error(f"{path}.event", "an approval (a wait with a form) waits for no event")
        elif step_type == StepType.HTTP_REQUEST:
            request = self.request(raw.get("request"), f"{path}.request", ancestors)
            retry = self.retry(raw.get("retry", {}), f"{path}.retry")
            budget_s = self.budget(raw, path, request)
            limit = raw.get("limit")
            if limit is not None and limit not in self.limit_names:
                self.error(f"{path}.limit", "limit must name one of the definition's limits")
        elif step_type == StepType.DELAY:
            duration_s, until = self.delay(raw, path, ancestors)
        elif "output" not in raw:
            self.error(f"{path}.output", "output is required")
        else:
            output = raw["output"]
            self.templates(output, f"{path}.output", ancestors, secrets=False)
        # Built even when errors were recorded, so only well-typed parts may be used here:
        # an id or depends_on of the wrong JSON type must end as a 422, not a TypeError.
        step_id, depends_on = raw.get("id"), raw.get("depends_on")
        return Step(
            id=step_id if isinstance(step_id, str) else "",
            type=StepType(step_type),
            depends_on=tuple(depends_on) if isinstance(depends_on, list) else (),
            when=when,
            request=request,
            retry=retry,
            duration_s=duration_s,
            until=until,
            output=output,
            budget_s=budget_s,
            timeout_s=timeout_s,
            on_timeout=on_timeout,
            resume_auth=resume_auth,
            form=form,
            event=event,
            limit=limit if isinstance(limit, str) else None,
            **mapped,
        )

    def item_steps(
        self, raw: dict[str, Any], path: str, ancestors: frozenset[str]
    ) -> tuple[Step, ...]:
        """Check the steps each of a map's items runs: what they may read besides their
        siblings is the map's own ancestors, and the item and its index."""
        steps = raw.get("steps")
        if not isinstance(steps, list) or not steps:
            self.error(
                f"{path}.steps", "steps is required: a non-empty array of the steps each item runs"
            )
        else:
            return self.parse_steps(steps, f"{path}.steps", ancestors | ITEM_NAMES)
        return ()

    def when(
        self, raw: dict[str, Any], path: str, ancestors: frozenset[str]
    ) -> dict[str, Any] | None:
        """Check a step's condition, which reads context paths without braces."""
        if "when" not in raw:
            return None
        when = raw["when"]
        path = f"{path}.when"
        if not isinstance(when, dict):
            self.error(path, "when must be an object with path, op and value")
            return None
        self.unknown_keys(when, {"path", "op", "value"}, path)
        target = when.get("path")
        if not isinstance(target, str) or not templating.is_path(target):
            self.error(f"{path}.path", "path is required: a dotted path such as shape.total")
        else:
            self.reference(target, f"{path}.path", ancestors, secrets=False)
        op = when.get("op")
        if op not in OPS:
            self.error(f"{path}.op", f"op must be one of {', '.join(OPS)}")
        elif op != "exists" and "value" not in when:
            self.error(f"{path}.value", f"value is required for op {op!r}")
        elif op == "in" and not isinstance(when["value"], list):
            self.error(f"{path}.value", "value must be an array for op 'in'")
        elif op in ("gt", "gte", "lt", "lte") and not (
            is_number(when["value"]) or isinstance(when["value"], str)
        ):
            self.error(f"{path}.value", f"value must be a number or a string for op {op!r}")
        return when
