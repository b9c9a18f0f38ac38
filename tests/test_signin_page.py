"""Sign-in on the page (AppTest, the session's real Redis and pool): with an `[auth]` section the page asks for
sign-in before anything else; a signed-in person lists, opens and changes only their own conversations; a
link to someone else's says not found; an admin reads everyone's, read-only; a person past their share of
turns in flight is refused with a sentence, the text kept. (The OpenID Connect flow itself, in Chromium:
tests/test_browser_signin.py.)"""

from __future__ import annotations

import secrets
import time

import pytest

from agent.conversation import people
from agent.conversation.listing import list_conversations
from agent.queue import new_id, submit_turn
from agent.tools.acting_for import running_for
from agent.tools.notes import add_note
from agent.ui.signin import sign_in_address
from tests.apptest_page import app, texts
from tests.conftest import wait_done
from tests.test_app import app_env, assert_no_exception  # noqa: F401 - app_env: the page's environment
from tests.test_signin import ISSUER, SLOW, door, person

pytestmark = pytest.mark.usefixtures("pool")

AUTH = {"redirect_uri": "http://localhost:8501/oauth2callback", "cookie_secret": "x" * 32, "client_id": "demo",
        "client_secret": "demo", "server_metadata_url": "http://127.0.0.1:9/.well-known/openid-configuration"}


def signed(who: people.Person | None, cid: str | None = None, auth: dict | None = None, **claims):
    """The page with sign-in configured, as `who` (None: signed out), with the identity cookie's other
    `claims` (an ID token's `iat`, `nonce`, ...)."""
    at = app(cid)
    at.secrets["auth"] = auth or AUTH
    at.user = {"is_logged_in": False} if who is None else {
        "is_logged_in": True, "iss": ISSUER, "sub": who.subject, "email": who.email, "name": who.name,
        "email_verified": who.email_verified, **claims}
    at.run()
    assert_no_exception(at)
    return at


def test_signed_out_the_page_asks_for_sign_in_and_shows_nothing_else(store, queue):
    at = signed(None)
    assert [b.label for b in at.button] == ["Sign in"]
    assert not at.chat_input and not at.sidebar.button, "no chat and no list before sign-in"
    assert "sign in" in texts(at).lower()
    two = signed(None, auth={**AUTH, "google": {"client_id": "a", "client_secret": "b", "server_metadata_url": "u"},
                             "okta": {"client_id": "c", "client_secret": "d", "server_metadata_url": "v"}})
    assert [b.label for b in two.button] == ["Sign in with google", "Sign in with okta"]


def test_a_signed_in_person_sends_and_lists_only_their_own(store, queue):
    alice, bob = person("page-alice", "pa@example.org"), person("page-bob", "pb@example.org")
    at = signed(alice)
    assert "Signed in as **pa@example.org**" in texts(at) and at.sidebar.button(key="sign-out")
    at.chat_input[0].set_value("What is 17*23?").run()
    cid = at.query_params["c"][0] if isinstance(at.query_params["c"], list) else at.query_params["c"]
    final = wait_done(store, cid)
    assert final["owner"] == alice.id
    assert people.find(store.redis, "PA@example.org") == alice.id  # remembered for the operator's --owner
    at.run()
    assert any(b.key == f"conv-{cid}" for b in at.sidebar.button)

    as_bob = signed(bob)
    assert not any(b.key == f"conv-{cid}" for b in as_bob.sidebar.button)
    link = signed(bob, cid)
    page = texts(link)
    assert "was not found" in page and "17*23" not in page and "391" not in page, page[-1500:]
    assert not link.chat_input[0].disabled  # a new chat of Bob's, not Alice's
    assert list_conversations(door(store, bob)).conversations == []


