"""Rendering untrusted text: no image, no link the browser would follow but to a web page or a mail
address, and a cost linear in the text's length (the page renders a reply holding the GIL, so a slow
render freezes every session of the server)."""

from __future__ import annotations

import random
import re
import time

import pytest

from agent.ui.markdown import inert, safe_markdown

MB = 1_000_000
QUARTER_MB = MB // 4
RENDER_BOUND_S = 2.0  # CPU seconds for 1 MB of any text: 0.5 s is the goal on an idle machine, and this one is busy
GROWTH_BOUND = 8.0  # 4x the text may cost at most 8x the CPU time: linear is 4x, quadratic 16x
TIMING_FLOOR_S = 0.02  # a 256 KB render faster than this is noise: the growth is taken against this

# Markdown, HTML and URL syntax a renderer may scan for; every prefix of each is repeated on its own.
SYNTAX = [
    '![alt](http://e.test/x.png "t")', "![a][r]", "[a](b)", "[a][b]", "[a]: data:x", "[^1]: x",
    "<a href=x>", "<data:x>", "<img src=x>", "< img", "`code`", "```", "**b**", "_e_", "\\\\", "~~s~~",
    "javascript:", "&#106;", "&Tab;", "&colon;", "](&#58;", "]( a ", "](\\:", "]:<d ", "$x$",
]
SHAPES = ["[" * 8 + "]" * 8, "(" * 8 + ")" * 8, "[[[(((", "]]])))", "![[](", " ", "\n", " \n", "\t", "\n\n>",
          "a", "-"]


