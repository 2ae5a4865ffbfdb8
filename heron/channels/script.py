"""`heron run`: one message in, the reply streamed to stdout, progress and errors to stderr."""

from __future__ import annotations

import sys
from typing import TextIO

from heron.agent.engine import Engine, TurnHooks, new_key
from heron.agent.runner import ToolCallRecord
from heron.config import Settings
from heron.providers.base import Provider, StreamEvent

EMBEDDED_BANNER = (
    "Offline demo model (SmolLM2-135M, no tools, short answers) for trying Heron out; for real "
    "work set ANTHROPIC_API_KEY, OPENAI_API_KEY or HERON_BASE_URL (see README)."
)


class _StreamPrinter:
    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out, self.err = out, err
        self.wrote = False
        self.at_line_start = True

    def event(self, ev: StreamEvent) -> None:
        if ev.kind == "text" and ev.text:
            self.out.write(ev.text)
            self.out.flush()
            self.wrote = True
            self.at_line_start = ev.text.endswith("\n")

    def tool_end(self, record: ToolCallRecord) -> None:
        if not self.at_line_start:
            self.out.write("\n")
            self.at_line_start = True
        status = "error" if record.result.is_error else "ok"
        seconds = record.ended - record.started
        self.err.write(f"[{record.call.name} {status} {seconds:.1f}s]\n")
        self.err.flush()


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
    key = key or new_key("run")
    printer = _StreamPrinter(out, err)
    hooks = TurnHooks(
        on_event=printer.event,
        on_tool_end=printer.tool_end,
        on_retry=lambda e, wait: err.write(f"[retrying in {wait:.1f}s: {e}]\n"),
    )
    async with Engine.open(settings, model=model, ephemeral=ephemeral, provider=provider) as engine:
        if engine.choice.embedded:
            err.write(EMBEDDED_BANNER + "\n")
        result = await engine.turn(key, text, hooks, agent=agent)
    if not printer.wrote and result.text:
        out.write(result.text)
    if printer.wrote or result.text:
        out.write("\n")
    out.flush()
    if result.run.error is not None:
        err.write(f"heron: the turn failed: {result.run.error}\n")
        err.write(f"Your message is saved in conversation {key!r}; run again to retry.\n")
    return result.ok
