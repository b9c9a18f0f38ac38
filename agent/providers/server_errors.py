"""A provider's own error where a reply was expected: an error event in a stream (OpenAI-compatible
servers send `data: {"error": {...}}`, Anthropic `event: error`, llama.cpp an `error: {...}` line), a
2xx body that carries an error instead of an answer, or an error status whose body says the request
cannot succeed.

Each is classified by the error's type or code into the HTTP status the same error has as a reply,
so that what cannot succeed (an invalid request, a prompt past the model's context) is never retried,
and is quoted to the person in the server's own words (redacted and cut, as every quoted text).
"""

from __future__ import annotations

from typing import Any, NoReturn

from agent import bounded_json
from agent.providers.base import ProviderError, ProviderErrorKind
from agent.providers.http import HTTPReply, check_status, error_text
from agent.providers.retry import RETRY_POLICY

# An error's `type` or `code` -> the HTTP status it has as a reply: Anthropic's types, OpenAI's (type
# or code), llama.cpp's and llama-cpp-python's. Anything else is the server failing.
ERROR_STATUSES = {
    "invalid_request_error": 400,
    "context_length_exceeded": 400,
    "exceed_context_size_error": 400,
    "string_above_max_length": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "rate_limit_exceeded": 429,
    "requests": 429,
    "tokens": 429,
    "api_error": 500,
    "server_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
DEFAULT_STATUS = 500
# How servers without a code say that the prompt does not fit: the same request can never succeed.
CONTEXT_PHRASES = ("context length", "context window", "context size", "maximum context", "exceeds the context")
# An error's own word for its class that `ERROR_STATUSES` names first (before a numeric code).
_NAMED = ("code", "type")


def error_of(data: Any) -> dict | None:
    """The error object a decoded body or event carries, or None when it carries none: `{"error":
    {...}}`, `{"error": "text"}` (Ollama), or llama.cpp's bare `{"code": 400, "message": ..., "type": ...}`."""
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    if isinstance(error, dict):
        return error
    if isinstance(error, str) and error:
        return {"message": error}
    if isinstance(data.get("message"), str) and any(name in data for name in _NAMED) and "choices" not in data:
        return data
    return None


def status_of(error: dict) -> int:
    """The HTTP status this error has as a reply: its named type or code first, then a numeric code,
    then its words (a prompt past the context), else a server failure."""
    for name in _NAMED:
        value = error.get(name)
        if isinstance(value, str) and value in ERROR_STATUSES:
            return ERROR_STATUSES[value]
    if cannot_succeed(error):
        return 400
    for name in ("code", "status"):
        value = error.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and 400 <= value < 600:
            return value
    return DEFAULT_STATUS


def cannot_succeed(error: dict) -> bool:
    """The error says the prompt does not fit the model: asking again cannot help."""
    named = {error.get(name) for name in _NAMED}
    if named & {"context_length_exceeded", "exceed_context_size_error"}:
        return True
    message = error.get("message")
    return isinstance(message, str) and any(phrase in message.lower() for phrase in CONTEXT_PHRASES)


def raise_reported(data: Any, *, secret: str | None, where: str) -> NoReturn:
    """Raise the ProviderError a server's error object means, its own message quoted; `where` says
    where it came ("in its stream", "in its HTTP 200 reply")."""
    error = error_of(data) or {}
    status = status_of(error)
    body = bounded_json.dumps({"error": error}).encode()
    label = next((error[name] for name in _NAMED if error.get(name) in ERROR_STATUSES), None)
    named = f" ({label})" if label else ""  # a name from the table only: the rest is the server's text
    message = f"the provider reported an error {where}{named}: {error_text(body, secret=secret) or 'no message'}"
    try:
        check_status(HTTPReply(status=status, headers={}, body=body), secret=secret)
    except ProviderError as exc:  # its kind (and so whether it is retried) is the status's
        raise ProviderError(exc.kind, message, status=status) from None
    raise ProviderError(ProviderErrorKind.SERVER, message, status=status)  # not reached: status_of is an error


def check(reply: HTTPReply, *, secret: str | None) -> None:
    """check_status, except that an error whose body says it cannot succeed is not retried, whatever
    its status."""
    try:
        check_status(reply, secret=secret)
    except ProviderError as exc:
        error = error_of(_lenient_json(reply.body)) if RETRY_POLICY.retryable(exc) else None
        if error is not None and cannot_succeed(error):
            raise ProviderError(ProviderErrorKind.BAD_REQUEST, exc.message, status=exc.status) from None
        raise


def _lenient_json(body: bytes) -> Any:
    try:
        return bounded_json.loads(body)
    except ValueError:  # malformed, or nested too deeply (bounded_json.TooDeep)
        return None
