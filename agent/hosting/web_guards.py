"""Guards for the queue's dashboard (a Flask app with no login): which requests it answers, and what
never leaves it.

A browser will send a request to the dashboard from any page it opens: an `<img>` makes a GET, a
form a cross-site POST, and a name an attacker's DNS points at 127.0.0.1 makes the dashboard
same-origin with the attacker's page (DNS rebinding). So:
- it answers only at the names the page answers at (agent/hosts.py, AGENT_ALLOWED_HOSTS);
- a route that changes anything (one that takes a method besides GET, HEAD and OPTIONS) takes only
  those other methods: a GET there is refused, whatever the route itself would accept;
- such a request is refused when a browser says it came from another origin. As Go's
  net/http.CrossOriginProtection does: `Sec-Fetch-Site` when the browser sends it (same-origin or
  none: typed by the user), else an `Origin` whose host and port must be the Host's; neither header
  is a client that is not a browser page (curl), which no other site can make send anything.
The dashboard's own buttons post with jQuery from its own pages: same-origin, so they still work.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from flask import Flask, Response, request

from agent.hosts import host_allowed
from agent.settings import ALLOWED_HOSTS_VARIABLE, DEFAULT_ALLOWED_HOSTS

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
BROWSER_SAME_ORIGIN = frozenset({"same-origin", "none"})  # Sec-Fetch-Site values of a request this site made
MASK = "***"


def refuse_foreign_requests(app: Flask, allowed_hosts: tuple[str, ...]) -> None:
    """Refuse, before any view runs, a foreign Host, a GET on a state-changing route, a cross-origin change."""

    @app.before_request
    def _refuse() -> Response | None:
        return refusal(allowed_hosts)


def refusal(allowed_hosts: tuple[str, ...]) -> Response | None:
    """The response refusing this request, or None to serve it."""
    if not host_allowed(request.headers.get("Host"), allowed_hosts):
        # The name asked for is not echoed: it is whatever the caller chose to send.
        return _refused(403, f"This dashboard answers only at {', '.join(DEFAULT_ALLOWED_HOSTS)} and the names in "
                             f"{ALLOWED_HOSTS_VARIABLE}, not at the name in this address.")
    rule = request.url_rule
    changes = set(rule.methods or ()) - SAFE_METHODS if rule is not None else set()
    if not changes:
        return None
    if request.method not in changes:
        response = _refused(405, f"This address changes the queue: it takes {', '.join(sorted(changes))} only.")
        response.headers["Allow"] = ", ".join(sorted(changes))
        return response
    if not same_origin(request.headers.get("Sec-Fetch-Site"), request.headers.get("Origin"), request.host):
        return _refused(403, "Refused: a change to the queue from another site's page.")
    return None


def same_origin(fetch_site: str | None, origin: str | None, host: str) -> bool:
    """Whether a state-changing request came from this site's own pages (or from no browser page at all)."""
    if fetch_site is not None:
        return fetch_site.strip().lower() in BROWSER_SAME_ORIGIN
    if origin is None:
        return True
    try:
        netloc = urlsplit(origin.strip()).netloc
    except ValueError:
        return False
    return bool(netloc) and netloc.lower() == host.lower()  # "null" (a sandboxed or file page) has no netloc


def _refused(status: int, sentence: str) -> Response:
    return Response(sentence + "\n", status=status, mimetype="text/plain", headers={"Cache-Control": "no-store"})


def mask_secrets(app: Flask, secrets: tuple[str, ...]) -> None:
    """Replace each secret in every response's body and headers: the last guard behind showing URLs
    without their password, for whatever else might put one in a response (an error's text)."""
    if not secrets:
        return

    @app.after_request
    def _mask(response: Response) -> Response:
        pairs = list(response.headers.items())
        masked_pairs = [(name, mask(value, secrets)) for name, value in pairs]
        if masked_pairs != pairs:  # rebuilt whole: a header sent twice (Set-Cookie) stays two headers
            response.headers.clear()
            response.headers.extend(masked_pairs)
        if response.direct_passthrough or response.is_streamed:
            return response  # a static file, sent from disk: no secret is in those
        body = response.get_data()
        masked_body = mask_bytes(body, secrets)
        if masked_body != body:
            response.set_data(masked_body)
        return response


def mask(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:  # longest first (connection.url_secrets)
        text = text.replace(secret, MASK)
    return text


def mask_bytes(data: bytes, secrets: tuple[str, ...]) -> bytes:
    for secret in secrets:
        data = data.replace(secret.encode(), MASK.encode())
    return data


class MaskingFormatter(logging.Formatter):
    """A log line (its traceback too) with each secret replaced."""

    def __init__(self, fmt: str, secrets: tuple[str, ...]):
        super().__init__(fmt)
        self.secrets = secrets

    def format(self, record: logging.LogRecord) -> str:
        return mask(super().format(record), self.secrets)