def test_an_admin_reads_someone_elses_conversation_read_only(store, queue, monkeypatch):
    monkeypatch.setenv("AGENT_ADMINS", "boss@example.org")
    alice, boss = person("page-alice-2", "pa2@example.org"), person("boss", "boss@example.org")
    cid = new_id()
    submit_turn(door(store, alice), queue, cid, "What is 6*7?", SLOW)
    wait_done(store, cid, timeout_s=30)
    at = signed(boss, cid)
    page = texts(at)
    assert "42" in page and "Read-only" in page and "can read everyone's conversations" in page, page[-1500:]
    assert at.chat_input[0].disabled
    keys = {b.key for b in at.sidebar.button}
    assert f"conv-{cid}" in keys and "rename" not in keys and "delete" not in keys
    assert store.read(cid)["owner"] == alice.id


def test_an_admin_sees_someone_elses_branches_read_only(store, queue, monkeypatch):
    """Every branch is the owner's: no Regenerate, no Edit, and the picker only says where the turn is (a switch
    would change what the owner sees)."""
    monkeypatch.setenv("AGENT_ADMINS", "boss@example.org")
    alice, boss = person("page-alice-3", "pa3@example.org"), person("boss", "boss@example.org")
    cid = new_id()
    first = submit_turn(door(store, alice), queue, cid, "What is 6*7?", SLOW)
    wait_done(store, cid, timeout_s=30)
    second = submit_turn(door(store, alice), queue, cid, "What is 6*7?", SLOW, branch_of=first)
    wait_done(store, cid, timeout_s=30)
    as_alice = signed(alice, cid)
    assert "2 / 2" in texts(as_alice)
    assert any((b.key or "").startswith("regenerate-") for b in as_alice.button)
    at = signed(boss, cid)
    assert "2 / 2" in texts(at) and "Read-only" in texts(at)
    keys = [b.key or "" for b in at.button]
    assert not any(k.startswith(("regenerate-", "edit-")) for k in keys), keys
    pickers = [b for b in at.button if (b.key or "").startswith("branch-")]
    assert pickers and all(b.disabled for b in pickers)
    assert store.read(cid)["turn_id"] == second


def test_past_the_share_of_turns_in_flight_the_message_is_refused_and_kept(store, queue, monkeypatch):
    monkeypatch.setenv("AGENT_MAX_TURNS_PER_USER", "1")
    carol = person("page-carol", "pc@example.org")
    busy = new_id()
    # In flight for longer than a busy machine takes to draw the page (14 s of its 17 s deadline), then stopped.
    turn_id = submit_turn(door(store, carol, max_turns=1), queue, busy,
                          "Please be slow 14 seconds, then tell me the time.", SLOW)
    at = signed(carol)
    at.chat_input[0].set_value("And what is 2+2?").run()
    page = texts(at)
    assert "Not sent: you already have 1 turn in flight" in page, page[-1500:]
    assert any("And what is 2+2?" in code.value for code in at.code), "the text is kept to send again"
    store.request_cancel(turn_id, ttl_s=60)
    wait_done(store, busy, timeout_s=30)


def test_sign_out_brings_the_sign_in_page_back(store, queue):
    at = signed(person("page-dan", "pd@example.org"))
    at.sidebar.button(key="sign-out").click().run()
    assert [b.label for b in at.button] == ["Sign in"]
    assert not at.chat_input


def test_sign_out_ends_that_sign_in_on_the_server_a_copy_of_its_cookie_and_an_open_tab_read_as_signed_out(
        store, queue):
    dan = person("page-dan-2", "pd2@example.org")
    cookie = {"iat": int(time.time()), "exp": int(time.time()) + 3600, "nonce": secrets.token_urlsafe(16)}
    other_tab = signed(dan, **cookie)  # a tab opened before Sign out, on the same sign-in
    copied = signed(dan, **cookie)  # the same cookie in another browser
    assert copied.sidebar.button(key="sign-out")
    elsewhere = signed(dan, **{**cookie, "nonce": secrets.token_urlsafe(16)})  # Dan's own sign-in elsewhere

    signed(dan, **cookie).sidebar.button(key="sign-out").click().run()

    for page in (signed(dan, **cookie), copied.run(), other_tab.run()):
        assert_no_exception(page)
        assert [b.label for b in page.button] == ["Sign in"] and not page.chat_input
        assert not page.sidebar.button and "You signed out of this sign-in" in texts(page)
    assert elsewhere.run().chat_input and elsewhere.sidebar.button(key="sign-out")  # another sign-in goes on
    again = signed(dan, **{**cookie, "iat": cookie["iat"] + 5, "nonce": secrets.token_urlsafe(16)})
    assert again.chat_input and "Signed in as" in texts(again)  # signing in again makes a new sign-in


