"""Sign-in as people meet it in Chromium: a real OpenID Connect flow on loopback, against `oidc-provider-mock`
(its authorize page, where a click picks who signs in), and `streamlit run app.py` with an `[auth]` section in
its secrets (STREAMLIT_SECRETS_FILES). Two people in two browser contexts: each sees the sign-in page first,
signs in, chats; neither lists nor opens the other's conversation; Sign out brings the sign-in page back (also
to a copy of the cookie signed out of, replayed in another browser), and so does a cookie not signed with the
page's secret. Then two page servers on one Redis: a turn started on one
is followed on the other by the person who owns it. Tests wait for events, never a fixed sleep."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from streamlit.web.server.starlette.starlette_app_utils import create_signed_value

from harness.page import (
    BUSY_TEXTS,
    START_TIMEOUT_S,
    chromium,
    chromium_available,
    conversation_id,
    free_port,
    page_server,
    send,
    wait_settled,
)
from harness.processes import kill, processes_with_env
from harness.waiting import wait_for
from tests.conftest import ROOT

if not chromium_available():
    pytest.skip("Debian's chromium is not installed (no `chromium` on PATH; `apt-get install chromium`)",
                allow_module_level=True)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

QUESTION = "What is 17*23?"
ANSWER = "17*23 = 391"
PAGE_ENV = {"AGENT_MODEL": "demo@0.05~0", "AGENT_WORKERS": "2"}
SLOW_PAGE_ENV = {"AGENT_MODEL": "demo@1~0", "AGENT_WORKERS": "2"}  # 1 s a model call: the turn is seen in flight
PEOPLE = {
    "alice": {"email": "alice@example.org", "name": "Alice Example"},
    "bob": {"email": "bob@example.org", "name": "Bob Example"},
}
SIGN_IN = "Sign in"
SIGN_OUT = "Sign out"
SIGN_IN_TEXT = "This demo is shared"  # the sign-in page's own sentence
SIGNED_OUT_TEXT = "You signed out of this sign-in"  # what it adds for a sign-in ended by Sign out
NOT_FOUND = "was not found"
EMPTY_LIST = "Your conversations will be listed here."
USER_COOKIE = "_streamlit_user"  # streamlit/web/server/starlette/starlette_server_config.py: USER_COOKIE_NAME
PROVIDER_START_S = 30.0  # seconds for the provider to answer its discovery document
STEP_S = 30.0  # seconds for one step of the flow (a redirect, a rerun) on a busy machine: a loose bound
ANSWER_S = 60.0  # seconds from sending to the settled answer (the model answers in 0.05 s; the page may be cold)
# Installed before the page loads: whether the page ever showed a turn in flight (it follows it live).
BUSY_WATCH_JS = """(() => {
    window.__busySeen = false;
    const busy = __BUSY__;
    new MutationObserver(() => {
        if (!window.__busySeen && busy.some((b) => document.body.innerText.includes(b))) window.__busySeen = true;
    }).observe(document, {subtree: true, childList: true, characterData: true});
})()""".replace("__BUSY__", json.dumps(BUSY_TEXTS))
CHAT_INPUT = 'textarea[data-testid="stChatInputTextArea"]'


@contextlib.contextmanager
def oidc_provider(log_path):
    """`oidc-provider-mock` on 127.0.0.1, in its own process, with Alice and Bob one click away on its
    authorize page; stopped at the end, also on failure."""
    port = free_port()
    users = [json.dumps({"sub": sub, **claims}) for sub, claims in PEOPLE.items()]
    args = [sys.executable, "-m", "oidc_provider_mock", "--host", "127.0.0.1", "--port", str(port)]
    for user in users:
        args += ["--user-claims", user]
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            end = time.monotonic() + PROVIDER_START_S
            while True:
                with contextlib.suppress(OSError):
                    with urllib.request.urlopen(f"{url}/.well-known/openid-configuration", timeout=2) as response:
                        if response.status == 200:
                            break
                if proc.poll() is not None or time.monotonic() > end:
                    raise RuntimeError(f"oidc-provider-mock did not start: {log_path.read_text(errors='replace')}")
                time.sleep(0.1)
            yield url
        finally:
            proc.kill()
            proc.wait(10)


def write_secrets(path, provider_url: str, page_url: str, cookie_secret: str) -> None:
    path.write_text(
        "[auth]\n"
        f'redirect_uri = "{page_url}oauth2callback"\n'
        f'cookie_secret = "{cookie_secret}"\n'
        'client_id = "agent-demo"\n'
        f'client_secret = "{secrets.token_hex(16)}"\n'
        f'server_metadata_url = "{provider_url}/.well-known/openid-configuration"\n')


@contextlib.contextmanager
def signed_in_page(tmp_path, name: str, provider_url: str, cookie_secret: str, env: dict[str, str],
                   host: str = "localhost"):
    """A page server with `[auth]` in its secrets, and the address to open it at: the host and port of its
    redirect_uri, where the sign-in's cookies are set (a browser keeps cookies by host, not port, and
    Streamlit's identity cookie names the origin it was set for)."""
    port = free_port()
    url = f"http://{host}:{port}/"
    secrets_file = tmp_path / f"{name}-secrets.toml"
    write_secrets(secrets_file, provider_url, url, cookie_secret)
    with page_server(tmp_path / f"{name}-data", tmp_path / f"{name}-streamlit.log",
                     {**env, "STREAMLIT_SECRETS_FILES": str(secrets_file)}, port=port) as server:
        yield server, url


