"""What each section of the definition parser may use of the others. The sections are
mixins of one parser (flowforge/domain/definitions/__init__.py): each names its needs here
instead of importing the others, so no section depends on another and adding one touches
this list and the parser's bases only."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from flowforge.domain.definitions.shapes import ApprovalForm, EventWait, RetryPolicy
    from flowforge.domain.model import ItemFailure, OnTimeout, ResumeAuth

# A closed set's member (domain/model.py's enums).
Choice = TypeVar("Choice", bound=StrEnum)


class Checker(Protocol):
    """One definition's walk: the problems found so far (each with its JSON path), and the
    checks every section shares."""

    errors: list[dict[str, str]]
    # A version published already: rules newer than it apply at run time only.
    stored: bool
    wait_ids: frozenset[str]
    top_ids: frozenset[str]
    limit_names: frozenset[str]

    def error(self, path: str, message: str) -> None: ...

    def unknown_keys(self, value: dict[str, Any], allowed: Iterable[str], path: str) -> None: ...

    def templates(
        self, value: Any, path: str, ancestors: frozenset[str], *, secrets: bool
    ) -> None: ...

    def reference(
        self, dotted: str, path: str, ancestors: frozenset[str], *, secrets: bool
    ) -> None: ...

    def concurrency_key(self, key: Any, path: str) -> None: ...

    def choice(
        self, raw: dict[str, Any], name: str, default: Choice, path: str, message: str
    ) -> Choice: ...

    # The step kinds' own fields, which the steps section asks for by a step's type.
    def request(
        self, request: Any, path: str, ancestors: frozenset[str]
    ) -> dict[str, Any] | None: ...

    def retry(self, retry: Any, path: str) -> RetryPolicy: ...

    def budget(
        self, raw: dict[str, Any], path: str, request: dict[str, Any] | None
    ) -> float | None: ...

    def delay(
        self, raw: dict[str, Any], path: str, ancestors: frozenset[str]
    ) -> tuple[float | None, str | None]: ...

    def wait(
        self, raw: dict[str, Any], path: str
    ) -> tuple[float | None, OnTimeout, ResumeAuth]: ...

    def approval(self, raw: dict[str, Any], path: str) -> ApprovalForm | None: ...

    def event_wait(
        self, raw: dict[str, Any], path: str, ancestors: frozenset[str]
    ) -> EventWait | None: ...

    def map(
        self, raw: dict[str, Any], path: str, ancestors: frozenset[str]
    ) -> tuple[Any, int, ItemFailure]: ...

    def child(
        self, raw: dict[str, Any], path: str, ancestors: frozenset[str]
    ) -> dict[str, Any]: ...


def is_whole(value: Any) -> bool:
    """Tell JSON integers from booleans and floats."""
    return isinstance(value, int) and not isinstance(value, bool)
