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
    {"sub": "alice", "email": "alice@example.org", "name": "Alice"},
    {"sub": "bob", "email": "bob@example.org", "name": "Bob"},
    {"sub": "admin", "email": "admin@example.org", "name": "Admin (reads everyone's)"},
)
START_S = 20.0  # seconds the mock gets to answer


def main() -> int:
    host, port = os.environ.get("HOST", "127.0.0.1"), os.environ.get("PORT", "8501")
    oidc_port = int(os.environ.get("OIDC_PORT", "9400"))
    issuer = f"http://127.0.0.1:{oidc_port}"
    secrets_file = write_secrets(issuer, f"http://localhost:{port}/oauth2callback")
    mock = subprocess.Popen(
        [sys.executable, "-m", "oidc_provider_mock", "--host", "127.0.0.1", "--port", str(oidc_port),
         *(arg for person in PEOPLE for arg in ("--user-claims", json.dumps(person)))],
        env={**os.environ, "AUTHLIB_INSECURE_TRANSPORT": "1"}, start_new_session=True)
    page = None
    try:
        if not answers(f"{issuer}/.well-known/openid-configuration", mock):
            print(f"run-signin: the mock provider did not answer on {issuer}", file=sys.stderr)
            return 1
        files = [str(p) for p in (ROOT / ".streamlit" / "secrets.toml",) if p.exists()] + [str(secrets_file)]
        print(f"run-signin: open http://localhost:{port} (not 127.0.0.1: the sign-in cookie belongs to the name in "
              f"redirect_uri) and sign in as alice, bob or admin (AGENT_ADMINS), or any name.", flush=True)
        env = {"AGENT_ADMINS": "admin@example.org", **os.environ}
        page = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app.py", "--server.address", host, "--server.port", port,
             *(arg for path in files for arg in ("--secrets.files", path))], cwd=ROOT, env=env)
        signal.signal(signal.SIGTERM, lambda *_: page.terminate())
        while page.poll() is None and mock.poll() is None:
            time.sleep(0.5)
        return page.returncode or 0
    except KeyboardInterrupt:
        return 130
    finally:
        for proc in (page, mock):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()


def write_secrets(issuer: str, redirect_uri: str) -> Path:
    DATA.mkdir(parents=True, exist_ok=True)
    cookie_file = DATA / "cookie_secret"
    if not cookie_file.exists():
        cookie_file.write_text(secrets.token_urlsafe(32))
        cookie_file.chmod(0o600)
    path = DATA / "secrets.toml"
    path.write_text(
        "# Written by `make run-signin` for its mock provider; a real provider's goes in .streamlit/secrets.toml\n"
        "[auth]\n"
        f"redirect_uri = {json.dumps(redirect_uri)}\n"
        f"cookie_secret = {json.dumps(cookie_file.read_text().strip())}\n"
        'client_id = "agent-demo"\n'
        'client_secret = "agent-demo"\n'
        f"server_metadata_url = {json.dumps(issuer + '/.well-known/openid-configuration')}\n")
    path.chmod(0o600)
    return path


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
