"""Rendering untrusted text: no image, no link the browser would follow but to a web page or a mail
address, and a cost linear in the text's length (the page renders a reply holding the GIL, so a slow
render freezes every session of the server)."""

from __future__ import annotations

import html
import json
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.text.markdown import inert, no_html_markdown, safe_markdown
from tests.conftest import cpu_seconds, repeated

MB = 1_000_000
QUARTER_MB = MB // 4
RENDER_BOUND_S = 1.0  # CPU seconds for 1 MB of any text: 0.5 s is the goal on an idle machine, and this one is busy
# The ~190 patterns are each timed at a quarter of the size (64 and 256 KB: the same 4x growth, the same
# rate bound), a quarter of the sweep's CPU; random text and the file export's shapes are timed at 1 MB.
SWEEP_SIZES = (MB // 16, MB // 4)
GROWTH_BOUND = 8.0  # 4x the text may cost at most 8x the CPU time: linear is 4x, quadratic 16x
TIMING_FLOOR_S = 0.02  # a 256 KB render faster than this is noise: the growth is taken against this

# Markdown, HTML and URL syntax a renderer may scan for; every prefix of each is repeated on its own.
SYNTAX = [
    '![alt](http://e.test/x.png "t")', "![a][r]", "[a](b)", "[a][b]", "[a]: data:x", "[^1]: x",
    "<a href=x>", "<data:x>", "<img src=x>", "< img", "`code`", "```", "**b**", "_e_", "\\\\", "~~s~~",
    "javascript:", "&#106;", "&Tab;", "&colon;", "](&#58;", "]( a ", "](\\:", "]:<d ", "$x$",
]
SHAPES = ["[" * 8 + "]" * 8, "(" * 8 + ")" * 8, "[[[(((", "]]])))", "![[](", " ", "\n", " \n", "\t", "\n\n>",
          "a", "-", "![]]", "![]", "](&#1;"]  # the last three: alt text and entities, worst cases once


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


def render_seconds(text: str) -> float:
    """CPU seconds of this thread for rendering `text` (see tests.conftest.cpu_seconds)."""
    return cpu_seconds(safe_markdown, text)


def bounds(large: int) -> tuple[float, float]:
    """For a text of `large` characters: the CPU seconds it may take (RENDER_BOUND_S a megabyte), and the
    noise floor of the render a quarter its size (TIMING_FLOOR_S at 1 MB)."""
    return RENDER_BOUND_S * large / MB, TIMING_FLOOR_S * large / MB


def render_costs(make, sizes: tuple[int, int] = (QUARTER_MB, MB), render=safe_markdown) -> tuple[float, float]:
    """CPU seconds for a text and one 4x as long (256 KB and 1 MB unless told), side by side; measured
    again once if either looks slow, so a burst from a neighbour on this busy machine does not fail the
    test."""
    small, large = make(sizes[0]), make(sizes[1])
    bound, floor = bounds(sizes[1])
    quarter, whole = cpu_seconds(render, small), cpu_seconds(render, large)
    if whole > bound or whole / max(quarter, floor) > GROWTH_BOUND:
        quarter, whole = min(quarter, cpu_seconds(render, small)), min(whole, cpu_seconds(render, large))
    return quarter, whole


def test_a_32_kb_run_of_image_openers_renders_at_once():
    assert render_seconds("![" * 16_384) < RENDER_BOUND_S / 4


@pytest.mark.parametrize("pattern", patterns())
def test_any_repeated_syntax_renders_in_linear_time_at_a_megabyte_a_second(pattern):
    large = SWEEP_SIZES[1]
    bound, floor = bounds(large)
    quarter, whole = render_costs(lambda size: repeated(pattern, size), SWEEP_SIZES)
    assert whole < bound, f"{pattern!r}: {large:,} characters took {whole:.2f} s"
    assert whole / max(quarter, floor) < GROWTH_BOUND, f"{pattern!r}: {quarter:.3f} s -> {whole:.3f} s"


@pytest.mark.parametrize("seed", range(4))
def test_a_megabyte_of_random_markdown_renders_in_linear_time(seed):
    quarter, whole = render_costs(lambda size: random_mix(seed, size))
    assert whole < RENDER_BOUND_S, f"seed {seed}: 1 MB took {whole:.2f} s"
    assert whole / max(quarter, TIMING_FLOOR_S) < GROWTH_BOUND, f"seed {seed}: {quarter:.3f} s -> {whole:.3f} s"


# What the file export's pass adds: a `<` at every line start (each one skipped as a block start),
# carriage returns, fences between them, and random text.
NO_HTML_SHAPES = ["<a\n", "<\n```\n", "\r<b>\r\n", "```\n<i>\n```\n<p>\n", "- <x\n", "< <! </ <?"]


@pytest.mark.parametrize("make", [*(lambda size, s=shape: repeated(s, size) for shape in NO_HTML_SHAPES),
                                  lambda size: random_mix(0, size)])
def test_a_megabyte_made_inert_for_a_file_renders_in_linear_time(make):
    large = make(MB)
    quarter, whole = render_costs(make, render=no_html_markdown)
    assert whole < RENDER_BOUND_S, f"{large[:20]!r}: 1 MB took {whole:.2f} s"
    assert whole / max(quarter, TIMING_FLOOR_S) < GROWTH_BOUND, f"{large[:20]!r}: {quarter:.3f} s -> {whole:.3f} s"


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
        f"{head}\t{tail}:", f"{head}\x01{tail}:", f"{head}&Tab;{tail}:",
        f"{head}&NewLine;{tail}:", f"{scheme}&#58;", f"{scheme}&#x3a;", f"{scheme}&#X3A;", f"{scheme}&colon;",
        f"{scheme}&#0000058;", f"&#{ord(head)};{tail}:", f"&#x{ord(head):x};{tail}:", f"{scheme}\\:",
        f"&Tab;{scheme}:", f"&#32;{scheme}:",
    ]