def test_the_sidebar_shows_the_signed_in_persons_own_notes_only(store, queue, tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_DATA_DIR", str(tmp_path / "data"))
    erin, finn = person("page-erin", "pe@example.org"), person("page-finn", "pf@example.org")
    for who, text in ((erin, "erin's plan"), (finn, "finn's secret")):
        with running_for(who.id):
            add_note(text)
    add_note("the playground's note")  # a turn with no owner
    page = texts(signed(erin))
    assert "erin's plan" in page and "finn's secret" not in page and "the playground's note" not in page
    assert "**Notes** (`add_note`, 1 latest, yours)" in page
    assert "**Notes**" not in texts(signed(person("page-gail")))  # no notes of her own yet: none drawn


def test_a_turn_held_behind_the_persons_own_says_so(store, queue, monkeypatch):
    monkeypatch.setenv("AGENT_MAX_TURNS_PER_USER", "5")
    erin = person("page-erin", "pe@example.org")
    as_erin = door(store, erin, max_turns=5)
    cids = [new_id() for _ in range(3)]
    # A share of 2 (one per worker): the third waits outside the queue. The first two stay in flight for longer
    # than a busy machine takes to draw the page (14 s of their 17 s deadline), then are stopped.
    turn_ids = [submit_turn(as_erin, queue, cid, "Please be slow 14 seconds, then tell me the time.", SLOW, share=2)
                for cid in cids]
    at = signed(erin, cids[-1])
    page = texts(at)
    assert "behind your own turns" in page and "at most 2 workers at a time" in page, page[-1500:]
    for turn_id in turn_ids:
        store.request_cancel(turn_id, ttl_s=60)
    for cid in cids:
        wait_done(store, cid, timeout_s=40)


@pytest.mark.parametrize("auth", ["not a section", {"redirect_uri": "x", "cookie_secret": "y"}])
def test_a_broken_auth_section_shows_nothing_rather_than_everything(store, queue, auth):
    at = app()
    at.secrets["auth"] = auth
    at.run()
    assert_no_exception(at)
    page = texts(at)
    assert "Sign-in is not set up correctly" in page, page[-800:]
    assert not at.chat_input and not at.sidebar.button, "not the open playground"


@pytest.mark.parametrize(("redirect_uri", "origin", "expected"), [
    ("http://localhost:8501/oauth2callback", "http://127.0.0.1:8501", "http://localhost:8501/"),
    ("http://localhost:8501/oauth2callback", "http://localhost:8502", "http://localhost:8501/"),
    ("https://demo.example.org/app/oauth2callback", "http://demo.example.org", "https://demo.example.org/app/"),
    ("http://localhost:8501/oauth2callback", "http://localhost:8501", None),
    ("https://Demo.Example.org/oauth2callback", "https://demo.example.org", None),  # names are not case-sensitive
    ("http://localhost:8501/oauth2callback", None, None),  # the page's origin unknown: no claim about it
    (None, "http://127.0.0.1:8501", None),
    ("not a url", "http://127.0.0.1:8501", None),
])
def test_the_sign_in_page_names_the_address_to_sign_in_at_only_when_it_is_open_at_another(
        redirect_uri, origin, expected):
    assert sign_in_address(redirect_uri, origin) == expected
