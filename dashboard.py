"""`python dashboard.py`: rq-dashboard against the Redis the app uses, with the JSON serializer.

`make dashboard` runs it. With REDIS_URL set it watches that server; without, it joins (or starts)
the embedded Redis under .data/, as `python worker.py` does, and leaves it on SIGTERM or Ctrl-C (the
last process to leave stops it). `--rq-info` runs RQ's `rq info` instead (`make rq-info`), with the
server's URL and password, which it never prints. Nothing here unpickles (agent/runtime/json_only.py),
and the dashboard answers only requests that its own pages could have made (agent/hosting/web_guards.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from rq.serializers import JSONSerializer

from agent.hosting import web_guards
from agent.hosting.services import ServiceError, redis_for_command
from agent.queue import SafeJob, SafeQueue
from agent.runtime import json_only
from agent.runtime.connection import describe, url_secrets
from agent.runtime.logs import FORMAT
from agent.settings import DEFAULT_ALLOWED_HOSTS, allowed_hosts, settings_for_command

DEFAULT_PORT = 9181  # rq-dashboard's own default
SERIALIZER_PATH = "rq.serializers.JSONSerializer"  # what every job and worker of this project uses
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# `rq info` builds its queues with neither the job class nor the serializer it is given, then cleans
# their registries, which loads jobs and runs an abandoned job's failure callback: its queues are ours.
RQ_INFO_CLASSES = ["--serializer", SERIALIZER_PATH, "--job-class", f"{SafeJob.__module__}.{SafeJob.__name__}",
                   "--queue-class", f"{SafeQueue.__module__}.{SafeQueue.__name__}"]


def make_app(redis_url: str, hosts: tuple[str, ...] = DEFAULT_ALLOWED_HOSTS):
    """rq-dashboard's Flask app, reading jobs and workers with the project's JSON serializer, answering
    only at `hosts` and only what its own pages could ask, and never showing the URL's password."""
    from rq_dashboard import web
    from rq_dashboard.cli import make_flask_app

    json_only.install()  # rq-dashboard reads with RQ's default serializer wherever it is not given one
    web.config.serializer = JSONSerializer
    app = make_flask_app(None, None, None, "")
    app.config["RQ_DASHBOARD_REDIS_URL"] = [redis_url]
    app.config["DEPRECATED_OPTIONS"] = []
    # Its routes without an instance number (requeue, delete, empty) read the connection this sets up;
    # rq-dashboard's own command does this at start, and without it they fail until a page has been read.
    web.setup_rq_connection(app)

    # rq-dashboard 0.9 lists workers without a serializer, so a worker busy with a JSON job (or a key a
    # killed worker left with its current job) fails the whole view with a DeserializationError. Flask's
    # table of views takes the same view, reading workers with the serializer every job here uses.
    app.view_functions["rq_dashboard.list_workers"] = web.jsonify(_list_workers)
    web_guards.refuse_foreign_requests(app, hosts)
    # Its header lists the URL it watches, hiding only a `user:password@`, not a `?password=`.
    web_guards.mask_secrets(app, url_secrets(redis_url))
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
    """RQ's `rq info` on the project's queue and workers, run in this process (where nothing unpickles):
    the URL is never on a command line."""
    from rq.cli import main as rq_main

    try:
        rq_main(["info", "--url", redis_url, *RQ_INFO_CLASSES, *extra], prog_name="rq")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return 0


def serve(app, host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT. The signal asks the server to stop from a thread (its shutdown waits
    for the loop this thread runs), and the caller then releases what it acquired."""
    from werkzeug.serving import make_server

    server = make_server(host, port, app, threaded=True)

    def stop(signum, frame) -> None:
        threading.Thread(target=server.shutdown, name="dashboard-stop", daemon=True).start()

    # Kept once the server has stopped: a second signal then does nothing, rather than cut short the release.
    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
    server.serve_forever()  # werkzeug's closes the socket when it returns


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # before the server runs: the start is cut short, and what it acquired released


def _log_to_stderr(secrets: tuple[str, ...]) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(web_guards.MaskingFormatter(FORMAT, secrets))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python dashboard.py", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--rq-info", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="run `rq info` (with ARGS, e.g. --interval 1) against the same Redis instead")
    args = parser.parse_args(argv)
    # Without these a SIGTERM ends the process where it stands, and an embedded Redis it started runs on.
    for sig in STOP_SIGNALS:
        signal.signal(sig, _interrupt)
    settings = settings_for_command()
    if settings is None:
        return 2
    try:
        with redis_for_command(settings) as url:
            _log_to_stderr(url_secrets(url))
            if args.rq_info is not None:
                return rq_info(url, args.rq_info)
            app = make_app(url, allowed_hosts(os.environ, args.host))
            print(f"rq-dashboard on http://{args.host}:{args.port}/ for {describe(url)}; Ctrl-C to stop",
                  file=sys.stderr, flush=True)
            serve(app, args.host, args.port)
            return 0
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the port is taken, or the address is not this machine's
        print(f"error: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
