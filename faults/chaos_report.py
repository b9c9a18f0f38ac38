"""What a chaos run saw, and its verdict (faults/chaos.py runs it): the records of its turns and kills, every
turn held to the fault runner's promises (checks.py) and to its bound in time, the resumes timed from each kill,
the ledger and the API key checked, and the report printed."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import redis

from agent.hosting.lost_worker import LOST_GRACE_S
from faults.checks import check_observations
from faults.ledger import ledger_problems, read_ledger
from faults.runner import KILL_SLACK_S, WATCH_DETECT_S, _unwritten_results
from harness.private_redis import stored_values
from harness.stats import summary

CANARY_KEY = "sk-chaos-canary-5e1f0c9a27d4"  # given to the workers; must never reach Redis or the logs
# Seconds from a worker's kill, which its supervisor sees (or RQ, for a work horse), to the ending the hand-over
# writes when nothing can go on (no time or no resume left): at once (agent/hosting/deaths.py). A turn whose job
# was lost before its first write is queued again rather than ended, so no kill lets an ending wait for a lapse
# but a whole pool's (nothing sees it die: the heartbeat's lapse and the watch's look, WATCH_DETECT_S).
SEEN_DEATH_S = 1.0


@dataclass(frozen=True)
class TurnPlan:
    index: int
    asks_first: bool  # its calculator and clock ask first
    answer: str | None  # approved, denied, or None (nobody answers)
    answer_delay_s: float


@dataclass
class Kill:
    at: float  # epoch seconds
    kind: str  # "worker" or "pool"
    pool: int
    pids: list[int]
    jobs: list[str] = field(default_factory=list)  # the jobs its workers were running
    turns: list[tuple[str, str]] = field(default_factory=list)  # (conversation, turn) of those jobs


@dataclass
class TurnResult:
    plan: TurnPlan
    conversation_id: str
    turn_id: str
    text: str
    model: str
    submitted_at: float
    observed: list[dict] = field(default_factory=list)
    answered: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    @property
    def final(self) -> dict | None:
        return self.observed[-1] if self.observed else None


def judge(chaos, results: list[TurnResult], run_s: float, fleet_up_s: float, pages_answer: list[bool]) -> dict:
    """The report of a run: `chaos` is the run (faults/chaos.py's Chaos: its options, fleet, provider, kills,
    Redis outages, ledger, pool restarts and errors), `results` its turns as their clients saw them."""
    kills_of: dict[str, list[Kill]] = {}
    for kill in chaos.kills:
        for _, turn_id in kill.turns:
            kills_of.setdefault(turn_id, []).append(kill)
    stuck, late, lost, delays = [], [], [], {"worker": [], "pool": []}
    after_outage = {"worker": 0, "pool": 0}
    unresumed: Counter = Counter()
    past: Counter = Counter()  # final writes after the turn's job timeout, by what explains them
    for result in results:
        served = list(chaos.provider.runs[result.model].served) if result.model in chaos.provider.runs else []
        result.violations = check_observations(result.observed, turn_id=result.turn_id, user_text=result.text,
                                               served=served, max_resumes=chaos.options.clocks.max_resumes)
        final = result.final
        if final is None or not final["done"]:
            stuck.append(result)
            continue
        recheck(chaos, result, lost)
        bound, why = ending_bound(chaos, result, kills_of.get(result.turn_id, []))
        if bound is not None and final["updated_at"] > bound:
            late.append(result)
            result.violations.append(f"the ending landed {final['updated_at'] - bound:+.2f} s past its bound"
                                     + why)
        why_late = past_job_timeout(chaos, result, kills_of.get(result.turn_id, []))
        if why_late:
            past[why_late] += 1
        for kill in kills_of.get(result.turn_id, []):
            step = next((s for s in final["steps"] if s.get("kind") == "resume"
                         and s.get("turn_id") == result.turn_id and (s.get("ended_at") or 0) > kill.at), None)
            if step is None:
                unresumed[(final["error"] or {}).get("kind") or "done before a resume was needed"] += 1
            elif outage_between(chaos, kill.at, step["ended_at"]):
                after_outage[kill.kind] += 1
            else:
                delays[kill.kind].append(step["ended_at"] - kill.at)
    leaks = canary_leaks(chaos)
    ledger = read_ledger(chaos.ledger)
    twice = ledger_problems(ledger)
    unwritten = _unwritten_results(
        [_AsRun(r) for r in results], {key for key, _ in ledger})
    violations = sum(len(r.violations) for r in results) + len(twice) + len(unwritten) + len(leaks)
    finals = [r.final for r in results if r.final is not None and r.final["done"]]
    report = {
        "turns": len(results),
        "seed": chaos.options.seed,
        "fleet": {"redis": f"{chaos.fleet.redis.kind} {chaos.fleet.redis.version()}", "pools": chaos.options.pools,
                  "workers_per_pool": chaos.options.workers, "classes": list(chaos.options.classes),
                  "page_servers": chaos.options.pages, "pages_answer_after": pages_answer,
                  "up_s": round(fleet_up_s, 1)},
        "run_s": round(run_s, 1),
        "turns_per_s": round(len(results) / run_s, 2),
        "stuck": len(stuck),
        "lost": len(lost),
        "late": len(late),
        "past_job_timeout": dict(past),
        "invariant_violations": violations,
        "ledger_entries": len(ledger),
        "ledger_twice": twice,
        "ledger_results_unwritten": unwritten,
        "canary_leaks": leaks,
        "statuses": dict(Counter(f["status"] for f in finals).most_common()),
        "endings": dict(Counter((f["error"] or {}).get("kind", "answer") for f in finals).most_common()),
        "calls": dict(Counter(k for run in chaos.provider.runs.values() for k in run.faults).most_common()),
        "approvals": {"asked_first": sum(r.plan.asks_first for r in results),
                      "answered": sum(bool(r.answered) for r in results),
                      "left_to_expire": sum(r.plan.asks_first and not r.plan.answer for r in results)},
        "kills": {"workers": sum(k.kind == "worker" for k in chaos.kills),
                  "pools": sum(k.kind == "pool" for k in chaos.kills),
                  "turns_hit": sum(len(k.turns) for k in chaos.kills)},
        "resumed_turns": sum((f.get("attempt") or 0) > 0 for f in finals),
        "resume_s": {"worker_killed": summary(delays["worker"], 1, 2),
                     "pool_killed": summary(delays["pool"], 1, 2)},
        "resumes_across_a_redis_outage": after_outage,
        "killed_turns_not_resumed": dict(unresumed),
        "worker_lost_by_kind": dict(Counter(worker_lost_kind((f["error"] or {}).get("message") or "") for f in finals
                                            if (f["error"] or {}).get("kind") == "worker_lost")),
        "pool_back_s": summary(chaos.pool_restarts, 1, 1),
        "redis_outages": [{"what": what, "s": round(end - start, 2)} for start, end, what in chaos.outages],
        "chaos_errors": chaos.errors,
        "other_endings": [{"turn": r.plan.index, "ending": (r.final["error"] or {}).get("kind"),
                           "message": (r.final["error"] or {}).get("message", "")[:120],
                           "calls": chaos.provider.runs[r.model].faults if r.model in chaos.provider.runs else []}
                          for r in results if r.final and r.final["done"] and r.final["error"]][:40],
        "failed_turns": [{"turn": r.plan.index, "violations": r.violations,
                          "status": (r.final or {}).get("status"), "stuck": r in stuck,
                          "calls": chaos.provider.runs[r.model].faults if r.model in chaos.provider.runs else [],
                          "kills": [(k.kind, round(k.at, 2)) for k in kills_of.get(r.turn_id, [])],
                          "trace": [(s["version"], s["status"], s.get("attempt"), s.get("deadline_at") and round(
                              s["deadline_at"], 2), s.get("job_id"), round(s["updated_at"], 2))
                              for s in r.observed]}
                         for r in results if r.violations or r in stuck][:30],
    }
    return report


def ending_bound(chaos, result: TurnResult, kills: list[Kill]) -> tuple[float | None, str]:
    """The latest instant the turn's final write may land (None: its job never started), and why.

    A turn's ending lands before its job timeout (a resume keeps the turn's clocks; an answer's continuation
    runs on fresh ones, so the last set counts), except: after a kill, the watch's ending once the heartbeat
    lapsed (WATCH_DETECT_S after it); where Redis was away, the front ends' lost-worker bound plus the outage."""
    job_timeout_at = last_job_timeout_at(result)
    if job_timeout_at is None:
        return None, ""
    outage = outage_s(chaos, result)
    bound, why = job_timeout_at, ""
    if kills:
        bound = max(bound, *(k.at + kill_allowance_s(k) for k in kills))
        why = " (a kill: " + ", ".join(f"{k.kind} {kill_allowance_s(k):g} s after it" for k in kills) + ")"
    if outage > 0:
        bound = max(bound, job_timeout_at + LOST_GRACE_S + KILL_SLACK_S + outage)
        why += f" (Redis away {outage:.1f} s: job timeout + {LOST_GRACE_S + KILL_SLACK_S:g} s + the outage)"
    return bound, why


