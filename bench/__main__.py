"""`python -m bench` (`make bench`): every figure, side by side in one run.

Starts a private Redis (a temp dir) and worker pools as subprocesses, runs the demo provider at
set latencies, prints a table, writes bench/results.json and two plots. `--quick` runs a tiny
configuration (for the smoke test) and writes wherever `--out` says.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import rq

from agent.hosting.worker_process import DEFAULT_WORKER_CLASS
from bench import (
    approvals,
    approve_click,
    branches,
    branches_page,
    budget_cost,
    conversations,
    cost,
    first_screen,
    fleet,
    latency,
    load,
    page,
    report,
    resume,
    signin,
    tracing_cost,
    worker_memory,
)
from bench.lab import Lab
from bench.plans import FULL, QUICK, Plan

HERE = Path(__file__).resolve().parent

METHOD = {
    "first_step_ratio": "The three-tool turn (calculator, current_time, search_docs; 4 model calls at {latency} s) "
    "on 2 simple workers; from submit, (first tool step visible) / (final answer visible), median of {n} turns. "
    "Each turn is followed by two clients at once: the event-driven poll (Store.wait_version, as the CLI does) "
    "gives first_step_ratio; a plain poll every 1 s with a random phase gives first_step_ratio_plain_poll. "
    "The write-at-end loop (TurnConfig.safeguards=False) runs beside it at the same time.",
    "queue_overhead_ratio": "The same three-tool turn at {latency} s per call, through RQ (submit to the final "
    "write seen by an event-driven client) / in-process (the same submit without the enqueue, then "
    "agent.turn.run_turn called in a warm thread of the bench process); both started together; median of "
    "the pair ratios. 2 workers per class; the headline uses the default class.",
    "tracing_overhead": "The same three-tool turn (4 model calls at {latency} s) called in-process, tracing off "
    "then on (the SDK's batch processor, OTLP/HTTP to a loopback collector), back to back, {pairs} pairs; ratio = "
    "on / off per pair, median. spans_build_ms: building one turn's spans from its final state, alone.",
    "clamp_overhead": "The fourth clock's cost on a turn without a budget: the same three-tool turn (4 model calls "
    "at {latency} s) called in-process, with the clamp's arithmetic (each call's input bound from the request's "
    "bytes or the last call's count, its plan, the spend written with its start, its charge) and with a constant "
    "plan instead, back to back, {pairs} pairs; ratio = on / off per pair, median. budget_ratio: the same turn "
    "with a 200,000-token budget (max_tokens asked) / without one.",
    "conversations_list": "The sidebar's page of 20 conversations listed from the index (a sorted set by last "
    "write) with 20, 1,000 and 10,000 conversations stored (calculator turns written through the store's own "
    "scripts); median of 50 listings, and the Redis commands one listing sends. memory_per_conversation: "
    "MEMORY USAGE of a conversation's keys by its number of turns.",
    "branches": "One conversation of {branch_turns} calculator turns written through the store's scripts. write: "
    "a regenerate and an edit of turn 2 and of turn {branch_turns} (begun beside it, then a worker's three writes "
    "of a calculator turn): aof_bytes = what Redis appended to its append-only file (a script's effects, as "
    "Redis 6.2 logs them), sent_bytes = INFO total_net_input_bytes, tree_bytes = the tree hash's new or changed "
    "fields and values; ratio = at turn {branch_turns} / at turn 2 (goal: within 10%). read: a page showing the "
    "branch at turn {branch_turns} in a process that read nothing yet (open), then each next read with what it "
    "read before (Store.read_since): poll (nothing changed), switch (to the other answer of that turn), "
    "switch_back, new_message; bytes = both directions (INFO total_net_input/output_bytes), commands = INFO "
    "commandstats calls (a script's own included), round_trips = the client's calls.",
    "worker_memory": "RSS of one idle simple worker of the pool after one three-tool turn (demo@0~0), with no MCP "
    "server configured and with the project's mcp.json, beside a bare `rq worker --worker-class "
    "rq.worker.SimpleWorker` idle on the same Redis; ratio = ours / bare. Goal: at most 1.3 without MCP servers.",
    "dispatch_latency_ms": "2 idle workers per class, one instant turn (demo@0~0) at a time, after warm-up. "
    "start_ms: submit to RQ's job.started_at (stamped in the process that runs the job, after any fork or "
    "spawn). first_call_ms: submit to the start of the turn's first model call (also the job's import, "
    "state read and first write).",
    "publish_to_observed_ms": "Writers publish a new step to in-flight conversations at random gaps "
    "(0.2-2 s) through Store.publish; for each write, the time until a client first sees that version or a "
    "later one. Three clients per conversation at once: plain HGET of the version every {interval} s (random "
    "phase); Store.wait_version (XREAD BLOCK on the events stream, then HGET; bounded by the same interval); "
    "and for contrast a plain poll 5x as often. Redis CPU = commands per client-second x INFO commandstats "
    "usec per call.",
    "cost_vs_history": "Conversations prepared with exactly 10/100/1000 messages (user, tool call, tool "
    "result, answer). publish: one round-trip's write (one message, one step, the small fields) via the Lua "
    "script. poll_no_change: Store.version (one HGET). poll_one_new_message: Store.read_since with a state "
    "one message old (the small fields and the new tail of each list). Contrasts: the full-state read, and a "
    "whole-state "
    "rewrite (one SET of the state JSON, what a single-key layout would send per write). Bytes: Redis's own "
    "total_net_input/output_bytes counters, both directions, per operation. Time: client-side, per call.",
    "throughput": "N one-call turns (demo@{latency}~0: 1 model call each) submitted at once to a pool of W "
    "workers after a warm-up; turns/s = N / (last final write - first submit); latency = final write - submit; "
    "memory = peak of the mean RSS per worker process (plus its work horse, for fork) during the run. "
    "ideal = turns / (ceil(turns / W) rounds x {latency} s).",
    "fleet_throughput": "{fleet_turns} one-call turns (demo@{fleet_latency}~0) submitted at once, after a warm-up "
    "of two instant turns per worker, to {fleet_pools} pools of `python worker.py --workers {fleet_workers}` (simple "
    "workers, each pool with its own AGENT_DATA_DIR and demo model) on one Redis over TCP (harness/fleet.py: "
    "Debian's redis-server 7, a password, appendonly yes, appendfsync everysec; the embedded binary on TCP where "
    "Debian's is missing). turns/s = turns / (last final write - first submit); ideal = turns / (ceil(turns / "
    "workers) x {fleet_latency} s); efficiency = turns/s / ideal (goal >= 0.9). wait = the state's enqueued_at to "
    "started_at. Redis CPU = INFO cpu (used_cpu_sys + used_cpu_user, children included) across the turns / turns. "
    "memory = peak of the mean RSS per worker process during the run; a worker's CPU = user + system CPU seconds of "
    "the workers across the turns / turns.",
    "page": "`streamlit run app.py` (embedded Redis, 2 workers) in headless Chromium through Playwright, against "
    "a scripted OpenAI-compatible model on loopback (harness/stream_model.py) that streams 30 words, 0.1 s apart, "
    "and notes when each word left it; earlier turns are written through the same queue with the instant demo "
    "model, then the page is reloaded on the conversation and {page_turns} turns are asked at each length. "
    "word_to_screen_ms: a word leaving the model to its first sight in the newest chat message (a "
    "MutationObserver, the browser's clock; one machine, one clock). A tick is a fragment run (the turn in "
    "flight, followed within the run); tick_draw_ms runs from its first element to its first component (what "
    "it draws before it follows), tick_bytes is what it sent until then; update_bytes is each element redrawn "
    "while following. settle_s: the turn's final write (updated_at in Redis) to the answer on screen with "
    "nothing of a turn in flight left and the input enabled. writes_per_s: the turn's versions after its begin, "
    "per second from its start to its final write. Stop: a 600-word reply, Stop clicked once 5 words show; "
    "click to \"Stopping…\" on screen (stop_acknowledged_ms; the ending, when it replaced \"Stopping…\" "
    "before the browser's observer saw it) and click to the turn ended on screen, settled "
    "(stop_ended_s), both on the browser's clock; a Stop whose ending has not shown 30 s after the click is "
    "clicked again, timed from the first click and listed with what it left (stops_clicked_again). "
    "Conditions: an idle machine, then with busy-loop processes "
    "running (hogs).",
    "first_screen": "From opening the page to a chat input that can be typed into (navigation start to the "
    "input present and enabled, the browser's clock), `streamlit run app.py` against a minimal Streamlit chat "
    "app (harness/minimal_chat.py: a title, the history, st.chat_input) in the same Chromium and venv, with "
    "50 and 10,000 conversations stored; per size both apps are started afresh, opened once (the first page "
    "after the start), then {first_screen_opens} more times each in turns (A B, B A, ...), every time in a "
    "fresh browser context (no cache, a new session). ratio: page / minimal per pair; median and p95.",
    "branches_page": "Branches on the page (bench/branches_page.py), one `streamlit run app.py` (embedded Redis, "
    "2 workers) in headless Chromium against the scripted streaming model, idle and beside 2 CPU hogs. "
    "switch_ms: {branch_switches} clicks on ‹ or › (alternately) between two branches at a conversation's first "
    "turn (a question and its edit); from the click (a capturing listener) to the other branch's place (k / 2) "
    "shown and the other question gone from the chat (checked every 10 ms), the browser's clock. first_word_ms: "
    "{branch_pairs} pairs in one conversation of a new message (Enter) then Regenerate on its answer, each timed "
    "to the first word of the new answer in the chat; regenerate_over_message = p50 / p50.",
    "resume": "A turn outlives its worker, default heartbeat (1 s, 3 s mark) and clocks. kill_to_first_write_s: "
    "{resume_kills} one-call turns (demo@3~0) on {resume_workers} simple workers, one at a time; the worker running "
    "it SIGKILLed 0.2-1.8 s into its 3 s call (a random phase against the heartbeat); from the kill to the resumed "
    "job's first write (its resume step's stamp; kill_to_seen_s: a client's 20 ms poll sees it). done_share: those "
    "turns and {resume_rounds} rounds of a turn killed mid-stream (demo@0.3~30, 30 characters shown) beside one "
    "killed mid-tool (wait(4), 0.2-1.8 s in), each killed once; ended `done` / killed. heartbeat_overhead: the "
    "three-tool turn ({latency} s calls) in-process with its heartbeat and with heartbeat.beating made a no-op, "
    "back to back, {pairs} pairs; on / off, median. watch_redis: 100 running turns fabricated (index, meta, live "
    "mark) on a Redis with no pool; TurnWatch.sweep once a second for {watch_seconds} s, then 100 heartbeat SETs "
    "a second for as long; INFO commandstats deltas (INFO left out) per second, per supervisor for the watch. "
    "side_effect_cost: a turn of 16 calls of a tool that is not safe to repeat (each start stored before it runs, "
    "each result written as it returns) against 16 of one that is (results in batches), in-process on the lab's "
    "Redis, the model answering at once, {pairs} pairs back to back; extra_ms_p50 and writes per turn.",
    "approvals": "Tools that ask a person first, on {approvals_workers} simple workers with their pool's watch (a "
    "look every 1 s). start_beside_parked: plain one-call turns (demo@0~0) one at a time, enqueue to the job's "
    "start (the state's enqueued_at to its started_at, RQ's stamp), {approvals_runs} with nothing parked (after 2 "
    "warm-up turns), then {approvals_parked} turns that ask before the calculator (\"what is 6*7?\", "
    "approve_tools=calculator, nobody answers for an hour) submitted at once, each confirmed awaiting_approval "
    "with its job finished, workers holding a job sampled 10 times over a second, then {approvals_runs} plain "
    "turns again; added_ms = beside - nothing parked, against the page's poll interval. expiry: "
    "{approvals_expiring} such turns submitted at once (beside the parked ones) with approval timeouts spread "
    "evenly over 2-6 s; from each request's expires_at to the ended_at of its expired approval step (the "
    "watch's stamp when it expired it). watch_redis: {approvals_parked} requests in the index of parked turns, "
    "none due, on a Redis with no pool; expire_due {approvals_looks} times, then TurnWatch.sweep (no running "
    "turns) as often; INFO commandstats deltas (INFO left out) per look.",
    "signin": "Sign-in and fair share, on {signin_workers} simple workers. fairness: person A (a store bound to A, "
    "at most {signin_turns} turns in flight) submits {signin_turns} turns at once (\"What is 1+2, and what time is "
    "it?\", demo@{signin_call}~0: three model calls a turn) after a warm-up turn per worker; once {signin_workers} "
    "of them run, and 1.5 model calls later (half a turn: the mean of an arrival at a random moment), person B "
    "submits one; B's wait is its turn summary's enqueued_at to started_at, against one turn (the median of A's "
    "turns' started_at to ended_at); with a share of {signin_share} (RQ's RateLimit per person: A's backlog waits "
    "outside the queue), then without (share 0: one FIFO queue, B behind all of A's). list_per_owner: one "
    "person's list of 20 (list_conversations on their bound store) with 20 conversations stored, and with "
    "{signin_conversations} across {signin_owners} owners (theirs written through the store's scripts, the others' "
    "meta hash and index entries by hand), each in a database of its own on one Redis; the Redis commands one "
    "listing sends (INFO commandstats deltas, INFO left out), and {signin_repeats} listings of each, in turns. "
    "first_draw: AppTest (the server's run of app.py, not the browser) on an empty chat for a new session, with "
    "sign-in configured and a person signed in, against local mode (no [auth] secrets); the same Redis "
    "(REDIS_URL), AGENT_WORKERS=0; 2 warm-up runs of each, then {signin_pairs} pairs in turns (A B, B A, ...); "
    "ratio = signed in / local per pair, median.",
    "deadline_accuracy": "Three-tool turns on {workers} simple workers with short clocks {clocks}; each turn's "
    "provider is random: 50% demo@U(0.05,1.5), 20% demo@U(1.5,4) (calls that outlive the cap or the "
    "deadline), 15% demo:hang, 15% demo:flaky@U(0.05,1). final write = the updated_at of the turn's last "
    "write; asserted: none at or past job_timeout_at, none killed by the queue.",
}


def progress(message: str, started: float) -> None:
    print(f"[{time.monotonic() - started:6.1f} s] {message}", file=sys.stderr, flush=True)


def run_page(plan: Plan, started: float, results: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-page-") as tmp:
        say = lambda message: progress(message, started)  # noqa: E731
        section = page.page_cost(plan.page_lengths, plan.page_turns, plan.page_hogs, Path(tmp), say,
                                 stops=plan.page_stops, new_chats=plan.page_new_chats)
        if section is not None and plan.approve_click_runs:
            say("approvals: from Approve clicked to the tool's step on screen, idle and beside 2 CPU hogs")
            results["approve_click"] = {f"hogs_{hogs}": approve_click.measure(plan.approve_click_runs, hogs,
                                                                              Path(tmp) / f"approve-{hogs}")
                                        for hogs in (0, 2)}
        if section is not None and plan.branch_switches:
            say("branches: a click on ‹ or › to the other branch on screen, and Regenerate to its first word against "
                "a new message's, idle and beside 2 CPU hogs")
            results["branches_page"] = {f"hogs_{hogs}": branches_page.measure(
                plan.branch_switches, plan.branch_pairs, hogs, Path(tmp) / f"branches-{hogs}") for hogs in (0, 2)}
        if section is not None:
            results["first_screen"] = first_screen.first_screen(plan.first_screen_sizes, plan.first_screen_opens,
                                                                Path(tmp), say)
    if section is not None:
        results["page"] = section
        busiest = list(section["conditions"])[-1]
        results["page_tick_growth"] = page.growth(section, busiest, "tick_draw_ms")
        results["page_tick_bytes_growth"] = page.growth(section, busiest, "tick_bytes")
        results["page_tick_added_ms"] = page.tick_added_ms(section, busiest)
        results["page_update_bytes_growth"] = page.growth(section, busiest, "update_bytes")
        results["page_tick_noise_ms"] = page.TICK_NOISE_MS
    return results


def run(plan: Plan, seed: int, started: float, results: dict) -> dict:
    """Fills `results` section by section, so what was measured survives a later section's failure."""
    rng = random.Random(seed)
    run_page(plan, started, results)
    lab = Lab().start()
    try:
        progress("cost against history length", started)
        rows = cost.history_cost(lab, plan.history_samples)
        results["cost_vs_history"] = rows
        results["publish_growth_1000_vs_10"] = round(rows[-1]["publish"]["bytes"] / rows[0]["publish"]["bytes"], 3)
        results["poll_growth_1000_vs_10"] = round(
            rows[-1]["poll_no_change"]["bytes"] / rows[0]["poll_no_change"]["bytes"], 3)

        progress("conversations: listing cost and memory per conversation", started)
        results["conversations_list"] = conversations.list_cost(lab.store, plan.list_sizes)
        results["memory_per_conversation"] = conversations.memory_per_conversation(lab.store, plan.memory_turns)
        lab.client.flushdb()

        progress(f"branches: a regenerate and an edit at turn 2 and turn {plan.branch_turns:,}, and what a page "
                 "reads to show another branch", started)
        results["branches"] = branches.branch_figures(lab.store, plan.branch_turns)
        lab.client.flushdb()

        progress("a worker's memory beside a bare rq worker", started)
        results["worker_memory"] = worker_memory.worker_memory(
            lab, with_mcp_json=plan.worker_memory_with_mcp_json)

        progress("publish to observed: plain poll vs event-driven wait", started)
        results["publish_to_observed_ms"] = cost.publish_to_observed(
            lab, plan.observe_conversations, plan.observe_duration_s, plan.poll_interval_s, rng)

        dispatch, overhead = {}, {}
        for kind in plan.classes:
            progress(f"{kind} workers: dispatch latency and queue overhead", started)
            pool = lab.pool(2, kind)
            dispatch[kind] = latency.dispatch_latency(lab, pool, plan.dispatch_turns, warmup=2)
            pairs = plan.overhead_pairs if kind == DEFAULT_WORKER_CLASS else plan.overhead_pairs_other
            overhead[kind] = latency.queue_overhead(lab, pool, pairs, plan.latency_s)
            if kind == DEFAULT_WORKER_CLASS:
                progress(f"{kind} workers: tracing off and on", started)
                results["tracing_overhead"] = tracing_cost.tracing_overhead(lab, pool, pairs, plan.latency_s)
                progress(f"{kind} workers: the fourth clock's clamp on and off", started)
                results["clamp_overhead"] = budget_cost.clamp_overhead(lab, pool, pairs, plan.latency_s)
                progress(f"{kind} workers: first-step ratio", started)
                results["first_step"] = latency.first_step(
                    lab, plan.first_step_repeats, plan.poll_interval_s, rng, plan.latency_s)
            lab.stop_pool(pool)
        first = results["first_step"]
        results["first_step_ratio"] = first["publish_as_you_go"]["event"]["ratio_median"]
        results["first_step_ratio_plain_poll"] = first["publish_as_you_go"]["plain"]["ratio_median"]
        results["first_step_ratio_write_at_end"] = first["write_at_end"]["event"]["ratio_median"]
        results["queue_overhead_ratio"] = overhead[DEFAULT_WORKER_CLASS]["ratio"]
        results["queue_overhead_ratio_by_class"] = {k: v["ratio"] for k, v in overhead.items()}
        results["queue_overhead"] = overhead
        results["dispatch_latency_ms"] = dispatch

        results["throughput"] = []
        for kind, workers, turns in plan.throughput:
            progress(f"throughput: {turns} turns on {workers} {kind} workers", started)
            pool = lab.pool(workers, kind)
            results["throughput"].append(load.throughput(lab, pool, turns, plan.latency_s))
            lab.stop_pool(pool)

        progress(f"throughput across pools: {plan.fleet_turns} turns on {plan.fleet_pools} pools x "
                 f"{plan.fleet_workers} workers, one Redis over TCP", started)
        results["fleet_throughput"] = fleet.fleet_throughput(
            plan.fleet_turns, plan.fleet_pools, plan.fleet_workers, plan.fleet_latency_s, lab.dir / "fleet",
            lambda message: progress(message, started))

        progress(f"deadline accuracy: {plan.deadline_turns} turns on {plan.deadline_workers} workers", started)
        pool = lab.pool(plan.deadline_workers, DEFAULT_WORKER_CLASS)
        results["deadline_accuracy"] = load.deadline_accuracy(
            lab, pool, plan.deadline_turns, rng, plan.deadline_clocks)
        lab.stop_pool(pool)

        results["resume"] = resume.resume_figures(
            lab, call_kills=plan.resume_call_kills, other_rounds=plan.resume_other_rounds,
            watch_seconds=plan.watch_seconds, pairs=plan.overhead_pairs, latency_s=plan.latency_s, rng=rng,
            say=lambda message: progress(message, started))
        results["approvals"] = approvals.approvals_figures(
            lab, parked=plan.approvals_parked, runs=plan.approvals_runs, expiring=plan.approvals_expiring,
            say=lambda message: progress(message, started))
        results["signin"] = signin.signin_figures(lab, plan, say=lambda message: progress(message, started))
        results["redis_version"] = lab.client.info("server")["redis_version"]
    finally:
        lab.close()
    return results


