"""`make dashboard`: the real rq-dashboard against the project's Redis, asked through its own HTTP API,
and what it must never do: unpickle, change the queue for another site's page, answer a foreign
Host, show the Redis password, or leave running a Redis it started."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

import pytest
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

import dashboard as dashboard_module
from agent.hosting import web_guards
from agent.queue import JOB_FUNCTION, QUEUE_NAME
from agent.runtime.connection import state_client, url_secrets
from agent.runtime.embedded_redis import EmbeddedRedis, alive
from harness import pools
from harness.page import chromium, chromium_available, free_port
from harness.waiting import wait_for
from tests import forged_jobs
from tests.conftest import FAST, ROOT, ask, wait_done

START_TIMEOUT_S = 30.0  # seconds for the dashboard to answer
SLOW = dataclasses.replace(FAST, model="demo:slow@1.5")  # a model call a worker is busy with for 1.5 s


def _get_json(url: str):
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None, None


@contextlib.contextmanager
def running_dashboard(env: dict, stderr_path):
    """`python dashboard.py` on a free port; yields (process, its root URL). Its stderr goes to a file."""
    port = free_port()
    with open(stderr_path, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "dashboard.py", "--port", str(port)], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=stderr)
    root = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _get_json(f"{root}/0/data/queues.json")[0] == 200 or proc.poll() is not None,
                 START_TIMEOUT_S, "the dashboard to answer")
        assert proc.poll() is None, stderr_path.read_text()
        yield proc, root
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def dashboard(redis_url, base_env, tmp_path):
    with running_dashboard({**base_env, "REDIS_URL": redis_url}, tmp_path / "dashboard.err") as (_, root):
        yield f"{root}/0/data"


def test_the_dashboard_lists_the_queue_and_the_pools_workers(dashboard, pool, store, queue):
    pools.wait_for_workers(pool, queue.connection, 2)
    wait_done(store, ask(store, queue, "What is 2+2?"))  # RQ lists a queue once a job has been enqueued on it
    status, queues = _get_json(f"{dashboard}/queues.json")
    assert status == 200
    assert QUEUE_NAME in [queue["name"] for queue in queues["queues"]]
    status, data = _get_json(f"{dashboard}/workers.json")
    assert status == 200, "the workers view failed"
    names = [worker["name"] for worker in data["workers"]]
    assert sum(name.startswith(f"agent-{pool.proc.pid}-") for name in names) == 2, names


def test_the_workers_view_shows_a_worker_busy_with_a_json_job(dashboard, pool, store, queue):
    """The case rq-dashboard 0.9 fails on its own: a worker's current job, read with the wrong serializer."""
    cid = ask(store, queue, "What is 2+2?", SLOW)
    job_id = wait_for(lambda: (store.read(cid) or {}).get("job_id"), 10, "the turn's job id")

    def busy_worker():
        status, data = _get_json(f"{dashboard}/workers.json")
        assert status == 200, "the workers view failed while a worker was busy"
        current = [w["current_job"] for w in data["workers"] if isinstance(w["current_job"], dict)]
        return [job for job in current if job["job_id"] == job_id]

    busy = wait_for(busy_worker, 10, "a worker shown busy with the turn's job")
    assert "run_turn" in busy[0]["call_string"]
    wait_done(store, cid)


