"""bench/branches.py on a Redis of the test's own: a branch writes what it writes at turn 2, and a page on another
branch fetches each turn once, then only what changes."""

from __future__ import annotations

from bench import branches


def test_a_branch_writes_the_same_at_turn_2_as_at_its_last_and_a_page_reads_each_turn_once(private_redis):
    figures = branches.branch_figures(private_redis.store, 40)
    assert all(branches.goals(figures).values()), figures["write"]
    write = figures["write"]
    assert write["regenerate_at_2"]["commands"] == write["regenerate_at_40"]["commands"]  # no walk up the path
    assert write["edit_at_2"]["commands"] == write["edit_at_40"]["commands"]
    read = figures["read"]
    assert read["poll"]["commands"] == 1 and read["new_message"]["round_trips"] == 1
    assert read["new_message"]["bytes"] < 3000  # only the message, whatever the branch's length
    # A switch fetches the one turn it had not read, not the branch: far less than opening it.
    assert read["switch"]["bytes"] < read["open"]["bytes"] / 4 and read["switch"]["round_trips"] == 2
    assert read["switch_back"]["round_trips"] == 1