# A block quote, nested or in a list item, as its first line and each next line start: a destination
# may sit on the line after `](` or `]:`, behind the container's markers (or none: a lazy line).
CONTAINERS = [("> ", "> "), ("> ", ">"), ("> ", ""), ("> > ", "> > "), ("> > ", ">>"), ("- > ", "  > "),
              ("1. > ", "   >  "), ("> - ", ">   ")]


def link_forms(destination: str) -> list[str]:
    forms = [f"[x]({destination}rest)", f"[x]( {destination}rest \"title\")", f"[x](<{destination}rest>)",
             f"[x]:\n  {destination}rest\n\n[x]", f"[x]: <{destination}rest> 'title'\n\n[x][]",
             f"![x]({destination}rest)", f"[![x](http://ok)]({destination}rest)"]
    for first, next_line in CONTAINERS:
        forms += [f"{first}[x](\n{next_line}{destination}rest)", f"{first}[x](\n{next_line}<{destination}rest>)",
                  f"{first}[x]:\n{next_line}{destination}rest\n{first}\n{first}[x]"]
    return forms


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


@pytest.mark.parametrize("scheme", OTHER_SCHEMES)
def test_a_line_ending_inside_a_scheme_ends_the_destination_so_the_text_is_left_as_written(scheme):
    for cut in range(1, len(scheme)):
        for markdown in link_forms(f"{scheme[:cut]}\n{scheme[cut:]}:")[:5]:
            assert safe_markdown(markdown) == markdown


def code_samples(seed: int) -> list[str]:
    """Lines of code a reply may show, made of every piece of Markdown syntax there is."""
    rng = random.Random(seed)
    pieces = patterns() + ["data:", "x: int", "\n", "\n", "grid[0]", "<img src=x>", "<data:x>", "`"]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))) for _ in range(40)]


FENCES = [("```", "```"), ("```py", "```"), ("~~~", "~~~"), ("````", "`````"), ("~~~ `x`", "~~~  ")]


@pytest.mark.parametrize("seed", range(4))
def test_fenced_code_is_shown_as_written(seed):
    for body in code_samples(seed):
        if re.search(r"^ {0,3}(```|~~~)", body, re.MULTILINE):
            continue  # a fence in the body ends the block early
        for opening, closing in FENCES:
            for block in (f"{opening}\n{body}\n{closing}", f"{opening}\n{body}", f"a\n{opening}\n{body}\n{closing}\n"):
                assert safe_markdown(block) == block


def test_code_blocks_from_the_review_are_shown_as_written():
    for code in ("```py\ncell = grid[0]: int\nnext: str\n```", "```html\n<data:x> <img src=x> ![a](b)\n```"):
        assert safe_markdown(code) == code
    assert safe_markdown("cell = grid[0]: int\nnext: str") == "cell = grid[0]: int\nnext: str"


# A line that may open a block a fence line does not end (HTML, math, a directive), or a fence that
# a container holds: what follows is not surely code, so a link in it is judged as anywhere else.
NOT_SURELY_CODE = ["<!--\n\n```\n-->\n{link}\n```", "<div>\n```\n\n{link}\n```", "$$\n```\n$$\n{link}\n```",
                   ":::note\n```\n:::\n{link}\n```", "> <pre>\n```\n{link}\n```", "- a\n  ```\n{link}\n  ```",
                   " ```\n{link}\n```", "```\r{link}\r```", "```\n```\n{link}", "~~~\n~~~ x\n~~~\n{link}",
                   "```a`\n{link}\n```", "````\n```\n````\n{link}"]


