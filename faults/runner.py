"""The seeded fault runner: `python -m faults --runs N --seed S`.

Each run is one real turn: submitted through the queue, run by real RQ workers (a real
`agent.hosting.pool` subprocess, with SimpleWorker or forking workers) against a real Redis server,
calling a provider on loopback that misbehaves at random on every call (provider.py). On top
of that, some runs get a process fault in the middle of the turn: SIGKILL of the job's
process, SIGKILL of the whole worker, SIGTERM (warm shutdown), Redis paused (SIGSTOP, then
SIGCONT) or Redis restarted on the same data.

A client per run polls the state like the page does (and, like the page and the CLI, calls
`lost_worker_check` when nothing moves), records every state it saw, and checks it
(checks.py). The runner prints the figures and exits 1 on any violation or stuck turn.

A turn whose worker was hard-killed is resumed on another worker while a resume and the time for
one are left (agent/turn/resume.py): such runs get clocks long enough for a resume wherever the kill
lands (`clocks_for`), and the report counts the turns resumed, their resume steps, and the share of
hard-killed turns that still ended `done`.

Some replies ask for a dozen side-effecting `ledger` calls (faults/ledger.py) among quick tools that
are safe to repeat, so that kills land inside batches of results: after the runs, no ledger call may
have run twice, and every call whose result says it was written must be in the ledger.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import redis
from rq.exceptions import NoSuchJobError
from rq.serializers import JSONSerializer

from agent.hosting.lost_worker import LOST_GRACE_S, lost_worker_check
from agent.hosting.pool import PoolHandle
from agent.hosting.turn_watch import WATCH_S
from agent.queue import SafeJob, job_id_for, new_id, submit_turn
from agent.runtime.loopback_server import LoopbackServer
from agent.settings import TurnConfig
from agent.turn.heartbeat import HEARTBEAT_TTL_S
from faults import budgets
from faults.checks import check_observations
from faults.ledger import ledger_problems, read_ledger
from faults.provider import FaultProvider
from harness.follow import states
from harness.pools import start_pool, stop_pool
from harness.private_redis import PrivateRedis, stored_values
from harness.processes import children
from harness.stats import percentile

ROOT = Path(__file__).resolve().parents[1]
CANARY_KEY = "sk-faults-canary-3b9d2e7a41c6"  # given to the workers; must never reach Redis or the logs

# The clocks scaled down so a run takes a few seconds; each turn runs with these plus its provider.
FAULT_CLOCKS = TurnConfig(
    provider="openai", job_timeout_s=5, deadline_margin_s=1.5, call_timeout_cap_s=2.0, connect_timeout_s=0.5,
    min_call_s=0.4, max_steps=6,
)
DEFAULT_CONCURRENCY = 4  # turns in flight at once, one worker each
POLL_S = 0.05  # seconds between a client's polls
LOST_CHECK_S = 0.5  # seconds between a client's lost-worker checks while nothing moves
SETTLE_S = 0.5  # seconds a client keeps watching after done (done must not revert)
KILL_SLACK_S = 1.0  # seconds on top of a detection bound for a killed worker's ending
# Seconds from a hard kill to the pool's watch seeing the heartbeat lapse and acting (resume or ending).
WATCH_DETECT_S = HEARTBEAT_TTL_S + WATCH_S
STUCK_AFTER_S = 30.0  # seconds past job timeout + LOST_GRACE_S (from submit) before a turn counts as stuck
START_WAIT_S = 20.0  # seconds a process fault waits for its job to start
STATE_TTL_S = 6 * 3600  # seconds: every run's state outlives the whole run, for the final re-check

PROCESS_FAULTS = {"kill_job": 30, "kill_worker": 20, "sigterm": 20, "redis_pause": 15, "redis_restart": 15}
HARD_KILLS = ("kill_job", "kill_worker")
# Seconds added to a hard-killed run's job timeout: its heartbeat lapses and the watch resumes it ~WATCH_DETECT_S
# after the kill, which lands up to the base job timeout into the turn; the resume then has time for calls.
RESUMABLE_EXTRA_S = 8


@dataclass(frozen=True)
class Options:
    runs: int = 1000
    seed: int = 1
    concurrency: int = DEFAULT_CONCURRENCY
    clocks: TurnConfig = FAULT_CLOCKS
    process_fault_share: float = 0.35  # of runs
    fork_share: float = 0.3  # of runs, on forking workers (the job's process is not the worker)
    refused_share: float = 0.04  # of runs, pointed at a closed port (connection refused)
    verbose: bool = False


@dataclass(frozen=True)
class Plan:
    index: int
    worker_class: str
    process_fault: str | None
    fault_at_s: float  # seconds after the job started
    pause_s: float  # for redis_pause
    refused: bool
    budget: budgets.BudgetPlan | None = None  # the fourth clock (faults/budgets.py); None: no budget


@dataclass
class RunResult:
    plan: Plan
    conversation_id: str
    observed: list[dict] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    stuck: bool = False
    fault_applied: bool = False
    fault_note: str = ""
    rq_timeout: bool = False
    final_minus_deadline_s: float | None = None
    final_minus_job_timeout_s: float | None = None
    status: str | None = None
    error_kind: str | None = None
    call_faults: list[str] = field(default_factory=list)
    submitted_at: float = 0.0
    redis_outage_s: float = 0.0  # seconds of Redis pause or restart while this turn was in flight
    late: bool = False  # the ending landed after the job timeout (allowed only after a hard fault)
    fault_at: float | None = None  # epoch seconds when the process fault was applied
    attempt: int = 0  # the turn's last attempt: 1, 2, ... once resumed after a lost worker
    resume_steps: int = 0  # steps of kind "resume" in the turn
    lost_tool_results: int = 0  # tool calls answered "not run again" after a lost worker
    ending_after_kill_s: float | None = None  # a hard-killed turn's final write, seconds after the kill
    error_message: str = ""  # the ending's reason, for the report of resumed turns
    budget: budgets.BudgetOutcome | None = None  # a budget run's spend against its budget

    @property
    def hard_killed(self) -> bool:
        return self.fault_applied and self.plan.process_fault in HARD_KILLS


def clocks_for(options: Options, plan: Plan) -> TurnConfig:
    """The run's clocks: a hard-killed run's job timeout leaves room to resume wherever the kill lands."""
    if plan.process_fault in HARD_KILLS:
        return options.clocks.with_changes(job_timeout_s=options.clocks.job_timeout_s + RESUMABLE_EXTRA_S)
    return options.clocks


def make_plans(options: Options) -> list[Plan]:
    rng = random.Random(f"plans:{options.seed}")
    plans = []
    for index in range(options.runs):
        fault = None
        if rng.random() < options.process_fault_share:
            fault = rng.choices(list(PROCESS_FAULTS), weights=list(PROCESS_FAULTS.values()))[0]
        plans.append(Plan(
            index=index,
            worker_class="fork" if rng.random() < options.fork_share else "simple",
            process_fault=fault,
            # Mostly early in the turn (most turns end well before the deadline), sometimes late.
            fault_at_s=round(rng.uniform(0.0, 1.5 if rng.random() < 0.7 else options.clocks.job_timeout_s), 3),
            pause_s=round(rng.uniform(0.2, 2.5), 3),
            refused=rng.random() < options.refused_share,
            budget=budgets.draw(random.Random(f"budget:{options.seed}:{index}")),  # its own draws: plans as before
        ))
    return plans


class FaultLab:
    """Redis (private to the runner), the fault provider and a worker pool; all stopped by close()."""

    def __init__(self, options: Options, workdir: Path):
        self.options = options
        self.workdir = workdir
        self.redis = PrivateRedis(workdir / "redis", state_ttl_s=STATE_TTL_S)
        self.url = self.redis.url
        self.store, self.queue_connection, self.queue = self.redis.store, self.redis.queue_connection, self.redis.queue
        self.faults = FaultProvider(options.seed)
        self.provider = LoopbackServer(self.faults, api_path="/v1", name="fault-provider").start()
        self.pool: PoolHandle | None = None
        self.pool_log = workdir / "pool.log"
        self.redis_lock = threading.Lock()  # one Redis fault at a time
        self.outages: list[tuple[float, float]] = []  # (start, end) epoch seconds of Redis faults
        self.closed_port = _closed_port()
        self.ledger = workdir / "ledger.txt"  # what the workers' ledger tool wrote (faults/ledger.py)

    def start_pool(self, worker_class: str) -> None:
        self.pool = start_pool(self.url, self.options.concurrency, self.pool_log, worker_class=worker_class,
                               demo=False, env={"OPENAI_API_KEY": CANARY_KEY, "AGENT_STATE_TTL": str(STATE_TTL_S),
                                                "AGENT_TOOLS": "faults.ledger", "LEDGER_FILE": str(self.ledger)},
                               queue_connection=self.queue_connection)

    def stop_pool(self) -> None:
        handle, self.pool = self.pool, None
        if handle is not None:
            stop_pool(handle, self.url, timeout_s=20)

    def close(self) -> None:
        try:
            self.stop_pool()
        finally:
            try:
                self.provider.stop()
            finally:
                self.redis.close()

    # -- process faults --------------------------------------------------------------------

    def job_processes(self, job_id: str) -> tuple[int | None, int | None]:
        """(worker pid, work horse pid or None) of the worker running this job now."""
        conn = self.queue_connection
        name = conn.hget(f"rq:job:{job_id}", "worker_name")
        if not name:
            return None, None
        worker_key = f"rq:worker:{name.decode()}"
        pid = conn.hget(worker_key, "pid")
        current = conn.hget(worker_key, "current_job")
        if not pid or (current is not None and current.decode() != job_id):
            return None, None
        pid = int(pid)
        horses = children(pid)
        return pid, (horses[0] if horses else None)

    def inject(self, plan: Plan, job_id: str) -> str:
        """Apply the run's process fault now; returns a note ('' when it could not be applied)."""
        fault = plan.process_fault
        if fault in ("redis_pause", "redis_restart"):
            if not self.redis_lock.acquire(blocking=False):
                return ""
            try:
                started = time.time()
                try:
                    server = self.redis.server
                    if fault == "redis_pause":
                        pid = server.pid
                        os.kill(pid, signal.SIGSTOP)
                        try:
                            time.sleep(plan.pause_s)
                        finally:
                            os.kill(pid, signal.SIGCONT)
                        return f"redis paused {plan.pause_s:.1f} s"
                    server.stop()
                    for _ in range(3):
                        try:
                            server.acquire()
                            break
                        except RuntimeError:
                            time.sleep(0.5)
                    return f"redis restarted in {time.time() - started:.1f} s"
                finally:
                    self.outages.append((started, time.time()))
            finally:
                self.redis_lock.release()
        worker_pid, horse_pid = self.job_processes(job_id)
        if worker_pid is None:
            return ""
        if fault == "kill_job":
            target = horse_pid if plan.worker_class == "fork" else worker_pid
            if target is None:
                return ""
            os.kill(target, signal.SIGKILL)
            return f"SIGKILL job process {target}"
        if fault == "kill_worker":
            for pid in (worker_pid, horse_pid):
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            return f"SIGKILL worker {worker_pid}" + (f" and its horse {horse_pid}" if horse_pid else "")
        if fault == "sigterm":
            os.kill(worker_pid, signal.SIGTERM)
            return f"SIGTERM worker {worker_pid}"
        raise ValueError(fault)


