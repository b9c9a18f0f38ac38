#!/usr/bin/env bash
# The suite beside CPU hogs: `make test` with HOGS (default 2) busy loops running, to find the
# tests that wait on a wall-clock figure instead of the event they mean. The hogs are stopped
# on every exit: success, failure, Ctrl-C or a kill.
set -u
PY=${PY:-.venv/bin/python}
HOGS=${HOGS:-2}
hogs=()
HOG='
import os, sys
parent = int(sys.argv[1])
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass
'

stop_hogs() {
    for pid in "${hogs[@]}"; do
        kill "$pid" 2>/dev/null
    done
    for pid in "${hogs[@]}"; do
        wait "$pid" 2>/dev/null
    done
    hogs=()
}
trap stop_hogs EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for _ in $(seq 1 "$HOGS"); do
    # A busy loop that also ends by itself once this script is gone (even after a SIGKILL).
    "$PY" -c "$HOG" "$$" &
    hogs+=($!)
done
echo "under-load: ${#hogs[@]} CPU hogs running (pids ${hogs[*]:-none})" >&2
export CPU_HOGS_RUNNING=${#hogs[@]}  # a test that brings its own hogs counts these (harness/page.py)

started=$(date +%s)
# Not exec: the shell must stay to stop the hogs when pytest ends.
# shellcheck disable=SC2086  # PYTEST_ARGS is a list of arguments, split on purpose
"$PY" -m pytest -q ${PYTEST_ARGS:-}
status=$?
echo "under-load: the suite took $(( $(date +%s) - started )) s beside ${#hogs[@]} CPU hogs (exit $status)" >&2
exit "$status"
