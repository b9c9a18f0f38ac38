"""The RQ job: one chat turn under the three clocks, publishing the state as it goes.

A worker runs `agent.turn.run_turn` (the one job function agent/queue.py allows) and, when the job
fails without writing its ending, `agent.turn.on_failure`. Inside: job.py (the entry points),
loop.py (the loop), model_calls.py and tool_runs.py (its two kinds of step), context.py (what
the three share), policies.py (what "safeguards off" changes), writer.py (the writes), exits.py
(how it ends), stop_watch.py (stop requests) and response_limits.py (what one model response may
bring in).
"""

from agent.turn.job import on_failure, run_turn

__all__ = ["on_failure", "run_turn"]
