"""Citations of the contract hold: code, tests and pages cite docs/contract.md and the
reference pages by anchors that exist, and never a document outside the repository (which
a reader of the repository cannot open). docs/contract.md says how to cite it."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("flowforge", "docs", "bin", "tests")
CONTRACT = ROOT / "docs" / "contract.md"
# The contract as first specified, numbered by section, lives outside the repository: a
# citation of it by number ("SPEC" then a section sign or "section") cannot be followed.
# Spelled in pieces so that this file does not cite it either.
OUTSIDE_CITATION = re.compile("SPEC" + r"\s*(?:\u00a7|section\s+\d)")
# The contract's sections are renumbered as it grows: cite an anchor, not a number.
NUMBERED_CITATION = re.compile(r"contract\.md\s*\u00a7")
OUTSIDE_NAMES = (
    "../" + "shared",
    "/work/" + "shared",
    "/work/" + "notes",
    "SP" + "EC.md",
    "ANCH" + "ORS.md",
    "CONVEN" + "TIONS.md",
)
OUTSIDE_DOCUMENTS = re.compile("|".join(re.escape(name) for name in OUTSIDE_NAMES))
# docs/contract.md#<anchor> or docs/reference/<page>.md#<anchor>, as code and tests cite them.
CODE_CITATION = re.compile(r"docs/((?:contract|reference/[\w-]+)\.md)#([\w-]+)")
# A Markdown link to a page of docs/ with an anchor, or to an anchor of the same page.
PAGE_LINK = re.compile(r"\]\(([\w./-]*?\.md)?#([^)\s]+)\)")
EXPLICIT_ID = re.compile(r"""<a\s+(?:name|id)=["']([^"']+)["']""")
FENCE = re.compile(r"^\s*(```|~~~)")


def _files() -> list[Path]:
    found = [ROOT / "README.md"]
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                found.append(path)
    return found


@cache
def _text(path: Path) -> str | None:
    try:
        return path.read_text()
    except UnicodeDecodeError:  # images, binaries
        return None


def _prose(text: str) -> str:
    """A Markdown page with its code (fenced blocks, inline spans) blanked, lines kept: an
    anchor or a link shown as an example is neither."""
    lines = []
    fenced = False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
        elif fenced:
            lines.append("")
        else:
            lines.append(re.sub(r"`[^`]*`", lambda m: " " * len(m.group(0)), line))
    return "\n".join(lines)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """Every anchor of a Markdown page: explicit ids, and each heading's slug (a repeated
    heading's slug gets -1, -2, ... as on GitHub); headings inside code fences are none."""
    text = _text(page) or ""
    found = set(EXPLICIT_ID.findall(_prose(text)))
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fenced or not heading:
            continue
        slug = _slug(heading.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(found)


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _citations() -> list[tuple[str, Path, str]]:
    """(where, page, anchor) for every anchor cited anywhere scanned."""
    cited = []
    for path in _files():
        text = _text(path)
        if text is None:
            continue
        rel = path.relative_to(ROOT).as_posix()
        for match in CODE_CITATION.finditer(text):
            page = ROOT / "docs" / match.group(1)
            cited.append((f"{rel}:{_line(text, match.start())}", page, match.group(2)))
        if path.suffix != ".md":
            continue
        for match in PAGE_LINK.finditer(_prose(text)):
            target = match.group(1)
            if target and "://" in target:
                continue
            page = (path.parent / target).resolve() if target else path
            cited.append((f"{rel}:{_line(text, match.start())}", page, match.group(2)))
    return cited


def _offenders(pattern: re.Pattern[str], quoted: bool = True) -> list[str]:
    """Every match of `pattern` in the checked files, as path:line (and the match itself
    when `quoted`)."""
    return [
        f"{path.relative_to(ROOT)}:{_line(text, match.start())}"
        + (f": {match.group(0)!r}" if quoted else "")
        for path in _files()
        if (text := _text(path)) is not None
        for match in pattern.finditer(text)
    ]


def test_nothing_cites_the_first_specification_by_section() -> None:
    offenders = _offenders(OUTSIDE_CITATION)
    assert offenders == [], "cite docs/contract.md#<anchor> instead:\n" + "\n".join(offenders)


def test_nothing_cites_the_contract_by_section_number() -> None:
    offenders = _offenders(NUMBERED_CITATION, quoted=False)
    assert offenders == [], "cite docs/contract.md#<anchor> instead:\n" + "\n".join(offenders)


def test_nothing_cites_a_document_outside_the_repository() -> None:
    offenders = _offenders(OUTSIDE_DOCUMENTS)
    assert offenders == [], "\n".join(offenders)


def test_every_cited_anchor_exists_in_its_page() -> None:
    citations = _citations()
    assert len(citations) > 100, "the scan found too few citations to be looking right"
    broken = [
        f"{where}: {page.relative_to(ROOT) if page.is_relative_to(ROOT) else page}#{anchor}"
        for where, page, anchor in citations
        if not page.exists() or anchor not in anchors(page)
    ]
    assert broken == [], "no such anchor:\n" + "\n".join(broken)


def test_the_contract_names_its_anchors_once_each() -> None:
    """An explicit id used twice would make one of two promises unreachable."""
    ids = EXPLICIT_ID.findall(_prose(_text(CONTRACT) or ""))
    assert len(ids) > 50
    assert sorted({i for i in ids if ids.count(i) > 1}) == []


def test_the_contracts_index_lists_every_anchor() -> None:
    """The list at the top of docs/contract.md is where a reader (and a comment's author)
    finds the anchor to cite: every explicit id is in it, and it names no other."""
    text = _prose(_text(CONTRACT) or "")
    index = text[: text.index("<a id=")]
    listed = set(re.findall(r"\]\(#([\w-]+)\)", index))
    assert listed == set(EXPLICIT_ID.findall(text))


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        (
            "12. A frozen or partitioned process stops nobody else",
            "12-a-frozen-or-partitioned-process-stops-nobody-else",
        ),
        (
            "Metrics answer only Prometheus (`FLOWFORGE_METRICS_TOKEN`)",
            "metrics-answer-only-prometheus-flowforge_metrics_token",
        ),
        ("Running steps once per item: `map`", "running-steps-once-per-item-map"),
    ],
)
def test_heading_slugs_are_githubs(heading: str, slug: str) -> None:
    assert _slug(heading) == slug


def test_a_missing_anchor_is_found(tmp_path: Path) -> None:
    """The check can fail: a page without the cited anchor is reported."""
    page = tmp_path / "page.md"
    page.write_text(
        '# Title\n\n<a id="kept"></a>\nText, `<a id="shown"></a>`.\n\n```\n# not a heading\n```\n'
    )
    assert anchors(page) == frozenset({"title", "kept"})
    assert "not-a-heading" not in anchors(page)
