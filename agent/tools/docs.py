"""The search_docs tool: word overlap over README.md and docs/*.md."""

from __future__ import annotations

import re
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from agent import PROJECT_ROOT
from agent.tools.registry import ToolError

MAX_QUERY_CHARS = 1000  # the demo model sends the whole user message as the query
MAX_PASSAGES = 3
MAX_PASSAGE_CHARS = 1200  # three passages and their headings fit in MAX_OUTPUT_CHARS
_STOPWORDS = frozenset(  # common words, and the words people use to ask for docs at all ("search the docs")
    "a about an and are as at be by can do does for from how i if in is it its me my of on or so that the their "
    "then there this to was what when where which who why will with you your "
    "doc docs documentation search find look say says tell explain please project mean means work works use".split()
)


@dataclass(frozen=True)
class _Passage:
    source: str
    heading: str
    text: str
    words: Counter[str]  # word -> occurrences, heading included
    heading_words: frozenset[str]

_corpus_lock = threading.Lock()
_corpus_cache: dict = {"key": None, "passages": []}


def _words(text: str) -> Counter[str]:
    tokens = [t for t in re.findall(r"[a-z0-9_]+", text.lower()) if t not in _STOPWORDS]
    # A crude plural fold ("deadlines" ~ "deadline"), applied to query and docs alike.
    return Counter(t[:-1] if len(t) > 3 and t.endswith("s") else t for t in tokens)


def _doc_files() -> list[Path]:
    files = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
    return [f for f in files if f.is_file()]


_LINK_ITEM = re.compile(r"^\s*[-*]\s+\[[^\]]+\]\([^)]+\)")


def _is_link_list(lines: list[str]) -> bool:
    """A list whose every item starts with a link (the README's table of contents) only names topics:
    a question would match its words and get pointers instead of the passage they point to."""
    items = [line for line in lines if line.strip()]
    return bool(items) and all(_LINK_ITEM.match(line) for line in items)


def _split_passages(source: str, text: str) -> list[_Passage]:
    passages, heading, paragraph, in_fence = [], source, [], False

    def flush() -> None:
        body = "\n".join(paragraph).strip()
        if body and not _is_link_list(paragraph):
            passages.append(_Passage(source, heading, body, _words(body) + _words(heading), frozenset(_words(heading))))
        paragraph.clear()

    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        if not in_fence and re.match(r"^#{1,6}\s", line):
            flush()
            heading = line.lstrip("#").strip()
        elif not in_fence and not line.strip():
            flush()
        else:
            paragraph.append(line)
    flush()
    return passages


def _corpus() -> list[_Passage]:
    files = _doc_files()
    key = tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    with _corpus_lock:  # tools run in threads; parse once per change, per process
        if _corpus_cache["key"] != key:
            passages = []
            for f in files:
                source = f.relative_to(PROJECT_ROOT).as_posix()
                passages.extend(_split_passages(source, f.read_text(encoding="utf-8", errors="replace")))
            _corpus_cache.update(key=key, passages=passages)
        return _corpus_cache["passages"]


def search_docs(query: str) -> str:
    """Search this project's own documentation (README and docs/) and return the best matching passages.

    Args:
        query: a few words about what to look up, e.g. "deadline margin" or "stop button"
    """
    if not query.strip():
        raise ToolError("query is empty")
    if len(query) > MAX_QUERY_CHARS:
        raise ToolError(f"query is too long ({len(query)} characters; the limit is {MAX_QUERY_CHARS})")
    wanted = frozenset(_words(query))
    if not wanted:
        raise ToolError(f"query {query!r} has no words to search for")
    scored = []
    for order, passage in enumerate(_corpus()):
        matched = wanted & passage.words.keys()
        if matched:
            # Distinct query words matched count most; heading matches and repeated mentions break ties.
            repeats = sum(passage.words[w] for w in matched)
            score = len(matched) + 0.5 * len(wanted & passage.heading_words) + 0.1 * min(repeats, 5)
            # On a tie, prose before a table or code block: a reply can quote prose, not a table.
            verbatim = passage.text.lstrip().startswith(("|", "```"))
            scored.append((-score, verbatim, order, passage))
    if not scored:
        return f"No passage matches {query!r} in the project docs."
    scored.sort(key=lambda item: item[:3])
    blocks = []
    for *_, passage in scored[:MAX_PASSAGES]:
        text = passage.text if len(passage.text) <= MAX_PASSAGE_CHARS else passage.text[:MAX_PASSAGE_CHARS] + " ..."
        blocks.append(f"[{passage.source} - {passage.heading}]\n{text}")
    return "\n\n".join(blocks)
