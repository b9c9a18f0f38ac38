"""Secrets (API keys): from the process's own environment, else `.streamlit/secrets.toml` at the project root.

Read where they are used, at call time: a secret never enters a TurnConfig, a job payload or Redis.
"""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

from agent import PROJECT_ROOT

log = logging.getLogger(__name__)

SECRETS_FILE = Path(".streamlit") / "secrets.toml"


def read_secret(variable: str, *, env: Mapping[str, str] | None = None, project_root: Path | None = None) -> str | None:
    """A secret from the environment, else a top-level key of .streamlit/secrets.toml; None if neither has it."""
    env = os.environ if env is None else env
    value = env.get(variable, "").strip()
    if value:
        return value
    path = (PROJECT_ROOT if project_root is None else Path(project_root)) / SECRETS_FILE
    try:
        with path.open("rb") as file:
            secrets = tomllib.load(file)
    except FileNotFoundError:
        return None
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        # Name the file, not its contents: the contents are secrets.
        log.warning("could not read %s (%s); ignoring it", path, type(exc).__name__)
        return None
    value = secrets.get(variable)
    return value.strip() or None if isinstance(value, str) else None
