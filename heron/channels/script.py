"""`heron run`: one message in, the reply streamed to stdout, progress and errors to stderr.

The message goes through the AgentLoop like every channel's: the one of a running `heron serve`
when its control socket answers (heron/channels/remote.py), else one started in this process
(heron/channels/inprocess.py). This module only prints what comes back, the same either way.
The engine, the config and the providers are imported only on the in-process path, so a
message through serve costs no SDK import.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from heron.bus import RETRY_MARKER, Outbound, OutboundMessage, TurnEnd, TurnEvent

if TYPE_CHECKING:
    from pathlib import Path

    from heron.config import Settings
    from heron.providers.base import Provider

EMBEDDED_BANNER = (
    "Offline demo model (SmolLM2-135M, no tools, short answers) for trying Heron out; for real "
    "work set ANTHROPIC_API_KEY, OPENAI_API_KEY or HERON_BASE_URL (see README)."
)
CHANNEL = "script"


class _Printer:
    """The reply's text on stdout as it streams; tool calls, notices and errors on stderr."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out, self.err = out, err
        self.wrote = False
        self.at_line_start = True
        self.end: TurnEnd | None = None

    async def deliver(self, item: Outbound) -> None:
        if isinstance(item, TurnEvent):
            self.event(item)
        else:
            self.message(item)

    def event(self, ev: TurnEvent) -> None:
        if ev.kind == "delta" and ev.text:
            self.write(ev.text)
        elif ev.kind == "tool_end" and ev.call is not None and ev.result is not None:
            self.line_break()
            status = "error" if ev.result.is_error else "ok"
            self.note(f"[{ev.call.name} {status} {ev.seconds:.1f}s]")
        elif ev.kind == "retry":
            self.note(f"[retrying in {ev.seconds:.1f}s: {ev.text}]")
        elif ev.kind == "restart":  # the stream was cut; what follows is the reply anew
            self.line_break()
            self.write(RETRY_MARKER + "\n")
        elif ev.kind == "mail":  # through serve: the conversation's turn was running
            self.note("heron: the conversation is busy; your message went to the running turn")
        elif ev.kind == "queued":
            self.note("heron: the conversation is busy; your message waits for the running turn")
        elif ev.kind == "turn_end":
            self.end = ev.end

    def message(self, m: OutboundMessage) -> None:
        if m.kind == "notice":
            self.note(m.text)
        elif m.kind == "message":  # the agent spoke with the `message` tool
            self.line_break()
            self.write(m.text + "\n")
        elif m.kind != "error" and not self.wrote:  # an answer that did not stream
            self.write(m.text)

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()
        self.wrote = True
        self.at_line_start = text.endswith("\n")

    def line_break(self) -> None:
        if not self.at_line_start:
            self.write("\n")

    def note(self, text: str) -> None:
        self.err.write(text + "\n")
        self.err.flush()


def new_run_key() -> str:
    """A new thread's key, shaped as heron.agent.engine.new_key("run") makes it."""
    return f"run-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


async def run_message(
    load_settings: Callable[[], Settings],
    text: str,
    agent: str,
    key: str | None,
    model: str | None,
    ephemeral: bool,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> bool:
    """Through a running serve when one answers (and the run asks for nothing it cannot give:
    another model, or keeping nothing), else in this process."""
    if model is None and not ephemeral:
        from heron.channels.remote import serve_socket

        path = serve_socket()
        if path is not None:
            try:
                return await run_remote(path, text, agent, key, out, err)
            except ConnectionRefusedError:
                pass  # a socket left by a serve that is gone: run here
    return await run_once(load_settings(), text, agent, key, model, ephemeral, out, err)


async def run_remote(
    path: Path, text: str, agent: str, key: str | None, out: TextIO, err: TextIO
) -> bool:
    from heron.channels.remote import ServeGone, connect_remote

    key = key or new_run_key()
    printer = _Printer(out, err)
    async with connect_remote(path, CHANNEL, printer.deliver, key, agent) as conn:
        if conn.embedded:
            err.write(EMBEDDED_BANNER + "\n")
        await conn.send(text, key, agent)
        try:
            await conn.settle()
        except ServeGone:
            printer.note("heron: heron serve stopped before the turn ended")
    return _finish(printer, key, out, err)


async def run_once(
    settings: Settings,
    text: str,
    agent: str,
    key: str | None,
    model: str | None,
    ephemeral: bool,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    provider: Provider | None = None,
) -> bool:
    from heron.agent.engine import Engine
    from heron.channels.inprocess import connect
    from heron.tools.approval import start_notice

    key = key or new_run_key()
    printer = _Printer(out, err)
    async with Engine.open(settings, model=model, ephemeral=ephemeral, provider=provider) as engine:
        if engine.choice.embedded:
            err.write(EMBEDDED_BANNER + "\n")
        notice = start_notice(engine.registry, engine.sandbox)
        if notice:
            err.write(f"heron: {notice}\n")
        approve = functools.partial(_approve, err)
        opened = connect(engine, CHANNEL, "stdin", printer.deliver, idle=False, approve=approve)
        async with opened as conn:
            await conn.send(text, key, agent)
            await conn.settle()
    return _finish(printer, key, out, err)


def _finish(printer: _Printer, key: str, out: TextIO, err: TextIO) -> bool:
    """End the output; say why the turn failed, if it did, and how to answer it again."""
    if printer.wrote and not printer.at_line_start:
        out.write("\n")
    out.flush()
    end = printer.end
    if end is None or not end.ok:
        error = end.error if end is not None and end.error else "it was stopped"
        from heron.agent.commands import retry_hint

        err.write(f"heron: the turn failed: {error}\n")
        err.write(retry_hint(key) + "\n")
        return False
    return True


async def _approve(err: TextIO, tool: str, command: str) -> str | None:
    """Approval in `heron run`: asked on the terminal when there is one; refused (and said to
    the person) when the run has none."""
    from heron.tools.approval import DECLINED, NO_TERMINAL

    if not (sys.stdin.isatty() and err.isatty()):
        err.write(
            f"heron: refused to run {tool} without your approval (no terminal to ask in):\n"
            f"  {command}\n  Run it in `heron chat`, install bubblewrap, or set "
            'approval = "allow" under [tools] in config.toml.\n'
        )
        return NO_TERMINAL
    err.write(f"heron: the agent wants to run ({tool}, unconfined):\n{command}\nRun it? [y/N] ")
    err.flush()
    answer = await asyncio.to_thread(sys.stdin.readline)
    return None if answer.strip().lower() in ("y", "yes") else DECLINED
