"""The docs as GitHub renders them: every relative link in README.md, CHANGELOG.md and docs/*.md
leads to a file that exists, and every `#anchor` into a Markdown page to one of its headings.
The README stays a first page (the rest lives in docs/). Standard library only."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = [README, REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 250

FENCE = re.compile(r"^\s*(```|~~~)")
# A code span may wrap onto the next line, never past a paragraph's end.
CODE_SPAN = re.compile(r"(`+)(?:(?!\1)(?!\n[ \t]*\n).)+?\1", re.DOTALL)
# [text](target) or [text](target "title"); images (![alt](src)) are links too.
LINK = re.compile(r"\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(?P<text>.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s[^>]*(?:name|id)=\"(?P<name>[^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # http:, https:, mailto:, ...


def prose(text: str) -> list[str]:
    """The page's lines, those of fenced code blocks (where Markdown makes no link and no
    heading) left empty, so that line numbers stay."""
    lines: list[str] = []
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text lowercased, punctuation other than '-'
    and '_' removed, each space turned into '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = text.replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a link may name in the page: its headings' (a repeated heading gets -1, -2,
    ... as on GitHub) and explicit <a name/id="..."> ones."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose(page.read_text(encoding="utf-8")):
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group("text"))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        found.update(match.group("name") for match in HTML_ANCHOR.finditer(line))
    return found


def relative_links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link that is not to another site or a mail address; the
    text of a link may wrap onto the next line."""
    text = "\n".join(prose(page.read_text(encoding="utf-8")))
    # `[x](y)` in code is no link; the newlines stay, and so do the line numbers
    text = CODE_SPAN.sub(lambda span: "code" + "\n" * span.group(0).count("\n"), text)
    links: list[tuple[int, str]] = []
    for match in LINK.finditer(text):
        target = match.group("target").strip("<>")
        if not SCHEME.match(target):
            links.append((text.count("\n", 0, match.start("target")) + 1, target))
    return links


def shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def broken_links(page: Path) -> list[str]:
    broken: list[str] = []
    for number, target in relative_links(page):
        path_part, _, anchor = target.partition("#")
        where = f"{shown(page)}:{number}: [..]({target})"
        linked = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not linked.exists():
            broken.append(f"{where}: {shown(linked)} does not exist")
        elif anchor and linked.suffix == ".md" and unquote(anchor) not in anchors(linked):
            broken.append(f"{where}: no heading with anchor #{anchor} in {shown(linked)}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_leads_to_a_file_and_a_heading_that_exist(page: Path) -> None:
    assert page.is_file(), f"{page.relative_to(REPO)} is missing"
    broken = broken_links(page)
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_docs_folder_has_pages() -> None:
    assert len(PAGES) > 2, "no docs/*.md: the README links its pages there"


def test_the_readme_stays_a_first_page() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines < README_MAX_LINES, (
        f"README.md has {lines} lines (fewer than {README_MAX_LINES} wanted): move the details "
        "to a page in docs/ and link it"
    )


def test_the_marks_other_tests_read_are_in_place() -> None:
    """tests/release reads the try-it command from README.md and the executors' packages from
    the block after <!-- executor-requirements --> in README.md or docs/*.md."""
    try_it = README.read_text(encoding="utf-8").split("**Try it**", 1)
    assert len(try_it) == 2 and "demo records" in try_it[1].split("```", 1)[0]
    mark = "<!-- executor-requirements -->"
    texts = [page.read_text(encoding="utf-8") for page in PAGES]
    assert sum(text.count(mark) for text in texts) == 1, f"{mark} wanted once in README or docs"
    marked = next(text for text in texts if mark in text)
    assert marked.split(mark, 1)[1].startswith("\n```bash\npip install "), f"no block after {mark}"


def test_slugs_follow_githubs_rule() -> None:
    assert slug("Checking a config: `ktm check`") == "checking-a-config-ktm-check"
    assert slug("Active/active") == "activeactive"
    assert slug("Spark's own Kafka source") == "sparks-own-kafka-source"
    assert slug("Rounds, not epochs") == "rounds-not-epochs"
    assert slug("fetch_max_wait and -1") == "fetch_max_wait-and--1"
