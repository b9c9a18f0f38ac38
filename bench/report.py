"""The printed table and the plots, all from the results dict alone."""

from __future__ import annotations

from pathlib import Path


def _ms(stats: dict | None) -> str:
    if not stats or stats.get("p50") is None:
        return "-"
    return f"{stats['p50']:g} / {stats['p95']:g} ms"


def _signed(value: float | None) -> str:
    return "?" if value is None else f"{value:+g}"


def _check(ok: bool | None) -> str:
    return "" if ok is None else ("ok" if ok else "MISSED")


def rows(results: dict) -> list[tuple[str, str, str, str]]:
    """(measure, value, goal, verdict) for the table (also docs/benchmarks.md's)."""
    out = []
    goals = results.get("goals", {})
    plan = results.get("meta", {}).get("plan_detail", {})
    interval = f"{plan.get('poll_interval_s', 1.0):g} s"
    call = f"{plan.get('latency_s', 1.0):g} s"
    if "first_step_ratio" in results:
        out.append(("first_step_ratio (publish as you go, event-driven poll)", f"{results['first_step_ratio']:.3f}",
                    "<= 0.35", _check(goals.get("first_step_ratio"))))
        out.append((f"  same, plain poll every {interval}", f"{results['first_step_ratio_plain_poll']:.3f}", "", ""))
        out.append(("  write-at-end loop, for contrast", f"{results['first_step_ratio_write_at_end']:.3f}", "", ""))
    if "queue_overhead_ratio" in results:
        out.append((f"queue_overhead_ratio (RQ / in-process, {call} calls)", f"{results['queue_overhead_ratio']:.4f}",
                    "<= 1.02", _check(goals.get("queue_overhead_ratio"))))
        for kind, ratio in results.get("queue_overhead_ratio_by_class", {}).items():
            out.append((f"  with {kind} workers", f"{ratio:.4f}", "", ""))
    listing = results.get("conversations_list")
    if listing:
        for row in listing["rows"]:
            out.append((f"listing 20 of {row['conversations']:,} conversations", f"{row['list_ms_p50']:g} ms, "
                        f"{row['redis_commands']} commands", "flat", ""))
    tree = results.get("branches")
    if tree:
        n = tree["turns"]
        for kind in ("regenerate", "edit"):
            small, large = tree["write"][f"{kind}_at_2"], tree["write"][f"{kind}_at_{n}"]
            ratio = tree["write"][f"{kind}_ratio"]["aof_bytes"]
            out.append((f"{'an' if kind == 'edit' else 'a'} {kind}'s Redis writes (AOF), turn {n:,} / turn 2",
                        f"{ratio:.3f} ({large['aof_bytes']:,} / {small['aof_bytes']:,} B)", "within 10%",
                        _check(goals.get(f"branch_write_{kind}_flat"))))
        for name, row in tree["read"].items():
            out.append((f"  a page on the branch at turn {n:,}: {name.replace('_', ' ')}",
                        f"{row['bytes']:,} B, {row['commands']} commands, {row['round_trips']} round trips", "", ""))
    memory = results.get("worker_memory")
    if memory:
        out.append(("worker memory / bare rq SimpleWorker (RSS, idle)",
                    f"{memory['ratio']:.2f} ({memory['worker_mib']:g} / {memory['bare_rq_simple_worker_mib']:g} MiB)",
                    "<= 1.3", _check(goals.get("worker_memory"))))
        if "ratio_with_mcp_json" in memory:
            out.append(("  with the project's mcp.json (its time server's session)",
                        f"{memory['ratio_with_mcp_json']:.2f} ({memory['worker_with_mcp_json_mib']:g} MiB)", "", ""))
    traced = results.get("tracing_overhead")
    if traced:
        out.append((f"tracing_overhead (on / off, {call} calls)", f"{traced['ratio']:.4f}", "<= 1.02",
                    _check(goals.get("tracing_overhead_ratio"))))
        out.append(("  building one turn's spans, p50/p95", _ms(traced["spans_build_ms"]), "", ""))
    clamp = results.get("clamp_overhead")
    if clamp:
        out.append((f"clamp_overhead, no budget (on / off, {call} calls)", f"{clamp['ratio']:.4f}", "<= 1.01",
                    _check(goals.get("clamp_overhead_ratio"))))
        out.append(("  with a budget / without one", f"{clamp['budget_ratio']:.4f}", "", ""))
    for kind, stats in results.get("dispatch_latency_ms", {}).items():
        out.append((f"dispatch {kind}: enqueue->job start, p50/p95", _ms(stats["start_ms"]), "", ""))
        out.append((f"dispatch {kind}: enqueue->first model call", _ms(stats["first_call_ms"]), "", ""))
    observed = results.get("publish_to_observed_ms")
    if observed:
        out.append((f"publish->observed, plain poll {observed['interval_ms']} ms", _ms(observed["plain_poll"]), "", ""))
        out.append(("publish->observed, event-driven wait_version", _ms(observed["event_driven"]),
                    "p50 <= 100 ms", _check(goals.get("publish_to_observed_p50"))))
        fast = observed.get("plain_poll_fast")
        if fast:
            out.append((f"  contrast: plain poll {fast['interval_ms']} ms", _ms(fast), "", ""))
        out.append(("  Redis CPU per client-second: plain / event" + (" / fast plain" if fast else ""),
                    f"{observed['plain_poll']['redis_server_us_per_client_s']:g} / "
                    f"{observed['event_driven']['redis_server_us_per_client_s']:g}"
                    + (f" / {fast['redis_server_us_per_client_s']:g}" if fast else "") + " us", "", ""))
    for row in results.get("cost_vs_history", []):
        out.append((f"{row['messages']:>4} messages: publish bytes, p50 time",
                    f"{row['publish']['bytes']} B, {row['publish']['time_us']['p50']:g} us", "", ""))
        out.append((f"{row['messages']:>4} messages: no-change poll bytes, p50 time",
                    f"{row['poll_no_change']['bytes']} B, {row['poll_no_change']['time_us']['p50']:g} us", "", ""))
        if "poll_one_new_message" in row:
            new = row["poll_one_new_message"]
            out.append((f"{row['messages']:>4} messages: poll that finds one new message",
                        f"{new['bytes']} B, {new['time_us']['p50']:g} us", "", ""))
    if "cost_vs_history" in results:
        out.append(("  publish / no-change poll bytes, 1000 vs 10 messages",
                    f"{results['publish_growth_1000_vs_10']:.2f}x / {results['poll_growth_1000_vs_10']:.2f}x",
                    "O(new) / O(1)", _check(goals.get("cost_vs_history"))))
    for row in results.get("throughput", []):
        out.append((f"throughput {row['worker_class']} x{row['workers']:>2} ({row['turns']} turns)",
                    f"{row['turns_per_s']:.2f} turns/s, p95 {row['latency_s']['p95']:g} s, "
                    f"{row['rss_mib_per_worker']:g} MiB/worker", f"~{row['ideal_turns_per_s']:.1f}/s",
                    f"{row['scaling_efficiency'] * 100:.0f}%"))
    across = results.get("fleet_throughput")
    if across:
        out.append((f"throughput across {across['pools']} pools x {across['workers_per_pool']} workers, one Redis "
                    f"over TCP ({across['turns']} turns of one {across['latency_per_call_s']:g} s call)",
                    f"{across['turns_per_s']:.2f} turns/s ({across['efficiency'] * 100:.0f}% of "
                    f"{across['ideal_turns_per_s']:.1f}); wait to start p95 "
                    f"{across['wait_enqueue_to_start_s']['p95']:g} s; Redis {across['redis_cpu_ms_per_turn']:g} ms "
                    f"CPU/turn; {across['rss_mib_per_worker']:g} MiB/worker", ">= 90% of ideal",
                    _check(goals.get("fleet_throughput"))))
    section = results.get("page")
    if section:
        for condition, figures in section["conditions"].items():
            key = condition.replace(" ", "_")
            out.append((f"page, {condition}: a streamed word to the screen p50 / p95",
                        _ms(figures["word_to_screen_ms"]), "p95 <= " + ("200" if key == "idle" else "600") + " ms",
                        _check(goals.get(f"page_word_to_screen_ms_{key}"))))
            out.append((f"page, {condition}: a reply's first word / a new chat's words, p50 / p95",
                        f"{_ms(figures['first_word_ms'])}; {_ms(figures['new_chat_word_ms'])}", "", ""))
            out.append((f"page, {condition}: Stop click to \"Stopping…\" p50 / p95",
                        _ms(figures["stop_acknowledged_ms"]), "p95 <= 300 ms" if key == "idle" else "",
                        _check(goals.get(f"page_stop_acknowledged_ms_{key}"))))
            ended = figures["stop_ended_s"]
            out.append((f"page, {condition}: Stop click to the turn ended on screen p50 / p95",
                        f"{ended['p50']} / {ended['p95']} s", "p95 <= " + ("1" if key == "idle" else "2") + " s",
                        _check(goals.get(f"page_stop_ended_s_{key}"))))
            again = figures.get("stops_clicked_again") or []
            out.append((f"page, {condition}: Stops clicked again (no ending on screen 30 s after the click)",
                        str(len(again)), "0", _check(not again)))
            writes = figures["writes_per_s"]
            out.append((f"page, {condition}: Redis writes per second, one streaming turn p50 / max",
                        f"{writes['p50']} / {writes['max']}", "<= 12", _check(goals.get(f"page_writes_per_s_{key}"))))
            for row in figures["lengths"]:
                out.append((f"page, {condition}, {row['turns']:>3} turns: tick draw p50 / bytes p50",
                            f"{row['tick_draw_ms']['p50']} ms / {row['tick_bytes']['p50']:g} B", "", ""))
                out.append((f"page, {condition}, {row['turns']:>3} turns: final write to settled p50 / p95",
                            f"{row['settle_s']['p50']} / {row['settle_s']['p95']} s",
                            "p95 <= " + ("0.3" if key == "idle" else "1") + " s", ""))
            out.append((f"  settled, every length ({condition})", "", "", _check(goals.get(f"page_settle_s_{key}"))))
        last = list(section["conditions"])[-1]
        out.append((f"  tick cost, longest vs shortest chat ({last}): time (added) / bytes / bytes per write",
                    f"{results.get('page_tick_growth')}x ({_signed(results.get('page_tick_added_ms'))} ms) / "
                    f"{results.get('page_tick_bytes_growth')}x / {results.get('page_update_bytes_growth')}x",
                    f"<= 1.5x or +{results.get('page_tick_noise_ms', '?')} ms", _check(goals.get("page_tick_growth"))))
    for row in (results.get("first_screen") or {}).get("rows", []):
        out.append((f"first screen, {row['conversations']:,} conversations: page / minimal chat app, p50 (ratio)",
                    f"{row['page_ms']['p50']:g} / {row['minimal_ms']['p50']:g} ms ({row['ratio']['p50']}x; "
                    f"first after start {row['first_after_start_ratio']}x)", "<= 1.3x",
                    _check(goals.get(f"first_screen_ratio_{row['conversations']}"))))
        after_start = row["first_after_start_ms"]
        out.append((f"  the first page after the start, {row['conversations']:,} conversations: page / minimal app",
                    f"{after_start['page']:g} / {after_start['minimal']:g} ms ({row['first_after_start_ratio']}x)",
                    "<= 1.5x", _check(goals.get(f"first_screen_after_start_{row['conversations']}"))))
    for key, row in (results.get("branches_page") or {}).items():
        hogs = row["cpu_hogs"]
        condition = "idle" if not hogs else f"beside {hogs} CPU hogs"
        out.append((f"‹ or › clicked to the other branch on screen, p50 / p95 ({condition}, {row['switches']})",
                    f"{row['switch_ms']['p50']:g} / {row['switch_ms']['p95']:g} ms",
                    f"p95 <= {row['switch_goal_p95_ms']:g} ms" if row["switch_goal_p95_ms"] else "",
                    _check(goals.get(f"branch_switch_p95_{key}"))))
        words = row["first_word_ms"]
        out.append((f"  Regenerate / a new message, click to first word, p50 ({condition}, {row['pairs']} pairs)",
                    f"{row['regenerate_over_message']}x ({words['regenerate']['p50']:g} / "
                    f"{words['message']['p50']:g} ms)", f"<= {row['ratio_goal']:g}x",
                    _check(row["ratio_met"])))
    deadline = results.get("deadline_accuracy")
    if deadline:
        d = deadline["final_write_minus_deadline_ms"]
        out.append((f"final write - deadline ({deadline['turns']} turns) p5/p50/p95/max",
                    f"{d['p5']:g} / {d['p50']:g} / {d['p95']:g} / {d['max']:g} ms", "", ""))
        out.append(("  turns past the job timeout", str(deadline["turns_past_job_timeout"]), "0",
                    _check(goals.get("deadline_accuracy"))))
    lost = results.get("resume")
    if lost:
        kill = lost["kill_to_first_write_s"]
        out.append((f"worker SIGKILLed mid-call -> resumed job's first write, p50 / p95 ({kill['n']} kills)",
                    f"{kill['p50']:g} / {kill['p95']:g} s", "p95 <= 5 s",
                    _check(goals.get("resume_kill_to_first_write_p95"))))
        survived = lost["survival"]
        out.append(("turns killed once that end done (" + ", ".join(f"mid-{k}" for k in survived) + ")",
                    f"{lost['done_share'] * 100:g}% (" + ", ".join(f"{v['done']}/{v['killed']}"
                                                                 for v in survived.values()) + ")",
                    "100%", _check(goals.get("resume_done_share"))))
        out.append((f"heartbeat_overhead (turn with / without it, {call} calls)",
                    f"{lost['heartbeat_overhead']['ratio']:.4f}", "<= 1.02",
                    _check(goals.get("heartbeat_overhead_ratio"))))
        once = lost["side_effect_cost"]
        out.append((f"{once['calls']} side-effecting tool calls, each start stored first, against {once['calls']} "
                    "safe to repeat (p50, model answering at once)",
                    f"+{once['extra_ms_p50']:g} ms ({once['once_ms']['p50']:g} / {once['repeatable_ms']['p50']:g} ms; "
                    f"{once['once_writes']:g} / {once['repeatable_writes']:g} writes)", "<= +50 ms",
                    _check(goals.get("side_effect_extra_ms_p50"))))
        scaling = lost.get("watch_scaling") or []
        if scaling:
            out.append(("the watch's Redis commands/s per supervisor at " + ", ".join(
                f"{r['turns']:,}" for r in scaling if r["supervisors"] == 1) + " turns in flight (1 / 5 supervisors)",
                ", ".join(f"{r['commands_per_s']:g}" for r in scaling), "flat, <= 10/s",
                _check(goals.get("watch_flat"))))
        redis_cost = lost["watch_redis"]
        for label, key in (("the watch, per supervisor", "watch_per_supervisor"), ("their heartbeats", "heartbeats")):
            figures = redis_cost[key]
            out.append((f"Redis commands/s for {redis_cost['turns']} turns in flight: {label}",
                        f"{figures['commands_per_s']:g}/s (" + ", ".join(
                            f"{k.upper()} {v:g}" for k, v in figures["by_command_per_s"].items())
                        + f"), {figures['redis_cpu_us_per_s']:g} us CPU/s", "", ""))
    if results.get("approvals"):
        out += _approval_rows(results["approvals"], goals)
    if results.get("signin"):
        out += _signin_rows(results["signin"], goals)
    return out