def run_one(lab: FaultLab, plan: Plan) -> RunResult:
    options = lab.options
    store = lab.store
    model = f"fault-{plan.index}" + (plan.budget.model_suffix() if plan.budget else "") + (
        "-slow" if plan.process_fault else "")
    cid = f"faults-{options.seed}-{plan.index}-{new_id()[:6]}"
    turn_id = new_id()
    result = RunResult(plan=plan, conversation_id=cid)
    base_url = f"http://127.0.0.1:{lab.closed_port}/v1" if plan.refused else lab.provider.url
    clocks = clocks_for(options, plan)
    config = clocks.with_changes(model=model, base_url=base_url, **budgets.config_changes(plan.budget))
    text = f"run {plan.index}: what is 17*23, and what time is it in Tokyo?"
    submitted = result.submitted_at = time.time()
    _retry(lambda: submit_turn(store, lab.queue, cid, text, config, turn_id=turn_id))
    job_id = job_id_for(turn_id)
    injector = None
    if plan.process_fault:
        injector = threading.Thread(target=_inject_later, args=(lab, plan, job_id, result), daemon=True)
        injector.start()

    limit_s = submitted + clocks.job_timeout_s + LOST_GRACE_S + STUCK_AFTER_S - time.time()
    last_check, done_at = 0.0, None
    for state in states(store, cid, timeout_s=limit_s, interval_s=POLL_S, tolerate=(redis.RedisError,)):
        # A client sees Redis down as "reconnecting" and keeps polling: an error is a poll that saw nothing.
        if state is not None:
            result.observed.append(state)
            if state["done"] and done_at is None:
                done_at = time.monotonic()
        elif done_at is None and time.monotonic() - last_check > LOST_CHECK_S:
            last_check = time.monotonic()
            with contextlib.suppress(redis.RedisError):
                lost_worker_check(store, lab.queue_connection, cid)  # what the page and the CLI do
        if done_at is not None and time.monotonic() - done_at > SETTLE_S:
            break
    if injector is not None:
        injector.join(timeout=clocks.job_timeout_s + 10)
    finish_result(lab, plan, result, turn_id, text, model, job_id)
    return result


