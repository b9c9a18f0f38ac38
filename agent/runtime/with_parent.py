"""`python -m agent.runtime.with_parent COMMAND [ARGS...]`: run COMMAND so that Linux kills it when
the thread that started it exits. A worker starts its MCP servers through this, so a worker that is
killed (a job past its timeout takes its worker with it) leaves no server behind."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the thread that started it exits (kept across exec)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        return
    if os.getppid() == 1:  # the parent is already gone
        os._exit(1)


def main(argv: list[str]) -> None:
    if not argv:
        print("usage: python -m agent.runtime.with_parent COMMAND [ARGS...]", file=sys.stderr)
        sys.exit(2)
    die_with_parent()
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"{argv[0]}: {exc.strerror}", file=sys.stderr)
        sys.exit(127)


if __name__ == "__main__":
    main(sys.argv[1:])
