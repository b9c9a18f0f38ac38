"""A model reply is untrusted text: render it as Markdown without HTML, without images, and with no
link the browser would follow to anything but a web page or a mail address.

`st.markdown` escapes HTML by default but still renders Markdown images, which would make the
browser fetch any URL the model names, and it keeps links of every scheme but `javascript:` and
`vbscript:` (a `data:` or `file:` link stays clickable). Images become plain text; a link stays
only when the browser would resolve it to http, https or mailto (a relative one resolves to the
page's own address), judged the way the browser sees it: entities and escapes decoded, case folded,
whitespace and control characters dropped, wherever the destination starts (also on the next line,
behind a block quote's `>`). Any other link is shown as the text it was written as. Fenced code is
shown as written where the page's parser surely reads it as code.

Every pass is linear in the length of the text: the page renders a reply while holding the GIL, so a
quadratic pattern on one long reply would freeze every session of the server. No pattern below
can backtrack (possessive quantifiers), and no two scans cover the same stretch of text more than
twice (see each one's comment). The common cases are judged inside `re` (a substitution with a fixed
replacement), so that Python runs per link only for an entity, an escape or a control character.
"""

from __future__ import annotations

import functools
import html
import re

# `![alt]` and what follows it: `(url "title")` with one level of parentheses inside, or `[ref]`.
# The alt text ends at its first `]` (`\]` does not end it); it cannot hold an `![`, so a match that
# fails stops at the next `![` (escaped or not), where the next try starts: no stretch is read twice.
# A failed destination stops at its second unclosed `(` or at the end, and a later image inside that
# stretch stops at its first `)`, so no stretch is read more than twice. `[ref]` stops at the next `]`.
_IMAGE_RE = re.compile(r"!\[((?:[^\]\\!]++|\\(?!!\[).|!(?!\[))*+)\]"
                       r"(?:\((?:[^()\\]++|\\.|\([^()]*+\))*+\)|\[[^\]]*+\])?", re.DOTALL)
# What may come between `](` or `]:` and a destination's first character: spaces, tabs and control
# characters (the browser drops them), and after a line ending also the next line's container
# prefix (a block quote's `>`, a list item's indentation), then the `<` of `<url>`. Judged wider than
# CommonMark (any number of line endings and `>`), so that no form is missed.
_BLANK = r"\x00-\x09\x0b\x0c\x0e-\x20\x7f"  # blanks and control characters but the line endings
_LEAD = rf"(?>[{_BLANK}]*+(?:[\n\r][\x00-\x20\x7f>]*+)?(?:<[{_BLANK}]*+)?)"
_SCHEME = r"[A-Za-z][A-Za-z0-9+.\-]*+"
_ENTITY = r"&(?:#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});"  # as CommonMark reads one
_ESCAPE = r"\\[!-/:-@\[-`{-~]"
# The `]` of a `](` or `]:` whose destination is a plain scheme other than http, https or mailto:
# an escape after it (inserted by a substitution, no Python per match) leaves it text.
_PLAIN_LINK_RE = re.compile(rf"\](?=[(:]{_LEAD}(?!(?i:https?|mailto):){_SCHEME}:)")
# The `]` of a `](` or `]:` whose scheme, if any, has an entity, a control character or an escaped
# character that can be in a scheme in it: judged by `link_scheme`, decoded (any other escaped
# character ends the scheme). Each lookahead stops at the first character that cannot be in a scheme
# (a `(`, `)`, `]` or `:` among them), so no two of them cover the same stretch.
_ODD_LINK_RE = re.compile(rf"\](?=[(:]{_LEAD}(?:{_SCHEME})?(?:{_ENTITY}|\\[+.\-:<]|[\x00-\x09\x0b\x0c\x0e-\x1f\x7f]))")
# A destination's first characters before its scheme is decided: no raw line ending (a scheme cannot
# span one: CommonMark ends the destination there), nor `(`, `)`, `]` or `:`.
_SCHEME_AREA_RE = re.compile(rf"{_LEAD}((?:[A-Za-z0-9+.\-<{_BLANK}]++|{_ESCAPE}|{_ENTITY})*+)")
_ENTITY_OR_ESCAPE_RE = re.compile(rf"{_ESCAPE}|{_ENTITY}")
# The scheme of a decoded destination: blanks before it dropped, and tabs, line endings and control
# characters inside it (the browser drops tabs and newlines; the rest is judged as dropped too). A
# space inside ends it, as it does for the browser.
_DECODED_SCHEME_RE = re.compile(r"[\x00-\x20\x7f]*+(?:<[\x00-\x20\x7f]*+)?([A-Za-z][A-Za-z0-9+.\-\x00-\x1f\x7f]*+):")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
CLICKABLE_SCHEMES = frozenset({"http", "https", "mailto"})  # and relative links, which stay on this page
# A `<` to show as text: an autolink `<scheme:...>` to anything but http, https or mailto (judged
# wider than CommonMark's, with spaces and any length, so none is missed; each lookahead stops at the
# next `<` or `>`), or raw HTML that could fetch or embed something, escaped even though st.markdown
# escapes HTML too (the first lookahead is a cheap filter: a run of `<` costs one step each, not a
# try of every tag name).
_LESS_THAN_RE = re.compile(
    rf"<(?:(?=(?!(?i:https?|mailto):){_SCHEME}:[^<>]*+>)"
    r"|(?=/?\s*+[a-z])(?=/?\s*+(?:img|picture|source|video|audio|iframe|object|embed|svg|image|link|script)\b))",
    re.IGNORECASE)
