"""The first words of a reply are not held back by the timeline: a turn in flight draws its chart only
once one of its steps has ended (a first chart loads Vega in the browser, which held the first words
back about half a second)."""

from __future__ import annotations

import pytest

from agent.conversation.store import Store
from tests.apptest_page import app, walk
from tests.live_owner import keep_alive
from tests.test_app import app_env, assert_no_exception, begin, make_running, running_doc, write_live  # noqa: F401


def _running_call(store: Store, cid: str, turn_id: str) -> None:
    """The turn's first model call has started; no step has ended yet."""
    store.publish(cid, turn_id, running_doc(store, cid))


def _running_call_writing(store: Store, cid: str, turn_id: str) -> None:
    _running_call(store, cid, turn_id)
    write_live(store, cid, turn_id, "The first words")


@pytest.mark.parametrize(("prepare", "charted"), [
    (_running_call, False),
    (_running_call_writing, False),
    (make_running, True),  # a model call and a tool ended: the timeline shows them
], ids=["call-started", "call-writing", "steps-ended"])
def test_a_turn_in_flight_draws_its_timeline_only_once_a_step_has_ended(store, prepare, charted):
    cid, turn_id = begin(store)
    prepare(store, cid, turn_id)
    keep_alive(store, cid)
    at = app(cid)
    at.run()
    assert_no_exception(at)
    assert not store.read(cid)["done"]
    charts = [n for n in walk(at._tree) if getattr(n, "type", "") in ("vega_lite_chart", "arrow_vega_lite_chart")]
    assert bool(charts) is charted
