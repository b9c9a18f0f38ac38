"""`make run-signin`: the page with sign-in, through a mock OpenID Connect provider on loopback.

For trying sign-in (and showing it to stakeholders) on one machine, with no provider account: the mock
(`oidc-provider-mock`, the one the tests use) asks whom to sign in as, and accepts anyone. It starts the
mock on 127.0.0.1:OIDC_PORT, writes an `[auth]` section for it under .data/signin/ (its cookie secret
is kept there, so a restart keeps people signed in), and runs the page with that section beside
`.streamlit/secrets.toml` (whose API keys still count). Both stop together, on Ctrl-C or when either ends.
A real provider needs none of this: put its `[auth]` section in `.streamlit/secrets.toml`
(docs/sign-in.md).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("AGENT_DATA_DIR") or ROOT / ".data") / "signin"
PEOPLE = (  # offered on the mock's sign-in form; any other name typed there works too
    {"sub": "alice", "email": "alice@example.org", "email_verified": True, "name": "Alice"},
    {"sub": "bob", "email": "bob@example.org", "email_verified": True, "name": "Bob"},
    {"sub": "admin", "email": "admin@example.org", "email_verified": True, "name": "Admin (reads everyone's)"},
)
START_S = 20.0  # seconds the mock gets to answer
SIGN_IN_HOST = "localhost"  # the name in redirect_uri: sign-in works there only (the page says so elsewhere)


def main() -> int:
    host, port = os.environ.get("HOST", "127.0.0.1"), os.environ.get("PORT", "8501")
    oidc_port = int(os.environ.get("OIDC_PORT", "9400"))
    issuer = f"http://127.0.0.1:{oidc_port}"
    secrets_file = write_secrets(issuer, f"http://{SIGN_IN_HOST}:{port}/oauth2callback")
    # A terminal's hang-up or a kill ends this script through its `finally`, which stops both children.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _exit_on)
    mock = page = None
    try:
        mock = subprocess.Popen(
            [sys.executable, "-m", "oidc_provider_mock", "--host", "127.0.0.1", "--port", str(oidc_port),
             *(arg for person in PEOPLE for arg in ("--user-claims", json.dumps(person)))],
            env={**os.environ, "AUTHLIB_INSECURE_TRANSPORT": "1"}, start_new_session=True)
        if not answers(f"{issuer}/.well-known/openid-configuration", mock):
            print(f"run-signin: the mock provider did not start on {issuer} (is the port taken? set OIDC_PORT)",
                  file=sys.stderr)
            return 1
        files = [str(p) for p in (ROOT / ".streamlit" / "secrets.toml",) if p.exists()] + [str(secrets_file)]
        print(f"run-signin: open http://{SIGN_IN_HOST}:{port} (not 127.0.0.1: the sign-in cookie belongs to the name "
              f"in redirect_uri) and sign in as alice, bob or admin (AGENT_ADMINS), or any name.", flush=True)
        env = {"AGENT_ADMINS": "admin@example.org", **os.environ}
        # Streamlit prints the address to open as browser.serverAddress says, else as the bound address (127.0.0.1,
        # where sign-in cannot work): the name in redirect_uri it is.
        page = subprocess.Popen(
            [sys.executable, "-m", "agent.ui.launch", "--server.address", host, "--server.port", port,
             "--browser.serverAddress", SIGN_IN_HOST,
             *(arg for path in files for arg in ("--secrets.files", path))], cwd=ROOT, env=env)
        while page.poll() is None and mock.poll() is None:
            time.sleep(0.5)
        if mock.poll() is not None:
            print("run-signin: the mock provider stopped; stopping the page", file=sys.stderr)
            return 1
        return page.returncode
    except KeyboardInterrupt:
        return 130
    finally:
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # a second signal must not cut the cleanup
            signal.signal(signum, signal.SIG_IGN)
        for proc in (mock, page):
            _stop(proc)


def _exit_on(signum, _frame) -> None:
    raise SystemExit(128 + signum)


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def write_secrets(issuer: str, redirect_uri: str) -> Path:
    DATA.mkdir(parents=True, exist_ok=True)
    cookie_file = DATA / "cookie_secret"
    if not cookie_file.exists():
        _write_private(cookie_file, secrets.token_urlsafe(32))
    path = DATA / "secrets.toml"
    _write_private(path, (
        "# Written by `make run-signin` for its mock provider; a real provider's goes in .streamlit/secrets.toml\n"
        "[auth]\n"
        f"redirect_uri = {json.dumps(redirect_uri)}\n"
        f"cookie_secret = {json.dumps(cookie_file.read_text().strip())}\n"
        'client_id = "agent-demo"\n'
        'client_secret = "agent-demo"\n'
        f"server_metadata_url = {json.dumps(issuer + '/.well-known/openid-configuration')}\n"))
    return path


def _write_private(path: Path, text: str) -> None:
    """Readable by this user only from the first byte (never written first and restricted after)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)


def answers(url: str, proc: subprocess.Popen) -> bool:
    end = time.monotonic() + START_S
    while time.monotonic() < end and proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback, our own URL
                return response.status == 200
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    return False


if __name__ == "__main__":
    sys.exit(main())