# Fenced code is shown as written (inside it nothing is a link or an image), but only where the page's
# parser surely sees one: an opening fence at the start of a line (no container can hold it, and it
# interrupts any paragraph) with no line before it that could start an HTML, math or directive block,
# which a fence line does not end. The closing fence is read exactly as CommonMark reads it.
_FENCE_OR_BLOCK_RE = re.compile(r"^(?:(`{3,}+)(?![^`\n]*+`)|(~{3,}+)|[ \t>*+\-0-9.)]*+(?:<|\$\$|:::))", re.MULTILINE)
_CLOSING_FENCE_RE = re.compile(r"^ {0,3}+(`{3,}+|~{3,}+)[ \t]*+$", re.MULTILINE)


def _alt_text(image: re.Match) -> str:
    alt = image.group(1).strip().replace("[", "(").replace("]", ")")
    return f"(image not shown: {alt})" if alt else "(image not shown)"


def _without_images(text: str) -> str:
    """Every `![...]` image as its alt text, and every other `![` broken, so that no image is left."""
    # An `![` never closed shows as typed; the escape keeps it from becoming an image. An alt text
    # holds no `[`, so no `![` is made by the first substitution.
    return _IMAGE_RE.sub(_alt_text, text).replace("![", "!\\[")


def link_scheme(text: str, start: int = 0) -> str | None:
    """The scheme, lower case, of the link destination written at `start`, as the browser would
    read it; None for a relative reference (no scheme: it resolves to the page's own address)."""
    area = _SCHEME_AREA_RE.match(text, start)
    return _decoded_scheme(area.group(1) + text[area.end():area.end() + 1])


@functools.lru_cache(maxsize=256)  # a long reply repeats the same few destinations
def _decoded_scheme(area: str) -> str | None:
    if "&" in area or "\\" in area:
        area = _ENTITY_OR_ESCAPE_RE.sub(_decoded, area)
    scheme = _DECODED_SCHEME_RE.match(area)
    return _CONTROL_RE.sub("", scheme.group(1)).lower() if scheme else None


def _decoded(unit: re.Match) -> str:
    found = unit.group()
    return found[1] if found[0] == "\\" else html.unescape(found)


def clickable(scheme: str | None) -> bool:
    return scheme is None or scheme in CLICKABLE_SCHEMES


def _judged_link(match: re.Match) -> str:
    return "]" if clickable(link_scheme(match.string, match.end() + 1)) else "]\\"


def _inert_links(text: str) -> str:
    """Every link whose destination the browser would not open as http, https or mailto, as text:
    an escape between `]` and `(` or `:` breaks it, a `&lt;` an autolink."""
    text = _ODD_LINK_RE.sub(_judged_link, _PLAIN_LINK_RE.sub(r"]\\", text))
    return _LESS_THAN_RE.sub("&lt;", text)


def _outside_code(text: str, html_blocks: bool = True):
    """(is code, stretch) for each stretch of the text: fenced code, or the text between. With
    `html_blocks` false, the caller makes every `<` between the stretches inert, so none opens a block."""
    if "\r" in text:  # a lone CR ends a line for CommonMark and not for `re`: no stretch is taken as code
        yield False, text
        return
    done = pos = 0
    while (fence := _FENCE_OR_BLOCK_RE.search(text, pos)) is not None:
        marker = fence.group(1) or fence.group(2)
        if marker is None and not html_blocks and fence.group().endswith("<"):
            pos = fence.end()
            continue
        if marker is None:  # an HTML, math or directive block may start here: no code after it
            break
        end = len(text)
        for closing in _CLOSING_FENCE_RE.finditer(text, fence.end()):
            if closing.group(1)[0] == marker[0] and len(closing.group(1)) >= len(marker):
                end = closing.end()
                break
        yield False, text[done:fence.start()]
        yield True, text[fence.start():end]
        done = pos = end
    yield False, text[done:]


def safe_markdown(text: str | None) -> str:
    """Markdown with every image replaced by its alt text, links kept only to web pages and mail
    addresses, and media tags shown as text; fenced code as written."""
    if not text:
        return ""
    return "".join(part if code else _inert_links(_without_images(part)) for code, part in _outside_code(text))


# A `<` that could open raw HTML (a tag, an end tag, a comment, a declaration, a processing
# instruction) or an autolink: CommonMark and the browser both need a letter, `/`, `!` or `?` after it.
_TAG_OPENER_RE = re.compile(r"<(?=[A-Za-z/!?])")
_LINE_ENDING_RE = re.compile(r"\r\n?+")


def no_html_markdown(text: str | None) -> str:
    """`safe_markdown` for a file that any viewer may open, one that passes HTML included: also no raw
    HTML at all (every `<` that could open a tag or an autolink written `&lt;`), line endings as `\n`.

    Fenced code (surely code, see `_outside_code`) is left as written: a viewer shows it as text. An
    inline code span is not exempt: which backticks pair up depends on what the viewer's parser reads
    before them (`[x](`) <img> `` is a link, raw HTML, then a lone backtick), so a `<` in one is
    written `&lt;` too (shown so), rather than left to a guess."""
    if not text:
        return ""
    text = _LINE_ENDING_RE.sub("\n", text)  # a lone CR ends a line for CommonMark: the same lines for the fences
    return "".join(part if code else _TAG_OPENER_RE.sub("&lt;", _inert_links(_without_images(part)))
                   for code, part in _outside_code(text, html_blocks=False))


_MARKDOWN_SPECIAL_RE = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:])")


def inert(text) -> str:
    """Untrusted text for a label, caption or alert: every Markdown character escaped, so it shows as
    typed (a tool name like `![](http://…)` must not become an image the browser fetches)."""
    return _MARKDOWN_SPECIAL_RE.sub(r"\\\1", str(text if text is not None else "")).replace("\n", " ")
