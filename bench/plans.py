"""How much of everything `make bench` runs: the full plan (`make bench`) and the quick one (`--quick`, the
smoke test). One source for the numbers, read by `python -m bench` and by each section run alone."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from dataclasses import dataclass, field

from bench import approve_click, branches, branches_page, conversations, first_screen, load, page
from bench.lab import Lab


@dataclass(frozen=True)
class Plan:
    """How much of everything to run. FULL keeps `make bench` under 10 minutes on 2 cores."""

    latency_s: float  # per model call, for the first-step, overhead and throughput turns
    poll_interval_s: float  # the plain poll's interval and the event-driven wait's bound
    history_samples: int
    observe_conversations: int
    observe_duration_s: float
    classes: tuple[str, ...]
    dispatch_turns: int
    overhead_pairs: int  # for the default class; the others get `overhead_pairs_other`
    overhead_pairs_other: int
    first_step_repeats: int
    throughput: tuple[tuple[str, int, int], ...]  # (worker class, workers, turns)
    deadline_turns: int
    deadline_workers: int
    deadline_clocks: dict = field(default_factory=lambda: dict(load.DEADLINE_CLOCKS))
    page_lengths: tuple[int, ...] = (1, 10, 30, 100)  # turns in the conversation
    page_turns: int = 6  # measured turns per length and condition
    page_hogs: tuple[int, ...] = (0, 2)  # CPU hogs per condition: an idle machine, then a busy one
    page_stops: int = 6  # Stop clicks per condition
    page_new_chats: int = page.NEW_CHATS  # replies timed in a new chat per condition
    first_screen_sizes: tuple[int, ...] = first_screen.SIZES  # conversations stored when the first screen is timed
    first_screen_opens: int = first_screen.OPENS  # warm opens of each app per size
    list_sizes: tuple = conversations.LIST_SIZES  # conversations in the index when the sidebar's page is listed
    memory_turns: tuple = conversations.TURN_COUNTS  # (turns per conversation, conversations measured)
    branch_turns: int = branches.TURNS  # turns of the conversation a branch is made in, at turn 2 and at its last
    worker_memory_with_mcp_json: bool = True  # also measure a worker holding the project's MCP server
    resume_call_kills: int = 10  # workers SIGKILLed mid-call, one at a time: kill to resumed write
    resume_other_rounds: int = 2  # rounds of a mid-stream and a mid-tool kill side by side
    watch_seconds: int = 5  # seconds of TurnWatch sweeps (then of heartbeats) over 100 running turns
    approve_click_runs: int = approve_click.RUNS  # Approve clicks timed in Chromium, idle and beside 2 hogs
    branch_switches: int = branches_page.SWITCHES  # clicks on ‹ or › timed in Chromium, idle and beside 2 hogs
    branch_pairs: int = branches_page.PAIRS  # (a new message, a regenerate) pairs timed to their first word
    approvals_parked: int = 100  # turns parked on a request at once (and requests in the watch's cost)
    approvals_runs: int = 20  # plain turns timed with nothing parked, then as many beside the parked ones
    approvals_expiring: int = 20  # requests nobody answers, expiring 2-6 s after they were asked
    signin_turns: int = 20  # one person's turns submitted at once, before another's one
    signin_call_s: float = 1.0  # the demo model's seconds a call in those turns (three calls a turn)
    signin_list_owners: int = 100  # owners of the conversations stored when a person's list is counted
    signin_list_conversations: int = 10_000  # conversations across them
    signin_list_repeats: int = 50  # listings timed at each size, in turns
    signin_page_pairs: int = 20  # AppTest first draws, signed in and local, in turns
    fleet_turns: int = 1000  # one-call turns across the fleet's pools (bench/fleet.py)
    fleet_pools: int = 3  # pools of worker.py on one Redis over TCP, standing in for machines
    fleet_workers: int = 8  # simple workers per pool
    fleet_latency_s: float = 1.0  # the one call's seconds


# Throughput: 100 turns where 100 turns take at most ~25 s; fewer (25 per worker) below that, so
# 1 worker runs 25 turns (25 s), not 100 (100 s). turns/s is a rate either way; p95 latency grows
# with the queue, so each row says how many turns it ran. Fork workers: a shorter line for contrast.
FULL = Plan(
    latency_s=1.0,
    poll_interval_s=1.0,  # AGENT_POLL_INTERVAL_MS's default
    history_samples=50,
    observe_conversations=6,
    observe_duration_s=15.0,
    classes=("fork", "spawn", "simple"),
    dispatch_turns=30,
    overhead_pairs=5,
    overhead_pairs_other=3,
    first_step_repeats=3,
    throughput=tuple(("simple", n, min(100, 25 * n)) for n in (1, 2, 4, 8, 16))
    + tuple(("fork", n, min(50, 10 * n)) for n in (1, 2, 4, 8, 16)),
    deadline_turns=200,
    deadline_workers=16,
)

QUICK = Plan(
    latency_s=0.2,
    poll_interval_s=0.2,
    history_samples=5,
    observe_conversations=2,
    observe_duration_s=1.0,
    classes=("simple",),
    dispatch_turns=3,
    overhead_pairs=1,
    overhead_pairs_other=1,
    list_sizes=(20, 200),
    memory_turns=((1, 5), (10, 2)),
    branch_turns=20,
    worker_memory_with_mcp_json=False,
    first_step_repeats=1,
    throughput=(("simple", 1, 2), ("simple", 2, 4)),
    deadline_turns=4,
    deadline_workers=2,
    deadline_clocks=dict(job_timeout_s=2, deadline_margin_s=1.0, call_timeout_cap_s=0.5, connect_timeout_s=0.5,
                         min_call_s=0.2, max_steps=8),
    page_lengths=(1, 3),
    page_turns=1,
    page_hogs=(0,),
    page_stops=1,
    page_new_chats=1,
    first_screen_sizes=(20,),
    first_screen_opens=1,
    resume_call_kills=1,
    resume_other_rounds=1,
    watch_seconds=1,
    approvals_parked=10,
    approve_click_runs=0,  # the browser test covers the click; its timing is the full run's
    branch_switches=0,  # tests/test_browser_branches.py covers the picker and Regenerate; timing is the full run's
    branch_pairs=0,
    approvals_runs=3,
    approvals_expiring=3,
    signin_turns=4,
    signin_call_s=0.3,
    signin_list_owners=10,
    signin_list_conversations=200,
    signin_list_repeats=5,
    signin_page_pairs=2,
    fleet_turns=12,
    fleet_workers=2,
    fleet_latency_s=0.2,
)


def run_alone(prog: str, doc: str, figures, goals, argv: list[str] | None = None, add_arguments=None) -> int:
    """`python -m bench.<section> [--quick]`: one section on a lab of its own, its figures and goals printed as
    JSON, its progress on stderr; everything it started is stopped, on SIGTERM and Ctrl-C too.

    `figures(lab, plan, args, say)` measures; `goals(section)` judges; `add_arguments(parser)` adds the
    section's own options."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the quick plan (as `python -m bench --quick`)")
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt  # so the finally below stops what was started

    signal.signal(signal.SIGTERM, on_sigterm)
    started = time.monotonic()
    lab = Lab().start()
    try:
        section = figures(lab, QUICK if args.quick else FULL, args,
                          lambda m: print(f"[{time.monotonic() - started:6.1f} s] {m}", file=sys.stderr, flush=True))
    except KeyboardInterrupt:
        print("interrupted: everything started was stopped", file=sys.stderr)
        return 130
    finally:
        lab.close()
    print(json.dumps(section | {"goals": goals(section)}, indent=2))
    return 0
