"""The import picture of docs/architecture.md, checked on the source: the layers are the
folders of flowforge/, and a module that imports a higher layer, a folder the picture does
not rank, or a module the document does not list fails here."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "flowforge"
DOC = ROOT / "docs" / "architecture.md"

# The layers, lowest first: a module imports its own layer and the layers below it. "" is
# the root of flowforge/ (the foundation). The entry points share the top rank and never
# import each other.
LAYERS = ("", "domain", "trust", "observe", "store", "usecases", "steps", "entry points")
ENTRY_POINTS = frozenset({"api", "worker", "cli"})
RANK = {layer: rank for rank, layer in enumerate(LAYERS)}
# The foundation's modules: each imports nothing of FlowForge but the root.
FOUNDATION = frozenset({"errors", "cache", "logs", "launcher", "faults"})
# Layers whose modules must stay testable without a server: no I/O library.
PURE = frozenset({"", "domain"})
IO_LIBRARIES = {"psycopg", "psycopg_pool", "pika", "requests", "urllib3", "flask", "gunicorn"}
# The longest chain of runtime imports between FlowForge modules, counted in modules: 15 in
# the flat package; 13 since the API's blueprints stopped importing each other (intake and
# sources hold their process caches, bodies the supplied secret), retention its own
# statements, and the key rule sits in the model (api → console → views → catalog →
# schedules → intake → actions → runs → engine → definitions → templating → jsonvalues →
# errors). A new import may not make it longer. Still 13 since the use cases left the store
# (api → console → views → operate → ticks → intake → actions → runs → flowcontrol →
# definitions → templating → jsonvalues → errors): the store's own chain is now at most
# STORE_FLOORS, but six of the thirteen are runs and the rules below it, four the API and
# its console above the use cases, and three use cases calling one another (a tick goes
# through the intake, which stops what it replaced).
LONGEST_CHAIN = 13
# The store's floors: the longest chain of runtime imports between store/ modules, counted
# in modules (9 when the use cases lived in it: sources → catalog → schedules → intake →
# actions → runs → flowcontrol → db → outbox). A store module runs statements, loads and
# saves; composing units of work in a use case's order is usecases/'s.
STORE_FLOORS = 5
# No module of flowforge/ is longer than this (store/schedules.py had 967 lines before its
# tick half left for usecases/ticks.py; worker/executor.py 884 and api/openapi.py 807
# before issue #40), and no function longer than MAX_FUNCTION_LINES (nine were, up to
# supervisor's Worker.__init__ at 114). Generated modules are exempt.
MAX_LINES = 800
MAX_FUNCTION_LINES = 80
GENERATED = frozenset({"flowforge.api.client"})  # python -m flowforge.api.clientgen
# A statement that writes an execution's rows, in a module's source.
WRITES_EXECUTIONS = re.compile(
    r"(?:INSERT INTO|UPDATE|DELETE FROM)\s+(?:executions|steps|attempts|execution_events)\b"
)


def _modules() -> list[str]:
    names = []
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        names.append(".".join(("flowforge", *parts)).removesuffix(".__init__"))
    return sorted(name for name in names if name != "flowforge")


MODULES = _modules()


def _folder(module: str) -> str:
    """`flowforge.store.db` → `store`; `flowforge.errors` → "" (the root)."""
    parts = module.split(".")
    return parts[1] if (PACKAGE / parts[1]).is_dir() else ""


def _layer(module: str) -> str:
    folder = _folder(module)
    return "entry points" if folder in ENTRY_POINTS else folder


def _path(module: str) -> Path:
    relative = Path(*module.split(".")[1:])
    path = PACKAGE / relative.with_suffix(".py")
    return path if path.exists() else PACKAGE / relative / "__init__.py"


@cache
def _imports(module: str, runtime_only: bool = False) -> frozenset[str]:
    """Every FlowForge module this one imports, absolute names; `from flowforge.store
    import db` counts as importing flowforge.store.db. `runtime_only`: not those under
    `if TYPE_CHECKING:`."""
    path = _path(module)
    tree = ast.parse(path.read_text(), str(path))
    tops = [
        node
        for node in tree.body
        if not (
            runtime_only and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        )
    ]
    found: set[str] = set()
    for node in (inner for top in tops for inner in ast.walk(top)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in MODULES else node.module)
    return frozenset(name for name in found if name.startswith("flowforge.") and name != module)


def _docstring_only(path: Path) -> bool:
    """A package's __init__.py that only says what the folder holds."""
    body = ast.parse(path.read_text()).body
    return not body or (len(body) == 1 and isinstance(body[0], ast.Expr))


