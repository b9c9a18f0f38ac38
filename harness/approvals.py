"""A tool that asks first, as a person meets it in Chromium: the request on screen, its countdown, the click on
Approve, and the tool's step that follows, each timed on the browser's own clock. Shared by
tests/test_browser_approvals.py and bench/approve_click.py."""

from __future__ import annotations

from harness.waiting import wait_for

QUESTION = "What is 17*23?"  # the demo model asks the calculator, which the page's settings make ask first
ANSWER = "17*23 = 391"
PAGE_ENV = {"AGENT_APPROVE_TOOLS": "calculator", "AGENT_MODEL": "demo@0.05~0", "AGENT_WORKERS": "2"}
APPROVE = "✅ Approve"

# Installed before the page loads (epoch ms, the browser's clock): when the request's Approve button was first
# there, when it was clicked (a capturing listener: before Streamlit sees the click), when the tool's step
# and the answer were first in the page.
WATCH_JS = """(() => {
    window.__requestAt = null; window.__approveClickedAt = null; window.__toolStepAt = null;
    window.__answerAt = null;
    document.addEventListener('click', (event) => {
        const button = event.target.closest && event.target.closest('button');
        if (button && (button.innerText || '').includes('Approve') && window.__approveClickedAt === null) {
            window.__approveClickedAt = Date.now();
        }
    }, true);
    const check = () => {
        const now = Date.now();
        if (window.__requestAt === null
            && [...document.querySelectorAll('button')].some((b) => (b.innerText || '').includes('Approve'))) {
            window.__requestAt = now;
        }
        if (window.__toolStepAt === null) {
            for (const el of document.querySelectorAll('[data-testid="stExpander"] summary')) {
                if ((el.innerText || '').includes('🔧 calculator')) { window.__toolStepAt = now; break; }
            }
        }
        if (window.__answerAt === null) {
            for (const el of document.querySelectorAll('[data-testid="stChatMessage"]')) {
                if ((el.innerText || '').includes('__ANSWER__')) { window.__answerAt = now; break; }
            }
        }
    };
    new MutationObserver(check).observe(document, {subtree: true, childList: true, characterData: true});
})()""".replace("__ANSWER__", ANSWER)


def times(page) -> dict[str, float | None]:
    """What WATCH_JS saw, in epoch seconds (None: not yet)."""
    raw = page.evaluate("() => ({request: window.__requestAt, clicked: window.__approveClickedAt, "
                        "tool: window.__toolStepAt, answer: window.__answerAt})")
    return {name: (value / 1000 if value else None) for name, value in raw.items()}


def wait_request(page, timeout_s: float) -> None:
    """The request's Approve button is on screen and can be clicked."""
    page.get_by_role("button", name=APPROVE).wait_for(state="visible", timeout=timeout_s * 1000)


def wait_seen(page, name: str, timeout_s: float) -> float:
    """Wait until WATCH_JS saw `name` (request, tool, answer); returns when (epoch seconds)."""
    key = {"request": "__requestAt", "tool": "__toolStepAt", "answer": "__answerAt"}[name]
    return page.wait_for_function(f"() => window.{key}", timeout=timeout_s * 1000, polling=50).json_value() / 1000


def countdown_text(page) -> str | None:
    """The countdown's words, from inside its frame (drawn by the browser's own script), or None."""
    for frame in page.frames:
        try:
            text = frame.evaluate("() => { const el = document.querySelector('[data-testid=approval-countdown]');"
                                  " return el ? el.textContent : null; }")
        except Exception:  # noqa: BLE001 - a frame that went away meanwhile
            continue
        if text:
            return text
    return None


def wait_countdown_moves(page, timeout_s: float) -> tuple[str, str]:
    """The countdown's words, and then different words once it has counted on: it runs in the browser."""
    first = wait_for(lambda: countdown_text(page), timeout_s, "the countdown on screen")
    later = wait_for(lambda: (t := countdown_text(page)) and t != first and t, timeout_s, "the countdown to move")
    return first, later
