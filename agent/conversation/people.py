"""Who owns a conversation: a signed-in person, known by their provider's issuer and subject.

A person's id is a digest of the two (never the email): it names their Redis keys, is stored as each of
their conversations' `owned_by`, and is what a trace carries. What the page shows of them (their name,
else their email) and what the operator types to find them (`--owner EMAIL`) is kept beside it, written
at sign-in, so that the CLI can find a person's conversations by email.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass

import redis

from agent.conversation.keys import PEOPLE_BY_EMAIL_KEY, person_record
from agent.conversation.well_formed import decoded
from agent.text.surrogates import scrub

PERSON_ID_CHARS = 20  # hex digits of the digest: 80 bits, no collision among any number of people a demo has


@dataclass(frozen=True)
class Person:
    """A signed-in person."""

    id: str
    issuer: str
    subject: str
    name: str  # what the page shows: their name, else their email, else their subject
    email: str  # lower-cased; "" when the provider gave none
    admin: bool = False  # may read everyone's conversations (AGENT_ADMINS)
    email_verified: bool = False  # the provider vouched for the email (`email_verified: true`)


def person_id(issuer: str, subject: str) -> str:
    """The stable id of the person `subject` at provider `issuer` ("p" and 20 hex digits).

    Of the values exactly as the provider sent them (the issuer's length first, so no pair of values can
    make another pair's text); `surrogatepass`: JSON may escape a lone surrogate, and it still names one."""
    text = f"{len(issuer)}:{issuer}{subject}"
    return "p" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:PERSON_ID_CHARS]


def from_claims(claims: Mapping, admins: frozenset[str] = frozenset()) -> Person | None:
    """The person an OpenID Connect sign-in's claims name, or None without an issuer and a subject.

    An admin (AGENT_ADMINS) is named by their person id, or by an email their provider vouched for
    (`email_verified`): some providers let people set any email they like, and an unverified one, or one
    that only looks like an admin's once case is folded, must not open everyone's conversations."""
    issuer, subject = _text_claim(claims, "iss"), _text_claim(claims, "sub")
    if not issuer.strip() or not subject.strip():
        return None
    email = normal_email(scrub(_text_claim(claims, "email")))
    verified = claims.get("email_verified") in (True, "true") and bool(email)
    name = scrub(_text_claim(claims, "name")).strip() or email or scrub(subject).strip()
    pid = person_id(issuer, subject)
    admin = pid in admins or (verified and email in admins)
    return Person(pid, issuer, subject, name[:80], email, admin=admin, email_verified=verified)


def normal_email(raw: str) -> str:
    """An email as it is compared: ASCII only, lower-cased; "" for anything else (a look-alike such as the
    Kelvin sign folds to a plain K under `casefold`, so non-ASCII addresses are never compared at all)."""
    email = raw.strip()
    return email.lower() if email.isascii() and "@" in email else ""


def _text_claim(claims: Mapping, name: str) -> str:
    value = claims.get(name)
    return value if isinstance(value, str) else ""


def remember(client: redis.Redis, person: Person) -> None:
    """Keep who the person is, for the operator's `--owner EMAIL` (one round-trip, at sign-in); only an
    email the provider vouched for finds them, so nobody can claim another's address for `--owner`."""
    with client.pipeline(transaction=False) as pipe:
        pipe.hset(person_record(person.id), mapping={
            "issuer": scrub(person.issuer), "subject": scrub(person.subject), "name": person.name,
            "email": person.email,
            "seen_at": repr(time.time())})
        if person.email and person.email_verified:
            pipe.hset(PEOPLE_BY_EMAIL_KEY, person.email, person.id)
        pipe.execute()


def find(client: redis.Redis, owner: str) -> str | None:
    """The id of the person `owner` names: an email someone signed in with, or a person's id itself."""
    owner = owner.strip()
    if "@" in owner:
        found = client.hget(PEOPLE_BY_EMAIL_KEY, normal_email(owner)) if normal_email(owner) else None
        return decoded(found) if found else None
    return owner if client.exists(person_record(owner)) else None


def describe(client: redis.Redis, person: str | None) -> str | None:
    """A person's id as the operator reads it: "Name <email> (id)", or the id alone once their record is gone."""
    if not person:
        return None
    name, email = client.hmget(person_record(person), "name", "email")
    who = decoded(name or b"")
    if email:
        who = f"{who} <{decoded(email)}>" if who else decoded(email)
    return f"{who} ({person})" if who else person


def email_of(client: redis.Redis, person: str) -> str | None:
    """The email the person last signed in with, or None (for traces, only where the operator asked for it)."""
    email = client.hget(person_record(person), "email")
    return decoded(email) or None if email else None
