"""`python -I agent/runtime/with_parent.py COMMAND [ARGS...]`: run COMMAND in a process group of its
own, under a small guard that ends that whole group (COMMAND and everything it started) when
COMMAND exits, when the guard is told to stop (SIGTERM, SIGINT, SIGHUP), or when the thread that
started the guard exits: a worker that is SIGKILLed runs no code, so the guard does the cleaning.

A worker starts each stdio MCP server through this. Linux's PR_SET_PDEATHSIG alone would stop only
the server (its direct child), and only with SIGKILL, which leaves a `sleep 600` its tool started
running for ever. The guard is also a child subreaper: a descendant that leaves the group (setsid)
and is orphaned comes back to the guard, which ends it too. Standard library only, so it starts fast.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
SWEEP_S = 2.0  # seconds the guard spends ending descendants that left the group before it gives up
SWEEP_POLL_S = 0.01  # seconds between two looks for such descendants


class Stop(Exception):
    """The guard was told to stop (by a signal, or by its parent's death)."""


def _prctl(option: int, value: int) -> bool:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except OSError:
        return False


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send `sig` to this process when the thread that started it exits (kept across exec)."""
    parent = os.getppid()
    if _prctl(PR_SET_PDEATHSIG, sig) and (os.getppid() != parent or parent == 1):  # the parent is already gone
        os._exit(1)


_stopping = False  # set once the guard starts ending the group: later signals change nothing


def _stop(signum, frame) -> None:
    global _stopping
    if not _stopping:
        _stopping = True
        raise Stop(signum)


def end_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def sweep(pgid: int) -> None:
    """SIGKILL the group and every child left (orphans that came back to this subreaper, also from
    members killed just now), reaping them, until none is left or SWEEP_S has passed."""
    deadline = time.monotonic() + SWEEP_S
    while time.monotonic() < deadline:
        end_group(pgid)
        for pid in _children():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        if not _group_alive(pgid) and not _children():
            return
        time.sleep(SWEEP_POLL_S)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a member we may not signal still counts
    return True


def _children() -> list[int]:
    pids = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            pids += [int(pid) for pid in (task / "children").read_text().split()]
    return pids


def run(argv: list[str]) -> int:
    """Start argv in its own group, wait for it or for a stop, end the group and what left it; its exit code."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop)
    child = None
    code = 1
    try:
        die_with_parent(signal.SIGTERM)  # caught: the guard ends the group before it goes
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # a stop now waits until `child` is known
        child = os.fork()
        if child == 0:
            _exec_child(argv)
        with contextlib.suppress(OSError):  # also here, so the group exists before any stop can name it
            os.setpgid(child, child)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        _let_go_of_the_pipes()
        wait_for_exit(child)
    except Stop:
        pass
    finally:
        global _stopping
        _stopping = True
        if child:
            end_group(child)
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                _, status = os.waitpid(child, 0)
                code = os.waitstatus_to_exitcode(status)
            sweep(child)  # the group's id stays taken while any member lives: no other group can be hit
    return code if code >= 0 else 128 - code


def wait_for_exit(child: int) -> None:
    """Until `child` exits, left unreaped (its pid, so its group id, cannot be reused until the group
    is ended); orphans that came back to this subreaper meanwhile are reaped as they exit."""
    while True:
        exited = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        if exited is None or exited.si_pid == child:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(exited.si_pid, 0)


def _exec_child(argv: list[str]) -> None:
    """In the forked child: a group of its own, death with the guard, then the command."""
    try:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # the mask would outlive exec
        os.setpgid(0, 0)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        os.execvp(argv[0], argv)
    except BaseException as exc:  # noqa: BLE001 - nothing of the guard may run on in the child
        print(f"{argv[0]}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        os._exit(127)


def _let_go_of_the_pipes() -> None:
    """The server alone holds its stdin and stdout: the client sees them close when it exits."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)


def main(argv: list[str]) -> None:
    if not argv:
        print("usage: python -I agent/runtime/with_parent.py COMMAND [ARGS...]", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
