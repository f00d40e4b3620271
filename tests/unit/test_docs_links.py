"""The docs are a tree a reader can navigate: every relative link in README.md and under
docs/ resolves (to a file, and to a heading when it names one), and every page under
docs/ is listed in docs/index.md, so a new page cannot be left where nobody finds it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
# An inline code span shows a link or an anchor as an example; it is neither.
CODE_SPAN = re.compile(r"`[^`\n]*`")
# An explicit anchor (docs/contract.md gives every promise one).
EXPLICIT_ID = re.compile(r"""<a\s+(?:name|id)=["']([^"']+)["']""")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors (lower case, punctuation dropped, spaces as dashes) and the
    page's explicit `<a id>` anchors."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    found = set(EXPLICIT_ID.findall(CODE_SPAN.sub("", text)))
    for heading in re.findall(r"^#+ (.+)$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def broken_links(page: Path) -> list[str]:
    text = CODE_SPAN.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no such heading)")
    return broken


def test_every_relative_link_resolves() -> None:
    broken = {
        str(page.relative_to(ROOT)): found for page in pages() if (found := broken_links(page))
    }
    assert broken == {}


def test_every_page_under_docs_is_in_the_index() -> None:
    index = DOCS / "index.md"
    linked = {
        (index.parent / target.partition("#")[0]).resolve()
        for target in LINK.findall(index.read_text(encoding="utf-8"))
    }
    missing = [
        str(page.relative_to(DOCS))
        for page in DOCS.rglob("*.md")
        if page != index and page.resolve() not in linked
    ]
    assert missing == [], f"add a line for each to docs/index.md: {missing}"


def test_the_readme_is_short_and_links_the_docs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) <= 12 * 1024
    assert "docs/tutorial.md" in readme and "docs/index.md" in readme


def test_the_checker_finds_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text('# A heading\n\n<a id="kept"></a>\n`<a id="shown"></a>`\n')
    page.write_text(
        "[ok](there.md#a-heading) [gone](nowhere.md) [bad](there.md#nope) [id](there.md#kept)"
        " [example](there.md#shown) `[code](nowhere.md)`\n"
    )
    assert broken_links(page) == [
        "nowhere.md (no such file)",
        "there.md#nope (no such heading)",
        "there.md#shown (no such heading)",
    ]


def test_every_whole_definition_in_the_docs_is_valid() -> None:
    """A reader copies these: each ```json block that is a whole definition publishes."""
    import json

    from flowforge.domain.definitions import parse_definition

    checked = 0
    for page in pages():
        text = page.read_text(encoding="utf-8")
        for block in re.findall(r"^```json\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
            try:
                document = json.loads(block)
            except ValueError:
                continue  # a fragment: one field of a definition, shown alone
            if isinstance(document, dict) and "steps" in document:
                parse_definition(document)
                checked += 1
    assert checked >= 3
