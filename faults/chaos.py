"""Chaos on a fleet: `python -m faults.chaos --turns 1000 --seed 1` (`make chaos`).

A fleet on one machine (harness/fleet.py: Debian's redis-server on TCP with its append-only file, three pools of
`worker.py` standing in for three machines, two page servers) serves seeded turns of the kinds a fleet serves
(chaos_provider.py): answers, streamed replies, tools, slow tools, side-effecting `ledger` batches, providers that
hang, and tools that ask first, answered (or left to expire) by this script as a person would from the command line.
Meanwhile:

- a random worker is SIGKILLed every `--kill-every` seconds (5);
- a whole pool, its supervisor and workers at once (a machine lost), every `--pool-every` seconds (60), and
  started again;
- Redis is paused (SIGSTOP) for `--pause` seconds (3) once, when 35% of the turns have ended, and crashed
  (SIGKILL) and started again from its append-only file once, at 70%.

A client per turn follows it as the page does (and calls the front ends' lost-worker check when nothing moves),
keeps every state it saw, and the checker holds it to the fault runner's promises (checks.py). Then, for every
turn: it ended (`done`, or an ending whose sentence says why); its final write landed before its job timeout,
except after a kill (once the watch could see it: heartbeat lapse + a look) or where Redis itself was away
(the front ends' lost-worker bound plus the outage); it is still there, unchanged, after the run (none lost to
the restart); no ledger call ran twice. Figures: the resumes and their delays from each kill to the resumed
attempt's first write (a worker whose supervisor lives; a whole pool), turns per second, the run's length.
Exit status 1 on any violation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil
import redis
from rq.serializers import JSONSerializer

from agent.contract import Outcome, Status
from agent.hosting.deaths import current_job_of
from agent.hosting.lost_worker import LOST_GRACE_S, lost_worker_check
from agent.queue import SafeJob, new_id, submit_turn
from agent.runtime.loopback_server import LoopbackServer
from agent.settings import TurnConfig
from agent.turn import approvals
from faults.chaos_provider import ChaosProvider
from faults.chaos_report import CANARY_KEY, Kill, TurnPlan, TurnResult, judge, passed, print_report
from harness.fleet import Fleet, FleetPool
from harness.follow import states

# Every turn may be killed, so every turn's clocks leave room to resume wherever a kill lands.
CHAOS_CLOCKS = TurnConfig(
    provider="openai", job_timeout_s=12, deadline_margin_s=1.5, call_timeout_cap_s=2.0, connect_timeout_s=0.5,
    min_call_s=0.4, max_steps=6, approval_timeout_s=4.0,
)
POLL_S = 0.05  # seconds between a client's polls
LOST_CHECK_S = 0.5  # seconds between a client's lost-worker checks while nothing moves
SETTLE_S = 0.3  # seconds a client keeps watching after done (done must not revert)
STUCK_AFTER_S = 40.0  # seconds past a turn's clocks (and an answer's) before it counts as stuck
APPROVAL_SHARE = 0.25  # of turns: these tools ask first
ASKING = ("calculator", "current_time")
UNANSWERED_SHARE = 0.15  # of those: nobody answers, the request expires
DENY_SHARE = 0.3  # of the answered: denied
ANSWER_DELAY_S = (0.1, 1.0)  # seconds from seeing a request to answering it
BY_SCRIPT = approvals.BY_CLI  # the script stands in for `python -m agent approve`
PAUSE_AT, RESTART_AT = 0.35, 0.70  # shares of turns ended when Redis is paused, then crashed and restarted
REDIS_RETRY_S = 20.0  # seconds a client keeps retrying a command while Redis is away


@dataclass(frozen=True)
class ChaosOptions:
    turns: int = 1000
    seed: int = 1
    pools: int = 3
    workers: int = 4  # per pool
    classes: tuple[str, ...] = ("simple", "simple", "fork")  # a pool's worker class, in turn
    pages: int = 2
    concurrency: int = 12  # turns followed at once
    kill_every_s: float = 5.0
    pool_every_s: float = 60.0
    pause_s: float = 3.0
    clocks: TurnConfig = CHAOS_CLOCKS


class Chaos:
    """The fleet, the provider, the kills; `run()` returns the report."""

    def __init__(self, options: ChaosOptions, workdir: Path, out=None):
        self.options = options
        self.workdir = workdir
        self.out = out or sys.stdout
        self.rng = random.Random(f"chaos:{options.seed}")
        self.ledger = workdir / "ledger.txt"
        self.provider = ChaosProvider(options.seed)
        self.server: LoopbackServer | None = None
        self.fleet: Fleet | None = None
        self.kills: list[Kill] = []
        self.outages: list[tuple[float, float, str]] = []  # (start, end, what) epoch seconds
        self.ended = 0
        self.ended_lock = threading.Lock()
        self.stopping = threading.Event()
        self.pool_restarts: list[float] = []  # seconds from a pool's kill to its workers registered again
        self.errors: list[str] = []

    def say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    # -- the run ----------------------------------------------------------------------------------

    def run(self) -> dict:
        options = self.options
        started = time.monotonic()
        plans = make_plans(options)
        self.server = LoopbackServer(self.provider, api_path="/v1", name="chaos-provider").start()
        try:
            self.fleet = Fleet(self.workdir / "fleet", pools=options.pools, workers=options.workers,
                               classes=options.classes, pages=options.pages, say=self.say,
                               pool_env={"OPENAI_API_KEY": CANARY_KEY, "AGENT_TOOLS": "faults.ledger",
                                         "LEDGER_FILE": str(self.ledger)}).start()
            fleet_up_s = time.monotonic() - started
            self.say(f"fleet up in {fleet_up_s:.1f} s: {self.fleet.redis.kind} redis-server "
                     f"{self.fleet.redis.version()} on TCP, {options.pools} pools x {options.workers} workers "
                     f"{list(options.classes)}, {options.pages} page servers")
            chaos = threading.Thread(target=self.make_chaos, name="chaos", daemon=True)
            run_started = time.monotonic()
            chaos.start()
            results: list[TurnResult] = []
            try:
                with ThreadPoolExecutor(max_workers=options.concurrency) as executor:
                    for result in executor.map(self.run_turn, plans):
                        results.append(result)
                        if len(results) % 100 == 0:
                            self.say(f"... {len(results)}/{options.turns} turns ended "
                                     f"({time.monotonic() - run_started:.0f} s)")
            finally:
                self.stopping.set()
                chaos.join(60)
            run_s = time.monotonic() - run_started
            pages_answer = self.pages_answer()
            report = judge(self, results, run_s, fleet_up_s, pages_answer)
        finally:
            if self.fleet is not None:
                self.fleet.close()
            self.server.stop()
        report["elapsed_s"] = round(time.monotonic() - started, 1)
        return report

    def run_turn(self, plan: TurnPlan) -> TurnResult:
        fleet, options = self.fleet, self.options
        cid = f"chaos-{options.seed}-{plan.index}-{new_id()[:6]}"
        model = f"chaos-{plan.index}"
        config = options.clocks.with_changes(model=model, base_url=self.server.url,
                                             approve_tools=ASKING if plan.asks_first else ())
        text = f"turn {plan.index}: what is 17*23, and what time is it in Tokyo?"
        result = TurnResult(plan, cid, new_id(), text, model, time.time())
        _retry(lambda: submit_turn(fleet.store, fleet.queue, cid, text, config, turn_id=result.turn_id))
        limit_s = (options.clocks.job_timeout_s * (options.clocks.max_resumes + 2) + LOST_GRACE_S + STUCK_AFTER_S
                   + (options.clocks.approval_timeout_s + options.clocks.job_timeout_s if plan.asks_first else 0))
        last_check, done_at, answer_at = 0.0, None, None
        for state in states(fleet.store, cid, timeout_s=limit_s, interval_s=POLL_S, tolerate=(redis.RedisError,)):
            now = time.monotonic()
            if state is not None:
                result.observed.append(state)
                if state["done"] and done_at is None:
                    done_at = now
            latest = result.final
            request = pending_request(latest)
            if request and plan.answer and request["id"] not in result.answered:
                answer_at = answer_at or now + plan.answer_delay_s
                if now >= answer_at:
                    with contextlib.suppress(redis.RedisError):
                        approvals.answer(fleet.store, fleet.queue, cid, plan.answer, BY_SCRIPT,
                                         request_id=request["id"])
                        result.answered.append(request["id"])
                        answer_at = None
            elif state is None and done_at is None and now - last_check > LOST_CHECK_S:
                last_check = now
                with contextlib.suppress(redis.RedisError):
                    lost_worker_check(fleet.store, fleet.queue_connection, cid)  # what the page and the CLI do
            if done_at is not None and now - done_at > SETTLE_S:
                break
        with self.ended_lock:
            self.ended += 1
        return result

    # -- the faults -------------------------------------------------------------------------------

    def make_chaos(self) -> None:
        """Kill a worker every kill_every_s, a pool every pool_every_s; pause Redis once, then restart it once."""
        options = self.options
        rng = random.Random(f"chaos-faults:{options.seed}")
        next_kill = time.monotonic() + options.kill_every_s
        next_pool = time.monotonic() + options.pool_every_s
        paused = restarted = False
        while not self.stopping.wait(0.05):
            now = time.monotonic()
            share = self.ended / options.turns
            try:
                if not paused and share >= PAUSE_AT:
                    paused = True
                    self.pause_redis()
                elif not restarted and share >= RESTART_AT:
                    restarted = True
                    self.restart_redis()
                elif now >= next_pool:
                    next_pool = now + options.pool_every_s
                    self.kill_pool(rng)
                elif now >= next_kill:
                    next_kill = now + options.kill_every_s
                    self.kill_worker(rng)
            except Exception as exc:  # noqa: BLE001 - a fault that could not be made is reported, not fatal
                self.errors.append(f"{type(exc).__name__}: {exc}")
                self.say(f"chaos: a fault failed: {type(exc).__name__}: {exc}")

    def kill_worker(self, rng: random.Random) -> None:
        pools = [p for p in self.fleet.members if p.pid is not None]
        candidates = [(pool, pid, name) for pool in pools for pid, name in pool.worker_processes()]
        if not candidates:
            return
        pool, pid, name = rng.choice(candidates)
        job = _current_job(self.fleet.queue_connection, name)
        horses = [c.pid for c in _children(pid)]
        at = time.time()
        for target in [pid, *horses]:
            with contextlib.suppress(ProcessLookupError):
                os_kill(target)
        self.kills.append(self.attributed(Kill(at, "worker", pool.index, [pid, *horses], [job] if job else [])))

    def kill_pool(self, rng: random.Random) -> None:
        pool = rng.choice([p for p in self.fleet.members if p.pid is not None])
        jobs = [j for _, name in pool.worker_processes() if (j := _current_job(self.fleet.queue_connection, name))]
        at = time.time()
        pids = pool.kill()
        self.kills.append(self.attributed(Kill(at, "pool", pool.index, pids, jobs)))
        self.say(f"chaos: pool {pool.index} killed ({len(pids)} processes, {len(jobs)} turns running); starting it "
                 "again")
        self.restart(pool, at)

    def restart(self, pool: FleetPool, killed_at: float) -> None:
        end = time.monotonic() + 120
        while True:
            try:
                self.fleet.restart_pool(pool)
                self.pool_restarts.append(time.time() - killed_at)
                return
            except RuntimeError:
                if time.monotonic() > end:
                    raise
                time.sleep(1)

    def pause_redis(self) -> None:
        start = time.time()
        self.fleet.redis.pause()
        try:
            time.sleep(self.options.pause_s)
        finally:
            self.fleet.redis.resume()
            self.outages.append((start, time.time(), f"paused {self.options.pause_s:g} s"))
        self.say(f"chaos: Redis paused {self.options.pause_s:g} s (SIGSTOP, SIGCONT)")

    def restart_redis(self) -> None:
        start = time.time()
        try:
            away_s = self.fleet.redis.restart_from_aof()
        finally:
            self.outages.append((start, time.time(), "crashed and restarted"))
        self.say(f"chaos: Redis crashed (SIGKILL) and started again from its append-only file; away {away_s:.2f} s")

    def attributed(self, kill: Kill) -> Kill:
        """The (conversation, turn) each of the killed jobs ran."""
        for job_id in kill.jobs:
            with contextlib.suppress(Exception):
                job = SafeJob.fetch(job_id, connection=self.fleet.queue_connection, serializer=JSONSerializer)
                if len(job.args) == 2:
                    kill.turns.append(tuple(job.args))
        return kill

    def pages_answer(self) -> list[bool]:
        import urllib.request

        answers = []
        for server in self.fleet.page_servers:
            try:
                with urllib.request.urlopen(server.url + "_stcore/health", timeout=5) as response:
                    answers.append(response.status == 200)
            except OSError:
                answers.append(False)
        return answers

    # -- the judgement ----------------------------------------------------------------------------

def make_plans(options: ChaosOptions) -> list[TurnPlan]:
    rng = random.Random(f"chaos-plans:{options.seed}")
    plans = []
    for index in range(options.turns):
        asks = rng.random() < APPROVAL_SHARE
        answer = None
        if asks and rng.random() >= UNANSWERED_SHARE:
            answer = Outcome.DENIED if rng.random() < DENY_SHARE else Outcome.APPROVED
        plans.append(TurnPlan(index, asks, answer, round(rng.uniform(*ANSWER_DELAY_S), 3)))
    return plans


def pending_request(state: dict | None) -> dict | None:
    if not state or state["done"] or state["status"] != Status.AWAITING_APPROVAL:
        return None
    request = state.get("approval") or {}
    return request if request.get("id") and not request.get("answer") else None


def os_kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children()
    except psutil.Error:
        return []


def _current_job(connection: redis.Redis, worker_name: str) -> str | None:
    """The job RQ records the worker as running (read before the kill), or None."""
    try:
        return current_job_of(connection, worker_name)
    except redis.RedisError:
        return None


def _retry(fn, timeout_s: float = REDIS_RETRY_S, pause_s: float = 0.25):
    end = time.monotonic() + timeout_s
    while True:
        try:
            return fn()
        except redis.RedisError:
            if time.monotonic() > end:
                raise
            time.sleep(pause_s)


def run_chaos(options: ChaosOptions, out=None) -> dict:
    out = out or sys.stdout
    workdir = Path(tempfile.mkdtemp(prefix="agent-chaos-"))
    try:
        report = Chaos(options, workdir, out).run()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_report(report, out)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faults.chaos", description=__doc__.splitlines()[0])
    defaults = ChaosOptions()
    parser.add_argument("--turns", type=int, default=defaults.turns)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--workers", type=int, default=defaults.workers, help="per pool")
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency, help="turns followed at once")
    parser.add_argument("--kill-every", type=float, default=defaults.kill_every_s, help="seconds")
    parser.add_argument("--pool-every", type=float, default=defaults.pool_every_s, help="seconds")
    parser.add_argument("--pause", type=float, default=defaults.pause_s, help="seconds Redis is paused, once")
    parser.add_argument("--json", type=Path, help="also write the report to this file")
    args = parser.parse_args(argv)
    if args.turns < 1 or args.workers < 1 or args.concurrency < 1:
        print("--turns, --workers and --concurrency: must be at least 1", file=sys.stderr)
        return 2

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt  # so the finally blocks stop the fleet

    signal.signal(signal.SIGTERM, on_sigterm)
    options = ChaosOptions(turns=args.turns, seed=args.seed, workers=args.workers, concurrency=args.concurrency,
                           kill_every_s=args.kill_every, pool_every_s=args.pool_every, pause_s=args.pause)
    try:
        report = run_chaos(options)
    except KeyboardInterrupt:
        print("interrupted: everything started was stopped", file=sys.stderr)
        return 130
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if passed(report) else 1


if __name__ == "__main__":
    sys.exit(main())
