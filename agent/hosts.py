"""Hosts: which URLs and names are this machine (loopback), and the one host a Host header names.

Both answers guard something (where an API key may go, which names the page answers at), so both
read only plain text: no user info, backslash, whitespace, control or non-ASCII characters, which
URL parsers read differently, and a netloc that is a host and an optional port and nothing else.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import SplitResult, urlsplit


def is_local_url(url: str) -> bool:
    """A server on this machine (loopback), such as Ollama, llama.cpp or vLLM, which usually needs no key.

    Whether an API key may go to a turn's server rests on this, so it is strict: the URL must be
    plain, and its host must be a loopback IP literal (127.0.0.0/8, ::1) or exactly `localhost`,
    in any case. `127.0.0.1.evil.test`, `localhost.` (trailing dot), `127.1` and `0x7f.0.0.1` are
    names or shorthands, not literals: they are not local."""
    split = _split_plain(url)
    if split is None:
        return False
    parts, host = split
    return parts.scheme.lower() in ("http", "https") and is_local_host(host)


def is_local_host(host: str | None) -> bool:
    """The host (no port; IPv6 with or without brackets) is a loopback IP literal or exactly `localhost`."""
    if not host:
        return False
    host = host.lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(text: str) -> str | None:
    """The host of a Host header or a name ("Example.COM.:8501" -> "example.com", "[::1]" -> "::1");
    None when the text is anything more than a host and an optional port."""
    if not _is_plain(text):
        return None
    try:
        return str(ipaddress.ip_address(text))  # an unbracketed IPv6 address, as an operator may write it
    except ValueError:
        pass
    split = _split_plain("//" + text)
    if split is None:
        return None
    parts, host = split
    if parts.path or parts.query or parts.fragment:
        return None
    try:
        return str(ipaddress.ip_address(host))  # one spelling per address: "0:0::1" is "::1"
    except ValueError:
        return host.removesuffix(".") or None  # "localhost." is the same name as "localhost" to a resolver


def host_allowed(host_header: str | None, allowed: tuple[str, ...]) -> bool:
    """Whether the page may answer a request with this Host header.

    No header at all is allowed: every browser sends one (so a rebinding attack comes with one), and
    headless clients such as Streamlit's AppTest send none. A loopback literal or localhost is
    always this machine; any other name must be in `allowed`."""
    if host_header is None:
        return True
    name = host_name(host_header)
    return name is not None and (name in allowed or is_local_host(name))


def _is_plain(text: str) -> bool:
    return isinstance(text, str) and bool(text) and text.isascii() and text.isprintable() and " " not in text \
        and "\\" not in text


def _split_plain(url: str) -> tuple[SplitResult, str] | None:
    """A plain URL's parts and its host (lowercase, IPv6 without brackets); None unless its netloc is
    exactly that host and an optional port: urlsplit reads "[::1].evil.test" as host "::1", and
    "user@host" has a host that parsers disagree on."""
    if not _is_plain(url):
        return None
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError on a port that is not a number in range
    except ValueError:
        return None
    host = parts.hostname
    if not host:
        return None
    bracketed = f"[{host}]" if ":" in host else host
    if parts.netloc.lower() != (bracketed if port is None else f"{bracketed}:{port}"):
        return None
    return parts, host
