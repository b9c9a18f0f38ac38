"""Sign-in, when the page's secrets have an `[auth]` section: the page asks for it before anything else,
and the signed-in person's store (a PersonStore, agent/conversation/person_store.py) is the door to their
own conversations only.

Without the section, the local playground: no sign-in, one implicit owner, everything as before. With it,
Streamlit's own `st.login` / `st.user` / `st.logout` do the OpenID Connect flow and keep the identity in a
cookie signed with the section's `cookie_secret`: a cookie that is stale, or not signed with it, reads as
signed out. Who the person is comes from their provider's issuer and subject (agent/conversation/people.py).
Sign out also records the sign-in as ended on the server (agent/conversation/sign_outs.py): its cookie,
wherever a copy of it is presented, then reads as signed out too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import redis
import streamlit as st

from agent.conversation import people, sign_outs
from agent.settings import Settings
from agent.text.markdown import inert

log = logging.getLogger(__name__)

AUTH_SECTION = "auth"
REMEMBERED_KEY = "agent_person_remembered"  # the person id this session has written the record of
# A provider's settings in the section (or in one of its [auth.NAME] tables): how one is told from the rest.
PROVIDER_FIELDS = ("client_id", "server_metadata_url")


class SignInMisconfigured(Exception):
    """The page's secrets cannot say whether sign-in is on: the page then serves nobody, rather than
    everyone (a demo meant to be signed into must never fall back to the open playground)."""


def providers() -> list[str] | None:
    """None without an `[auth]` section (the local playground); else the named providers ([auth.NAME]),
    or [""] when the section itself names the one provider. SignInMisconfigured when a secrets file
    exists but cannot be read, or its `auth` is not a section of providers."""
    try:
        section = st.secrets.get(AUTH_SECTION)
    except FileNotFoundError as exc:  # Streamlit's error for no secrets file, and for one it cannot parse
        if any(Path(path).exists() for path in st.get_option("secrets.files") or ()):
            raise SignInMisconfigured(f"the secrets file cannot be read ({exc})") from None
        return None
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise SignInMisconfigured("`auth` in the secrets is not a section ([auth])")
    named = [name for name, value in section.items() if isinstance(value, Mapping)
             and any(field in value for field in PROVIDER_FIELDS)]
    if not named and not all(field in section for field in PROVIDER_FIELDS):
        raise SignInMisconfigured("the [auth] section names no provider (client_id and server_metadata_url, in "
                                  "[auth] itself or in an [auth.NAME] table)")
    return named or [""]


def signed_in(settings: Settings, client: redis.Redis) -> people.Person | None | bool:
    """Who may use the page in this run: None in the local playground (no sign-in), the signed-in person,
    or False once the sign-in page has been drawn instead (nothing else is drawn in this run). A sign-in
    that was signed out of (its cookie's copy, or a tab opened before Sign out) gets the sign-in page:
    `client` is where sign-outs are recorded."""
    try:
        offered = providers()
    except SignInMisconfigured as exc:
        st.title("⏱️ Agent demo")
        st.error(f"**Sign-in is not set up correctly:** {exc}. Nothing is shown until it is: fix the page's "
                 "secrets (docs/sign-in.md), then restart the app.", icon="🛑")
        return False
    if offered is None:
        return None
    user = st.user
    if not user.is_logged_in:
        sign_in_page(offered)
        return False
    claims = user.to_dict()
    if sign_outs.signed_out(client, sign_outs.sign_in_id(claims)):
        sign_in_page(offered, notice=SIGNED_OUT_NOTICE)
        return False
    person = people.from_claims(claims, settings.admins)
    if person is None:  # a provider that names no subject cannot own anything
        st.title("⏱️ Agent demo")
        st.error("The sign-in did not say who you are (no issuer and subject in its identity token), so this "
                 "page cannot keep your conversations apart from anyone else's. Sign in with another account.",
                 icon="🛑")
        st.button("Sign out", on_click=sign_out, args=(client,))
        return False
    return person


def remember_once(client, person: people.Person) -> None:
    """Keep who the person is for the operator's `--owner EMAIL`, once per session."""
    if st.session_state.get(REMEMBERED_KEY) != person.id:
        people.remember(client, person)
        st.session_state[REMEMBERED_KEY] = person.id


def sign_out(client: redis.Redis, person_id: str = "") -> None:
    """Sign out of this sign-in: recorded on the server first, so that no copy of its cookie signs in again
    (sign_outs.py), then Streamlit's own sign-out deletes the cookie here (and, where the provider offers
    it, ends the provider's session too)."""
    try:
        sign_outs.sign_out(client, sign_outs.sign_in_id(st.user.to_dict()), person_id)
    except redis.RedisError as exc:  # this browser is signed out all the same
        log.warning("the sign-out could not be recorded (%s): a copy of this sign-in's cookie still signs in", exc)
    st.logout()


SIGNED_OUT_NOTICE = ("You signed out of this sign-in (in this browser or another): it no longer opens this page. "
                     "Sign in again to go on.")


def sign_in_page(offered: list[str], notice: str | None = None) -> None:
    st.title("⏱️ An agent that always finishes")
    st.markdown("This demo is shared: **sign in** to chat. Your conversations are yours alone; nobody else "
                "signed in here can list, open or change them.")
    if notice:
        st.info(notice, icon="🚪")
    elsewhere = sign_in_address(_redirect_uri(), page_origin())
    if elsewhere is not None:  # a sign-in from here would come back signed out, with no word: say where instead
        cid = st.query_params.get("c")
        link = f"{elsewhere}?{urlencode({'c': cid})}" if cid else elsewhere
        st.warning(f"**Open this page at {elsewhere} to sign in.** It is open at {inert(page_origin() or '')}, "
                   "but sign-in comes back to the address in the page's `redirect_uri`, and its cookie belongs to "
                   "that address alone: signed in from here, you would land on this page again.", icon="🧭")
        st.link_button(f"Open {elsewhere}", link, type="primary", icon="🔑")
        return
    for name in offered:
        label = f"Sign in with {name}" if name else "Sign in"
        st.button(label, key=f"sign-in-{name or 'default'}", type="primary", icon="🔑",
                  on_click=st.login, args=(name,) if name else ())


def sign_in_address(redirect_uri: str | None, origin: str | None) -> str | None:
    """The page's address to sign in at (`redirect_uri` without its `oauth2callback`) when the page is open
    at another origin than `redirect_uri`'s; None when it is the same, or either is unknown. Streamlit keeps
    the identity cookie for the redirect_uri's origin and reads it only on a page open at that one."""
    if not redirect_uri or not origin:
        return None
    target, here = urlsplit(redirect_uri), urlsplit(origin)
    if not target.scheme or not target.netloc or not here.scheme or not here.netloc:
        return None
    if (target.scheme.lower(), target.netloc.lower()) == (here.scheme.lower(), here.netloc.lower()):
        return None
    return redirect_uri.removesuffix("oauth2callback")


def _redirect_uri() -> str | None:
    try:
        section = st.secrets.get(AUTH_SECTION)
    except FileNotFoundError:
        return None
    value = section.get("redirect_uri") if isinstance(section, Mapping) else None
    return value if isinstance(value, str) else None


def page_origin() -> str | None:
    """The origin the browser has this page open at (its WebSocket's Origin header, which Streamlit compares
    with the identity cookie's; else the page's URL); None when neither is known (AppTest)."""
    origin = st.context.headers.get("Origin")
    if origin:
        return origin
    url = st.context.url
    if not url:
        return None
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else None


def account(sb, person: people.Person, client: redis.Redis) -> None:
    """Into `sb` (a sidebar container): who is signed in, and Sign out (recorded in `client`'s Redis)."""
    role = " · can read everyone's conversations" if person.admin else ""
    sb.caption(f"Signed in as **{inert(person.name)}**{role}",
               help=f"Your id here: {person.id} (what AGENT_ADMINS and `python -m agent list --owner` take)")
    sb.button("Sign out", key="sign-out", icon="🚪", on_click=sign_out, args=(client, person.id), type="tertiary",
              help="Ends this sign-in on the server too: a copy of its cookie no longer signs in.")