def finish_result(lab: FaultLab, plan: Plan, result: RunResult, turn_id: str, text: str, model: str,
                  job_id: str) -> None:
    run_log = lab.faults.runs.get(model)
    result.call_faults = list(run_log.faults) if run_log else []
    served = list(run_log.served) if run_log else []
    result.violations = check_observations(result.observed, turn_id=turn_id, user_text=text, served=served,
                                           max_resumes=lab.options.clocks.max_resumes)
    final = result.observed[-1] if result.observed else None
    if final is None or not final["done"]:
        result.stuck = True
        result.fault_note += " | " + _diagnose(lab, result.conversation_id, job_id)
        return
    result.status = final["status"]
    result.error_kind = (final["error"] or {}).get("kind")
    result.error_message = str((final["error"] or {}).get("message") or "")
    result.attempt = final.get("attempt") or 0
    result.resume_steps = sum(s.get("kind") == "resume" and s.get("turn_id") == turn_id for s in final["steps"])
    result.lost_tool_results = sum(m.get("role") == "tool" and "not run again" in str(m.get("content"))
                                   for m in final["history"])
    if plan.budget is not None:
        result.budget = budgets.outcome(plan.budget, final, run_log.counted_tokens if run_log else 0)
        if result.budget.over:
            result.violations.append(f"the turn spent past its budget ({result.budget.ratio:.3f} of it)")
    # The turn's own instant, as first set (checks.py: it never changes once set).
    job_timeout_at = next((s["job_timeout_at"] for s in result.observed if s.get("job_timeout_at")), None)
    started_at = final.get("started_at")
    rq_job = _fetch(lab, job_id)
    if job_timeout_at is None and rq_job is not None and rq_job.started_at is not None:
        started_at = rq_job.started_at.timestamp()
        job_timeout_at = started_at + clocks_for(lab.options, plan).job_timeout_s
    if rq_job is not None:
        status = rq_job.get_status(refresh=False)
        exc = ""
        with contextlib.suppress(Exception):
            latest = rq_job.latest_result()
            exc = (latest.exc_string or "") if latest is not None else ""
        result.rq_timeout = getattr(status, "value", status) == "failed" and "JobTimeoutException" in exc
    result.rq_timeout = result.rq_timeout or result.error_kind == "job_timeout"
    if job_timeout_at is None:
        return  # the job never started: the turn ended (e.g. lost) before any clock ran
    final_write = final["updated_at"]
    deadline_at = job_timeout_at - clocks_for(lab.options, plan).deadline_margin_s
    result.final_minus_deadline_s = final_write - deadline_at
    result.final_minus_job_timeout_s = final_write - job_timeout_at
    hard_kill = result.hard_killed
    if hard_kill and result.fault_at is not None:
        result.ending_after_kill_s = final_write - result.fault_at
    # A Redis outage is a hard fault too: no write, the job's own included, lands while it lasts,
    # so a turn caught in one may end through the lost-worker path, and every client waits it out.
    result.redis_outage_s = sum(max(0.0, min(end, final_write) - max(start, result.submitted_at))
                                for start, end in list(lab.outages))
    allowed, why = ending_bound(result, job_timeout_at, started=bool(final.get("started_at")))
    result.late = final_write > job_timeout_at
    if final_write > allowed:
        result.violations.append(
            f"the ending was written {final_write - job_timeout_at:+.2f} s after the job timeout" + why)