def repeated(pattern: str, size: int) -> str:
    return (pattern * (size // len(pattern) + 1))[:size]


def patterns() -> list[str]:
    found = {p[:i] for p in SYNTAX for i in range(1, len(p) + 1)} | set(SHAPES)
    return sorted(found)


def random_mix(seed: int, size: int) -> str:
    rng = random.Random(seed)
    pieces = patterns() + ["data:", "http://x", "word ", "#", "*", "\\", "!"]
    out, length = [], 0
    while length < size:
        piece = rng.choice(pieces) * rng.choice((1, 1, 2, 7, 50))
        out.append(piece)
        length += len(piece)
    return "".join(out)[:size]


def cpu_seconds(text: str) -> float:
    started = time.process_time()
    safe_markdown(text)
    return time.process_time() - started


def render_costs(make) -> tuple[float, float]:
    """CPU seconds for 256 KB and 1 MB, side by side; measured again once if either looks slow, so
    a burst from a neighbour on this busy machine does not fail the test."""
    small, large = make(QUARTER_MB), make(MB)
    quarter, whole = cpu_seconds(small), cpu_seconds(large)
    if whole > RENDER_BOUND_S or whole / max(quarter, TIMING_FLOOR_S) > GROWTH_BOUND:
        quarter, whole = min(quarter, cpu_seconds(small)), min(whole, cpu_seconds(large))
    return quarter, whole


def test_a_32_kb_run_of_image_openers_renders_at_once():
    assert cpu_seconds("![" * 16_384) < RENDER_BOUND_S / 4


@pytest.mark.parametrize("pattern", patterns())
def test_a_megabyte_of_any_repeated_syntax_renders_in_linear_time(pattern):
    quarter, whole = render_costs(lambda size: repeated(pattern, size))
    assert whole < RENDER_BOUND_S, f"{pattern!r}: 1 MB took {whole:.2f} s"
    assert whole / max(quarter, TIMING_FLOOR_S) < GROWTH_BOUND, f"{pattern!r}: {quarter:.3f} s -> {whole:.3f} s"


@pytest.mark.parametrize("seed", range(4))
def test_a_megabyte_of_random_markdown_renders_in_linear_time(seed):
    quarter, whole = render_costs(lambda size: random_mix(seed, size))
    assert whole < RENDER_BOUND_S, f"seed {seed}: 1 MB took {whole:.2f} s"
    assert whole / max(quarter, TIMING_FLOOR_S) < GROWTH_BOUND, f"seed {seed}: {quarter:.3f} s -> {whole:.3f} s"


@pytest.mark.parametrize("seed", range(4))
def test_no_random_text_leaves_an_image_opener(seed):
    text = random_mix(seed, 50_000)
    assert "![" not in safe_markdown(text)


def test_images_become_their_alt_text_and_links_to_web_pages_stay():
    text = safe_markdown('a ![x](http://e/1.png "t") b ![y][r] c ![z] <IMG src=x> [link](http://ok) ![open')
    assert text == ("a (image not shown: x) b (image not shown: y) c (image not shown: z) &lt;IMG src=x> "
                    "[link](http://ok) !\\[open")


# -- which links stay clickable ------------------------------------------------------------------

OTHER_SCHEMES = ["data", "javascript", "vbscript", "file", "blob", "ftp", "about", "chrome", "intent",
                 "ms-settings", "x+y.z-w", "httpx", "mailto2", "ht"]


def scheme_spellings(scheme: str) -> list[str]:
    """`scheme:` as a destination may spell it: each is read by the browser as that scheme, or (for
    some) as a harmless relative address; none may stay clickable."""
    head, tail = scheme[0], scheme[1:]
    return [
        f"{scheme}:", f"{scheme.upper()}:", f"{head.upper()}{tail}:", f" {scheme}:", f"\t{scheme}:",
        f"{head}\t{tail}:", f"{head}\n{tail}:", f"{head}\x01{tail}:", f"{head}&Tab;{tail}:",
        f"{head}&NewLine;{tail}:", f"{scheme}&#58;", f"{scheme}&#x3a;", f"{scheme}&#X3A;", f"{scheme}&colon;",
        f"{scheme}&#0000058;", f"&#{ord(head)};{tail}:", f"&#x{ord(head):x};{tail}:", f"{scheme}\\:",
        f"&Tab;{scheme}:", f"&#32;{scheme}:",
    ]


def link_forms(destination: str) -> list[str]:
    return [f"[x]({destination}rest)", f"[x]( {destination}rest \"title\")", f"[x](<{destination}rest>)",
            f"[x]:\n  {destination}rest\n\n[x]", f"[x]: <{destination}rest> 'title'\n\n[x][]",
            f"![x]({destination}rest)", f"[![x](http://ok)]({destination}rest)"]


def live_link_syntax(markdown: str) -> list[str]:
    """What is left in rendered Markdown that could still make a link or an image."""
    return re.findall(r"!\[|\]\(|\]:|<[A-Za-z][A-Za-z0-9+.\-]*:[^<>\x00-\x20]*>", markdown)


@pytest.mark.parametrize("scheme", OTHER_SCHEMES)
def test_a_link_to_any_scheme_but_http_https_and_mailto_is_shown_as_text(scheme):
    for spelling in scheme_spellings(scheme):
        for markdown in link_forms(spelling):
            shown = safe_markdown(markdown)
            assert live_link_syntax(shown) == [], f"{markdown!r} -> {shown!r}"


@pytest.mark.parametrize("scheme", OTHER_SCHEMES)
def test_an_autolink_to_any_scheme_but_http_https_and_mailto_is_shown_as_text(scheme):
    for spelling in (scheme, scheme.upper(), scheme[0].upper() + scheme[1:]):
        shown = safe_markdown(f"see <{spelling}:rest> and <{spelling}:a b> now")
        assert live_link_syntax(shown) == [], shown


ALLOWED = ["http://e.test/a", "HTTPS://e.test/a", "https://e.test/a(b)", "mailto:someone@e.test",
           "http&#58;//e.test/", "#anchor", "/page", "?c=abc", "//e.test/x", "page.html", "a/b:c", "%64ata:x"]


@pytest.mark.parametrize("destination", ALLOWED)
def test_a_link_to_a_web_page_a_mail_address_or_this_page_stays_as_written(destination):
    for markdown in (f"[x]({destination})", f"[x]: {destination}\n\n[x]", f"[x](<{destination}>)"):
        assert safe_markdown(markdown) == markdown
    if re.match(r"(?i)(https?|mailto):[^\s<>&]*$", destination):
        assert safe_markdown(f"<{destination}>") == f"<{destination}>"


def test_code_that_looks_like_a_relative_link_is_left_alone():
    code = "```ts\nconst f = handlers[name](event);\ntype M = { [key: string]: number };\n```"
    assert safe_markdown(code) == code


def test_a_neutralised_link_shows_its_text_and_address_as_typed():
    assert safe_markdown("[click](data:text/html,hi) <data:x> [r]: vbscript:y") == (
        "[click]\\(data:text/html,hi) &lt;data:x> [r]\\: vbscript:y")


def test_labels_show_every_markdown_character_as_typed():
    assert inert("![x](data:y) <b>") == "\\!\\[x\\]\\(data\\:y\\) \\<b\\>"