def kill_allowance_s(kill: Kill) -> float:
    """Seconds after a kill within which the ending it explains may land past the turn's job timeout: a worker's
    death is seen and handed over at once; a whole pool's waits for the heartbeat to lapse."""
    return (SEEN_DEATH_S if kill.kind == "worker" else WATCH_DETECT_S) + KILL_SLACK_S


def worker_lost_kind(message: str) -> str:
    """What a `worker_lost` ending's sentence says stopped the hand-over."""
    if "0.0 s were left" in message:
        return "no time: 0.0 s left"  # the weakness of clocks read before a job set them: must not come back
    if "no time remained" in message:
        return "no time left before its deadline"
    if "after this reply had been resumed" in message or "AGENT_MAX_RESUMES" in message:
        return "no resume left"
    if "never started" in message or "before it began" in message or "taken off the queue" in message:
        return "taken off the queue, never started"  # ended instead of queued again: must not come back
    return "other"


def last_job_timeout_at(result: TurnResult) -> float | None:
    """The turn's last job timeout (an answer's continuation sets a new one; a resume keeps it)."""
    return next((s["job_timeout_at"] for s in reversed(result.observed) if s.get("job_timeout_at")), None)


def outage_s(chaos, result: TurnResult) -> float:
    """Seconds Redis was away between the turn's submission and its final write."""
    return sum(max(0.0, min(end, result.final["updated_at"]) - max(start, result.submitted_at))
               for start, end, _ in chaos.outages)


