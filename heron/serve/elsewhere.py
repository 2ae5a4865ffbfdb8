"""Turns another process runs on the serve's home: noticed, told to the clients, and their
stored rows told once they end.

A `heron run --model ...` or `heron chat --model ...` beside a running serve runs its turns in
its own process (docs/serve.md, "Terminal clients"): the serve's loop never sees them, so its
hub has no events of them. What every process writes is the conversation's turn lease
(heron/agent/leases.py, a row of `turn_leases` while a turn runs), so while some client is
attached the watcher reads the home's live leases once a second (`POLL`: one statement on a
table of one row per running turn) and sets aside this serve's own, which it knows by owner
(`leases.held_here`). A lease of another process is a turn running there: the hub tells that
conversation's clients (`elsewhere`, running: which program, which process) and lists it as
running in every tab. When the lease is gone (released, expired, its process dead), the turns
that process stored since it claimed the lease are read and told (`elsewhere`, running false,
with each turn's message and reply): a tab rereads its transcript, `heron chat` prints them.
Its stream stays in that process; nothing here pretends to show it.

SQLite offers no signal across processes but a read (as `leases.watch_epoch` knows): the poll
runs only while a client is attached, and waits on an event otherwise. A turn of this serve that
waits for such a lease asks the watcher first (`settle`, before its stored message is told), so
the other turn's end is told before the turn that followed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from heron.agent import leases
from heron.errors import FailureLog
from heron.serve.hub import Event, Hub
from heron.store import Store
from heron.store import engine_state as es
from heron.store.records import is_internal

POLL = 1.0  # seconds between two reads of the leases while a client is attached
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Seen:
    owner: str
    acquired: float
    conversation_id: int


class Watcher:
    """Reads the home's turn leases while clients are attached, and tells the hub of the
    turns other processes run."""

    def __init__(self, hub: Hub, store: Store, every: float = POLL) -> None:
        self.hub, self.store, self.every = hub, store, every
        self.seen: dict[str, _Seen] = {}  # conversation -> the other process's lease
        self.polls = 0  # reads made (tests, the bench)
        self._lock = asyncio.Lock()
        self._failures = FailureLog(log, "reading the turn leases")
        hub.settle = self.settle

    async def run(self) -> None:
        """Until cancelled: poll every `every` seconds while a client is attached."""
        while True:
            await self.hub.attached.wait()
            await self._poll_logged()
            await asyncio.sleep(self.every)

    async def settle(self, key: str) -> None:
        """A turn of this serve goes on in `key`: first, whether the other process's turn
        there has ended (then its end is told now, before what follows it)."""
        if key in self.seen:
            await self._poll_logged()

    async def _poll_logged(self) -> None:
        """A read that fails (a locked or damaged store) is logged and tried again at the next
        poll: it must neither end the watcher nor hold up the events of the serve's own turns."""
        try:
            await self.poll()
        except asyncio.CancelledError:
            raise
        except Exception:
            self._failures.failed()  # once per outage, not once a second
            return
        self._failures.worked()

    async def poll(self) -> None:
        async with self._lock:
            self.polls += 1
            held = {h.key: h for h in await self.store.call(es.live_leases, self.store)}
            mine = leases.held_here(self.store)
            now = {
                k: h for k, h in held.items() if h.holder.owner not in mine and not is_internal(k)
            }
            for key, seen in list(self.seen.items()):
                lease = held.get(key)  # whoever holds it now started after that turn ended
                if lease is None or lease.holder.owner != seen.owner:
                    del self.seen[key]
                    own = leases.claimed_here(self.store, seen.conversation_id)
                    until = _until(lease, own, seen.acquired)
                    told = await self.store.call(  # a turn's rows: as many as it wrote
                        es.turns_since, self.store, key, seen.acquired, until, off_loop=True
                    )
                    self.hub.ended_elsewhere(key, [_turn(t) for t in told])
            for key, lease in now.items():
                if key not in self.seen:
                    self.seen[key] = _Seen(
                        lease.holder.owner, lease.acquired, lease.conversation_id
                    )
                    self.hub.started_elsewhere(key, about(lease.holder))


def about(holder: es.Holder) -> Event:
    """What clients are told of another process's turn: its pid, the program when this host
    can tell (`heron run`), and `where` it runs in words ("heron run, process 4242")."""
    program = program_of(holder.pid) if holder.host == es.HOST else None
    where = f"process {holder.pid}" + ("" if holder.host == es.HOST else f" on {holder.host}")
    said: Event = {"pid": holder.pid, "program": program}
    return {**said, "where": f"{program}, {where}" if program else where}


def program_of(pid: int) -> str | None:
    """`heron run`, `heron chat`, ... from the process's command line (Linux's /proc), or None
    when it is not a `heron` command or cannot be read."""
    with contextlib.suppress(OSError):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        words = [os.path.basename(a.decode(errors="replace")) for a in argv if a]
        for i, word in enumerate(words[:4]):  # python, -m, heron, run / .../bin/heron, run
            if word == "heron":
                sub = words[i + 1] if i + 1 < len(words) else ""
                return f"heron {sub}" if sub.isalpha() else "heron"
    return None


def _until(lease: es.HeldLease | None, own: float | None, since: float) -> float | None:
    """Before when the ended turn's rows started: the claim of whoever holds the lease now, or
    this serve's own last claim there after that turn's (its turn may have come and gone
    before the watcher looked: its rows are its own, told as they ran)."""
    bounds = [t for t in (lease.acquired if lease else None, own) if t is not None and t > since]
    return min(bounds, default=None)


def _turn(told: es.TurnTold) -> Event:
    return {"text": told.text, "reply": told.reply, "status": told.status, "error": told.error}
