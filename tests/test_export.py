"""The Markdown export, opened in a viewer that renders raw HTML: whatever any stored field holds, the
file has no image, no raw HTML and no link but to a web page or a mail address, so the viewer fetches
nothing and runs nothing. Read by a real CommonMark/GFM parser (micromark, see tests/test_markdown.py)."""

from __future__ import annotations

import copy
import random
from html.parser import HTMLParser

import pytest

from agent.conversation.export import to_markdown
from tests.test_markdown import browser_scheme, parsed_html

HOST = "http://canary.test"
# What a person or a model may write to make a viewer fetch or run something: images, every tag that
# loads a resource, attributes that do, links to other schemes, and text that tries to leave the code
# block or quote it is written in.
HOSTILE = [
    f'![t]({HOST}/title.png) … <a href="javascript:alert(1)">x</a>',
    f'<input type=image src="{HOST}/input.png">',
    f'<p style="background-image:url({HOST}/style.png)">x</p>',
    f'<table background="{HOST}/table.png"><tr><td>x</td></tr></table>',
    f'<img src="{HOST}/img.png" onerror=alert(1)>',
    "<input type=image src=unquoted.png> <IMG SRC=upper.png> <img src=//canary.test/relative.png>",
    f'<svg><image href="{HOST}/svg.png"/></svg>',
    f'<video poster="{HOST}/poster.png"></video> <audio src="{HOST}/a.mp3"></audio>',
    f'<source src="{HOST}/s.mp4"> <iframe src="{HOST}/frame"></iframe>',
    f'<object data="{HOST}/o"></object> <embed src="{HOST}/e">',
    f'<link rel=stylesheet href="{HOST}/l.css"> <script src="{HOST}/s.js"></script>',
    f"<style>@import url({HOST}/i.css)</style>",
    f'<div>\n\n<img src="{HOST}/block.png">\n\n</div>',
    f'<!-- c --><img src="{HOST}/comment.png"> <?pi?> <!DOCTYPE x> <![CDATA[<img src="{HOST}/cdata.png">]]>',
    f'</blockquote><img src="{HOST}/close.png">',
    "[x](javascript:alert(1)) [y]( JaVaScRiPt&colon;alert(1)) <javascript:alert(1)> [z]: data:text/html,x\n\n[z]",
    f"![a][r]\n\n[r]: {HOST}/ref.png",
    f"[r]: {HOST}/ref2.png",
    "![a][r]",
    f'```\n<img src="{HOST}/fenced.png">\n```',
    f'```\n\t```\n<img src="{HOST}/tab.png">\n```',
    f'```\n```\n<img src="{HOST}/after.png">',
    f'~~~\n<img src="{HOST}/tilde.png">',
    f'`<img src="{HOST}/span.png">`',
    f'[x](`) <img src="{HOST}/span-pairing.png"> `',
    f'a\r<img src="{HOST}/cr.png">\r\n```\r\n<img src="{HOST}/crlf.png">\r\n```',
    f'| a |\n| - |\n| <img src="{HOST}/cell.png"> |',
    f'> a\n<img src="{HOST}/lazy.png">',
    f'- [ ] task <img src="{HOST}/task.png">',
    f'# <img src="{HOST}/heading.png">\nline\n===',
    f'&lt;img src="{HOST}/entity.png"&gt; &#60;img src="{HOST}/num.png"&#62;',
    "````" + f'\n<img src="{HOST}/long-fence.png">\n' + "`" * 12,
    "`" * 3 + "\n", "\n" + "`" * 7, "~~~", "$$\n", ":::x\n", "<pre>", "<textarea>", "\\", "*", "_", "|", "\n\n",
    f'<a href="{HOST}/ok">web page</a> <a href="vbscript:x">vb</a> <form action="{HOST}/f"><button>b</button></form>',
    f'<math><mi xlink:href="{HOST}/m">x</mi></math> <body background="{HOST}/body.png"> <td background=x>',
    f'<img\nsrc="{HOST}/multiline.png">', f'<img/src="{HOST}/slash.png">', f'< img src="{HOST}/space.png">',
]

# Tags and attributes that Markdown itself produces (GFM: tables, task lists, footnotes, strikethrough).
MARKDOWN_TAGS = {"p", "blockquote", "pre", "code", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "a", "ul",
                 "ol", "li", "hr", "br", "table", "thead", "tbody", "tr", "th", "td", "del", "input", "section",
                 "sup"}
MARKDOWN_ATTRIBUTES = {"href", "title", "class", "id", "type", "checked", "disabled", "start", "align",
                       "data-footnotes", "data-footnote-ref", "data-footnote-backref", "aria-describedby",
                       "aria-label", "dir"}