def _approval_rows(section: dict, goals: dict) -> list[tuple[str, str, str, str]]:
    """Tools that ask first: a start beside parked turns, the expiry's lateness, the watch's look."""
    starts, expiry, look = section["start_beside_parked"], section["expiry"], section["watch_redis"]
    alone, beside, added = starts["start_ms_nothing_parked"], starts["start_ms_beside_parked"], starts["added_ms"]
    late = expiry["after_expiry_s"]
    return [
        (f"enqueue->start of a turn, nothing parked / {starts['parked']} parked ({starts['workers']} workers)",
         f"{_ms(alone)}; {_ms(beside)} (added p50 {_signed(added['p50'])}, p95 {_signed(added['p95'])} ms)",
         f"added <= {starts['poll_interval_ms']} ms", _check(goals.get("approvals_start_added_p95"))),
        (f"  workers holding a job while {starts['parked']} turns are parked", str(starts["busy_workers_while_parked"]),
         "0", _check(goals.get("approvals_no_worker_held"))),
        (f"request expired -> its step, p50 / p95 / max ({late['n']} requests)",
         f"{late['p50']:g} / {late['p95']:g} / {late['max']:g} s", f"<= {expiry['goal_s']:g} s",
         _check(goals.get("approvals_expiry_max"))),
        (f"Redis commands per look of the watch, {look['parked']} parked, none due: expiry / whole look",
         f"{look['expiry_look']['commands_per_look']:g} (" + ", ".join(
             f"{k.upper()} {v:g}" for k, v in look["expiry_look"]["by_command_per_look"].items())
         + f") / {look['whole_look']['commands_per_look']:g}, {look['expiry_look']['redis_cpu_us_per_look']:g} us CPU",
         "", ""),
    ]