def ending_bound(result: RunResult, job_timeout_at: float, *, started: bool) -> tuple[float, str]:
    """The latest instant the turn's final write may land, and what allows past the job timeout.

    Every ending lands before the turn's job_timeout_at (a resumed job keeps the turn's clocks), except one
    written from outside after a hard fault: where Redis itself was away, the front ends' lost-worker bound
    (job timeout + LOST_GRACE_S, plus the outage); after a hard kill, a worker_lost ending the pool's watch
    writes once the heartbeat lapsed (WATCH_DETECT_S after the kill), or, for a job killed before its first
    write (no heartbeat watched yet), the front ends' lost-worker bound."""
    if result.redis_outage_s > 0:
        return (job_timeout_at + LOST_GRACE_S + KILL_SLACK_S + result.redis_outage_s,
                f" (beyond the grace for a Redis outage of {result.redis_outage_s:.1f} s)")
    if not result.hard_killed or result.error_kind != "worker_lost":
        return job_timeout_at, " (a resumed job keeps the turn's clocks)" if result.attempt else ""
    if not started or result.fault_at is None:
        return job_timeout_at + LOST_GRACE_S + KILL_SLACK_S, " (beyond the lost-worker grace for a hard kill)"
    return (max(job_timeout_at, result.fault_at + WATCH_DETECT_S + KILL_SLACK_S),
            f" (more than {WATCH_DETECT_S + KILL_SLACK_S:g} s after the kill)")