def sign_in_page_shown(page, timeout_s: float = STEP_S) -> None:
    page.get_by_text(SIGN_IN_TEXT).wait_for(timeout=timeout_s * 1000)
    page.get_by_role("button", name=SIGN_IN).wait_for(timeout=timeout_s * 1000)
    assert page.locator(CHAT_INPUT).count() == 0, "no chat before signing in"


def sign_in(page, url: str, sub: str) -> None:
    """From the sign-in page, through the provider's authorize page, back to the chat signed in as `sub`."""
    page.goto(url)
    sign_in_page_shown(page, START_TIMEOUT_S)
    page.get_by_role("button", name=SIGN_IN).click()
    page.wait_for_url("**/oauth2/authorize?*", timeout=STEP_S * 1000)
    page.get_by_role("button", name=sub, exact=True).click()
    page.wait_for_selector(CHAT_INPUT, timeout=STEP_S * 1000)
    signed_in_as(page, PEOPLE[sub]["name"])


def signed_in_as(page, name: str) -> None:
    sidebar = page.get_by_test_id("stSidebar")
    sidebar.get_by_text(f"Signed in as {name}").wait_for(timeout=STEP_S * 1000)


def listed(page, cid: str):
    """The sidebar's row for conversation `cid` (the list's button keyed `conv-ID`)."""
    return page.get_by_test_id("stSidebar").locator(f".st-key-conv-{cid}")


def sidebar_text(page) -> str:
    return page.get_by_test_id("stSidebar").inner_text()


@pytest.fixture
def provider(tmp_path):
    with oidc_provider(tmp_path / "provider.log") as url:
        yield url


@pytest.fixture
def browser():
    with chromium() as running:
        yield running


