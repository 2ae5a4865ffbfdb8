"""`heron chat`: the terminal channel.

prompt_toolkit reads the input (history, multi-line with Alt-Enter); rich renders the streamed
answer as Markdown, each tool call as a one-line pill, reasoning dimmed. Ctrl-C stops the turn
in flight (what it finished is kept), Ctrl-D leaves.
"""

from __future__ import annotations

import asyncio
import functools
import json
import signal
import subprocess
import sys
from dataclasses import dataclass, field

from rich.console import Console
from rich.live import Live
from rich.markdown import Markdown
from rich.text import Text as RichText

from heron.agent import commands
from heron.agent.engine import Engine, TurnHooks, new_key
from heron.agent.leases import presence
from heron.agent.loop import idle_compaction
from heron.agent.runner import ToolCallRecord
from heron.agent.turn import TurnControl
from heron.channels.script import EMBEDDED_BANNER
from heron.config import Settings
from heron.memory.commands import memory_command, opening_line
from heron.memory.queue import Suggestion
from heron.messages import ToolCall
from heron.providers.base import StreamEvent
from heron.tools.approval import DECLINED, start_notice

HELP = """\
In this terminal:
  /resume       with no key: pick an earlier conversation to continue
  /show N       print the full result of tool call N
Enter sends; Alt-Enter (or Esc then Enter) adds a new line.
Ctrl-C stops the running turn; Ctrl-D leaves."""


@dataclass
class ChatState:
    key: str
    agent: str
    results: list[ToolCallRecord] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)  # conversations talked in (review at exit)
    view: TurnView | None = None  # the turn on screen (an approval prompt closes its text)