def _diagnose(lab: FaultLab, cid: str, job_id: str) -> str:
    """What a stuck turn looks like from outside, for the report."""
    try:
        meta = lab.store.read_meta(cid)
        job = lab.queue_connection.hgetall(f"rq:job:{job_id}")
        queued = job_id.encode() in lab.queue_connection.lrange(f"rq:queue:{lab.queue.name}", 0, -1)
    except redis.RedisError as exc:
        return f"diagnosis failed: {exc}"
    job_view = {k.decode(): v.decode(errors="replace")[:40] for k, v in job.items()
                if k in (b"status", b"worker_name", b"started_at", b"enqueued_at")}
    meta_view = None if meta is None else {k: meta[k] for k in ("version", "status", "job_timeout_at")}
    return f"state {meta_view}; job {job_view or 'absent'}; in queue list: {queued}"


def _inject_later(lab: FaultLab, plan: Plan, job_id: str, result: RunResult) -> None:
    end = time.monotonic() + START_WAIT_S
    started = None
    while time.monotonic() < end:
        with contextlib.suppress(redis.RedisError):
            status = lab.queue_connection.hget(f"rq:job:{job_id}", "status")
            if status in (b"started",):
                started = time.monotonic()
                break
            if status in (b"finished", b"failed", b"stopped", b"canceled"):
                return
        time.sleep(0.02)
    if started is None:
        return
    time.sleep(plan.fault_at_s)
    with contextlib.suppress(redis.RedisError):
        meta = lab.store.read_meta(result.conversation_id)
        if meta is None or meta["done"]:
            return
    fault_at = time.time()
    try:
        note = lab.inject(plan, job_id)
    except (ProcessLookupError, redis.RedisError) as exc:
        note = ""
        result.fault_note = f"not applied: {type(exc).__name__}"
    if note:
        result.fault_applied = True
        result.fault_note = note
        result.fault_at = fault_at


def run_faults(options: Options, *, out=None) -> dict:
    """Run every planned run; returns the report (a dict of figures and the failed runs)."""
    out = out or sys.stdout
    plans = make_plans(options)
    workdir = Path(tempfile.mkdtemp(prefix="agent-faults-"))
    started = time.monotonic()
    results: list[RunResult] = []
    lab = FaultLab(options, workdir)
    try:
        for worker_class in ("simple", "fork"):
            batch = [p for p in plans if p.worker_class == worker_class]
            if not batch:
                continue
            lab.start_pool(worker_class)
            try:
                with ThreadPoolExecutor(max_workers=options.concurrency) as executor:
                    for result in executor.map(lambda plan: run_one(lab, plan), batch):
                        results.append(result)
                        if options.verbose or result.violations or result.stuck:
                            _print_run(result, out)
                        elif len(results) % 50 == 0:
                            print(f"... {len(results)}/{options.runs} runs", file=out, flush=True)
            finally:
                lab.stop_pool()
        # After every run: nothing moved after done, the canary key reached no key, no side effect ran twice.
        for result in results:
            _recheck(lab, result)
        leaks = _canary_leaks(lab)
        ledger = read_ledger(lab.ledger)
        twice = ledger_problems(ledger)
        unwritten = _unwritten_results(results, {key for key, _ in ledger})
    finally:
        lab.close()
        shutil.rmtree(workdir, ignore_errors=True)
    report = summarize(options, results, time.monotonic() - started, leaks)
    report.update(ledger_entries=len(ledger), ledger_twice=twice, ledger_results_unwritten=unwritten,
                  ledger_runs=sum("tool_ledger" in r.call_faults for r in results),
                  ledger_runs_hard_killed=sum("tool_ledger" in r.call_faults and r.hard_killed for r in results))
    report["invariant_violations"] += len(twice) + len(unwritten)
    print_report(report, out)
    return report


