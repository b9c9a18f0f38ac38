"""`python -m agent.ui.launch [streamlit options]`: `streamlit run app.py` as `make run` starts it, with the
configuration checked and the first page's work done before the server answers.

A bad setting, or a Redis that cannot be had (a wrong REDIS_URL), is said on stderr in one line, as the
command line says it (agent/settings.py, agent/hosting/services.py), and the launch exits 2 before
Streamlit says the app can be viewed. A page started otherwise (`streamlit run app.py`) still says it on
the page.

Then what a fresh server's first session would pay for is paid here, before anyone opens the page: the
services (the embedded Redis and the workers, once per process, which the page's own start then finds)
and the imports of what the page's first run imports (`warm`). The first person to open the page waits
no longer than the next.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys

import redis

from agent import PROJECT_ROOT
from agent.settings import settings_for_command

APP = PROJECT_ROOT / "app.py"
EXIT_CONFIG = 2  # as the command line: bad configuration, or services that could not start
# Imported by a session's first run rather than by the page's modules: the autorefresh component's
# arguments go through Streamlit's Arrow code (pyarrow, numpy); emoji icons; the script runner's helpers.
FIRST_RUN_MODULES = (
    "streamlit.components.v1.component_arrow",
    "pyarrow",
    "numpy",
    "streamlit.emojis",
    "streamlit.runtime.scriptrunner.magic_funcs",
)


def prepare() -> int | None:
    """Check the settings and start the services; the exit status if they cannot be had, else None."""
    settings = settings_for_command()  # one line on stderr when a value is wrong
    if settings is None:
        return EXIT_CONFIG
    from agent.hosting import services

    try:
        if settings.redis_url:  # said in its one line before anything is started
            services.check_redis(settings.redis_url)
        starting = ["the embedded Redis"] if not settings.redis_url else []
        starting += [f"{settings.workers} worker{'s' * (settings.workers != 1)}"] if settings.workers else []
        if starting:
            print(f"Starting {' and '.join(starting)}…", file=sys.stderr, flush=True)
        services.ensure(settings)
    except (services.ServiceError, redis.RedisError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return None


def warm() -> None:
    """Import what the page's first run imports, now rather than in the first session.

    A component (streamlit-autorefresh's) registers with Streamlit's runtime only when it is declared
    inside a script run, so the modules that declare one, and the page's own modules that hold what
    they declared, are dropped again: the first run imports them anew (about 0.1 s), and finds all
    they import (Streamlit's elements, pyarrow, numpy, redis, rq, httpx, the rest of the agent) loaded."""
    before = set(sys.modules)
    logging.disable(logging.WARNING)  # Streamlit warns of the missing script run on every import outside one
    try:
        importlib.import_module("agent.ui.shell")
        for name in FIRST_RUN_MODULES:
            with contextlib.suppress(ImportError):  # a Streamlit release that moved one: the first run imports it
                importlib.import_module(name)
    finally:
        logging.disable(logging.NOTSET)
    for name in set(sys.modules) - before:
        module = sys.modules[name]
        if name.startswith("agent.ui.") or (module is not None and _declares_component(module)):
            del sys.modules[name]


def _declares_component(module) -> bool:
    from streamlit.components.v1.custom_component import CustomComponent

    return any(isinstance(value, CustomComponent) for value in list(vars(module).values()))


def main(argv: list[str] | None = None) -> int:
    failed = prepare()
    if failed is not None:
        return failed
    warm()
    from streamlit.web import cli

    # The imports read Streamlit's config before its command reads it again with the command line's options:
    # that second reading says "please restart streamlit", about a server that has not started yet.
    logging.getLogger("streamlit.config").addFilter(
        lambda record: "config option section was detected" not in record.getMessage())

    # Streamlit's own command, in this process: it finds the services started and the modules imported.
    cli.main(args=["run", str(APP), *(sys.argv[1:] if argv is None else argv)], prog_name="streamlit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
