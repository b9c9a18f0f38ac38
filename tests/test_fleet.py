"""The fleet on one machine (harness/fleet.py, harness/tcp_redis.py) and a short chaos run on it (faults/chaos.py;
`make chaos` runs 1,000 turns): a real redis-server on TCP with its password and append-only file, pools of
worker.py with data directories of their own, page servers on 127.0.0.1, all stopped by pid, also after a pool
was killed as a machine is lost."""

from __future__ import annotations

import io
import urllib.request

import pytest
import redis

from agent.queue import new_id, submit_turn
from agent.settings import TurnConfig
from faults.chaos import ChaosOptions, passed, run_chaos
from harness import tcp_redis
from harness.fleet import Fleet
from harness.follow import wait_all_done
from harness.processes import listening_tcp_sockets
from harness.tcp_redis import TcpRedis
from harness.waiting import wait_for

SHORT = ChaosOptions(turns=50, seed=41, workers=3, concurrency=9, kill_every_s=2.0, pool_every_s=8.0, pause_s=3.0)


def test_a_tcp_redis_asks_a_password_keeps_its_append_only_file_and_comes_back_from_it(tmp_path):
    with TcpRedis(tmp_path / "redis") as server:
        assert listening_tcp_sockets(server.pid) == [("127.0.0.1", server.port)]
        client = server.client(socket_timeout=5)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5).ping()
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        client.set("kept", "yes")
        away_s = server.restart_from_aof()  # SIGKILL, then a start that loads appendonly.aof
        assert away_s < 10
        assert server.client(socket_timeout=5).get("kept") == b"yes"
        aof = tmp_path / "redis"  # Redis 7 keeps a directory of parts; the embedded 6.2, one file
        assert (aof / "appendonlydir").is_dir() or (aof / "appendonly.aof").stat().st_size > 0
    assert server.pid is None


def test_without_debians_redis_server_the_harness_says_so_and_runs_the_embedded_one_on_tcp(tmp_path, monkeypatch):
    monkeypatch.setattr(tcp_redis, "debian_binary", lambda: None)
    said = []
    with TcpRedis(tmp_path / "redis", say=said.append) as server:
        assert server.kind == "embedded" and "Debian's redis-server is not installed" in said[0]
        assert listening_tcp_sockets(server.pid) == [("127.0.0.1", server.port)]
        server.client(socket_timeout=5).set("kept", "yes")
        server.restart_from_aof()
        assert server.client(socket_timeout=5).get("kept") == b"yes"
        assert server.version().startswith("6.")


def test_a_fleet_serves_turns_from_every_pool_and_leaves_nothing_when_one_was_killed(tmp_path):
    fleet = Fleet(tmp_path / "fleet", pools=3, workers=1, pages=2, say=lambda line: None)
    with fleet:
        assert fleet.redis.kind == "debian" or tcp_redis.debian_binary() is None
        assert len({pool.dir for pool in fleet.members}) == 3  # a data directory per pool, as per machine
        for server in fleet.page_servers:  # two page servers, loopback only, on the fleet's Redis
            with urllib.request.urlopen(server.url + "_stcore/health", timeout=10) as response:
                assert response.status == 200
            assert {host for host, _ in listening_tcp_sockets(server.proc.pid)} == {"127.0.0.1"}
        cids = [new_id() for _ in range(9)]
        for cid in cids:
            submit_turn(fleet.store, fleet.queue, cid, "hello", TurnConfig(model="demo@0.3~0"))
        wait_all_done(fleet.client, cids, timeout_s=60)
        ran_on = {fleet.store.read(cid)["job_id"] and fleet.queue_connection.hget(
            f"rq:job:{fleet.store.read(cid)['job_id']}", "worker_name") for cid in cids}
        assert len({name.decode().split("-")[1] for name in ran_on if name}) >= 2  # more than one machine served
        killed = fleet.members[0].kill()
        assert killed and not fleet.members[0].members()
        fleet.restart_pool(fleet.members[0])
        assert fleet.members[0].worker_processes()
        members = [pid for pool in fleet.members for pid in pool.members()]
        redis_pid = fleet.redis.pid
    assert wait_for(lambda: not any(pool.members() for pool in fleet.members) and "gone", 10, "every pool process")
    assert all(server.proc.poll() is not None for server in fleet.page_servers)
    assert fleet.redis.pid is None and members and redis_pid


def test_a_fleet_that_fails_to_start_leaves_nothing_running(tmp_path):
    """A pool refused at start (a bad setting: worker.py says so and exits 2): the fleet stops what it started."""
    fleet = Fleet(tmp_path / "fleet", pools=2, workers=1, pages=0, pool_env={"AGENT_JOB_TIMEOUT": "-1"},
                  say=lambda line: None)
    with pytest.raises(RuntimeError, match="did not start"):
        fleet.start()
    assert "AGENT_JOB_TIMEOUT" in fleet.members[0].log_tail()
    assert fleet.redis.pid is None and not any(pool.members() for pool in fleet.members)


def test_a_short_chaos_run_ends_every_turn_and_runs_no_side_effect_twice():
    """`make chaos` in small: 50 turns while a worker is killed every 2 s, a pool every 8 s, Redis paused 3 s
    once and crashed and restarted from its append-only file once."""
    out = io.StringIO()
    report = run_chaos(SHORT, out=out)
    assert passed(report), out.getvalue()[-6000:]
    assert report["turns"] == SHORT.turns and report["stuck"] == 0 and report["lost"] == 0
    # Most turns are answered: a provider that failed every call would end each turn with a sentence, and pass.
    assert report["statuses"].get("done", 0) >= SHORT.turns // 2, report["statuses"]
    assert report["kills"]["workers"] >= 3 and report["kills"]["pools"] >= 1, report["kills"]
    assert [o["what"] for o in report["redis_outages"]] == ["paused 3 s", "crashed and restarted"]
    assert report["ledger_entries"] > 0 and not report["ledger_twice"]
    assert all(report["fleet"]["pages_answer_after"])
