"""The systemd unit docs/scaling.md shows (docs/systemd/agent-worker.service): it is the file in the repo, systemd's
own parser accepts it, and the command in it, run as systemd runs it (its working directory, its environment, its
ExecStart), starts a pool on a Redis over TCP that runs a turn, and stops cleanly on the SIGTERM its KillMode sends
to the main process alone, within its TimeoutStopSec, leaving nothing for systemd's SIGKILL to find.

systemd itself cannot run here (no init system): what it would do is done by hand, and named."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.conversation.store import Store
from agent.queue import get_queue, new_id, submit_turn
from agent.runtime.connection import queue_client, state_client
from agent.settings import TurnConfig
from harness.processes import kill, processes_with_env
from harness.tcp_redis import TcpRedis
from harness.waiting import wait_for
from tests.conftest import wait_done

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "docs" / "systemd" / "agent-worker.service"
INSTALL_DIR = "/srv/agent"  # where the unit expects the project
READY_TIMEOUT_S = 90.0  # seconds for 8 workers to start and register on a busy 2-core machine
MARKER = "AGENT_UNIT_TEST_MARKER"


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections of (key, value) pairs in order (a key may repeat, as systemd allows), comments dropped."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, _, value = line.partition("=")
        assert current is not None and _ == "=", f"not a unit line: {raw!r}"
        current.append((key.strip(), value.strip()))
    return sections


def one(section: list[tuple[str, str]], key: str) -> str:
    values = [v for k, v in section if k == key]
    assert len(values) == 1, f"{key}: {values}"
    return values[0]


def test_the_unit_in_the_docs_is_the_file_in_the_repo_and_says_what_a_supervised_pool_needs():
    text = UNIT.read_text()
    assert text.strip() in (ROOT / "docs" / "scaling.md").read_text()
    unit = parse_unit(text)
    service = unit["Service"]
    assert one(service, "WorkingDirectory") == INSTALL_DIR
    command = shlex.split(one(service, "ExecStart"))
    assert command[:2] == [f"{INSTALL_DIR}/.venv/bin/python", "worker.py"] and "--workers" in command
    assert one(service, "Restart") == "always"  # a killed worker.py comes back: its watch resumes lost turns
    assert one(service, "KillSignal") == "SIGTERM" and one(service, "KillMode") == "mixed"
    assert float(one(service, "TimeoutStopSec")) >= 20  # past a warm stop (1.5 s) and a cold one (4 s)
    assert one(service, "EnvironmentFile").lstrip("-").startswith(INSTALL_DIR)  # keys live there, not in the unit
    assert not any("KEY" in value for key, value in service if key == "Environment")
    assert one(unit["Install"], "WantedBy") == "multi-user.target"


def local_copy(tmp_path: Path, env_file: Path) -> Path:
    """The unit with this checkout in place of /srv/agent (and its environment file in tmp_path)."""
    text = UNIT.read_text().replace(f"{INSTALL_DIR}/.venv/bin/python", sys.executable)
    text = text.replace(f"EnvironmentFile={INSTALL_DIR}/worker.env", f"EnvironmentFile={env_file}")
    text = text.replace(f"WorkingDirectory={INSTALL_DIR}", f"WorkingDirectory={ROOT}")
    copy = tmp_path / UNIT.name
    copy.write_text(text)
    return copy


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_unit(tmp_path):
    env_file = tmp_path / "worker.env"
    env_file.write_text("REDIS_URL=redis://:secret@127.0.0.1:6379/0\n")
    run = subprocess.run(["systemd-analyze", "verify", str(local_copy(tmp_path, env_file))],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and not run.stderr.strip(), run.stderr


def test_the_units_command_runs_a_pool_on_a_tcp_redis_and_stops_cleanly_on_sigterm(tmp_path):
    with TcpRedis(tmp_path / "redis") as server:
        env_file = tmp_path / "worker.env"
        env_file.write_text(f"REDIS_URL={server.url}\n")
        env_file.chmod(0o600)
        unit = parse_unit(local_copy(tmp_path, env_file).read_text())
        service = unit["Service"]
        # As systemd runs it: a clean environment, the unit's Environment=, then its EnvironmentFile=.
        env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", MARKER: str(tmp_path)}
        for key, value in service:
            if key == "Environment":
                name, _, setting = value.partition("=")
                env[name] = setting
        env["AGENT_DATA_DIR"] = str(tmp_path / "state")  # StateDirectory= would create /var/lib/agent
        for line in Path(one(service, "EnvironmentFile").lstrip("-")).read_text().splitlines():
            name, _, setting = line.partition("=")
            env[name] = setting
        env["AGENT_MCP_CONFIG"] = "off"  # the test's one addition: no MCP server per worker on a busy machine
        command = shlex.split(one(service, "ExecStart"))
        workers = int(command[command.index("--workers") + 1])
        log = open(tmp_path / "journal.log", "wb")
        proc = subprocess.Popen(command, cwd=one(service, "WorkingDirectory"), env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        client = state_client(server.url)
        connection = queue_client(server.url)
        try:
            prefix = f"rq:worker:agent-{proc.pid}-".encode()
            wait_for(lambda: proc.poll() is None and sum(k.startswith(prefix) for k in connection.smembers(
                "rq:workers")) >= workers or proc.poll() is not None, READY_TIMEOUT_S, f"{workers} workers registered")
            assert proc.poll() is None, (tmp_path / "journal.log").read_text()[-3000:]
            store = Store(client, ttl_s=600)
            cid = new_id()
            submit_turn(store, get_queue(connection), cid, "What is 17*23?", TurnConfig(model="demo@0~0"))
            assert wait_done(store, cid, timeout_s=30)["status"] == "done"

            # KillMode=mixed: SIGTERM to the main process alone; after TimeoutStopSec, SIGKILL to what is left.
            stop_s = float(one(service, "TimeoutStopSec"))
            started = time.monotonic()
            os.kill(proc.pid, signal.SIGTERM)
            assert proc.wait(stop_s) == 0
            took_s = time.monotonic() - started
            left = wait_for(lambda: not processes_with_env(MARKER, str(tmp_path)) and ["none"], 5,
                            "every worker gone with worker.py")
            assert left == ["none"] and took_s < stop_s
            journal = (tmp_path / "journal.log").read_text()
            assert f"{workers} workers on redis://127.0.0.1:{server.port}" in journal
            assert server.password not in journal  # the URL is told without its password
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
            kill(processes_with_env(MARKER, str(tmp_path)))
            client.close()
            connection.close()
            log.close()