def _unwritten_results(results: list[RunResult], written: set[str]) -> list[str]:
    """Ledger calls whose stored result says they were written, but whose line is not in the ledger."""
    missing = []
    for result in results:
        final = result.observed[-1] if result.observed else None
        if final is None or not final["done"]:
            continue
        names = {c.get("id"): (c.get("function") or {}).get("name") for m in final["history"]
                 for c in m.get("tool_calls") or []}
        for message in final["history"]:
            call_id = message.get("tool_call_id")
            if (message.get("role") == "tool" and names.get(call_id) == "ledger"
                    and str(message.get("content")).startswith("written: ")
                    and f"{final['turn_id']}:{call_id}" not in written):
                missing.append(f"run {result.plan.index}: {call_id} says written, but is not in the ledger")
    return missing


def _recheck(lab: FaultLab, result: RunResult) -> None:
    if not result.observed or not result.observed[-1]["done"]:
        return
    try:
        state = lab.store.read(result.conversation_id)
    except redis.RedisError:
        return
    last = result.observed[-1]
    if state is None:
        result.violations.append("the state disappeared after the run")
    elif state["version"] != last["version"] or not state["done"]:
        result.violations.append(f"state moved after done: version {last['version']} -> {state['version']}")


def _canary_leaks(lab: FaultLab) -> list[str]:
    leaks = []
    for key, values in stored_values(lab.store.redis):
        if any(CANARY_KEY.encode() in v for v in [key, *values]):
            leaks.append(f"redis key {key.decode(errors='replace')}")
    for log_file in sorted(lab.pool_log.parent.glob(lab.pool_log.name + "*")):  # pool.log and its rotated files
        if CANARY_KEY in log_file.read_text(errors="replace"):
            leaks.append(f"the pool log ({log_file.name})")
    return leaks


def summarize(options: Options, results: list[RunResult], elapsed_s: float, leaks: list[str]) -> dict:
    deltas = [r.final_minus_deadline_s for r in results if r.final_minus_deadline_s is not None]
    calm = [r.final_minus_deadline_s for r in results if r.final_minus_deadline_s is not None
            and not r.redis_outage_s and not (r.fault_applied and r.plan.process_fault in HARD_KILLS)]
    applied = Counter(r.plan.process_fault for r in results if r.fault_applied)
    violated = [r for r in results if r.violations]
    budget_runs = [(r.plan.index, f"{r.plan.process_fault} {r.fault_note}", r.budget)
                   for r in results if r.budget is not None]
    return {**_figures(options, results, elapsed_s, leaks, deltas, calm, applied, violated),
            **resume_figures(results), **budgets.figures(budget_runs)}


def resume_figures(results: list[RunResult]) -> dict:
    """Turns resumed after a lost worker, and how the hard-killed turns ended."""
    killed = [r for r in results if r.hard_killed]
    killed_done = sum(r.status == "done" for r in killed)
    after_kill = [r.ending_after_kill_s for r in killed if r.ending_after_kill_s is not None]
    return {
        "resumed_turns": sum(r.attempt > 0 for r in results),
        "resume_steps": sum(r.resume_steps for r in results),
        "resumed_turns_after_hard_kill": sum(r.attempt > 0 for r in killed),
        "attempts": {str(k): v for k, v in sorted(Counter(r.attempt for r in results if not r.stuck).items())},
        "resumed_statuses": dict(Counter(r.status or "stuck" for r in results if r.attempt > 0).most_common()),
        "hard_killed_done": killed_done,
        "hard_killed_done_share": _round(killed_done / len(killed)) if killed else None,
        "hard_killed_statuses": dict(Counter(r.error_kind or r.status or "stuck" for r in killed).most_common()),
        "lost_tool_results": sum(r.lost_tool_results for r in results),
        "ending_after_hard_kill_s": {"p50": _round(percentile(after_kill, 50)),
                                     "max": _round(max(after_kill) if after_kill else None)},
        "resumed_runs": [{"run": r.plan.index, "fault": r.plan.process_fault, "class": r.plan.worker_class,
                          "note": r.fault_note, "attempt": r.attempt, "resume_steps": r.resume_steps,
                          "status": r.status, "error": r.error_kind, "message": r.error_message[:160]}
                         for r in results if r.attempt > 0],
    }