def test_two_people_sign_in_chat_apart_sign_out_and_a_forged_cookie_is_signed_out(tmp_path, provider, browser):
    cookie_secret = secrets.token_hex(32)
    with signed_in_page(tmp_path, "page", provider, cookie_secret, PAGE_ENV) as (server, url):
        alice_context, bob_context = browser.new_context(), browser.new_context()
        try:
            alice, bob = alice_context.new_page(), bob_context.new_page()
            sign_in(alice, url, "alice")
            sign_in(bob, url, "bob")

            send(alice, QUESTION)
            cid = conversation_id(alice)
            wait_settled(alice, ANSWER, ANSWER_S)
            listed(alice, cid).wait_for(timeout=STEP_S * 1000)
            assert QUESTION in listed(alice, cid).inner_text()
            bob.reload()
            signed_in_as(bob, PEOPLE["bob"]["name"])
            bob.get_by_test_id("stSidebar").get_by_text(EMPTY_LIST).wait_for(timeout=STEP_S * 1000)
            assert listed(bob, cid).count() == 0 and "17*23" not in sidebar_text(bob), sidebar_text(bob)

            bob.goto(f"{url}?c={cid}")
            bob.get_by_text(NOT_FOUND).first.wait_for(timeout=STEP_S * 1000)
            body = bob.locator("body").inner_text()
            assert cid in body and QUESTION not in body and "391" not in body, body
            assert bob.get_by_test_id("stChatMessage").count() == 0, "none of Alice's messages"

            # Sign out: Streamlit clears its cookies and sends the browser to the provider's end_session
            # endpoint (the mock's page asks for a click), which sends it back: the sign-in page again.
            bobs_cookies = [c for c in bob_context.cookies(url) if c["name"].startswith(USER_COOKIE)]
            assert bobs_cookies, "Bob's identity cookie, kept to replay after he signs out"
            bob.get_by_test_id("stSidebar").get_by_role("button", name=SIGN_OUT).click()
            bob.wait_for_url("**/oauth2/end_session?*", timeout=STEP_S * 1000)
            bob.get_by_role("button", name="End session").click()
            bob.wait_for_url(url, timeout=STEP_S * 1000)
            sign_in_page_shown(bob)
            assert not [c for c in bob_context.cookies() if c["name"].startswith(USER_COOKIE)]
            bob.goto(url)
            sign_in_page_shown(bob)

            # A copy of the cookie Bob signed out of, replayed in another browser: the server ended that
            # sign-in, so it reads as signed out, and says why.
            replay_context = browser.new_context()
            try:
                replay_context.add_cookies(bobs_cookies)
                replay = replay_context.new_page()
                replay.goto(url)
                sign_in_page_shown(replay, START_TIMEOUT_S)
                replay.get_by_text(SIGNED_OUT_TEXT).wait_for(timeout=STEP_S * 1000)
                body = replay.locator("body").inner_text()
                assert "Bob" not in body and "Signed in as" not in body, body
            finally:
                replay_context.close()

            # Alice's claims in a cookie of the right name, signed the way Streamlit signs but with another
            # secret than the page's cookie_secret, or not signed at all: each reads as signed out. The same
            # claims signed with the page's secret do sign in: what the forgery lacks is the secret alone.
            claims = json.dumps({"iss": provider, "sub": "alice", "email": PEOPLE["alice"]["email"],
                                 "name": PEOPLE["alice"]["name"], "origin": url.rstrip("/"), "is_logged_in": True,
                                 "provider": "default"}, separators=(",", ":"))
            forgeries = [create_signed_value(secrets.token_hex(32), USER_COOKIE, claims).decode(), claims]
            for value in [*forgeries, create_signed_value(cookie_secret, USER_COOKIE, claims).decode()]:
                forged_context = browser.new_context()
                try:
                    forged_context.add_cookies([{"name": USER_COOKIE, "value": value, "url": url}])
                    assert [c["value"] for c in forged_context.cookies(url) if c["name"] == USER_COOKIE] == [value]
                    forged = forged_context.new_page()
                    forged.goto(f"{url}?c={cid}")
                    if value in forgeries:
                        sign_in_page_shown(forged, START_TIMEOUT_S)
                        body = forged.locator("body").inner_text()
                        assert "Alice" not in body and QUESTION not in body and "391" not in body, body
                    else:
                        signed_in_as(forged, PEOPLE["alice"]["name"])
                        forged.get_by_test_id("stChatMessage").filter(has_text=ANSWER).wait_for(
                            timeout=STEP_S * 1000)
                finally:
                    forged_context.close()
        finally:
            alice_context.close()
            bob_context.close()


