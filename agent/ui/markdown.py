"""A model reply is untrusted text: render it as Markdown without HTML and without images.

`st.markdown` escapes HTML by default but still renders Markdown images, which would make the
browser fetch any URL the model names. Images become plain text; links may stay.
"""

from __future__ import annotations

import re

# ![alt](url "title") and ![alt][ref] / ![alt][] / ![alt] (reference-style)
_INLINE_IMAGE_RE = re.compile(r"!\[((?:[^\]\\]|\\.)*)\]\((?:[^()\\]|\\.|\([^()]*\))*\)")
_REFERENCE_IMAGE_RE = re.compile(r"!\[((?:[^\]\\]|\\.)*)\](?:\[[^\]]*\])?")
# Raw HTML that could fetch or embed something, escaped even though st.markdown escapes HTML too.
_HTML_TAG_RE = re.compile(r"<(?=/?\s*(?:img|picture|source|video|audio|iframe|object|embed|svg|image|link|script)\b)",
                          re.IGNORECASE)


def _alt_text(match: re.Match) -> str:
    alt = match.group(1).strip().replace("[", "(").replace("]", ")")
    return f"(image not shown: {alt})" if alt else "(image not shown)"


def safe_markdown(text: str | None) -> str:
    """Markdown with every image replaced by its alt text and media tags shown as text."""
    if not text:
        return ""
    previous = None
    while previous != text:  # nested or overlapping images: repeat until nothing is left
        previous = text
        text = _INLINE_IMAGE_RE.sub(_alt_text, text)
        text = _REFERENCE_IMAGE_RE.sub(_alt_text, text)
    return _HTML_TAG_RE.sub("&lt;", text)


_MARKDOWN_SPECIAL_RE = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:])")


def inert(text) -> str:
    """Untrusted text for a label, caption or alert: every Markdown character escaped, so it shows as
    typed (a tool name like `![](http://…)` must not become an image the browser fetches)."""
    return _MARKDOWN_SPECIAL_RE.sub(r"\\\1", str(text if text is not None else "")).replace("\n", " ")