def _figures(options: Options, results: list[RunResult], elapsed_s: float, leaks: list[str], deltas: list[float],
             calm: list[float], applied: Counter, violated: list[RunResult]) -> dict:
    """The figures of every run: endings, clocks, faults."""
    return {
        "runs": len(results),
        "seed": options.seed,
        "elapsed_s": round(elapsed_s, 1),
        "stuck": sum(r.stuck for r in results),
        "rq_timeouts": sum(r.rq_timeout for r in results),
        "hard_kills": sum(applied[f] for f in HARD_KILLS),
        "sigterms": applied["sigterm"],
        "redis_pauses": applied["redis_pause"],
        "redis_restarts": applied["redis_restart"],
        "late_endings": sum(r.late for r in results),
        "late_endings_without_hard_fault": sum(
            r.late and not r.redis_outage_s and not (r.fault_applied and r.plan.process_fault in HARD_KILLS)
            for r in results),
        "fork_runs": sum(r.plan.worker_class == "fork" for r in results),
        "refused_runs": sum(r.plan.refused for r in results),
        "invariant_violations": sum(len(r.violations) for r in results) + len(leaks),
        "runs_with_violations": len(violated),
        "canary_leaks": leaks,
        "final_minus_deadline_s": {
            "p50": _round(percentile(deltas, 50)),
            "p99": _round(percentile(deltas, 99)),
            "max": _round(max(deltas) if deltas else None),
        },
        "final_minus_deadline_without_hard_fault_s": {
            "p50": _round(percentile(calm, 50)),
            "p99": _round(percentile(calm, 99)),
            "max": _round(max(calm) if calm else None),
        },
        "planned_process_faults": dict(Counter(r.plan.process_fault for r in results if r.plan.process_fault)),
        "rq_timeout_runs": [{"run": r.plan.index, "fault": r.plan.process_fault, "note": r.fault_note,
                             "class": r.plan.worker_class, "calls": r.call_faults}
                            for r in results if r.rq_timeout],
        "final_minus_job_timeout_max_s": _round(max(
            (r.final_minus_job_timeout_s for r in results if r.final_minus_job_timeout_s is not None), default=None)),
        "final_minus_job_timeout_max_unkilled_s": _round(max(
            (r.final_minus_job_timeout_s for r in results if r.final_minus_job_timeout_s is not None
             and not r.redis_outage_s and not (r.fault_applied and r.plan.process_fault in HARD_KILLS)),
            default=None)),
        "statuses": dict(Counter(r.status or "stuck" for r in results).most_common()),
        "endings": dict(Counter(r.error_kind or "answer" for r in results if not r.stuck).most_common()),
        "call_faults": dict(Counter(f for r in results for f in r.call_faults).most_common()),
        "clocks": {"job_timeout_s": options.clocks.job_timeout_s, "margin_s": options.clocks.deadline_margin_s,
                   "call_cap_s": options.clocks.call_timeout_cap_s, "min_call_s": options.clocks.min_call_s,
                   "lost_grace_s": LOST_GRACE_S, "concurrency": options.concurrency},
        "failed_runs": [
            {"run": r.plan.index, "fault": r.plan.process_fault, "class": r.plan.worker_class,
             "note": r.fault_note, "stuck": r.stuck, "violations": r.violations, "calls": r.call_faults,
             "status": r.status, "error": r.error_kind}
            for r in results if r.violations or r.stuck
        ],
    }


