"""A model reply is untrusted text: render it as Markdown without HTML, without images, and with no
link the browser would follow to anything but a web page or a mail address.

`st.markdown` escapes HTML by default but still renders Markdown images, which would make the
browser fetch any URL the model names, and it keeps links of every scheme but `javascript:` and
`vbscript:` (a `data:` or `file:` link stays clickable). Images become plain text; a link stays
only when the browser would resolve it to http, https or mailto (a relative one resolves to the
page's own address), judged the way the browser sees it: entities and escapes decoded, case folded,
whitespace and control characters dropped. Any other link is shown as the text it was written as.

Every pass is linear in the length of the text: the page renders a reply while holding the GIL, so a
quadratic pattern on one long reply would freeze every session of the server. No pattern below
can backtrack (possessive quantifiers), and no two scans cover the same stretch of text more than
twice (see each one's comment).
"""

from __future__ import annotations

import html
import re
import string

# `![alt]` and what follows it: `(url "title")` with one level of parentheses inside, or `[ref]`.
# The alt text ends at its first `]` (`\]` does not end it); a match that fails has met no such `]`
# up to the end, so no later `![` can match either: it is tried once, not again and again. A failed
# destination stops at its second unclosed `(` or at the end, and a later image inside that stretch
# stops at its first `)`, so no stretch is read more than twice. `[ref]` fails only when no `]` is
# left at all, which ends the search.
_IMAGE_RE = re.compile(r"!\[((?:[^\]\\]++|\\.)*+)\](?:\((?:[^()\\]++|\\.|\([^()]*+\))*+\)|\[[^\]]*+\])?",
                       re.DOTALL)
# Every place a link's destination can start: `](` (inline link), `]:` (reference definition) and
# `<scheme:...>` (autolink; judged wider than CommonMark's, with spaces and any length, so none is
# missed). Escaped or not: judging an escaped one changes nothing the reader sees. A `](` or `]:` is
# picked only when a scheme may follow (a relative destination, the common case, costs nothing), and
# the lookaheads stop at the first character that is not in a scheme or at the next `<` or `>`, so
# no two of them overlap.
_LINK_START_RE = re.compile(
    r"\][(:](?=[\x00-\x20\x7f]*+<?(?:[A-Za-z][A-Za-z0-9+.\-]*+)?"
    r"(?:[:\x00-\x20\x7f]|\\[+.\-:]|&(?:#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});))"
    r"|<(?=([A-Za-z][A-Za-z0-9+.\-]*+):[^<>]*+>)")
# A destination's scheme in the common case: no entity, escape or whitespace inside it.
_PLAIN_SCHEME_RE = re.compile(r"[\x00-\x20\x7f]*+<?([A-Za-z][A-Za-z0-9+.\-]*+)?(.?)", re.DOTALL)
# A character reference as CommonMark reads one (the semicolon is required).
_ENTITY_RE = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")
_SCHEME_CHARS = frozenset(string.ascii_letters + string.digits + "+-.")
_SLOW_SCHEME_CHARS = frozenset("&\\<")
CLICKABLE_SCHEMES = frozenset({"http", "https", "mailto"})  # and relative links, which stay on this page
# Raw HTML that could fetch or embed something, escaped even though st.markdown escapes HTML too. The
# first lookahead is a cheap filter: a run of `<` costs one step each, not a try of every tag name.
_HTML_TAG_RE = re.compile(
    r"<(?=/?\s*+[a-z])(?=/?\s*+(?:img|picture|source|video|audio|iframe|object|embed|svg|image|link|script)\b)",
    re.IGNORECASE)


def _alt_text(alt: str) -> str:
    alt = alt.strip().replace("[", "(").replace("]", ")")
    return f"(image not shown: {alt})" if alt else "(image not shown)"


def _without_images(text: str) -> str:
    """Every `![...]` image as its alt text, and every other `![` broken, so that no image is left."""
    out, done = [], 0
    start = text.find("![")
    while start >= 0:
        image = _IMAGE_RE.match(text, start)
        if image is None:  # no closing bracket from here on: no image can start after this point
            break
        out.append(text[done:start])
        out.append(_alt_text(image.group(1)))
        done = image.end()
        start = text.find("![", done)
    # An `![` never closed shows as typed; the escape keeps it from becoming an image.
    out.append(text[done:].replace("![", "!\\["))
    return "".join(out)


def link_scheme(text: str, start: int = 0) -> str | None:
    """The scheme, lower case, of the link destination written at `start`, as the browser would
    read it; None for a relative reference (no scheme: it resolves to the page's own address)."""
    plain = _PLAIN_SCHEME_RE.match(text, start)
    after = plain.group(2)
    if after == ":":
        return plain.group(1).lower() if plain.group(1) else None
    if not (after in _SLOW_SCHEME_CHARS or (after and (after <= " " or after == "\x7f"))):
        return None
    # Entities, escapes or whitespace in the scheme: read it one character at a time, as decoded.
    # This stops at the first character that cannot be in a scheme, so it covers no other link start.
    scheme: list[str] = []
    pointy = False
    pos, size = start, len(text)
    while pos < size:
        char = text[pos]
        pos += 1
        if char == "&" and (entity := _ENTITY_RE.match(text, pos - 1)):
            chars, pos = html.unescape(entity.group()), entity.end()
        elif char == "\\" and pos < size and text[pos] in string.punctuation:
            chars, pos = text[pos], pos + 1
        else:
            chars = char
        for c in chars:
            if c <= " " or c == "\x7f":  # the browser drops tabs and newlines, and spaces at either end
                continue
            if c == "<" and not scheme and not pointy:  # `<url>`
                pointy = True
            elif c == ":":
                return "".join(scheme).lower() if scheme else None
            elif c in _SCHEME_CHARS and (scheme or c.isalpha()):
                scheme.append(c)
            else:
                return None
    return None


def clickable(scheme: str | None) -> bool:
    return scheme is None or scheme in CLICKABLE_SCHEMES


def _inert_links(text: str) -> str:
    """Every link whose destination the browser would not open as http, https or mailto, as text."""
    out, done = [], 0
    for match in _LINK_START_RE.finditer(text):
        at = match.start()
        if match.group(1) is not None:  # `<scheme:...>`: `&lt;` leaves it text, whatever comes before
            if match.group(1).lower() not in CLICKABLE_SCHEMES:
                out.append(text[done:at])
                out.append("&lt;")
                done = at + 1
        elif not clickable(link_scheme(text, at + 2)):  # `](` or `]:`: an escape between them breaks it
            out.append(text[done:at + 1])
            out.append("\\")
            done = at + 1
    out.append(text[done:])
    return "".join(out)


def safe_markdown(text: str | None) -> str:
    """Markdown with every image replaced by its alt text, links kept only to web pages and mail
    addresses, and media tags shown as text."""
    if not text:
        return ""
    return _HTML_TAG_RE.sub("&lt;", _inert_links(_without_images(text)))


_MARKDOWN_SPECIAL_RE = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:])")


def inert(text) -> str:
    """Untrusted text for a label, caption or alert: every Markdown character escaped, so it shows as
    typed (a tool name like `![](http://…)` must not become an image the browser fetches)."""
    return _MARKDOWN_SPECIAL_RE.sub(r"\\\1", str(text if text is not None else "")).replace("\n", " ")