def judge(results: dict) -> dict:
    goals = {}
    if results.get("page"):
        goals |= page.goals(results["page"])
        goals["page_tick_growth"] = page.tick_flat(results)
    for row in (results.get("first_screen") or {}).get("rows", []):
        goals[f"first_screen_ratio_{row['conversations']}"] = row["ratio"]["p50"] <= first_screen.RATIO_GOAL
        goals[f"first_screen_after_start_{row['conversations']}"] = (
            row["first_after_start_ratio"] <= first_screen.FIRST_AFTER_START_GOAL)
    # Each goal is judged from its own figures, when the results hold them (a `--page-only` run merges
    # into an earlier run's file, which may predate a section).
    checks = {
        "first_step_ratio": lambda r: r["first_step_ratio"] <= 0.35,
        "queue_overhead_ratio": lambda r: r["queue_overhead_ratio"] <= 1.02,
        "worker_memory": lambda r: r["worker_memory"]["ratio"] <= 1.3,
        "tracing_overhead_ratio": lambda r: r["tracing_overhead"]["ratio"] <= 1.02,
        "clamp_overhead_ratio": lambda r: r["clamp_overhead"]["ratio"] <= 1.01,
        "publish_to_observed_p50": lambda r: r["publish_to_observed_ms"]["event_driven"]["p50"] <= 100,
        # O(1) poll and O(new messages) publish: 100x the history, (nearly) the same bytes.
        "cost_vs_history": lambda r: r["poll_growth_1000_vs_10"] <= 1.1 and r["publish_growth_1000_vs_10"] <= 1.2,
        "fleet_throughput": lambda r: fleet.goals(r["fleet_throughput"])["fleet_throughput"],
        "deadline_accuracy": lambda r: (r["deadline_accuracy"]["turns_past_job_timeout"] == 0
                                        and r["deadline_accuracy"]["killed_by_queue"] == 0),
    }
    for name, check in checks.items():
        with contextlib.suppress(KeyError):
            goals[name] = check(results)
    if results.get("resume"):
        goals |= resume.goals(results["resume"])
    if results.get("branches"):
        goals |= branches.goals(results["branches"])
    if results.get("approvals"):
        goals |= approvals.goals(results["approvals"])
    if results.get("signin"):
        goals |= signin.goals(results["signin"])
    if results.get("approve_click"):
        goals["approve_click_p95_idle"] = results["approve_click"]["hogs_0"]["met"]
    if results.get("branches_page"):
        goals |= branches_page.goals(results["branches_page"])
    return goals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny configuration, for the smoke test")
    parser.add_argument("--out", type=Path, default=HERE / "results.json", help="results JSON (default bench/)")
    parser.add_argument("--plots", type=Path, help="folder for the PNGs (default: beside --out)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--page-only", action="store_true", help="only the page section (Chromium)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt  # so the finally blocks stop what was started

    signal.signal(signal.SIGTERM, on_sigterm)
    started = time.monotonic()
    wall_start = time.time()
    results: dict = {}
    try:
        if args.page_only:
            run_page(plan, started, results)
        else:
            run(plan, args.seed, started, results)
    except KeyboardInterrupt:
        print("interrupted: everything started was stopped", file=sys.stderr)
        return 130
    except Exception:
        partial = args.out.with_suffix(".partial.json")
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(results, indent=2) + "\n")
        print(f"a section failed; what was measured before it is in {partial}", file=sys.stderr)
        raise
    if args.page_only and args.out.exists():  # refresh the page figures, keep the rest of the last run
        previous = json.loads(args.out.read_text())
        results = {k: v for k, v in previous.items() if k not in ("goals", "method", "meta")} | results
    results["goals"] = judge(results)
    results["default_worker_class"] = DEFAULT_WORKER_CLASS
    results["method"] = {
        k: v.format(latency=plan.latency_s, pairs=plan.overhead_pairs, n=plan.first_step_repeats,
                    interval=plan.poll_interval_s, workers=plan.deadline_workers,
                    clocks=json.dumps(plan.deadline_clocks), page_turns=plan.page_turns,
                    first_screen_opens=plan.first_screen_opens, resume_kills=plan.resume_call_kills,
                    resume_workers=resume.WORKERS, resume_rounds=plan.resume_other_rounds,
                    watch_seconds=plan.watch_seconds,
                    approvals_parked=plan.approvals_parked, approvals_runs=plan.approvals_runs,
                    approvals_expiring=plan.approvals_expiring, approvals_workers=approvals.WORKERS,
                    approvals_looks=approvals.LOOKS, signin_workers=signin.WORKERS, signin_share=signin.SHARE,
                    signin_turns=plan.signin_turns, signin_call=f"{plan.signin_call_s:g}",
                    signin_conversations=f"{plan.signin_list_conversations:,}", signin_owners=plan.signin_list_owners,
                    signin_repeats=plan.signin_list_repeats, signin_pairs=plan.signin_page_pairs,
                    branch_turns=f"{plan.branch_turns:,}",
                    fleet_turns=f"{plan.fleet_turns:,}", fleet_latency=f"{plan.fleet_latency_s:g}",
                    fleet_pools=plan.fleet_pools, fleet_workers=plan.fleet_workers,
                    branch_switches=plan.branch_switches, branch_pairs=plan.branch_pairs)
        for k, v in METHOD.items()
    }
    results["meta"] = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall_start)),
        "runtime_s": round(time.monotonic() - started, 1),
        "plan": "quick" if args.quick else "full",
        "plan_detail": asdict(plan),
        "seed": args.seed,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "rq": rq.__version__,
        "redis_server": results.pop("redis_version", None),
        "platform": platform.platform(),
    }
    order = ("first_step_ratio", "first_step_ratio_write_at_end", "first_step_ratio_plain_poll", "queue_overhead_ratio",
             "queue_overhead_ratio_by_class", "tracing_overhead", "clamp_overhead", "conversations_list",
             "memory_per_conversation", "branches", "worker_memory",
             "dispatch_latency_ms", "publish_to_observed_ms",
             "cost_vs_history",
             "publish_growth_1000_vs_10", "poll_growth_1000_vs_10", "throughput", "fleet_throughput",
             "deadline_accuracy", "resume",
             "approvals", "signin",
             "page_tick_growth", "page_tick_bytes_growth", "page_tick_added_ms",
             "page_update_bytes_growth", "page_tick_noise_ms", "page", "first_screen", "approve_click", "branches_page",
             "goals",
             "default_worker_class",
             "first_step",
             "queue_overhead", "method", "meta")
    ordered = {k: results[k] for k in order if k in results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(ordered, indent=2) + "\n")
    written = report.plots(ordered, args.plots or args.out.parent)
    print(report.table(ordered))
    print(f"\nwrote {args.out}" + "".join(f", {p}" for p in written) + f" in {ordered['meta']['runtime_s']:g} s")
    if not ordered["goals"].get("deadline_accuracy", True):
        print("FAILED: a turn reached its job timeout", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