def past_job_timeout(chaos, result: TurnResult, kills: list[Kill]) -> str | None:
    """Why the turn's final write landed after its job timeout (None: it did not)."""
    job_timeout_at = last_job_timeout_at(result)
    if job_timeout_at is None or result.final["updated_at"] <= job_timeout_at:
        return None
    return "redis_away" if outage_s(chaos, result) > 0 else "after_a_kill" if kills else "neither"


def outage_between(chaos, start: float, end: float) -> bool:
    return any(s < end and e > start for s, e, _ in chaos.outages)


def recheck(chaos, result: TurnResult, lost: list[TurnResult]) -> None:
    """The turn is still there after the run, as its client last saw it (none lost to Redis's restart)."""
    try:
        state = chaos.fleet.store.read(result.conversation_id)
    except redis.RedisError as exc:
        result.violations.append(f"could not read the state after the run: {exc}")
        return
    last = result.final
    if state is None:
        lost.append(result)
        result.violations.append("the conversation disappeared after the run")
    elif state["version"] != last["version"] or not state["done"]:
        lost.append(result)
        result.violations.append(f"the state moved after done: version {last['version']} -> {state['version']}")


def canary_leaks(chaos) -> list[str]:
    leaks = [f"redis key {key.decode(errors='replace')}" for key, values in stored_values(chaos.fleet.client)
             if any(CANARY_KEY.encode() in v for v in [key, *values])]
    for log_file in sorted(chaos.fleet.dir.glob("**/*.log*")):
        if CANARY_KEY in log_file.read_text(errors="replace"):
            leaks.append(f"the log {log_file.relative_to(chaos.fleet.dir)}")
    return sorted(set(leaks))


@dataclass
class _AsRun:
    """A turn as the fault runner's ledger check reads one (`observed`)."""

    result: TurnResult

    @property
    def observed(self) -> list[dict]:
        return self.result.observed

    @property
    def plan(self):
        return self.result.plan


def print_report(report: dict, out) -> None:
    r = report
    w, p = r["resume_s"]["worker_killed"], r["resume_s"]["pool_killed"]
    print(
        f"chaos: {r['turns']} turns (seed {r['seed']}) in {r['run_s']} s, {r['turns_per_s']} turns/s "
        f"(whole run {r.get('elapsed_s')} s, fleet up in {r['fleet']['up_s']} s: {r['fleet']['redis']} on TCP, "
        f"{r['fleet']['pools']} pools x {r['fleet']['workers_per_pool']} workers, {r['fleet']['page_servers']} "
        f"page servers, answering after: {r['fleet']['pages_answer_after']})\n"
        f"stuck {r['stuck']}, lost {r['lost']}, endings past their bound {r['late']} (after their job timeout: "
        f"{r['past_job_timeout'] or 'none'}), "
        f"invariant violations {r['invariant_violations']}\n"
        f"statuses {r['statuses']}\nendings {r['endings']}\ncalls {r['calls']}\napprovals {r['approvals']}\n"
        f"kills {r['kills']}; resumed turns {r['resumed_turns']}; killed turns not resumed "
        f"{r['killed_turns_not_resumed']}; worker_lost endings by kind {r['worker_lost_by_kind'] or 'none'}\n"
        f"kill -> resumed first write: worker killed p50 {w['p50']} s, p95 {w['p95']} s, max {w['max']} s "
        f"(n {w['n']}); pool killed p50 {p['p50']} s, p95 {p['p95']} s, max {p['max']} s (n {p['n']}); "
        f"across a Redis outage {r['resumes_across_a_redis_outage']}\n"
        f"pool back (kill -> workers registered): {r['pool_back_s']}\n"
        f"Redis outages {r['redis_outages']}\n"
        f"ledger: {r['ledger_entries']} side effects; run twice {len(r['ledger_twice'])}, results without their "
        f"side effect {len(r['ledger_results_unwritten'])}; canary leaks {r['canary_leaks']}",
        file=out, flush=True)
    for turn in r["failed_turns"]:
        print(f"FAILED turn {turn['turn']}: {turn}", file=out)
    for problem in r["ledger_twice"] + r["ledger_results_unwritten"]:
        print(f"LEDGER: {problem}", file=out)
    for error in r["chaos_errors"]:
        print(f"CHAOS ERROR: {error}", file=out)


ANSWERED_AT_LEAST = 0.5  # of the turns end `done`: fewer means the run's own provider failed, not the fleet held


def passed(report: dict) -> bool:
    answered = report["statuses"].get("done", 0) >= ANSWERED_AT_LEAST * report["turns"]
    return answered and not (report["invariant_violations"] or report["stuck"] or report["lost"] or report["late"]
                             or report["chaos_errors"])
