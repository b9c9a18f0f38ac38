"""`python worker.py [--workers N]`: external RQ workers against the configured Redis.

Run it on any machine that can reach REDIS_URL to add workers to the pool; set
AGENT_WORKERS=0 where the app runs to rely on external workers only.
"""

from __future__ import annotations

import argparse
import os
import sys

from agent.hosting.pool import main as pool_main
from agent.hosting.services import ServiceError, redis_for_command
from agent.runtime.connection import describe
from agent.settings import settings_for_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python worker.py", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=None, help="how many workers (default: AGENT_WORKERS or 2)")
    parser.add_argument("--class", dest="worker_class", default="simple", choices=["simple", "fork", "spawn"])
    args = parser.parse_args(argv)
    settings = settings_for_command()
    if settings is None:
        return 2
    workers = args.workers if args.workers is not None else (settings.workers or 2)
    if workers < 1:
        print("--workers: must be at least 1", file=sys.stderr)
        return 2
    try:
        with redis_for_command(settings) as url:
            os.environ["REDIS_URL"] = url
            print(f"{workers} workers on {describe(url)}; Ctrl-C to stop", file=sys.stderr)
            return pool_main(["--workers", str(workers), "--class", args.worker_class])
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

if __name__ == "__main__":
    sys.exit(main())
