"""`python dashboard.py`: rq-dashboard against the Redis the app uses, with the JSON serializer.

`make dashboard` runs it. With REDIS_URL set it watches that server; without, it joins (or starts)
the embedded Redis under .data/, as `python worker.py` does. `--rq-info` runs the matching
`rq info` instead (`make rq-info`), with the server's URL and password, which it never prints.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from rq.serializers import JSONSerializer

from agent.hosting.services import ServiceError, redis_for_command
from agent.runtime.connection import describe
from agent.settings import settings_for_command

DEFAULT_PORT = 9181  # rq-dashboard's own default
SERIALIZER_PATH = "rq.serializers.JSONSerializer"  # what every job and worker of this project uses


def make_app(redis_url: str):
    """rq-dashboard's Flask app, reading jobs and workers with the project's JSON serializer."""
    from rq_dashboard import web
    from rq_dashboard.cli import make_flask_app

    web.config.serializer = JSONSerializer
    app = make_flask_app(None, None, None, "")
    app.config["RQ_DASHBOARD_REDIS_URL"] = [redis_url]
    app.config["DEPRECATED_OPTIONS"] = []

    # rq-dashboard 0.9 lists workers without a serializer, so a worker busy with a JSON job (or a key a
    # killed worker left with its current job) fails the whole view with a DeserializationError. Flask's
    # table of views takes the same view, reading workers with the serializer every job here uses.
    app.view_functions["rq_dashboard.list_workers"] = web.jsonify(_list_workers)
    return app


def _list_workers(instance_number):
    """rq-dashboard's workers.json, field for field, with the JSON serializer."""
    from flask import current_app
    from rq import Worker
    from rq_dashboard.web import serialize_current_job

    workers = [
        dict(name=worker.name, pid=worker.pid, queues=[queue.name for queue in worker.queues],
             state=str(worker.get_state()), current_job=serialize_current_job(worker.get_current_job()),
             last_heartbeat=worker.last_heartbeat, birth_date=worker.birth_date,
             successful_job_count=worker.successful_job_count, failed_job_count=worker.failed_job_count,
             total_working_time=worker.total_working_time, version=getattr(worker, "version", ""),
             python_version=getattr(worker, "python_version", ""))
        for worker in Worker.all(connection=current_app.redis_conn, serializer=JSONSerializer)
    ]
    return dict(workers=sorted(workers, key=lambda w: (w["state"], w["queues"], w["name"])))


def rq_info(redis_url: str, extra: list[str]) -> int:
    """`rq info` on the project's queue and workers; the URL goes in its environment, not on a command line."""
    command = [f"{sys.prefix}/bin/rq", "info", "--serializer", SERIALIZER_PATH, *extra]
    return subprocess.call(command, env={**os.environ, "RQ_REDIS_URL": redis_url})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python dashboard.py", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--rq-info", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="run `rq info` (with ARGS, e.g. --interval 1) against the same Redis instead")
    args = parser.parse_args(argv)
    settings = settings_for_command()
    if settings is None:
        return 2
    try:
        with redis_for_command(settings) as url:
            if args.rq_info is not None:
                return rq_info(url, args.rq_info)
            print(f"rq-dashboard on http://{args.host}:{args.port}/ for {describe(url)}; Ctrl-C to stop",
                  file=sys.stderr)
            make_app(url).run(host=args.host, port=args.port, use_reloader=False)
            return 0
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

if __name__ == "__main__":
    sys.exit(main())