def test_every_folder_is_a_layer() -> None:
    folders = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists()}
    assert folders == (set(LAYERS) - {"", "entry points"}) | ENTRY_POINTS


def test_the_root_holds_the_foundation_only() -> None:
    assert {m.split(".")[1] for m in MODULES if _folder(m) == ""} == FOUNDATION


@pytest.mark.parametrize("module", MODULES)
def test_imports_follow_the_layers(module: str) -> None:
    layer = _layer(module)
    for imported in _imports(module):
        target = _layer(imported)
        assert RANK[target] <= RANK[layer], f"{module} ({layer}) imports {imported} ({target})"
        if target == "entry points":
            assert _folder(imported) == _folder(module), f"{module} imports {imported}"


@pytest.mark.parametrize("module", [m for m in MODULES if _layer(m) in PURE])
def test_the_rules_import_no_io_library(module: str) -> None:
    path = _path(module)
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert not imported & IO_LIBRARIES, f"{module} imports {sorted(imported & IO_LIBRARIES)}"


@pytest.mark.parametrize("module", [m for m in MODULES if _folder(m) == "api"])
def test_the_api_never_talks_to_rabbitmq(module: str) -> None:
    tree = ast.parse(_path(module).read_text())
    names = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    names |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {name for name in names if name.split(".")[0] == "pika"}


@pytest.mark.parametrize("module", [m for m in MODULES if _folder(m) in {"store", "usecases"}])
def test_the_store_imports_no_observer(module: str) -> None:
    """Persistence says what it saved (runs.listen, intake.listen_target_reads), and so do
    the use cases over it; the API and the worker count and trace it."""
    assert not {m for m in _imports(module) if _folder(m) == "observe"}


# One translation boundary per library: psycopg's errors (and psycopg_pool's) are caught
# only in store/db.py (wrap_exceptions); pika's only where a pika connection is held
# (the broker module, and the consumer and relay, which run every pass inside
# broker.broker_errors), so worker/loop's error policy never sees them.
CATCHES = {
    "psycopg": {"store/db.py"},
    "pika": {"worker/broker.py", "worker/consumer.py", "worker/relay.py"},
}
CAUGHT_AS = {"psycopg": ("psycopg", "PoolTimeout"), "pika": ("pika", "BROKER_ERRORS")}