def test_a_turn_started_on_one_page_server_is_followed_on_another_on_the_same_redis(tmp_path, provider, browser):
    """Two page servers, one Redis (the first's, embedded; the second has no workers of its own), one
    cookie_secret: Alice, signed in on each, sends on the first and reads the answer on the second. The two
    are opened at different hosts (localhost, 127.0.0.1), so one browser keeps both sign-ins at once."""
    cookie_secret = secrets.token_hex(32)
    with signed_in_page(tmp_path, "first", provider, cookie_secret, SLOW_PAGE_ENV) as (first, first_url):
        context = browser.new_context()
        try:
            on_first = context.new_page()
            sign_in(on_first, first_url, "alice")  # the first run has started the embedded Redis
            shared = {"REDIS_URL": first.redis_url(), "AGENT_WORKERS": "0"}
            with signed_in_page(tmp_path, "second", provider, cookie_secret, shared, host="127.0.0.1") as (
                    _, second_url):
                on_second = context.new_page()
                on_second.add_init_script(BUSY_WATCH_JS)
                sign_in(on_second, second_url, "alice")
                on_first.reload()  # still signed in on the first: each host keeps its own cookie
                signed_in_as(on_first, PEOPLE["alice"]["name"])

                started = time.monotonic()
                send(on_first, QUESTION)
                cid = conversation_id(on_first)
                on_second.goto(f"{second_url}?c={cid}")
                on_second.get_by_test_id("stChatMessage").filter(has_text=QUESTION).wait_for(timeout=STEP_S * 1000)
                followed_at = wait_settled(on_second, ANSWER, ANSWER_S)
                wait_settled(on_first, ANSWER, ANSWER_S)
                listed(on_second, cid).wait_for(timeout=STEP_S * 1000)
                in_flight = on_second.evaluate("() => window.__busySeen")
                print(f"\nsent on the first server, the answer settled on the second "
                      f"{time.monotonic() - started:.1f} s later; the second showed the turn in flight: {in_flight}")
                assert followed_at and on_second.get_by_test_id("stChatMessage").count() >= 2
        finally:
            context.close()


@contextlib.contextmanager
def run_signin(tmp_path):
    """`make run-signin` (scripts/run_signin.py) on free ports with a data dir of its own and no workers: its
    process, the page's port, and what it and Streamlit print (read as they print it). Stopped as a person
    stops it (SIGTERM: the script stops its page and mock), and whatever is left of them killed."""
    port, marker, printed = free_port(), f"run-signin-{time.time_ns()}", []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "REDIS_URL"))}
    env.update(AGENT_DATA_DIR=str(tmp_path / "data"), AGENT_WORKERS="0", AGENT_MCP_CONFIG="off",
               AGENT_TEST_MARKER=marker, HOST="127.0.0.1", PORT=str(port), OIDC_PORT=str(free_port()))
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "run_signin.py")], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    reader = threading.Thread(target=lambda: printed.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        yield proc, port, printed
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STEP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        redis_pid = tmp_path / "data" / "redis.pid"
        left = processes_with_env("AGENT_TEST_MARKER", marker)
        with contextlib.suppress(OSError, ValueError):
            left.append(int(redis_pid.read_text().strip()))
        kill(left)
        reader.join(5)


def test_make_run_signin_prints_the_address_sign_in_works_at_and_the_other_one_says_where_to_go(tmp_path, browser):
    with run_signin(tmp_path) as (proc, port, printed):
        wait_for(lambda: any("URL:" in line for line in printed) or proc.poll() is not None, START_TIMEOUT_S,
                 "Streamlit printed its URL")
        urls = [line.split("URL:", 1)[1].strip() for line in printed if "URL:" in line]
        assert urls == [f"http://localhost:{port}"], "".join(printed)  # not 127.0.0.1, where sign-in cannot work
        assert f"open http://localhost:{port} " in "".join(printed)

        context = browser.new_context()
        try:
            page = context.new_page()
            page.goto(f"http://127.0.0.1:{port}/")  # the address the page is bound to, not the one in redirect_uri
            page.get_by_text(f"Open this page at http://localhost:{port}/ to sign in").wait_for(
                timeout=START_TIMEOUT_S * 1000)
            assert page.get_by_role("button", name=SIGN_IN).count() == 0, "no Sign in that would come back here"
            with context.expect_page(timeout=STEP_S * 1000) as opened:  # Streamlit's link button opens a tab
                page.get_by_role("link", name=f"Open http://localhost:{port}/").click()
            page = opened.value
            page.wait_for_url(f"http://localhost:{port}/**", timeout=STEP_S * 1000)
            page.get_by_role("button", name=SIGN_IN).click()  # there, sign-in goes through
            page.wait_for_url("**/oauth2/authorize?*", timeout=STEP_S * 1000)
            page.get_by_role("button", name="alice", exact=True).click()
            page.wait_for_selector(CHAT_INPUT, timeout=STEP_S * 1000)
            signed_in_as(page, "Alice")
        finally:
            context.close()
