"""The store's Lua scripts: read once from scripts/*.lua beside this module, registered once per client.

Every write goes through one of them, so the contract's rules (done never reverts, one turn at a
time, no write from a turn that is not current) hold in Redis itself, whatever the writer.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from pathlib import Path

import redis
from redis.commands.core import Script

SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"
INCLUDE = "--@include "


@functools.cache
def source(name: str) -> str:
    """The text of scripts/{name}.lua, read from the package the first time it is asked for; a line
    `--@include other` is replaced by the text of scripts/other.lua (the tree's shared functions)."""
    lines = (SCRIPTS_DIR / f"{name}.lua").read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(source(line.split()[1]) if line.startswith(INCLUDE) else line for line in lines)


@dataclass(frozen=True)
class Scripts:
    """The scripts registered on one client (EVALSHA, loaded into Redis on first use)."""

    begin: Script  # a new turn: the user's message, queued
    publish: Script  # a turn's write: what is new, the small fields, the version
    live: Script  # the live text of the model call in flight
    delete: Script  # a conversation, its index entry, and the deleted marker
    rename: Script  # a conversation's title
    resume: Script  # a turn whose worker was lost, handed to a new job once
    park: Script  # a turn parked on a request for approval: its job lets go
    answer: Script  # a parked turn's request answered, once
    beat: Script  # a running turn's heartbeat and lease renewed, also at Redis's maxmemory
    lapsed: Script  # the running turns whose lease lapsed, by Redis's clock
    daily_reserve: Script  # a signed-in person's daily budget: checked, and a turn's budget reserved, at send
    daily_settle: Script  # a turn's reservation replaced by what it spent, once
    claim: Script  # a job claims its turn once, only while it owns it, and is watched from then on
    switch: Script  # the branch shown: the conversation's tip moved to another turn
    read: Script  # a conversation read in one step: the shown path, or only what is new
    branches: Script  # the whole tree of turns, for `branches`

    @classmethod
    def register(cls, client: redis.Redis) -> Scripts:
        return cls(**{field.name: client.register_script(source(field.name)) for field in fields(cls)})