def print_report(report: dict, out) -> None:
    d = report["final_minus_deadline_s"]
    c = report["final_minus_deadline_without_hard_fault_s"]
    k = report["ending_after_hard_kill_s"]
    print(
        f"runs {report['runs']} (seed {report['seed']}, {report['elapsed_s']} s; "
        f"{report['fork_runs']} on forking workers, {report['refused_runs']} refused connections)\n"
        f"stuck turns {report['stuck']}\n"
        f"RQ timeouts {report['rq_timeouts']}\n"
        f"hard kills {report['hard_kills']} (also: {report['sigterms']} SIGTERM, "
        f"{report['redis_pauses']} Redis pauses, {report['redis_restarts']} Redis restarts)\n"
        f"invariant violations {report['invariant_violations']} (in {report['runs_with_violations']} runs)\n"
        f"final write - deadline: p50 {_fmt(d['p50'])}, p99 {_fmt(d['p99'])}, max {_fmt(d['max'])}\n"
        f"  without a hard kill or Redis outage: p50 {_fmt(c['p50'])}, p99 {_fmt(c['p99'])}, max {_fmt(c['max'])}\n"
        f"final write - job timeout, max: {_fmt(report['final_minus_job_timeout_max_s'])} "
        f"(without a hard kill or Redis outage: {_fmt(report['final_minus_job_timeout_max_unkilled_s'])})\n"
        f"endings after the job timeout {report['late_endings']} "
        f"(without a hard kill or Redis outage: {report['late_endings_without_hard_fault']})\n"
        f"statuses {report['statuses']}\n"
        f"endings {report['endings']}\n"
        f"resumed turns {report['resumed_turns']} ({report['resumed_turns_after_hard_kill']} after a hard kill), "
        f"resume steps {report['resume_steps']}, attempts {report['attempts']}, "
        f"resumed turns ended {report['resumed_statuses']}; "
        f"tool calls not run again after a lost worker {report['lost_tool_results']}\n"
        f"hard-killed turns ended done {report['hard_killed_done']} of {report['hard_kills']}"
        f" ({_share(report['hard_killed_done_share'])}; endings {report['hard_killed_statuses']}); "
        f"final write - kill: p50 {_fmt(k['p50'])}, max {_fmt(k['max'])}\n"
        f"ledger: {report['ledger_entries']} side effects in {report['ledger_runs']} runs "
        f"({report['ledger_runs_hard_killed']} hard-killed); run twice {len(report['ledger_twice'])}, "
        f"results without their side effect {len(report['ledger_results_unwritten'])}",
        file=out, flush=True,
    )
    print(budgets.report_lines(report), file=out, flush=True)
    for run in report["rq_timeout_runs"]:
        print(f"RQ timeout in run {run['run']} [{run['class']}] fault={run['fault']} {run['note']!r} "
              f"calls={run['calls']}", file=out)
    for run in report["resumed_runs"]:
        print(f"resumed run {run['run']} [{run['class']}] fault={run['fault']} {run['note']!r} "
              f"attempt={run['attempt']} steps={run['resume_steps']} status={run['status']} ending={run['error']}"
              + (f" {run['message']!r}" if run["message"] else ""), file=out)
    for problem in report["ledger_twice"] + report["ledger_results_unwritten"]:
        print(f"LEDGER: {problem}", file=out)
    if report["canary_leaks"]:
        print(f"CANARY KEY LEAKED: {report['canary_leaks']}", file=out)


def _print_run(result: RunResult, out) -> None:
    flag = "STUCK" if result.stuck else ("VIOLATION" if result.violations else "ok")
    print(
        f"run {result.plan.index} [{result.plan.worker_class}] {flag} fault={result.plan.process_fault} "
        f"{result.fault_note!r} status={result.status} ending={result.error_kind} calls={result.call_faults}"
        + "".join(f"\n    - {v}" for v in result.violations),
        file=out, flush=True,
    )


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:+.2f} s"


def _share(value) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _round(value):
    return None if value is None else round(value, 3)


def _retry(fn, attempts: int = 40, pause_s: float = 0.25):
    for attempt in range(attempts):
        try:
            return fn()
        except redis.RedisError:
            if attempt == attempts - 1:
                raise
            time.sleep(pause_s)


def _fetch(lab: FaultLab, job_id: str):
    try:
        return SafeJob.fetch(job_id, connection=lab.queue_connection, serializer=JSONSerializer)
    except (NoSuchJobError, redis.RedisError):
        return None


def _closed_port() -> int:
    """A loopback port nobody listens on (bound, then released without listen)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faults", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="turns in flight (= workers)")
    parser.add_argument("--job-timeout", type=int, default=FAULT_CLOCKS.job_timeout_s, help="seconds")
    parser.add_argument("--margin", type=float, default=FAULT_CLOCKS.deadline_margin_s, help="seconds")
    parser.add_argument("--json", help="also write the report to this file")
    parser.add_argument("--verbose", action="store_true", help="print every run")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.concurrency < 1:
        print("--runs and --concurrency: must be at least 1", file=sys.stderr)
        return 2
    if not 0 < args.margin < args.job_timeout:
        print("--margin: must be more than 0 and less than --job-timeout", file=sys.stderr)
        return 2
    clocks = FAULT_CLOCKS.with_changes(job_timeout_s=args.job_timeout, deadline_margin_s=args.margin)
    options = Options(runs=args.runs, seed=args.seed, concurrency=args.concurrency, clocks=clocks,
                      verbose=args.verbose)
    report = run_faults(options)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 1 if report["invariant_violations"] or report["stuck"] else 0


if __name__ == "__main__":
    sys.exit(main())