def _signin_rows(section: dict, goals: dict) -> list[tuple[str, str, str, str]]:
    """Sign-in: another person's first turn beside one's backlog, a person's list, the page's first draw."""
    fair, unfair = section["fairness"]["with_share"], section["fairness"]["without_share"]
    small, big = section["list_per_owner"]["rows"][0], section["list_per_owner"]["rows"][-1]
    page = section["first_draw"]
    return [
        (f"B's first turn after A's {fair['a_turns']}: wait (enqueue->start), share {fair['share']} / none "
         f"({fair['workers']} workers)",
         f"{fair['b_wait_s']:.2f} s ({fair['b_wait_turns']:g} turns of {fair['one_turn_s']:.2f} s) / "
         f"{unfair['b_wait_s']:.1f} s ({unfair['b_wait_turns']:g} turns)",
         "share: <= 1 turn", _check(goals.get("signin_fair_share"))),
        ("  with the share: B's start after the first of A's running turns ended",
         f"{fair['b_start_after_first_end_ms']:g} ms", "", ""),
        (f"a person's list of 20: {small['conversations']:,} conversations / {big['conversations']:,} across "
         f"{big['owners']} owners",
         f"{small['redis_commands']} / {big['redis_commands']} commands; {small['list_ms_p50']:g} / "
         f"{big['list_ms_p50']:g} ms", "same commands", _check(goals.get("signin_list_flat"))),
        (f"page's first draw (AppTest), signed in / local, p50 ({page['pairs']} pairs)",
         f"{page['signed_in_ms']['p50']:g} / {page['local_ms']['p50']:g} ms, ratio {page['ratio']:g}x", "", ""),
    ]


