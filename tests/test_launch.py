"""`make run` (agent/ui/launch.py): a bad setting or an unreachable Redis is refused in one line on stderr,
exit 2, before Streamlit says the app can be viewed; a good start has its services up and its workers
registered before the server answers, so the first page pays no more than the next."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from agent.queue import get_queue, running_workers
from agent.runtime.connection import queue_client
from harness.page import free_port, page_server
from tests.conftest import ROOT
from tests.test_cli import BAD_ENV, closed_port, one_line

LAUNCH_TIMEOUT_S = 60  # seconds for a refused launch to exit (it refuses before starting anything)
SERVED = "You can now view"  # Streamlit's line once it answers


def launch(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent.ui.launch", "--server.port", str(free_port()),
                           "--server.address", "127.0.0.1", "--server.headless", "true"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, stdin=subprocess.DEVNULL)


def test_make_run_starts_the_page_through_the_launch():
    makefile = (ROOT / "Makefile").read_text()
    run = re.search(r"^run: .*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    assert "-m agent.ui.launch" in run and "streamlit run" not in run


@pytest.mark.parametrize(("changes", "variable"), BAD_ENV, ids=[f"{v}-{i}" for i, (_, v) in enumerate(BAD_ENV)])
def test_a_bad_setting_is_refused_in_one_line_before_the_server_starts(base_env, changes, variable):
    result = launch({**base_env, **changes})
    assert result.returncode == 2
    assert variable in one_line(result.stderr.encode())
    assert SERVED not in result.stdout


def test_an_unreachable_redis_is_refused_in_one_line_that_hides_its_password(base_env):
    result = launch({**base_env, "REDIS_URL": f"redis://:hunter2-secret@127.0.0.1:{closed_port()}/0"})
    assert result.returncode == 2
    line = one_line(result.stderr.encode())
    assert "unreachable" in line and "127.0.0.1" in line and "hunter2-secret" not in line
    assert SERVED not in result.stdout


def test_a_wrong_redis_password_is_refused_in_one_line(base_env, redis_url):
    result = launch({**base_env, "REDIS_URL": re.sub(r"password=[^&]+", "password=wrong-guess", redis_url)})
    assert result.returncode == 2
    assert "password" in one_line(result.stderr.encode())


def test_the_workers_are_up_before_the_server_answers_and_before_anyone_opens_the_page(tmp_path):
    with page_server(tmp_path / "data", tmp_path / "streamlit.log") as server:
        connection = queue_client(server.redis_url())  # the page's embedded Redis runs before any page was opened
        try:
            assert running_workers(get_queue(connection)) == 2
        finally:
            connection.close()
    log = (tmp_path / "streamlit.log").read_text()
    assert log.index("Starting the embedded Redis and 2 workers…") < log.index(SERVED)
    assert "Traceback" not in log and "restart streamlit" not in log and "ScriptRunContext" not in log


WARMED = """
import sys
from agent.ui.launch import warm
warm()
print(sorted(name for name in ("pyarrow", "numpy", "redis", "rq", "httpx", "agent.hosting.services",
                               "streamlit.components.v1.component_arrow") if name not in sys.modules))
print(sorted(name for name in sys.modules if name.startswith("agent.ui.") and name != "agent.ui.launch"
            or name == "streamlit_autorefresh"))
"""


def test_the_warm_up_imports_what_the_first_run_needs_but_leaves_components_to_a_script_run(base_env):
    # A component declared outside a script run is never registered with the runtime: the page's ticks
    # (streamlit-autorefresh) stopped, and a turn in flight froze on screen.
    result = subprocess.run([sys.executable, "-c", WARMED], env=base_env, cwd=ROOT, capture_output=True, text=True,
                            timeout=LAUNCH_TIMEOUT_S)
    missing, page_modules = result.stdout.splitlines()
    assert missing == "[]", result.stderr
    assert page_modules == "[]", "the first run imports these itself"
    assert "ScriptRunContext" not in result.stderr