def test_rq_info_shows_the_queue_and_workers_without_printing_the_password(redis_url, base_env, pool, store, queue):
    pools.wait_for_workers(pool, queue.connection, 2)
    wait_done(store, ask(store, queue, "What is 2+2?"))
    done = subprocess.run([sys.executable, "dashboard.py", "--rq-info"], cwd=ROOT, capture_output=True, text=True,
                          env={**base_env, "REDIS_URL": redis_url}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert QUEUE_NAME in done.stdout
    assert f"agent-{pool.proc.pid}-" in done.stdout
    password = urllib.parse.parse_qs(urllib.parse.urlsplit(redis_url).query).get("password", [""])[0]
    assert password and password not in done.stdout + done.stderr


# -- nothing unpickles ------------------------------------------------------------------------------

# The values a route's arguments are fuzzed with: every registry rq-dashboard names, and each forged job.
DASHBOARD_REGISTRIES = ("queued", "failed", "started", "finished", "deferred", "scheduled", "canceled")
SAME_ORIGIN = "same-origin"


def _route_values(job_ids: list[str]) -> dict[str, list]:
    return {"instance_number": [0], "queue_name": [QUEUE_NAME], "registry_name": list(DASHBOARD_REGISTRIES),
            "job_id": job_ids, "per_page": [8], "order": ["asc", "dsc"], "page": [1], "filename": ["favicon.ico"]}


def every_request(app, job_ids: list[str]):
    """(rule, method, path) for every rule in the app's url_map, with each of its methods and GET and POST,
    and every value its arguments can take here."""
    values = _route_values(job_ids)
    for rule in app.url_map.iter_rules():
        names = sorted(rule.arguments)
        missing = set(names) - values.keys()
        assert not missing, f"{rule.rule}: the fuzz has no values for {missing}; add them"
        for combination in itertools.product(*(values[name] for name in names)):
            _, path = rule.build(dict(zip(names, combination, strict=True)), append_unknown=False)
            for method in sorted(rule.methods | {"GET", "POST"}):
                yield rule, method, path


def _send(root: str, method: str, path: str, headers: dict | None = None) -> tuple[int, bytes, str]:
    """(status, body, headers as text) of one request; a refusal or an error is an answer too."""
    request = urllib.request.Request(root + path, method=method, headers=headers or {},
                                     data=b"" if method in ("POST", "PUT", "PATCH", "DELETE") else None)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read(), str(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), str(exc.headers)


def _same_origin(root: str) -> dict:
    return {"Origin": root, "Sec-Fetch-Site": SAME_ORIGIN}


def _canaries(canary_dir) -> list[str]:
    return sorted(path.name for path in canary_dir.iterdir())


@pytest.fixture
def canary_dir(tmp_path):
    path = tmp_path / "canaries"
    path.mkdir()
    return path


def test_forged_pickles_are_never_unpickled_by_any_route_of_the_dashboard(private_redis, base_env, tmp_path,
                                                                          canary_dir):
    """The fuzz: forged jobs in the queue, in every registry and as workers' current jobs, then every route
    of the Flask app with every method, as the dashboard's own page would send it (so the changes run)."""
    job_ids = forged_jobs.plant(private_redis.queue_connection, canary_dir)
    app = dashboard_module.make_app(private_redis.url)
    secrets = [secret.encode() for secret in url_secrets(private_redis.url)]
    assert secrets
    env = {**base_env, "REDIS_URL": private_redis.url, forged_jobs.CANARY_DIR_VARIABLE: str(canary_dir)}
    answers = {}
    with running_dashboard(env, tmp_path / "dashboard.err") as (_, root):
        for _rule, method, path in every_request(app, job_ids):
            status, body, headers = _send(root, method, path, _same_origin(root))
            if method not in ("GET", "HEAD", "OPTIONS"):
                forged_jobs.plant(private_redis.queue_connection, canary_dir)  # a delete or an empty took them
            answers[(method, path)] = status
            assert _canaries(canary_dir) == [], f"{method} {path} unpickled a forged field"
            leaked = [secret for secret in secrets if secret in body or secret in headers.encode()]
            assert not leaked, f"{method} {path} answered with the Redis password"
    assert _canaries(canary_dir) == []
    stderr = (tmp_path / "dashboard.err").read_bytes()
    assert not [secret for secret in secrets if secret in stderr]
    # The paths that unpickled before ran (a forged field RQ cannot read may fail one with a 500), not refused.
    for reached in [("POST", f"/requeue/{QUEUE_NAME}"), ("POST", f"/queue/{QUEUE_NAME}/failed/empty")]:
        assert answers[reached] not in (403, 405), (reached, answers[reached])
    for reached in [("POST", "/job/forged-meta/delete"), ("POST", "/job/forged-data/requeue"),
                    ("POST", "/job/forged-result/requeue"), ("GET", "/0/view/job/forged-meta"),
                    ("GET", "/0/data/workers.json"), ("GET", "/0/data/job/forged-data.json")]:
        assert answers[reached] == 200, (reached, answers[reached])
    assert len(answers) > 100, len(answers)


def test_rq_info_never_unpickles_nor_runs_a_forged_jobs_callback(private_redis, base_env, canary_dir):
    """`rq info` cleans the registries it lists: an abandoned forged job is loaded and its failure callback run."""
    forged_jobs.plant(private_redis.queue_connection, canary_dir)
    done = subprocess.run([sys.executable, "dashboard.py", "--rq-info"], cwd=ROOT, capture_output=True, text=True,
                          env={**base_env, "REDIS_URL": private_redis.url,
                               forged_jobs.CANARY_DIR_VARIABLE: str(canary_dir)}, timeout=60)
    assert _canaries(canary_dir) == [], done.stderr
    assert done.returncode == 0, done.stderr
    assert QUEUE_NAME in done.stdout


# Each process that builds an RQ queue, job or worker: the dashboard (and `rq info`), the CLI, a worker,
# the page (its session logic). (worker.py's own process only supervises workers.)
ENTRY_MODULES = ["dashboard", "agent.cli.main", "agent.hosting.worker_process", "agent.ui.state"]


@pytest.mark.parametrize("module", ENTRY_MODULES)
def test_rqs_pickle_serializer_reads_json_in_every_process_of_the_product(module, base_env, canary_dir):
    """The class: in a fresh process that imports an entry point (and so the queue), RQ's default serializer
    and the one it calls "pickle" refuse a pickle instead of running it."""
    payload = forged_jobs.canary_pickle(canary_dir, "loaded")
    code = (f"import {module}\n"
            "import sys\n"
            "from rq.serializers import resolve_serializer\n"
            "for serializer in (resolve_serializer(), resolve_serializer('pickle')):\n"
            "    try:\n"
            f"        serializer.loads({payload!r})\n"
            "    except ValueError:\n"
            "        pass\n"
            "    else:\n"
            "        sys.exit('a pickle was loaded')\n"
            "assert resolve_serializer().loads(b'{\"a\": 1}') == {'a': 1}\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=base_env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert _canaries(canary_dir) == []


# -- which requests it answers ------------------------------------------------------------------------

def _failed_job(connection) -> str:
    """A job of ours (JSON) in the failed registry: what requeue and delete act on."""
    job = Job.create(JOB_FUNCTION, args=["c", "t"], connection=connection, serializer=JSONSerializer,
                     origin=QUEUE_NAME, status=JobStatus.FAILED)
    job.save()
    FailedJobRegistry(QUEUE_NAME, connection=connection).add(job, ttl=600)
    return job.id


@pytest.fixture
def app(private_redis):
    return dashboard_module.make_app(private_redis.url)


def _changing_routes(app) -> list[str]:
    values = _route_values(["some-job"])
    paths = []
    for rule in app.url_map.iter_rules():
        if rule.methods - {"GET", "HEAD", "OPTIONS"}:
            first = {name: values[name][0] for name in rule.arguments}
            paths.append(rule.build(first, append_unknown=False)[1])
    return paths


def test_the_dashboard_has_routes_that_change_the_queue(app):
    """The refusal tests below go over these: they must be there to be refused."""
    paths = _changing_routes(app)
    assert f"/requeue/{QUEUE_NAME}" in paths and "/job/some-job/delete" in paths, paths


def test_a_get_on_any_route_that_changes_the_queue_is_refused(app, private_redis):
    job_id = _failed_job(private_redis.queue_connection)
    client = app.test_client()
    for path in _changing_routes(app) + [f"/job/{job_id}/requeue", f"/job/{job_id}/delete"]:
        for method in ("GET", "HEAD"):
            response = client.open(path, method=method)
            assert response.status_code == 405, (method, path, response.status_code)
    assert client.get(f"/requeue/{QUEUE_NAME}", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 405
    assert FailedJobRegistry(QUEUE_NAME, connection=private_redis.queue_connection).get_job_ids() == [job_id]


CROSS_ORIGIN = [
    {"Origin": "http://evil.test", "Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},  # another port or subdomain of the same site: another origin still
    {"Origin": "http://evil.test"},  # a browser without Sec-Fetch-*
    {"Origin": "null"},  # a sandboxed frame or a file:// page
    {"Origin": "http://localhost:1"},  # the same host, another port: another origin
    {"Origin": "http://localhost.evil.test"},
]


@pytest.mark.parametrize("headers", CROSS_ORIGIN, ids=lambda h: " ".join(f"{k}={v}" for k, v in h.items()))
def test_a_cross_origin_post_is_refused_and_changes_nothing(app, private_redis, headers):
    job_id = _failed_job(private_redis.queue_connection)
    client = app.test_client()
    for path in (f"/requeue/{QUEUE_NAME}", f"/job/{job_id}/requeue", f"/job/{job_id}/delete",
                 f"/queue/{QUEUE_NAME}/failed/empty"):
        response = client.post(path, headers=headers)
        assert response.status_code == 403, (path, response.status_code)
    assert FailedJobRegistry(QUEUE_NAME, connection=private_redis.queue_connection).get_job_ids() == [job_id]


@pytest.mark.parametrize("headers", [
    {"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin"},  # the dashboard's own page, in a browser
    {"Origin": "http://localhost"},  # a browser without Sec-Fetch-*
    {},  # curl: no browser page sent it
], ids=["browser", "older-browser", "no-browser"])
def test_a_same_origin_post_deletes_and_requeues(app, private_redis, headers):
    connection = private_redis.queue_connection
    client = app.test_client()  # its requests name Host: localhost
    job_id = _failed_job(connection)
    response = client.post(f"/job/{job_id}/requeue", headers=headers)
    assert (response.status_code, response.json) == (200, {"status": "OK"})
    assert Job.fetch(job_id, connection=connection, serializer=JSONSerializer).get_status() == "queued"
    response = client.post(f"/job/{job_id}/delete", headers=headers)
    assert (response.status_code, response.json) == (200, {"status": "OK"})
    assert not Job.exists(job_id, connection=connection)


@pytest.mark.parametrize("host", ["evil.test", "evil.test:9181", "127.0.0.1.evil.test", "localhost.evil.test:9181",
                                  "user@localhost", "localhost:9181/x"])
def test_a_foreign_host_is_refused_on_every_route(app, private_redis, host):
    _failed_job(private_redis.queue_connection)
    client = app.test_client()
    for _rule, method, path in every_request(app, ["some-job"]):
        response = client.open(path, method=method, headers={"Host": host, **_same_origin(f"http://{host}")})
        assert response.status_code == 403, (host, method, path, response.status_code)
        assert QUEUE_NAME.encode() not in response.data


@pytest.mark.parametrize("host", ["127.0.0.1:9181", "localhost", "[::1]:9181", "LOCALHOST:9181"])
def test_the_dashboard_answers_at_this_machines_names(app, private_redis, host):
    private_redis.queue.enqueue(JOB_FUNCTION, "c", "t")  # RQ lists a queue once a job has been enqueued on it
    response = app.test_client().get("/0/data/queues.json", headers={"Host": host})
    assert response.status_code == 200
    assert QUEUE_NAME in [queue["name"] for queue in response.json["queues"]]


def test_the_dashboard_answers_at_a_name_its_operator_allowed(private_redis):
    app = dashboard_module.make_app(private_redis.url, ("127.0.0.1", "localhost", "::1", "dash.example"))
    assert app.test_client().get("/0/data/queues.json", headers={"Host": "dash.example:9181"}).status_code == 200


# -- the password --------------------------------------------------------------------------------------

def test_the_header_shows_the_redis_url_with_its_password_masked(app, private_redis):
    password = urllib.parse.parse_qs(urllib.parse.urlsplit(private_redis.url).query)["password"][0]
    for path in ("/", "/0/view/workers", f"/0/view/jobs/{QUEUE_NAME}/failed/8/asc/1"):
        response = app.test_client().get(path)
        assert response.status_code == 200
        page = response.get_data(as_text=True)
        assert "redis.sock?password=***" in page  # the URL is shown, its password is not
        assert password not in page


def test_a_log_line_and_its_traceback_show_the_password_masked():
    url = "redis://:p%40ss-1@127.0.0.1:6379/0?password=second-2"
    formatter = web_guards.MaskingFormatter("%(levelname)s %(message)s", url_secrets(url))
    try:
        raise ConnectionError(f"cannot reach {url}")
    except ConnectionError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "connecting to %s", (url,), sys.exc_info())
    line = formatter.format(record)
    assert line.count("***") == 4, line  # the message's two passwords, and the traceback's
    assert not [secret for secret in ("p%40ss-1", "p@ss-1", "second-2") if secret in line]


def test_a_response_header_shows_the_password_masked(private_redis):
    app = dashboard_module.make_app(private_redis.url)
    password = url_secrets(private_redis.url)[0]

    @app.route("/echo")
    def echo():
        return "", 204, [("X-Url", private_redis.url), ("Set-Cookie", f"a={password}"), ("Set-Cookie", "b=2")]

    response = app.test_client().get("/echo")
    assert response.headers["X-Url"].endswith("?password=***")
    assert response.headers.getlist("Set-Cookie") == ["a=***", "b=2"]


# -- SIGTERM -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_stops_the_embedded_redis_the_dashboard_started(base_env, tmp_path, signum):
    data_dir = tmp_path / "data"  # base_env's AGENT_DATA_DIR: a Redis of the dashboard's own
    with running_dashboard(base_env, tmp_path / "dashboard.err") as (proc, _):
        redis_pid = EmbeddedRedis(data_dir).pid
        assert redis_pid is not None and alive(redis_pid)
        os.kill(proc.pid, signum)
        status = proc.wait(15)
    wait_for(lambda: not alive(redis_pid), 10, "the embedded Redis to stop")
    assert status == 0, (tmp_path / "dashboard.err").read_text()


def test_a_stop_signal_leaves_running_an_embedded_redis_that_another_process_uses(base_env, tmp_path):
    shared = EmbeddedRedis(tmp_path / "data")
    shared.acquire()  # this test is the other user, as the page would be
    try:
        with running_dashboard(base_env, tmp_path / "dashboard.err") as (proc, _):
            os.kill(proc.pid, signal.SIGTERM)
            assert proc.wait(15) == 0
        assert shared.pid is not None and alive(shared.pid)
        assert state_client(shared.url).ping()
    finally:
        shared.release()
    assert shared.pid is None


def test_pickle_is_what_the_forged_jobs_hold(canary_dir):
    """The fuzz's payloads do run when unpickled: a test of the test."""
    pickle.loads(forged_jobs.canary_pickle(canary_dir, "self-test"))
    assert _canaries(canary_dir) == ["self-test"]


# -- in a browser ----------------------------------------------------------------------------------------

ATTACKER_PAGE = "http://evil.test/"  # served by Playwright, so it is another site's page to the browser
BROWSER_TIMEOUT_MS = 30_000


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(not chromium_available(), reason="Debian's chromium is not installed")
def test_in_a_browser_the_dashboards_delete_button_works_and_another_sites_page_changes_nothing(
        private_redis, base_env, tmp_path):
    connection = private_redis.queue_connection
    kept, deleted = _failed_job(connection), _failed_job(connection)
    with running_dashboard({**base_env, "REDIS_URL": private_redis.url}, tmp_path / "dashboard.err") as (_, root), \
            chromium() as browser:
        page = browser.new_context().new_page()
        # Another site's page: an <img> GETs a requeue, a form POSTs a delete (a navigation: no CORS to stop it).
        page.route(ATTACKER_PAGE, lambda route: route.fulfill(content_type="text/html", body=(
            f'<img src="{root}/requeue/{QUEUE_NAME}">'
            f'<form method="post" action="{root}/job/{kept}/delete"></form>'
            '<script>document.forms[0].submit()</script>')))
        with page.expect_response(f"{root}/job/{kept}/delete", timeout=BROWSER_TIMEOUT_MS) as refused:
            page.goto(ATTACKER_PAGE)
        assert refused.value.status == 403
        assert Job.exists(kept, connection=connection)
        # The dashboard's own page: the row's Delete, then Yes in its dialog (a jQuery POST, same-origin).
        page.goto(f"{root}/0/view/jobs/{QUEUE_NAME}/failed/8/asc/1")
        page.click(f'tr[data-job-id="{deleted}"] [data-role=delete-job-btn]', timeout=BROWSER_TIMEOUT_MS)
        with page.expect_response(f"{root}/job/{deleted}/delete", timeout=BROWSER_TIMEOUT_MS) as done:
            page.click("#confirmation-modal-yes", timeout=BROWSER_TIMEOUT_MS)
        assert done.value.status == 200
        wait_for(lambda: not Job.exists(deleted, connection=connection), 10, "the job to be deleted")
    assert FailedJobRegistry(QUEUE_NAME, connection=connection).get_job_ids() == [kept]
    assert Job.exists(kept, connection=connection)
