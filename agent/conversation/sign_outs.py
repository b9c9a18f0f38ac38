"""Sign-outs that hold on the server: a sign-in, once signed out of, stays signed out wherever its cookie goes.

Streamlit keeps a signed-in person's identity in a cookie signed with the `[auth]` section's `cookie_secret`,
good for 30 days (its signature for 31), and `st.logout` deletes it only from the browser that signs out:
a copy of the cookie (another browser's, one taken from this one) would go on signing in. So each sign-in
is known by a digest of its identity claims (those of its ID token: its issue time `iat`, and the `nonce`
Streamlit's OpenID Connect client sends, make every sign-in's claims its own, and every copy of one
cookie the same), and Sign out records that digest here for longer than the cookie's signature holds.
The page treats a recorded sign-in as signed out (agent/ui/signin.py). A person's other sign-ins (another
browser where they signed in on their own) are theirs to sign out of.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

import redis

from agent.conversation.keys import signed_out_key

# Longer than Streamlit accepts an identity cookie's signature (30 days, and a day's grace).
SIGNED_OUT_TTL_S = 31 * 24 * 3600 + 3600
SIGN_IN_ID_CHARS = 32  # hex digits of the digest: 128 bits
NOT_CLAIMS = ("is_logged_in", "tokens")  # what st.user adds beside the identity cookie's claims


def sign_in_id(claims: Mapping) -> str:
    """The id of the sign-in whose identity claims these are ("s" and 32 hex digits): the same for every copy
    of its cookie, another for each sign-in (its ID token's `iat` and `nonce` differ)."""
    kept = {str(name): value for name, value in claims.items() if name not in NOT_CLAIMS}
    text = json.dumps(kept, sort_keys=True, ensure_ascii=True, separators=(",", ":"), default=str)
    return "s" + hashlib.sha256(text.encode("ascii")).hexdigest()[:SIGN_IN_ID_CHARS]


def sign_out(client: redis.Redis, sign_in: str, person: str = "") -> None:
    """Record that `sign_in` was signed out of (by `person`, for the operator reading the key)."""
    client.set(signed_out_key(sign_in), person or "-", ex=SIGNED_OUT_TTL_S)


def signed_out(client: redis.Redis, sign_in: str) -> bool:
    """Whether `sign_in` was signed out of: its cookie, wherever it is presented, signs nobody in."""
    return bool(client.exists(signed_out_key(sign_in)))