def _caught(path: Path) -> set[str]:
    """The libraries whose exceptions a module catches (an except clause, or
    contextlib.suppress)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            text = ast.unparse(node.type)
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("suppress"):
            text = ast.unparse(node)
        else:
            continue
        found |= {lib for lib, names in CAUGHT_AS.items() if any(n in text for n in names)}
    return found


@pytest.mark.parametrize("module", MODULES)
def test_library_errors_are_caught_at_their_one_boundary(module: str) -> None:
    path = _path(module)
    where = str(path.relative_to(PACKAGE))
    for library in _caught(path):
        assert where in CATCHES[library], f"{where} catches {library}'s errors"


def test_the_loop_never_sees_pika() -> None:
    assert "flowforge.worker.broker" not in _imports("flowforge.worker.loop")
    assert "BROKER_ERRORS" not in _path("flowforge.worker.loop").read_text()
    assert not {name for name in _imports("flowforge.worker.loop") if "pika" in name}


# A refusal that an error type of flowforge/errors.py names leaves as that type (its
# status and title once, in the class), never as a Problem written by hand: request
# validation included (400, 413, 415, 422), so api/problems.py only renders.
TYPED_STATUSES = {
    400: "InvalidParameter",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    413: "PayloadTooLarge",
    415: "UnsupportedMediaType",
    422: "InvalidBody",
}


@pytest.mark.parametrize("module", [m for m in MODULES if _folder(m) == "api"])
def test_typed_refusals_are_raised_as_their_type(module: str) -> None:
    for node in ast.walk(ast.parse(_path(module).read_text())):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("Problem") and node.args:
            status = node.args[0]
            if isinstance(status, ast.Constant) and status.value in TYPED_STATUSES:
                raise AssertionError(
                    f"{module}:{node.lineno} Problem({status.value}, ...): "
                    f"raise errors.{TYPED_STATUSES[status.value]}"
                )


def test_the_longest_import_chain_is_short() -> None:
    @cache
    def depth(module: str) -> int:
        return 1 + max((depth(m) for m in _imports(module, runtime_only=True)), default=0)

    longest = max(MODULES, key=depth)
    assert depth(longest) <= LONGEST_CHAIN, f"{longest} sits on a chain of {depth(longest)}"


def test_the_store_is_a_few_floors_deep() -> None:
    @cache
    def floors(module: str) -> int:
        inside = {m for m in _imports(module, runtime_only=True) if _folder(m) == "store"}
        return 1 + max((floors(m) for m in inside), default=0)

    store = [m for m in MODULES if _folder(m) == "store"]
    deepest = max(store, key=floors)
    assert floors(deepest) <= STORE_FLOORS, f"{deepest} sits {floors(deepest)} floors up"


@pytest.mark.parametrize("module", [m for m in MODULES if m not in GENERATED])
def test_no_module_is_over_the_line_limit(module: str) -> None:
    lines = len(_path(module).read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines: split it by what it does"


@pytest.mark.parametrize("module", [m for m in MODULES if m not in GENERATED])
def test_no_function_is_over_the_line_limit(module: str) -> None:
    """Every function and method, nested ones included, from its `def` to its last line."""
    long = {
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(_path(module).read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    }
    assert not long, f"{module}: split {sorted(long)} along what each part does"


def test_the_document_lists_every_module_in_its_folder() -> None:
    named = re.findall(r"`((?:\w+/)*\w+\.py)`", DOC.read_text())
    listed = {name for name in named if not name.startswith("tests/")}
    on_disk = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if not _docstring_only(path)
    }
    assert on_disk - listed == set(), "describe these in docs/architecture.md's listing"
    assert listed - on_disk == set(), "docs/architecture.md lists modules that do not exist"


def test_the_document_names_every_writer_of_an_executions_rows() -> None:
    """The table's row for executions names every module with a statement that writes an
    execution's rows (executions, steps, attempts, execution_events), and no other."""
    rows = DOC.read_text().splitlines()
    row = next(line for line in rows if line.startswith("| `executions` |"))
    named = {name for name in re.findall(r"`((?:\w+/)*\w+\.py)`", row) if (PACKAGE / name).exists()}
    writers = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if WRITES_EXECUTIONS.search(path.read_text())
    }
    assert named == writers


def _owner_rows() -> list[tuple[set[str], set[str]]]:
    """The rows of "Who owns which table": (tables, modules named), a table named bare or
    by a column (`workflows.paused_at`); a module by path, name or function
    (`worker/retention.Retention.expire_unmatched`, `catalog`, `runs.save_run`)."""
    section = DOC.read_text().split("## Who owns which table")[1].split("\n## ")[0]
    by_name: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        relative = str(path.relative_to(PACKAGE))[: -len(".py")]
        for name in {relative, relative.split("/")[-1]}:
            by_name.setdefault(name, set()).add(relative + ".py")
    rows = []
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith("|---") or line.startswith("| table"):
            continue
        table_cell, writers_cell = line.strip("|").split("|")[:2]
        tables = {t.split(".")[0] for t in re.findall(r"`([a-z_]+(?:\.[a-z_]+)?)`", table_cell)}
        named: set[str] = set()
        for token in re.findall(r"`([\w/.]+)`", writers_cell):
            named |= by_name.get(token.removesuffix(".py").split(".")[0], set())
        rows.append((tables, named))
    return rows