@pytest.mark.parametrize("shape", NOT_SURELY_CODE)
def test_a_link_after_something_that_is_not_surely_a_code_block_is_still_judged(shape):
    for scheme in OTHER_SCHEMES:
        shown = safe_markdown(shape.format(link=f"[x]({scheme}:y) <{scheme}:y> ![i](http://e.test/i.png)"))
        assert live_link_syntax(shown) == [], shown


def test_code_that_looks_like_a_relative_link_is_left_alone():
    code = "```ts\nconst f = handlers[name](event);\ntype M = { [key: string]: number };\n```"
    assert safe_markdown(code) == code


def test_a_neutralised_link_shows_its_text_and_address_as_typed():
    assert safe_markdown("[click](data:text/html,hi) <data:x> [r]: vbscript:y") == (
        "[click]\\(data:text/html,hi) &lt;data:x> [r]\\: vbscript:y")


def test_labels_show_every_markdown_character_as_typed():
    assert inert("![x](data:y) <b>") == "\\!\\[x\\]\\(data\\:y\\) \\<b\\>"


# -- the same, read by a real Markdown parser ---------------------------------------------------

# Raw HTML escaped (as the page renders) unless the first argument says `html` (as a viewer that
# passes it on does); links of every scheme kept, so that only what was written decides.
PARSER_SCRIPT = """
const {micromark} = require('micromark'); const {gfm, gfmHtml} = require('micromark-extension-gfm');
const texts = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const allowDangerousHtml = process.argv[1] === 'html';
console.log(JSON.stringify(texts.map(text => micromark(text, {extensions: [gfm()], htmlExtensions: [gfmHtml()],
                                                              allowDangerousProtocol: true, allowDangerousHtml}))));
"""
PARSER_TIMEOUT_S = 120  # one parse of a few hundred small documents, on a busy machine


PARSER_MODULES = Path(__file__).parent / "markdown_parser" / "node_modules"  # `make setup` installs it there


def parsed_html(texts: list[str], *, raw_html: bool = False) -> list[str]:
    """Each text as HTML, read by micromark with GFM (the parser the page's Markdown is built on), raw
    HTML passed on with `raw_html`; the test is skipped, saying why, where node or the parser is missing."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node to run micromark (apt-get install nodejs npm, then make setup)")
    if not (PARSER_MODULES / "micromark").is_dir():
        pytest.skip("micromark is not installed: make setup installs it where npm is available")
    done = subprocess.run([node, "-e", PARSER_SCRIPT, "html" if raw_html else "escaped"], input=json.dumps(texts),
                          capture_output=True, text=True, timeout=PARSER_TIMEOUT_S,
                          env={**os.environ, "NODE_PATH": str(PARSER_MODULES)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def browser_scheme(url: str) -> str | None:
    """The scheme the browser reads in an attribute's value, as the URL standard strips it."""
    url = re.sub(r"[\t\n\r]", "", html.unescape(url)).strip("".join(map(chr, range(0x21))))
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.\-]*):", url)
    return scheme.group(1).lower() if scheme else None


# Block structure a reply can use around a link: containers, fences, blocks that hold a fence line.
STRUCTURE = ["\n", "\n", "\n\n", "> ", ">", "- ", "  ", "1. ", "```", "~~~", "```py\n", "\n```\n", "<!--", "-->",
             "<div>", "$$", ":::", "| a |\n| - |\n", "`", "[x]: ", "[x]", "](", "[y](", "(", ")", "<", ">", "\r"]


def hostile_document(rng: random.Random) -> str:
    pieces = []
    for _ in range(rng.randint(3, 14)):
        if rng.random() < 0.3:
            scheme = rng.choice(OTHER_SCHEMES)
            pieces.append(rng.choice(scheme_spellings(scheme)) + "y")
        else:
            pieces.append(rng.choice(STRUCTURE))
    return "".join(pieces)


@pytest.mark.parametrize("seed", range(3))
def test_a_real_markdown_parser_finds_no_link_or_image_to_another_scheme_in_a_rendered_reply(seed):
    rng = random.Random(seed)
    texts = [hostile_document(rng) for _ in range(400)]
    if seed == 0:  # and every spelling of every scheme in every link form
        texts += [form for scheme in OTHER_SCHEMES for spelling in scheme_spellings(scheme)
                  for form in link_forms(spelling)]
    for text, page in zip(texts, parsed_html([safe_markdown(text) for text in texts]), strict=True):
        assert "<img" not in page, (text, page)
        for url in re.findall(r'(?:href|src)="([^"]*)"', page):
            assert browser_scheme(url) in (None, "http", "https", "mailto"), (text, page)
