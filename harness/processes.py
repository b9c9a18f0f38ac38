"""Processes found and measured through psutil: whether one lives, its children, its memory, and
every process that carries a given environment variable or command line (how a caller finds what
it started, also what was orphaned)."""

from __future__ import annotations

import contextlib
import os
import signal

import psutil

from agent.runtime.embedded_redis import alive  # noqa: F401 - the one liveness rule, shared


def children(pid: int, *, recursive: bool = False) -> list[int]:
    """The process's children (all descendants when `recursive`); none when it is gone."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=recursive)]
    except psutil.Error:
        return []


def rss_kib(pid: int) -> int:
    """Resident set size in KiB (0 when the process is gone)."""
    try:
        return psutil.Process(pid).memory_info().rss // 1024
    except psutil.Error:
        return 0


def processes_with_env(name: str, value: str, *, command_part: str | None = None) -> list[int]:
    """Live pids, this one excepted, whose environment has name=value (and whose command line has
    `command_part`, when given)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid == os.getpid() or process.environ().get(name) != value:
                continue
            if command_part is not None and not any(command_part in part for part in process.cmdline()):
                continue
            if process.status() != psutil.STATUS_ZOMBIE:
                found.append(process.pid)
        except psutil.Error:
            continue  # gone meanwhile, or not ours to read
    return found


def processes_running(command_part: str) -> list[int]:
    """Live pids, this one excepted, with `command_part` in an argument of their command line."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and any(command_part in part for part in process.cmdline()) \
                    and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


def kill(pids: list[int], signum: int = signal.SIGKILL) -> None:
    """Signal each of these processes that is still there."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def listening_tcp_sockets(pid: int) -> list[tuple[str, int]]:
    """The (address, port) of every TCP socket, IPv4 or IPv6, on which the process listens."""
    connections = psutil.Process(pid).net_connections(kind="tcp")
    return [tuple(c.laddr) for c in connections if c.status == psutil.CONN_LISTEN]