def test_each_row_of_the_owners_table_is_one_table() -> None:
    """One line per table: a row names one table, whole or by some of its columns."""
    grouped = [tables for tables, _ in _owner_rows() if len(tables) != 1]
    assert grouped == [], "split these rows, one per table"


OWNED_TABLES = sorted({t for tables, _ in _owner_rows() for t in tables} - {"executions"})


@pytest.mark.parametrize("table", OWNED_TABLES)
def test_the_document_names_every_writer_of_each_table(table: str) -> None:
    """Every module with a statement that writes `table` is named in a row of the table of
    owners that names it."""
    named = set().union(*(modules for tables, modules in _owner_rows() if table in tables))
    statement = re.compile(rf"(?:INSERT INTO|UPDATE|DELETE FROM)\s+{table}\b")
    writers = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if statement.search(path.read_text())
    }
    assert writers - named == set(), f"docs/architecture.md: name the writers of {table}"


# The threads' table: "`worker/scheduler` → `schedules`" (or "(→ `retention`)") says
# which modules a thread's module hands its work to.
THREAD_ROW = re.compile(r"^\| `[\w-]+` \| `(worker/\w+)` \(?→ ([^|]*?)\)? \|", re.M)


def test_the_threads_table_says_what_each_thread_hands_work_to() -> None:
    claims = THREAD_ROW.findall(DOC.read_text().split("## The worker's threads")[1])
    assert len(claims) == 4, claims  # scheduler, reaper, housekeeping, notifier
    for module, callees in claims:
        imported = {m.split(".")[-1] for m in _imports("flowforge." + module.replace("/", "."))}
        for callee in re.findall(r"`(\w+)`", callees):
            assert callee in imported, f"{module} does not use {callee}"


# "act only through api/console/operate, the one place it calls actions": elsewhere the
# console asks domain/operations its rules, and never names actions.
ACTION_RULES: frozenset[str] = frozenset()


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith("flowforge.api.console")])
def test_the_console_acts_only_through_operate(module: str) -> None:
    if module == "flowforge.api.console.operate":
        return
    used = {
        node.attr
        for node in ast.walk(ast.parse(_path(module).read_text()))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "actions"
    }
    assert used <= ACTION_RULES, f"{module} acts through actions: {sorted(used - ACTION_RULES)}"


def _console_sentence(pattern: str) -> set[str]:
    """The store modules one clause of docs/architecture.md's sentence on the console
    names, `search`, `timeline` … (the sentence wraps over lines)."""
    text = " ".join(DOC.read_text().split("## The API")[1].split())
    match = re.search(pattern, text)
    assert match, f"docs/architecture.md: the console's sentence lost {pattern!r}"
    return set(re.findall(r"`(\w+)`", match.group(1)))


def _store_uses(module: str) -> tuple[set[str], set[tuple[str, str]]]:
    """The store and use-case modules a module imports (short names), and each
    `module.name` of them it calls, aliases (`replay as replay_module`) resolved."""
    tree = ast.parse(_path(module).read_text())
    alias_of: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in PERSISTENCE:
            alias_of |= {alias.asname or alias.name: alias.name for alias in node.names}
    imported = {m.split(".")[2] for m in _imports(module) if _folder(m) in {"store", "usecases"}}
    used = {
        (alias_of[func.value.id], func.attr)
        for func in (node.func for node in ast.walk(tree) if isinstance(node, ast.Call))
        if isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id in alias_of
    }
    return imported, used


CONSOLE = [m for m in MODULES if m.startswith("flowforge.api.console")]
PERSISTENCE = frozenset({"flowforge.store", "flowforge.usecases"})
OPERATE = "flowforge.api.console.operate"