class TurnView:
    """Renders one turn as it streams."""

    def __init__(self, console: Console, state: ChatState) -> None:
        self.console = console
        self.state = state
        self.text = ""
        self.live: Live | None = None
        self.thinking = False

    def event(self, ev: StreamEvent) -> None:
        if ev.kind == "thinking":
            self.console.print(RichText(ev.text, style="dim italic"), end="")
            self.thinking = True
            return
        if self.thinking:
            self.console.print()
            self.thinking = False
        self.text += ev.text
        if self.live is None:
            self.live = Live(
                console=self.console, refresh_per_second=12, vertical_overflow="visible"
            )
            self.live.start()
        self.live.update(Markdown(self.text))

    def close_text(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
        self.text = ""

    def tool_start(self, call: ToolCall) -> None:
        self.close_text()

    def tool_end(self, record: ToolCallRecord) -> None:
        self.state.results.append(record)
        n = len(self.state.results)
        args = json.dumps(record.call.args, ensure_ascii=False)
        args = args if len(args) <= 60 else args[:59] + "…"
        ok = "[red]✗[/red]" if record.result.is_error else "[green]✓[/green]"
        took = record.ended - record.started
        self.console.print(
            f"[cyan]⚙ {n}[/cyan] {record.call.name} [dim]{args}[/dim] {ok} [dim]{took:.1f}s"
            f"  (/show {n})[/dim]",
            highlight=False,
        )


async def run_chat(
    settings: Settings, agent: str, key: str | None, model: str | None, ephemeral: bool
) -> None:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory

    console = Console()
    state = ChatState(key or new_key("chat"), agent)
    opened = Engine.open(settings, model=model, ephemeral=ephemeral)
    async with opened as engine, idle_compaction(engine):  # idle sweeps until the chat ends
        if engine.choice.embedded:
            console.print(f"[yellow]{EMBEDDED_BANNER}[/yellow]")
        notice = start_notice(engine.registry, engine.sandbox)
        if notice:
            console.print(f"[yellow]{notice}[/yellow]", highlight=False)
        engine.approve = functools.partial(_approve, state, console)
        console.print(
            f"[dim]Heron · {engine.choice.provider}/{engine.choice.model} · conversation "
            f"{state.key} · /help for commands[/dim]"
        )
        if engine.memory is not None:
            waiting = await asyncio.to_thread(opening_line, engine.memory)
            if waiting:
                console.print(f"[cyan]{waiting}[/cyan]", highlight=False)
        history = FileHistory(str(settings.paths.home / "chat_history"))
        session: PromptSession[str] = PromptSession(history=history)
        while True:
            try:
                text = await session.prompt_async("› ")
            except KeyboardInterrupt:
                continue
            except EOFError:
                console.print("[dim]Bye.[/dim]")
                if not ephemeral and not engine.choice.embedded:
                    start_review_pass(state.keys)
                return
            if not text.strip():
                continue
            if text.startswith("/") and await _command(text, engine, state, console, session):
                continue
            async with presence(engine.store, engine.store.open_conversation(state.key).id):
                await _turn(engine, state, console, text)
            if state.key not in state.keys:
                state.keys.append(state.key)


async def _turn(engine: Engine, state: ChatState, console: Console, text: str) -> None:
    view = TurnView(console, state)
    control = TurnControl(state.key)
    hooks = TurnHooks(
        on_event=view.event,
        on_tool_start=view.tool_start,
        on_tool_end=view.tool_end,
        on_retry=lambda e, wait: console.print(f"[yellow]retrying in {wait:.1f}s: {e}[/yellow]"),
        on_busy=lambda note: console.print(f"[yellow]{note}[/yellow]"),
        control=control,
    )
    state.view = view
    task = asyncio.ensure_future(engine.turn(state.key, text, hooks, agent=state.agent))
    loop = asyncio.get_running_loop()

    def stop() -> None:  # Ctrl-C is /stop: the turn goes stale at once, then is cancelled
        control.stale = True
        task.cancel()

    loop.add_signal_handler(signal.SIGINT, stop)
    try:
        result = await task
    except asyncio.CancelledError:
        view.close_text()
        console.print("[yellow]Stopped.[/yellow] What the turn finished is kept.")
        return
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    view.close_text()
    if result.switch_to:
        state.key = result.switch_to
        state.results.clear()
    if result.command and result.run.model_calls == 0:
        console.print(result.reply or "", markup=False, highlight=False)
    elif result.run.error is not None:
        console.print(f"[red]The turn failed:[/red] {result.run.error}")
        console.print("[dim]Your message is saved; send it again to retry.[/dim]")
    elif not result.text and not view.text:
        console.print("[dim](no answer)[/dim]")


async def _approve(state: ChatState, console: Console, tool: str, command: str) -> str | None:
    """Approval when commands are unconfined: the exact command, then y/n."""
    from prompt_toolkit import PromptSession

    if state.view is not None:
        state.view.close_text()
    console.print(f"[yellow]The agent wants to run ({tool}, unconfined):[/yellow]")
    console.print(command, markup=False, highlight=False)
    try:
        answer = await PromptSession().prompt_async("Run it? [y/N] ")
    except (KeyboardInterrupt, EOFError):
        answer = ""
    return None if answer.strip().lower() in ("y", "yes") else DECLINED


async def _command(text: str, engine: Engine, state: ChatState, console: Console, session) -> bool:
    """Run a chat command; False means it is not one, and the text goes to the model."""
    name, _, arg = text.strip().partition(" ")
    if name == "/help":
        console.print(commands.HELP + "\n" + HELP, highlight=False, markup=False)
    elif name == "/new":
        await _turn(engine, state, console, text)
        state.results.clear()
        console.rule("[dim]new conversation[/dim]")
    elif name == "/resume" and not arg:
        await _resume(engine, state, console, session)
    elif name == "/show":
        _show(arg, state, console)
    elif name == "/memory" and arg.strip() == "review":
        await _review(engine, console)
    elif name in ("/learn", "/reflect"):
        await _turn(engine, state, console, text)
        if engine.memory is not None and await asyncio.to_thread(engine.memory.count_waiting):
            await _review(engine, console)
    elif commands.parse(text) is not None:  # /stop, /status, /retry, /tree, /compact, ...
        await _turn(engine, state, console, text)
    else:
        return False
    return True


async def _review(engine: Engine, console: Console) -> None:
    """/memory review: checklists of up to 10 in a dialog; checked items are kept, the rest of
    that checklist dropped; Esc leaves it and every later one waiting."""
    if engine.memory is None:
        console.print(commands.NO_MEMORY)
        return
    loop = asyncio.get_running_loop()

    def choose(batch: list[Suggestion]) -> set[int] | None:  # on the worker thread
        return asyncio.run_coroutine_threadsafe(_checklist(batch), loop).result()

    text = await asyncio.to_thread(memory_command, engine.memory, "review", choose=choose)
    console.print(text, markup=False, highlight=False)


async def _checklist(batch: list[Suggestion]) -> set[int] | None:
    from prompt_toolkit.shortcuts import checkboxlist_dialog

    picked = await checkboxlist_dialog(
        title="Memory review",
        text="Check what to keep. Unchecked items are dropped; Cancel or Esc leaves them waiting.",
        values=[(s.id, f"#{s.id} {s.describe()}") for s in batch],
    ).run_async()
    return None if picked is None else set(picked)


def start_review_pass(keys: list[str]) -> None:
    """When a chat ends: a detached process reviews what was said since the last review (it
    only adds suggestions to the queue), so leaving the chat does not wait for a model call."""
    if not keys:
        return
    argv = [sys.executable, "-m", "heron", "memory", "review-pass"]
    for key in keys:
        argv += ["--conversation", key]
    subprocess.Popen(  # our own interpreter and module, fixed arguments
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _show(arg: str, state: ChatState, console: Console) -> None:
    if not arg.strip().isdigit() or not 1 <= int(arg) <= len(state.results):
        console.print(f"Give a tool call number from 1 to {len(state.results)}.")
        return
    record = state.results[int(arg) - 1]
    console.print(
        f"[cyan]{record.call.name}[/cyan] {json.dumps(record.call.args)}", highlight=False
    )
    console.print(record.result.content, markup=False, highlight=False)


async def _resume(engine: Engine, state: ChatState, console: Console, session) -> None:
    rows = await asyncio.to_thread(engine.store.conversations, 20)
    if not rows:
        console.print("No earlier conversations.")
        return
    for i, c in enumerate(rows, 1):
        console.print(f"{i:3}. {c.key}  [dim]{c.title or ''}[/dim]", highlight=False)
    choice = await session.prompt_async("Number to resume (Enter cancels): ")
    if choice.strip().isdigit() and 1 <= int(choice) <= len(rows):
        state.key = rows[int(choice) - 1].key
        state.results.clear()
        console.rule(f"[dim]resumed {state.key}[/dim]")