def table(results: dict) -> str:
    body = rows(results)
    headers = ("measure", "value", "goal", "")
    widths = [max(len(str(r[i])) for r in [headers, *body]) for i in range(4)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(headers, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in body]
    return "\n".join(lines)


def markdown_table(results: dict) -> str:
    lines = ["| measure | value | goal | |", "| --- | --- | --- | --- |"]
    lines += [f"| {m.strip()} | {v} | {g} | {c} |" for m, v, g, c in rows(results)]
    return "\n".join(lines)


def plots(results: dict, directory: Path) -> list[Path]:
    """throughput.png, history_cost.png and page_cost.png; none (with a note) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (make setup installs it)")
        return []
    written = []
    if results.get("throughput"):
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        for kind in sorted({r["worker_class"] for r in results["throughput"]}):
            runs = [r for r in results["throughput"] if r["worker_class"] == kind]
            workers = [r["workers"] for r in runs]
            left.plot(workers, [r["turns_per_s"] for r in runs], "o-", label=f"{kind} workers")
            right.plot(workers, [r["latency_s"]["p95"] for r in runs], "o-", label=f"{kind} workers")
            for r in runs:  # p95 grows with the queue: say how many turns each point ran
                right.annotate(f"{r['turns']}", (r["workers"], r["latency_s"]["p95"]), fontsize=7,
                               textcoords="offset points", xytext=(4, 4))
        workers = sorted({r["workers"] for r in results["throughput"]})
        ideal = {r["workers"]: r["ideal_turns_per_s"] for r in results["throughput"] if r["worker_class"] == "simple"}
        left.plot(list(ideal), list(ideal.values()), ":", color="gray", label="ideal: ceil(turns/workers) rounds")
        left.set(xscale="log", yscale="log", xlabel="workers", ylabel="turns per second",
                 title="Throughput: one-call turns")
        left.set_xticks(workers, [str(w) for w in workers])
        right.set(xscale="log", xlabel="workers", ylabel="p95 turn latency (s)",
                  title="p95 latency, submit to final write (label: turns)")
        right.set_xticks(workers, [str(w) for w in workers])
        written.append(_save(plt, fig, directory / "throughput.png"))
    if results.get("cost_vs_history"):
        data = results["cost_vs_history"]
        lengths = [r["messages"] for r in data]
        series = (
            ("publish (append-only)", "publish", "o-"),
            ("poll, no change (HGET version)", "poll_no_change", "s-"),
            ("poll, one new message (read_since)", "poll_one_new_message", "^-"),
            ("contrast: whole-state rewrite", "contrast_whole_state_rewrite", "x--"),
            ("contrast: full-state read", "contrast_full_read", "d--"),
        )
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        for label, key, style in series:
            left.plot(lengths, [r[key]["bytes"] for r in data], style, label=label)
            right.plot(lengths, [r[key]["time_us"]["p50"] for r in data], style, label=label)
        left.set(xscale="log", yscale="log", xlabel="messages in history", ylabel="bytes on the wire per operation",
                 title="Bytes per operation")
        right.set(xscale="log", yscale="log", xlabel="messages in history", ylabel="p50 time (us)",
                  title="Time per operation")
        for ax in (left, right):
            ax.set_xticks(lengths, [str(n) for n in lengths])
        written.append(_save(plt, fig, directory / "history_cost.png"))
    if results.get("page"):
        written.append(_page_plot(plt, results["page"], directory / "page_cost.png"))
    return written


def _page_plot(plt, section: dict, path: Path) -> Path:
    """Tick cost and settle time against the conversation's length, and the real-time figures, per condition."""
    fig, (draw, size, settle, live) = plt.subplots(1, 4, figsize=(17, 4))
    lengths = section["lengths"]
    names = [("word_to_screen_ms", "word\nto screen", 1), ("stop_acknowledged_ms", "Stop to\n\"Stopping…\"", 1),
             ("stop_ended_s", "Stop to\nturn ended", 1000)]
    width = 0.8 / max(1, len(section["conditions"]))
    for n, (condition, figures) in enumerate(section["conditions"].items()):
        rows = figures["lengths"]
        turns = [r["turns"] for r in rows]
        draw.plot(turns, [r["tick_draw_ms"]["p50"] for r in rows], "o-", label=f"follower's start, {condition}")
        draw.plot(turns, [r["full_run_ms"]["p50"] for r in rows], "x--", label=f"full run ending a turn, {condition}")
        size.plot(turns, [r["update_bytes"]["p50"] for r in rows], "o-", label=f"p50, {condition}")
        size.plot(turns, [r["update_bytes"]["p95"] for r in rows], "^:", label=f"p95, {condition}")
        settle.plot(turns, [r["settle_s"]["p50"] for r in rows], "o-", label=f"p50, {condition}")
        settle.plot(turns, [r["settle_s"]["p95"] for r in rows], "^:", label=f"p95, {condition}")
        xs = [i + n * width for i in range(len(names))]
        live.bar(xs, [(figures[key]["p95"] or 0) * scale for key, _, scale in names], width, label=f"p95, {condition}")
    live.set_xticks([i + width * (len(section["conditions"]) - 1) / 2 for i in range(len(names))],
                    [label for _, label, _ in names])
    draw.set(xscale="log", xlabel="turns in the conversation", ylabel="ms (p50)",
             title="Drawing: the follower vs a full run")
    size.set(xscale="log", xlabel="turns in the conversation", ylabel="bytes to the browser",
             title="Bytes per write drawn while following")
    settle.set(xscale="log", xlabel="turns in the conversation", ylabel="seconds",
               title="Final write to page settled")
    live.set(ylabel="ms (p95)", title="Real time, in Chromium")
    for ax in (draw, size, settle):
        ax.set_xticks(lengths, [str(n) for n in lengths])
    for ax in (draw, size, settle, live):
        ax.set_ylim(bottom=0)
    return _save(plt, fig, path)


def _save(plt, fig, path: Path) -> Path:
    """Grid and legend on every panel, then the PNG."""
    for ax in fig.axes:
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