def test_the_console_reads_and_signs_in_through_the_modules_the_document_names() -> None:
    reads = _console_sentence(
        r"its pages read through (.*?), and ask `domain/operations.py` its rules"
    )
    signs_in = _console_sentence(r"they sign in through (.*?); and they act")
    imported = set().union(*(_store_uses(m)[0] for m in CONSOLE if m != OPERATE))
    assert imported == reads | signs_in


def test_the_console_acts_through_operate_alone() -> None:
    """operate imports the modules the document says it acts through (and apikeys, the
    actor's key), and nothing else of the console calls what operate calls."""
    acts = _console_sentence(r"the one place the console calls (.*?) to change anything")
    imported, operate_calls = _store_uses(OPERATE)
    assert imported - {"apikeys"} == acts
    for module in CONSOLE:
        if module != OPERATE:
            shared = _store_uses(module)[1] & operate_calls
            assert not shared, f"{module} acts around operate: {sorted(shared)}"


def _defined(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """The names a module's (or a class's) body defines or imports, with their nodes."""
    found: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found[node.name] = node
        elif isinstance(node, ast.Assign):
            found |= {t.id: node for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            found |= {alias.asname or alias.name: node for alias in node.names}
    return found


def _resolves(body: list[ast.stmt], names: list[str]) -> bool:
    """Whether `A.b.c` names something defined: each name in the body of the one before."""
    node = _defined(body).get(names[0])
    if len(names) == 1 or node is None:
        return node is not None
    return isinstance(node, ast.ClassDef) and _resolves(node.body, names[1:])


def _bodies() -> dict[str, list[list[ast.stmt]]]:
    """Each module's body by the names the document calls it: path (`worker/retention`)
    and bare name (`retention`)."""
    found: dict[str, list[list[ast.stmt]]] = {}
    for path in PACKAGE.rglob("*.py"):
        relative = str(path.relative_to(PACKAGE))[: -len(".py")]
        body = ast.parse(path.read_text()).body
        for name in {relative, relative.split("/")[-1]}:
            found.setdefault(name, []).append(body)
    return found


def test_every_name_the_document_gives_exists() -> None:
    """`runs.save_run`, `worker/retention.Retention.expire_unmatched`, `Run.hold`: each
    dotted name whose first part is a module (or, capitalised, a class) of flowforge/ is
    defined there, so a rename cannot leave the document behind. A table's column
    (`executions.slot_at`) is no module's name."""
    text = DOC.read_text()
    tables = {t for tables, _ in _owner_rows() for t in tables}
    bodies = _bodies()
    classes: list[ast.stmt] = [
        node
        for bs in bodies.values()
        for body in bs
        for node in body
        if isinstance(node, ast.ClassDef)
    ]
    checked = 0
    for first, rest in re.findall(r"`((?:\w+/)*\w+)((?:\.\w+)+)(?:\(\))?`", text):
        names = rest.split(".")[1:]
        if names == ["py"] or first in tables:
            continue
        if first in bodies:
            candidates = bodies[first]
        elif first[0].isupper():
            candidates = [classes]
            names = [first, *names]
        else:
            continue
        checked += 1
        assert any(_resolves(body, names) for body in candidates), f"`{first}{rest}`"
    assert checked > 20, checked


def test_every_module_path_the_document_gives_exists() -> None:
    """`worker/timers`, `api/console/operate`: a module named by its path (without .py,
    in the threads' table and the prose) is a module of flowforge/ (a file or a package)."""
    folders = "|".join(sorted(ENTRY_POINTS | set(LAYERS) - {"", "entry points"}))
    named = set(re.findall(rf"`((?:{folders})(?:/\w+)+)(?:\.\w+)*`", DOC.read_text()))
    assert len(named) > 10, named
    missing = {
        name
        for name in named
        if not (PACKAGE / f"{name}.py").exists() and not (PACKAGE / name / "__init__.py").exists()
    }
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"
