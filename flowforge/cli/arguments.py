"""The words a command line is made of: the parser class, the checks each argument's
value passes as it is parsed, and the options every command takes.

Loaded by every command, so it imports nothing heavy: the definitions parser is loaded
only when a step id is actually checked."""

from __future__ import annotations

import argparse
import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from flowforge.domain.model import MAX_PAGE, WORKFLOW_KEY, ExecutionStatus
from flowforge.errors import FlowForgeError

# Exit status of a command that cannot run as typed (argparse's own is 2 as well).
USAGE = 2
STATUSES = tuple(status.value for status in ExecutionStatus)


class UsageError(FlowForgeError):
    """The command cannot run as typed."""


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        """One line on stderr (argparse prints the whole usage block)."""
        self.exit(USAGE, f"error: {message} (see: {self.prog} --help)\n")


def execution_id(text: str) -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an execution id (a UUID)") from None


def step_id(text: str) -> str:
    from flowforge.domain.definitions import is_step_id

    if not is_step_id(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a step id")
    return text


def step_row(text: str) -> str:
    """A step, or one of a map's items' steps (`lines[3].reserve`), which resolve settles."""
    from flowforge.domain.definitions import is_step_row

    if not is_step_row(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a step id")
    return text


def where(text: str) -> tuple[str, str]:
    """--where NAME=VALUE: an execution's search attribute (docs/contract.md#search-attributes),
    held to the rules the API holds `attr.NAME` to."""
    from flowforge.domain.definitions import AttributeFilterInvalid, attribute_filter

    name, equals, value = text.partition("=")
    if not equals:
        raise argparse.ArgumentTypeError(f"{text!r}: say NAME=VALUE, such as order_id=4711")
    try:
        return attribute_filter([("--where", name, value)])[0]
    except AttributeFilterInvalid as exc:
        message = (exc.errors or [{}])[0].get("message")
        raise argparse.ArgumentTypeError(f"{text!r}: {message}") from None


def workflow_key(text: str) -> str:
    if not WORKFLOW_KEY.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a workflow key (1-64 of a-z, 0-9, '-' and '_')"
        )
    return text


def positive(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{number} must be 1 or more")
    return number


def limit(text: str) -> int:
    number = positive(text)
    if number > MAX_PAGE:
        raise argparse.ArgumentTypeError(f"{number} is more than {MAX_PAGE}")
    return number


AGE = re.compile(r"(\d+)([smhd])")
AGE_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def instant(text: str) -> datetime:
    """`2026-12-01T09:00:00Z`, `2026-12-01` (UTC unless an offset is given), or an age
    back from now: `30m`, `6h`, `2d`."""
    if found := AGE.fullmatch(text.strip()):
        return datetime.now(UTC) - timedelta(
            seconds=int(found.group(1)) * AGE_SECONDS[found.group(2)]
        )
    try:
        instant = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an instant (2026-12-01T09:00:00Z) or an age (30m, 6h, 2d)"
        ) from None
    return instant if instant.tzinfo else instant.replace(tzinfo=UTC)


def json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}): {text!r}") from None


def api_url(text: str) -> str:
    if not text.startswith(("http://", "https://")) or len(text) < len("http://x"):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL")
    return text


def common_options() -> Parser:
    """Options every command takes, before or after its name. SUPPRESS as the default lets
    a value given at either place survive the other parser."""
    common = Parser(add_help=False)
    common.add_argument(
        "--api",
        type=api_url,
        metavar="URL",
        default=argparse.SUPPRESS,
        help="run through the HTTP API at URL (default: $FLOWFORGE_API_URL), "
        "with the key in $FLOWFORGE_API_KEY",
    )
    common.add_argument(
        "--db",
        action="store_true",
        default=argparse.SUPPRESS,
        help="talk to PostgreSQL directly ($FLOWFORGE_DATABASE_URL), on the box",
    )
    common.add_argument(
        "--output",
        dest="format",
        choices=("table", "json"),
        default=argparse.SUPPRESS,
        help="table (default) or json",
    )
    common.add_argument(
        "--no-pager",
        action="store_true",
        default=argparse.SUPPRESS,
        help="never page long output (default: $FLOWFORGE_PAGER or $PAGER, else less, "
        "on a terminal only)",
    )
    return common


class Version(argparse.Action):
    """`--version`, looked up only when asked: importlib.metadata is slow to load."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("flowforge")
        except PackageNotFoundError:  # run from a checkout without an install
            found = "unknown"
        print(f"flowforge {found}")
        parser.exit(0)


def target_version(text: str) -> int | None:
    """--onto: a version number, or `latest` (None)."""
    if text == "latest":
        return None
    return positive(text)


def version_or_latest(text: str) -> int | str:
    """`workflow resume --onto`: a version number, or `latest` (kept as the word: the
    option's absence means no re-pinning at all)."""
    return text if text == "latest" else positive(text)