class _Audit(HTMLParser):
    """Everything in rendered HTML that Markdown did not make, or that could fetch or run."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in MARKDOWN_TAGS:
            self.found.append(f"<{tag}>")
        for name, value in attrs:
            if name not in MARKDOWN_ATTRIBUTES:
                self.found.append(f"<{tag} {name}=>")
            elif name == "href" and browser_scheme(value or "") not in (None, "http", "https", "mailto"):
                self.found.append(f"<{tag} href={value}>")
        if tag == "input" and dict(attrs).get("type") != "checkbox":  # a task list's box is the only input
            self.found.append(f"<input type={dict(attrs).get('type')}>")

    handle_startendtag = handle_starttag

    def handle_comment(self, data):
        self.found.append(f"<!--{data}-->")

    def handle_decl(self, decl):
        self.found.append(f"<!{decl}>")

    def handle_pi(self, data):
        self.found.append(f"<?{data}>")

    def unknown_decl(self, data):
        self.found.append(f"<![{data}]>")


def what_fetches_or_runs(page: str) -> list[str]:
    audit = _Audit()
    audit.feed(page)
    audit.close()
    return audit.found


def base_state() -> dict:
    """Two turns with every kind of message, tool call, step and ending the export writes."""
    call = {"id": "k1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1"}'}}
    return {
        "conversation_id": "c0ffee", "turn_id": "t2", "version": 9, "done": True, "status": "failed",
        "error": {"kind": "provider", "message": "The model call failed."}, "updated_at": 1.7e9,
        "deadline_at": 1.7e9, "job_timeout_at": 1.7e9, "started_at": 1.7e9, "enqueued_at": 1.7e9,
        "current_step": None, "config": {"provider": "demo", "model": "demo"}, "job_id": "j",
        "history": [
            {"role": "user", "content": "What is 1?"},
            {"role": "assistant", "content": "Let me see.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "k1", "content": "1"},
            {"role": "assistant", "content": "It is 1."},
            {"role": "user", "content": "And 2?"},
            {"role": "assistant", "content": "The model call failed."},
        ],
        "steps": [{"turn_id": "t1", "index": 1, "kind": "tool", "name": "calculator", "started_at": 1.7e9,
                   "ended_at": 1.7e9, "timeout_s": 1.0, "remaining_s": 1.0, "outcome": "ok", "duration_s": 0.1,
                   "arguments": "{}", "result": "1", "detail": "d", "call_id": "k1"}],
        "turns": [{"turn_id": "t1", "status": "done", "error": {"kind": "k", "message": "m"}, "ended_at": 1.7e9}],
    }


def string_slots(value, path=()):
    """The path of every string the state holds: each is a field an export may write."""
    if isinstance(value, str):
        yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from string_slots(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from string_slots(item, (*path, index))


SLOTS = [("title",), *string_slots(base_state())]


def exported(payloads: dict) -> str:
    """The Markdown export of the base state with each slot's payload in it."""
    state, title = copy.deepcopy(base_state()), "Sums"
    for path, payload in payloads.items():
        if path == ("title",):
            title = payload
            continue
        holder = state
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = payload
    return to_markdown(state, title)


def assert_nothing_fetches(cases: list[tuple[str, str]]) -> None:
    pages = parsed_html([markdown for _, markdown in cases], raw_html=True)
    for (what, markdown), page in zip(cases, pages, strict=True):
        found = what_fetches_or_runs(page)
        assert not found, f"{what}: {found}\n--- markdown:\n{markdown}\n--- html:\n{page}"


def test_the_audit_finds_what_the_review_saw_fetched_when_it_is_written_raw():
    raw = "\n\n".join(HOSTILE[:5])
    found = what_fetches_or_runs(parsed_html([raw], raw_html=True)[0])
    assert {"<img src=>", "<input src=>", "<input type=image>", "<p style=>", "<table background=>",
            "<a href=javascript:alert(1)>"} <= set(found), found


def test_no_field_of_a_conversation_makes_an_exported_file_fetch_or_run_anything():
    # One parse for all (a node process per field costs seconds on a busy machine); the message names the field.
    assert_nothing_fetches([(f"{slot} = {payload!r}", exported({slot: payload}))
                            for slot in SLOTS for payload in HOSTILE])


def test_hostile_text_in_every_field_at_once_makes_an_exported_file_fetch_or_run_nothing():
    rng = random.Random(0)
    cases = [(f"every field = {payload!r}", exported(dict.fromkeys(SLOTS, payload))) for payload in HOSTILE]
    for _ in range(200):  # each field its own payload: text left open in one may meet the next
        payloads = {slot: rng.choice(HOSTILE) for slot in SLOTS}
        cases.append((repr(payloads), exported(payloads)))
    assert_nothing_fetches(cases)


def test_an_export_keeps_the_text_a_person_wrote_readable():
    markdown = exported({("history", 0, "content"): "is 2 < 3 and x<y? <b>bold</b>\n```html\n<p>kept</p>\n```",
                         ("title",): "Sums <b> & `x`"})
    assert markdown.startswith("# Sums \\<b\\> & \\`x\\`\n")
    assert "is 2 < 3 and x&lt;y? &lt;b>bold&lt;/b>" in markdown  # shown as typed, never as a tag
    assert "  > ```html\n  > <p>kept</p>\n  > ```" in markdown  # fenced code as written
    page = parsed_html([markdown], raw_html=True)[0]
    assert "is 2 &lt; 3 and x&lt;y? &lt;b&gt;bold&lt;/b&gt;" in page and "&lt;p&gt;kept&lt;/p&gt;" in page


@pytest.mark.parametrize("when", [-1e11, 1e11, 0, 1e300, "soon", [1], True])
def test_an_ending_time_no_calendar_has_is_written_as_stored(when):
    state = base_state()
    state["turns"][0]["ended_at"] = when
    state["updated_at"] = when
    markdown = to_markdown(state)
    assert "*Ending: answered" in markdown
