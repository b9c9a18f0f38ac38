"""The bench's sign-in section (bench/signin.py): it runs alone on the quick plan and writes its three figures,
and its goals and table rows are judged from the figures alone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

# One page of the person's index, a row read per conversation shown, the expiry sweep's look, the total.
LIST_COMMANDS = {"zrevrange": 1, "hmget": 20, "zrangebyscore": 1, "zcard": 1}


@pytest.mark.slow
def test_the_signin_section_runs_alone_on_the_quick_plan():
    from bench.plans import QUICK

    run = subprocess.run([sys.executable, "-m", "bench.signin", "--quick"], cwd=ROOT, capture_output=True, text=True,
                         timeout=240)  # seconds: about 30 alone, more beside other work
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    section = json.loads(run.stdout)
    turns, held = QUICK.signin_turns, QUICK.signin_turns - 2  # 2 workers: 2 of A's run, the rest wait
    fair, fifo = section["fairness"]["with_share"], section["fairness"]["without_share"]
    for figures in (fair, fifo):
        assert figures["a_turns_done"] == turns and figures["b_done"] and figures["queue_left"] == 0, figures
        assert figures["b_wait_s"] > 0 and figures["one_turn_s"] > 0
    # With the share, A's backlog waits outside the queue and B is the only one in it; without, B is behind it.
    assert (fair["a_held_outside_queue_at_b_submit"], fair["queue_length_at_b_submit"]) == (held, 0), fair
    assert (fifo["a_held_outside_queue_at_b_submit"], fifo["queue_length_at_b_submit"]) == (0, held), fifo
    assert fifo["a_started_before_b"] >= turns - 1, fifo  # FIFO: B starts (about) last
    small, big = section["list_per_owner"]["rows"]
    assert (small["conversations"], big["conversations"]) == (20, QUICK.signin_list_conversations)
    assert small["by_command"] == big["by_command"] == LIST_COMMANDS, section["list_per_owner"]
    draw = section["first_draw"]
    assert draw["signed_in_ms"]["n"] == draw["local_ms"]["n"] == QUICK.signin_page_pairs and draw["ratio"] > 0
    assert section["goals"]["signin_list_flat"] is True


def test_the_signin_figures_are_judged_and_reported():
    from bench.report import rows
    from bench.signin import goals

    def section(b_wait_s, big_commands):
        def fairness(wait_s, share):
            return {"share": share, "a_turns": 20, "workers": 2, "b_wait_s": wait_s, "one_turn_s": 3.0,
                    "b_wait_turns": round(wait_s / 3.0, 2), "b_start_after_first_end_ms": 4.2}

        def row(conversations, commands):
            return {"conversations": conversations, "owners": 100 if conversations > 20 else 1,
                    "redis_commands": commands, "list_ms_p50": 1.5}

        stats = {"n": 20, "p50": 200.0, "p95": 260.0, "min": 180.0, "max": 300.0}
        return {"fairness": {"with_share": fairness(b_wait_s, 2), "without_share": fairness(30.0, 0)},
                "list_per_owner": {"rows": [row(20, 23), row(10_000, big_commands)]},
                "first_draw": {"pairs": 20, "signed_in_ms": stats, "local_ms": stats, "ratio": 1.02}}

    assert goals(section(2.9, 23)) == {"signin_fair_share": True, "signin_list_flat": True}
    assert goals(section(3.1, 23))["signin_fair_share"] is False  # past one turn
    assert goals(section(2.9, 24))["signin_list_flat"] is False
    good = section(2.9, 23)
    table = rows({"signin": good, "goals": goals(good)})
    assert [r[3] for r in table] == ["ok", "", "ok", ""]
    assert "2.90 s (0.97 turns of 3.00 s) / 30.0 s (10 turns)" in table[0][1] and "23 / 23 commands" in table[2][1]
    assert "ratio 1.02x" in table[3][1]
