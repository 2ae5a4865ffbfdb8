"""`heron chat`: the terminal channel.

Messages go through the AgentLoop like every channel's (heron/channels/inprocess.py), and the
prompt stays open while the agent works: a message typed then goes to the running turn's
mailbox and is answered in the same turn. prompt_toolkit reads the input (history, multi-line
with Alt-Enter) with the output printed above it, and the prompt shows how long the agent has
been working. rich renders the answer as Markdown one finished block at a time, so a reply
taller than the screen never repeats itself in the scrollback; each tool call is a one-line
pill, reasoning is dimmed. Ctrl-C stops the turn in flight (what it finished is kept), Ctrl-D
leaves; SIGTERM and SIGHUP stop it the same way, then end the chat (exit 128 + the signal).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import signal
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape
from rich.text import Text as RichText

from heron.agent import commands
from heron.agent.engine import Engine
from heron.agent.leases import presence
from heron.bus import (
    RETRY_MARKER,
    STOP_ANSWER_CODE,
    Outbound,
    OutboundMessage,
    TurnEnd,
    TurnEvent,
)
from heron.channels.early import signalled_again
from heron.channels.inprocess import InProcessAgent, connect
from heron.channels.remote import RemoteAgent
from heron.channels.script import EMBEDDED_BANNER, STOP_WAIT, served_banner, to_null
from heron.channels.visible import command_shown, visible
from heron.config import AttachmentCaps, ConfigWatch, Settings
from heron.errors import HeronError
from heron.memory.commands import memory_command, opening_line, review_on_close, unreviewed_keys
from heron.memory.queue import Suggestion
from heron.messages import File, ToolCall, ToolResult
from heron.providers.profiles import file_summary
from heron.saved import read_whole
from heron.tools.approval import DECLINED, start_notice

if TYPE_CHECKING:  # prompt_toolkit is imported when a chat starts
    from prompt_toolkit import PromptSession
    from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent

    from heron.memory.service import MemoryService

CHANNEL = "terminal"
PERSONAL = "personal"  # the one conversation the browser and a plain `heron chat` share
HELP = """\
In this terminal:
  /resume       with no key: pick an earlier conversation to continue
  /show N       print the full result of tool call N
  /attach PATH  attach a file to your next message (/attach lists them, /attach clear drops them)
  /exit, /quit  leave (as Ctrl-D does)
Enter sends; Alt-Enter (or Esc then Enter) adds a new line. A message sent while the agent
works is answered in the same turn. Ctrl-C stops the running turn; Ctrl-D leaves."""


# A row of a two-column list: its indent and command, two spaces or more, its description.
_ROW = re.compile(r"^(\s+\S.*?)(\s{2,})(\S.*)$")


def hanging(text: str, width: int) -> str:
    """/help's two columns at `width`: a description that wraps goes on under itself, or, when
    its column is past half the width, on the lines after its command, indented; never back
    at column 0 under the commands. Other lines are left for the console to wrap."""
    out: list[str] = []
    for line in text.splitlines():
        row = _ROW.match(line)
        if len(line) <= width or row is None:
            out.append(line)
            continue
        head, gap, body = row.groups()
        column = len(head) + len(gap)
        if column <= width // 2:
            out += textwrap.wrap(
                body, width, initial_indent=head + gap, subsequent_indent=" " * column
            )
            continue
        out += textwrap.wrap(head.strip(), width, initial_indent="  ", subsequent_indent="    ")
        out += textwrap.wrap(body, width, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(out)


SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
# Answered here, beside the engine's (commands.NAMES).
LOCAL_COMMANDS = ("show", "exit", "quit", "attach")
# Each stops the running turn as /stop does, then ends the chat (`_hang_ups`).
HANG_UPS = (signal.SIGTERM, signal.SIGHUP)


@dataclass
class ToolPill:
    """A finished tool call, for /show N."""

    call: ToolCall
    result: ToolResult


# Commands that call the model outside any turn, about the conversation they run in.
MAINTENANCE = ("compact", "learn", "reflect")


@dataclass
class ChatState:
    key: str
    agent: str
    results: list[ToolPill] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)  # conversations talked in (review at exit)
    caps: AttachmentCaps = field(default_factory=AttachmentCaps)
    pending: list[File] = field(default_factory=list)  # /attach: files for the next message
    config: ConfigWatch | None = None  # config.toml as the chat found it (see send_turn)
    home: Path | None = None  # HERON_HOME: where /show finds the whole of a cut result
    embedded: bool = False  # the offline demo answers: /help says how to use a real model
    answered: bool = False  # a turn ended well (the review at exit has a working model)
    broken: str | None = None  # why the last turn failed, when no model was usable (a key)
    # The serve went with a message of this chat kept unanswered (`RemoteAgent.kept_unanswered`).
    kept_on_gone: bool = False

    def followed(self, end: TurnEnd) -> None:
        """What a turn of this chat says of its model, whatever started the turn: a message, a
        command that runs one (/retry, /edit), or one that calls the model outside any turn
        (/compact, /learn: `end.model_answered`). A command answered without the model
        (/status, /tree) says nothing of it."""
        if end.command in MAINTENANCE:
            self._talked_in()
            if end.model_answered:
                self.answered, self.broken = True, None
            return
        if end.command is not None and end.model_calls == 0 and not end.unusable:
            return
        self._talked_in()
        if end.ok:
            self.answered, self.broken = True, None
        elif end.unusable:
            self.broken = (end.error or "no answer").splitlines()[0]

    def _talked_in(self) -> None:
        if self.key not in self.keys:
            self.keys.append(self.key)

    def why_no_review(self) -> str | None:
        """Why the memory review at exit would only repeat a failure (None: it can run)."""
        if self.broken is not None:
            return f"the model's last call failed ({self.broken})"
        return None if self.answered else "no turn was answered"

    def take_files(self) -> tuple[File, ...]:
        """The files /attach gathered, for the message being sent (and no later one)."""
        files = tuple(self.pending)
        self.pending.clear()
        return files


def attach_command(arg: str, state: ChatState) -> str:
    """`/attach PATH` (the file goes with the next message), `/attach` (what is pending) and
    `/attach clear`; what to print. A file that cannot be attached is said, nothing else
    changes."""
    from heron.attachments import check_total, from_path
    from heron.errors import AttachmentError
    from heron.providers.wire import file_label

    arg = arg.strip()
    if not arg:
        if not state.pending:
            return "Nothing attached. /attach PATH attaches a file to your next message."
        names = "\n".join(f"  {file_label(f)}" for f in state.pending)
        return f"Attached to your next message:\n{names}"
    if arg == "clear":
        dropped = len(state.pending)
        state.pending.clear()
        return f"Dropped {dropped} attachment(s)." if dropped else "Nothing was attached."
    if len(arg) > 1 and arg[0] == arg[-1] and arg[0] in "'\"":
        arg = arg[1:-1]  # a path pasted in quotes
    try:
        made = from_path(arg, state.caps)
        if made in state.pending:  # the same name and bytes: a second copy adds nothing
            return f"{file_label(made)} is already attached; it goes once with your next message."
        check_total([*state.pending, made], state.caps)
    except AttachmentError as e:
        return f"heron: {e}"
    state.pending.append(made)
    return f"Attached {file_label(made)}; it goes with your next message."


def split_blocks(text: str) -> tuple[str, str]:
    """The finished Markdown blocks at the start of `text` (up to its last blank line outside
    a code fence) and the unfinished rest."""
    done, offset, fenced = 0, 0, False
    for line in text.splitlines(keepends=True):
        offset += len(line)
        if not line.endswith("\n"):
            break
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            fenced = not fenced
        elif not stripped and not fenced:
            done = offset
    return text[:done], text[done:]


class TerminalView:
    """Renders what the AgentLoop sends back for this chat."""

    def __init__(self, console: Console, state: ChatState) -> None:
        self.console = console
        self.state = state
        self.pending = ""  # streamed answer text not printed yet (an unfinished block)
        self.streamed = False  # this turn's answer was shown as it streamed
        self.reasoning = False
        self.working_since: float | None = None
        self.waiting = False  # the turn runs and nothing of the model's has come yet
        self.asking: asyncio.Future[str] | None = None  # an approval waiting for y/n
        self.one_at_a_time = asyncio.Lock()  # the approvals that wait for their turn to ask
        self.chat_id = ""  # this chat's id in turn events: other ids are other clients
        self.asked = False  # a question (ask_user) waits: the next message sent answers it
        self.stopping = False  # this chat sent /stop: its reply says so, the turn's end need not
        # A message is on its way (Enter pressed, not yet handed to the agent: `send_turn`
        # reads config.toml first), and a Ctrl-C meanwhile asked to stop the turn it opens.
        self.sending = 0
        self.stop_after_send = False
        # The last thing printed was a block of the answer: the next block gets the blank line
        # Markdown puts between blocks (each is printed on its own as it completes).
        self.spaced = False
        # Runs a callable once what was printed before it is on screen (`PromptOutput.then`):
        # the prompt turns idle only after the reply's last block is shown.
        self.after_shown: Callable[[Callable[[], None]], None] = _at_once
        self.turns = 0  # turns started: a turn's end idles the prompt only if no other began
        self.running = False  # between a turn's start and its end (the prompt may lag behind)
        self.held: list[OutboundMessage] = []  # /stop's answer, shown after what it stopped
        self.stopped_unsaid = 0  # turns this chat stopped that ended before /stop's answer came

    def prompt(self) -> str:
        if self.asking is not None:
            return "run it? [y/N] › "
        if self.working_since is None:
            return "› "
        elapsed = time.monotonic() - self.working_since
        if self.waiting:  # nothing from the model yet: a spinner, so the wait is visible
            frame = SPINNER[int(elapsed * 2) % len(SPINNER)]  # the prompt redraws every 0.5 s
            return f"{frame} thinking {elapsed:.0f}s · Ctrl-C stops › "
        return f"working {elapsed:.0f}s · Ctrl-C stops › "

    async def deliver(self, item: Outbound) -> None:
        if item.key != self.state.key:
            return  # a turn of the conversation this chat left (/resume)
        if isinstance(item, TurnEvent):
            self.event(item)
        else:
            self.message(item)

    def event(self, ev: TurnEvent) -> None:
        if ev.kind in ("delta", "reasoning", "tool_start"):
            self.waiting = False
        if ev.kind == "delta":
            self.end_reasoning()
            self.pending += ev.text
            self.streamed = True
            done, self.pending = split_blocks(self.pending)
            self.markdown(done)
        elif ev.kind == "reasoning":
            self.console.print(RichText(visible(ev.text), style="dim italic"), end="")
            self.reasoning = True
        elif ev.kind == "tool_start":
            self.flush()
        elif ev.kind == "tool_end" and ev.call is not None and ev.result is not None:
            self.pill(ev.call, ev.result, ev.seconds)
        elif ev.kind == "retry":
            said = escape(visible(ev.text))  # the server's words: neither markup nor controls
            self.console.print(f"[yellow]retrying in {ev.seconds:.1f}s: {said}[/yellow]")
        elif ev.kind == "restart":  # the stream was cut; what follows is the reply anew
            self.flush()
            self.console.print(f"[dim]{RETRY_MARKER}[/dim]", highlight=False)
        elif ev.kind == "mail" and ev.text and ev.chat_id != self.chat_id:  # typed elsewhere
            self.console.print(RichText(f"{ev.channel} › {visible(ev.text)}", style="cyan"))
            self.asked = False
        elif ev.kind == "mail":
            said = "answered the agent's question" if self.asked else "added to the running turn"
            self.console.print(f"[dim]↳ {said}[/dim]")
            self.asked = False
        elif ev.kind == "queued":
            self.console.print("[dim]↳ waiting: answered when this turn ends[/dim]")
        elif ev.kind == "turn_start":
            self.said_held()  # the stopped turn is over: the next one (kept mail) follows it
            self.working_since, self.streamed, self.waiting = time.monotonic(), False, True
            self.turns, self.running = self.turns + 1, True
            if ev.text and ev.provenance != "user":  # Heron's: a result, a nudge, a reminder
                self.console.print(RichText(f"heron › {visible(ev.text)}", style="dim cyan"))
            elif (ev.text or ev.files) and ev.chat_id != self.chat_id:  # typed elsewhere
                self.console.print(RichText(f"{ev.channel} › {visible(ev.text)}", style="cyan"))
                if ev.files:  # attached in the browser: named, as the model reads them
                    named = escape(visible(", ".join(ev.files)))
                    self.console.print(f"[dim]  attached: {named}[/dim]")
        elif ev.kind == "approval_end" and ev.approval is not None:
            if ev.approval.by != self.chat_id:  # not answered here: say how it ended
                self.console.print(f"[dim]↳ {ev.approval.outcome()}[/dim]", highlight=False)
        elif ev.kind == "turn_end" and ev.end is not None:
            self.flush()
            self.asked, self.running = False, False
            if ev.end.outcome == "stale" and self.stopping and not self.held:
                self.stopped_unsaid += 1  # its /stop's answer may come after it
            self.ended(ev.end)
            self.said_held()
            self.after_shown(functools.partial(self.idle, self.turns))
        elif ev.kind == "elsewhere" and ev.end is not None:  # another process's, now stored
            self.flush()
            self.console.print(RichText(f"{ev.channel} › {visible(ev.text)}", style="cyan"))
            self.spaced = False
            self.markdown(ev.end.reply or "")
            if ev.end.error:  # a failed turn stores no reply, only why
                why = RichText(f"↳ {visible(ev.end.error)}", style="dim")
                self.console.print(why, highlight=False)
        if ev.kind != "delta":  # a pill, a notice, the turn's end: the next block starts flush
            self.spaced = False

    def said_held(self) -> None:
        """/stop's answer, after the text the stopped turn kept."""
        self.flush()
        for held in self.held:
            self.console.print(visible(held.text), markup=False, highlight=False)
        self.held.clear()

    def idle(self, turns: int) -> None:
        """The prompt turns idle, unless another turn started since the one that ended."""
        if turns == self.turns:
            self.working_since, self.waiting = None, False

    def message(self, m: OutboundMessage) -> None:
        if m.code == STOP_ANSWER_CODE:
            if self.stopped_unsaid:  # the turn it stopped is over: said now
                self.stopped_unsaid -= 1
            elif self.running:  # the stopped turn's last text may still come: said after it
                self.held.append(m)
                return
        self.flush()
        if m.kind == "notice":
            # escaped: a notice names settings in brackets ([agent] max_continuations)
            self.console.print(f"[yellow]{escape(visible(m.text))}[/yellow]", highlight=False)
        elif m.kind == "error":
            self.console.print(RichText(visible(m.text), style="red"), highlight=False)
        elif m.kind == "command":
            self.console.print(visible(m.text), markup=False, highlight=False)
        elif m.kind in ("message", "question") or not self.streamed:
            if m.by:  # background work's message (a monitor, the heartbeat): say whose
                self.console.print(RichText(f"from {visible(m.by)}:", style="dim cyan"))
            self.markdown(m.text)
        if m.kind == "question":  # ask_user: the next line typed here is the answer
            self.console.print("[dim]↳ your next message answers it[/dim]")
            self.asked = True
        self.spaced = False

    def ended(self, end: TurnEnd) -> None:
        if end.outcome == "stale" and end.stopped_by and not self.stopping:
            # Another client's /stop or /new (the browser, another chat, a script): the stream
            # just ended here, so say what ended it.
            said = f"Stopped by {end.stopped_by}. What the turn finished is kept."
            self.console.print(f"[dim]{said}[/dim]", highlight=False)
        self.stopping = False
        if end.switch_to:
            self.state.key = end.switch_to
            self.state.results.clear()
            self.console.rule(f"[dim]resumed {end.switch_to}[/dim]")
        elif end.command == "new":
            self.state.results.clear()
            self.console.rule("[dim]new conversation[/dim]")
        elif end.ok and end.command is None and not self.streamed and not end.reply:
            self.console.print("[dim](no answer)[/dim]")
        self.state.followed(end)

    async def approve(self, tool: str, command: str, confined: bool) -> str | None:
        """Approval of a command (unconfined, or approval "ask"): whether the sandbox confines
        it and the exact command, then the next line typed answers (y runs it; anything else,
        Ctrl-C or Ctrl-D declines). The calls of one reply may ask at once: they are asked one
        after the other, each with its own line."""
        from heron.tools.approval import approval_label

        async with self.one_at_a_time:
            self.flush()
            label = approval_label(tool, confined)
            # Every character of the command visible, and the question repeated after it: what
            # the command holds can neither hide itself nor push the question off the screen.
            shown, after = command_shown(label, command, self.console.width)
            self.console.print(f"The agent wants to run ({label}):", style="yellow", markup=False)
            self.console.print(shown, markup=False, highlight=False)
            self.console.print(after, style="yellow", markup=False, highlight=False)
            self.asking = asyncio.get_running_loop().create_future()
            try:
                answer = await self.asking
            finally:
                self.asking = None
        return None if answer.strip().lower() in ("y", "yes") else DECLINED

    def answer(self, text: str) -> bool:
        """Give a typed line to a waiting approval; False when none waits."""
        if self.asking is None or self.asking.done():
            return False
        self.asking.set_result(text)
        return True

    def pill(self, call: ToolCall, result: ToolResult, seconds: float) -> None:
        self.state.results.append(ToolPill(call, result))
        n = len(self.state.results)
        args = visible(json.dumps(call.args, ensure_ascii=False))
        args = escape(args if len(args) <= 60 else args[:59] + "…")  # shown, never markup
        ok = "[red]✗[/red]" if result.is_error else "[green]✓[/green]"
        name = escape(visible(call.name))
        self.console.print(
            f"[cyan]⚙ {n}[/cyan] {name} [dim]{args}[/dim] {ok} [dim]{seconds:.1f}s"
            f"  (/show {n})[/dim]",
            highlight=False,
        )

    def markdown(self, text: str) -> None:
        if text.strip():
            if self.spaced:
                self.console.print()
            self.console.print(Markdown(visible(text.strip())))
            self.spaced = True

    def end_reasoning(self) -> None:
        if self.reasoning:
            self.console.print()
            self.reasoning = False

    def flush(self) -> None:
        self.end_reasoning()
        self.markdown(self.pending)
        self.pending = ""


def _at_once(fn: Callable[[], None]) -> None:
    fn()


async def run_chat(
    settings: Settings, agent: str, key: str | None, model: str | None, ephemeral: bool
) -> None:
    console = Console()
    state = ChatState(key or PERSONAL, agent, caps=settings.config.attachments)
    state.home = settings.paths.home
    state.config = ConfigWatch(settings.paths.config)
    if model is None and not ephemeral:
        from heron.channels.remote import serve_socket

        path = serve_socket(settings.paths.home)
        if path is not None:
            from heron.channels.remote import ServeDiffers, ServeGone

            try:
                await _chat_remote(path, settings, console, state)
                return
            except ServeDiffers as differs:
                console.print(differs.notice(), style="yellow", markup=False, highlight=False)
            except ConnectionRefusedError:
                pass  # a socket left by a serve that is gone: chat here
            except ServeGone:
                console.print(serve_gone_note(state), highlight=False)
                raise SystemExit(1) from None
    else:
        from heron.channels.remote import beside_serve

        note = beside_serve(settings.paths.home, model, "chat")
        if note is not None:
            console.print(note, style="yellow", markup=False, highlight=False)
    switch: SwitchModel | None = SwitchModel(model)
    back: SwitchModel | None = None  # the model before a /model switch, while the switch opens
    while switch is not None:  # once more per /model NAME: the same conversation, that model
        model = switch.model
        after = await _chat_here(settings, model, ephemeral, console, state, back)
        # Gone back after a failed switch: the model it had failing to open again ends the chat.
        back = None if after is back else SwitchModel(model)
        switch = after


class SwitchModel(Exception):
    """`/model NAME` in a chat run in this process: the chat goes on in the same conversation
    with that model (`run_chat` opens the engine again), after checking it as --model is.
    (No frozen dataclass: contextlib sets an exception's __traceback__ as it unwinds.)"""

    def __init__(self, model: str | None) -> None:
        super().__init__(model)
        self.model = model


async def _chat_here(
    settings: Settings,
    model: str | None,
    ephemeral: bool,
    console: Console,
    state: ChatState,
    back: SwitchModel | None,
) -> SwitchModel | None:
    """The chat in this process, with `model`, until it ends (None) or `/model NAME` names
    another (returned). A model a switch names that fails to open (a local file that does not
    load) is said, and the chat goes `back` to the one it had."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory

    from heron.channels.prompt_output import prompt_output

    async with AsyncExitStack() as stack:
        try:
            engine = await stack.enter_async_context(
                Engine.open(settings, model=model, ephemeral=ephemeral)
            )
        except HeronError as e:
            if back is None:
                raise
            console.print(f"{e}\nThe chat goes on with the model it had.", highlight=False)
            return back
        state.embedded = engine.choice.embedded
        if engine.choice.embedded:
            console.print(f"[yellow]{EMBEDDED_BANNER}[/yellow]")
        notice = start_notice(engine.registry, engine.sandbox)
        if notice:
            console.print(f"[yellow]{notice}[/yellow]", highlight=False)
        console.print(
            f"[dim]Heron · {engine.choice.provider}/{engine.choice.model} · conversation "
            f"{state.key} · /help for commands[/dim]"
        )
        read = None if engine.choice.embedded else file_summary(engine.choice)
        if read:  # what the local model's file allows: its window, whether it takes tools
            console.print(f"Model {read}", style="dim", markup=False, highlight=False)
        if engine.memory is not None and back is None:
            waiting = await asyncio.to_thread(opening_line, engine.memory)
            if waiting:
                console.print(f"[cyan]{waiting}[/cyan]", highlight=False)
        history = FileHistory(str(settings.paths.home / "chat_history"))
        session: PromptSession[str] = PromptSession(history=history)
        view = TerminalView(console, state)
        chat = view.chat_id = f"pid{os.getpid()}"
        opened = connect(engine, CHANNEL, chat, view.deliver, approve=view.approve)
        try:
            async with opened as conn, AsyncExitStack() as held, prompt_output() as out:
                view.after_shown = out.then
                with eof_as_a_key():
                    talk = _chat(engine, conn, state, view, session, held)
                    await _until_hung_up(talk, conn, state, view)
        except SwitchModel as switch:
            return switch  # the review at exit waits for the chat's real end
        if not ephemeral and not engine.choice.embedded:
            await _review_at_exit(settings, model, engine, state, console)
    return None


async def _switch_model(arg: str, engine: Engine, conn: InProcessAgent, console: Console) -> None:
    """`/model NAME`: checked as --model is (a typo's error is said and the chat stays as it
    was), then the running turn is waited for (Ctrl-C stops it) before the chat reopens."""
    try:
        choice = await asyncio.to_thread(engine.settings.model, arg)
    except HeronError as e:
        console.print(f"{e}\nThe model stays {engine.choice.provider}/{engine.choice.model}.")
        return
    await _settle(conn)
    console.print(f"[dim]Switching to {choice.provider}/{choice.model} …[/dim]")
    raise SwitchModel(arg)


NOTHING_NEW = "nothing was said since its last review"


async def exit_review(engine: Engine, state: ChatState) -> tuple[list[str], str | None]:
    """The conversations the review at exit reads: those of the chat with messages past their
    review cursor, whatever wrote them (/learn reviewed what it read; a fold did not). None of
    them: why not, the true reason (nothing new; the model's last call failed; none
    answered)."""
    store = engine.store
    unread = await store.call(unreviewed_keys, store, state.keys) if state.keys else []
    if not unread:
        return [], NOTHING_NEW
    skip = state.why_no_review()
    return (unread, None) if skip is None else ([], skip)


async def _review_at_exit(
    settings: Settings, model: str | None, engine: Engine, state: ChatState, console: Console
) -> None:
    """The memory review of what is new (in the background), unless nothing is, or the chat
    never had a usable model: a wrong key or a server down would fail it the same way, unseen."""
    if not state.keys or not settings.config.memory.review_on_close:
        return
    keys, skip = await exit_review(engine, state)
    if skip is None:
        # Printed, not written out: the console wraps it between words at its width.
        say = functools.partial(console.print, highlight=False, markup=False)
        review_on_close(settings, model, engine.choice, keys, say=say)
    else:
        console.print(RichText(f"Not reviewing this chat for memory: {skip}.", style="dim"))


@contextmanager
def eof_as_a_key() -> Iterator[None]:
    """Ctrl-D stays a key between two prompts. prompt_toolkit puts the terminal back in its
    line mode whenever no prompt is up (while a message is sent, say), and there the terminal
    itself takes a Ctrl-D as end of input and drops it, so a person's Ctrl-D pressed just then
    was lost. With the terminal's end-of-input character switched off for the chat, the key
    waits as a byte for the next prompt, which leaves as Ctrl-D does."""
    if not sys.stdin.isatty():
        yield
        return
    import termios

    fd = sys.stdin.fileno()
    before = termios.tcgetattr(fd)
    during = termios.tcgetattr(fd)
    during[6][termios.VEOF] = b"\0"  # _POSIX_VDISABLE on Linux: no end-of-input character
    termios.tcsetattr(fd, termios.TCSANOW, during)
    try:
        yield
    finally:
        with contextlib.suppress(termios.error):  # a terminal that closed has nothing to restore
            termios.tcsetattr(fd, termios.TCSANOW, before)


async def _chat_remote(path: Path, settings: Settings, console: Console, state: ChatState) -> None:
    """`heron chat` as a client of the running serve: the same prompt and rendering; the
    serve runs the turns (and shows its own notices), so this process opens no engine."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory

    from heron.channels.prompt_output import prompt_output
    from heron.channels.remote import ServeGone, connect_remote

    view = TerminalView(console, state)
    history = FileHistory(str(settings.paths.home / "chat_history"))
    session: PromptSession[str] = PromptSession(history=history)
    remote = connect_remote(path, CHANNEL, view.deliver, state.key, state.agent, view.approve)
    async with remote as conn:
        view.chat_id = conn.chat_id or ""
        state.embedded = conn.embedded

        def gone() -> None:  # the serve stopped: leave the prompt with ServeGone
            state.kept_on_gone = conn.kept_unanswered()
            if session.app.is_running:
                session.app.exit(exception=ServeGone("heron serve stopped"))

        conn.on_gone = gone
        console.print(
            f"[dim]Heron · {conn.model} · through heron serve · conversation {state.key} · "
            "/help for commands[/dim]"
        )
        read = conn.welcome.get("model_file")
        if conn.embedded:  # a key set in this shell does not reach the serve: say so
            console.print(f"[yellow]{escape(served_banner(settings))}[/yellow]")
        elif read:
            console.print(f"Model {read}", style="dim", markup=False, highlight=False)
        for said in conn.news():  # another Heron, or a config.toml changed since it started
            console.print(said, style="yellow", markup=False, highlight=False)
        async with AsyncExitStack() as held, prompt_output() as out:
            view.after_shown = out.then
            with eof_as_a_key():
                talk = _chat(None, conn, state, view, session, held)
                await _until_hung_up(talk, conn, state, view)
    note = serve_review_note(settings, state)
    if note is not None:
        console.print(RichText(note, style="dim"))


def serve_gone_note(state: ChatState) -> str:
    """What the chat says as it leaves because the serve stopped: with a message of its kept
    unanswered, that it is kept and what answers it; else how to go on."""
    if not state.kept_on_gone:
        return (
            "[red]heron: heron serve stopped.[/red] Start it again with `heron serve`, "
            "or run `heron chat` again to chat without it."
        )
    key = escape(state.key)
    return (
        "[red]heron: heron serve stopped before your message was answered.[/red] It is kept "
        f"in conversation {key!r}: `/retry` in `heron chat -c {key}` answers it (with "
        f"`heron serve` started again, or without it), as `heron run --retry -c {key}` does."
    )


def serve_review_note(settings: Settings, state: ChatState) -> str | None:
    """What leaving a chat through a serve says of memory (docs/memory.md, "Chat end"): the
    conversation goes on there (the browser, other chats), so its review is not this chat's
    end but the serve's nightly one, or /learn now. None when nothing was talked about or
    `[memory] review_on_close` is off (the person asked for no word of it)."""
    memory, review = settings.config.memory, settings.config.review
    if not state.keys or not memory.review_on_close:
        return None
    nightly = review.enabled is not False and memory.review_every_hours > 0
    later = (
        f"its nightly review at {review.time} reads it" if nightly else "no nightly review is on"
    )
    return (
        "Not reviewing this chat for memory here: the conversation goes on in heron serve, "
        f"and {later}; /learn reviews it now."
    )


async def _chat(
    engine: Engine | None,
    conn: InProcessAgent | RemoteAgent,
    state: ChatState,
    view: TerminalView,
    session: PromptSession[str],
    held: AsyncExitStack,
) -> None:
    """Read messages until Ctrl-D; the open conversation is marked present (an open chat)
    when the engine is this process's (a serve keeps its own)."""
    present = await _present(engine, state.key, held)
    keys = _stop_keys(conn, state, view)
    with _ctrl_c_signal(conn, state, view) as rearm:  # not in `held`: /resume closes that
        while True:
            if isinstance(conn, RemoteAgent) and conn.gone:  # the serve stopped: run_chat says so
                from heron.channels.remote import ServeGone

                raise ServeGone("heron serve stopped")
            try:
                text = await session.prompt_async(
                    view.prompt, refresh_interval=0.5, key_bindings=keys
                )
            except KeyboardInterrupt:  # Ctrl-C with nothing running: a fresh line
                rearm()
                continue
            except EOFError:
                rearm()
                await _leave(conn, state, view)
                return
            rearm()
            if view.answer(text):
                continue
            if text.strip() in ("/exit", "/quit"):
                await _leave(conn, state, view)
                return
            if present != state.key:  # /resume moved the chat to another conversation
                await held.aclose()
                present = await _present(engine, state.key, held)
            if not text.strip():
                continue
            try:
                handled = text.startswith("/") and await _command(
                    text, engine, conn, state, view, session
                )
            except EOFError:  # /exit or Ctrl-D at a command's own question (/resume's list)
                await _leave(conn, state, view)
                return
            finally:  # a command's own prompt (/resume's list, a checklist) dropped the handler
                rearm()
            if not handled:
                await send_turn(conn, state, view, text, with_files=True)


def _stop_keys(
    conn: InProcessAgent | RemoteAgent, state: ChatState, view: TerminalView
) -> KeyBindings:
    """Ctrl-C at the prompt. While the agent works it stops the turn (what it finished is
    kept) without leaving the prompt: a prompt left by Ctrl-C would stay on screen as a line
    in the middle of the reply, and what the person was typing is kept. At an approval it
    declines; with nothing running it gives a fresh line, as in a shell."""
    from prompt_toolkit.key_binding import KeyBindings

    keys = KeyBindings()

    @keys.add("c-c")
    @keys.add("<sigint>")  # SIGINT while the prompt is up (a `kill -INT`, or the key in line mode)
    def _(event: KeyPressEvent) -> None:
        if view.answer(""):
            return
        # Not running: the prompt was just left by Enter and its message is on its way (a
        # SIGINT queued in that instant), so the turn it opens is the one to stop.
        if view.sending:  # not handed to the agent yet: stopped once it is (`send_turn`)
            view.stopping = view.stop_after_send = True
            return
        if conn.running(state.key) or not event.app.is_running:
            view.stopping = True
            conn.send_nowait("/stop", state.key, state.agent)
            return
        event.app.exit(exception=KeyboardInterrupt())

    return keys


async def _leave(conn: InProcessAgent | RemoteAgent, state: ChatState, view: TerminalView) -> None:
    """Ctrl-D or /exit (an approval waiting here is declined first). Through a serve the chat
    only leaves: a turn running there goes on and its other clients see it end, as a client
    that disconnects stops nothing. In this process nothing would run the turn once the chat
    is gone: it is stopped as /stop stops it (what it finished is kept), and the chat says so."""
    view.answer("")
    if isinstance(conn, RemoteAgent):
        if conn.running(state.key):
            view.console.print(f"[dim]{GOES_ON.format(key=state.key)}[/dim]", highlight=False)
        view.console.print("[dim]Bye.[/dim]")
        return
    stopped = conn.running(state.key)
    if stopped:
        view.stopping = True
        await conn.send("/stop", state.key, state.agent)
    await _settle(conn)
    if stopped:
        view.console.print(f"[dim]{STOPPED_ON_LEAVING}[/dim]", highlight=False)
    view.console.print("[dim]Bye.[/dim]")


# What leaving says when a turn runs (`_leave`): through a serve it goes on, here it stops.
GOES_ON = "The turn goes on in heron serve: the browser and `heron chat -c {key}` show how it ends."
STOPPED_ON_LEAVING = (
    "Leaving stopped it: without heron serve, nothing runs a turn once its chat is gone."
)


async def _until_hung_up(
    chat: Awaitable[None], conn: InProcessAgent | RemoteAgent, state: ChatState, view: TerminalView
) -> None:
    """The chat, until Ctrl-D or until SIGTERM or SIGHUP ends it (`_hang_ups`): then the turn
    it stopped is given a while to end, and the chat leaves with 128 + the signal's number
    (143, 129), its terminal put back as it was on the way out."""
    with _hang_ups(conn, state, view) as ended:
        try:
            await chat
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if ended.number is None or task is None:
                raise
            task.uncancel()  # the signal's cancel, taken: the chat winds up below
        if ended.number is None:
            return
        await _wind_up(conn, view, ended.number)
    raise SystemExit(128 + ended.number)


@dataclass
class _Ended:
    """The signal that ends the chat, once one came (`_hang_ups`)."""

    number: int | None = None
    at: float = 0.0  # time.monotonic() of it


@contextmanager
def _hang_ups(
    conn: InProcessAgent | RemoteAgent, state: ChatState, view: TerminalView
) -> Iterator[_Ended]:
    """SIGTERM (`kill`, systemd, a session ending) and SIGHUP (the terminal window closed)
    end the chat as they end any program, but first stop the running turn as /stop does, in
    this process or in the serve: what it streamed and the tool work it finished are kept,
    the turn is closed as interrupted. The handler sends the /stop at once, then cancels the
    chat wherever it waits (a prompt, a settle), which unwinds it (`_chat`). A second signal
    ends the process at once, as it would have without this handler."""
    loop = asyncio.get_running_loop()
    chat = asyncio.current_task()
    ended = _Ended()

    def hung_up(number: int) -> None:
        if ended.number is not None:
            signalled_again(number, ended.at)
            return
        ended.number, ended.at = number, time.monotonic()
        view.answer("")  # an approval waiting: declined, as /stop declines it
        if conn.running(state.key):
            view.stopping = True
            conn.send_nowait("/stop", state.key, state.agent)
        if chat is not None:
            chat.cancel()

    def caught(number: int, frame: object) -> None:
        # At once, between two bytecodes, not when the loop gets to it: a terminal that
        # closed fails every write (EIO), and the loop may be about to print or redraw.
        if number == signal.SIGHUP:  # the descriptors, under the chat's PromptOutput
            for stream in (sys.__stdout__, sys.__stderr__):
                if stream is not None:
                    to_null(stream)
        loop.call_soon_threadsafe(hung_up, number)

    before = {number: signal.signal(number, caught) for number in HANG_UPS}
    try:
        yield ended
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


async def _wind_up(conn: InProcessAgent | RemoteAgent, view: TerminalView, number: int) -> None:
    """After SIGTERM or SIGHUP: the stopped turn has a while to end (and be stored as
    interrupted) before the process leaves; a serve gone meanwhile has nothing to wait for."""
    from heron.channels.remote import ServeGone

    with contextlib.suppress(TimeoutError, ConnectionError, ServeGone):
        await asyncio.wait_for(conn.settle(), STOP_WAIT)
    with contextlib.suppress(OSError):  # the terminal closed (SIGHUP): nobody reads it
        view.console.print(f"[dim]Ended by {signal.Signals(number).name}.[/dim]")


async def _present(engine: Engine | None, key: str, held: AsyncExitStack) -> str:
    if engine is None:
        return key
    store = engine.store
    conversation = await store.call(store.open_conversation, key)
    # Left (or /resume'd away from) with nothing said: no empty conversation stays behind.
    # Pushed first, so it runs once the chat's presence below has ended.
    held.push_async_callback(store.call, store.drop_if_empty, conversation.id)
    await held.enter_async_context(presence(store, conversation.id))
    return key


@contextmanager
def _ctrl_c_signal(
    conn: InProcessAgent | RemoteAgent, state: ChatState, view: TerminalView
) -> Iterator[Callable[[], None]]:
    """Ctrl-C when no prompt is up. The terminal is in its line mode then (between two
    prompts, while a reply is printed above the prompt, while the chat waits for the agent
    to settle), where it is the signal SIGINT, not a key: asyncio's own handler would cancel
    the chat. Here it does what the key does at the prompt (`_stop_keys`). A prompt takes
    SIGINT over while it is up and drops every handler when it ends, so the chat sets this
    one again after each prompt (the callable yielded)."""
    loop = asyncio.get_running_loop()

    def interrupt() -> None:
        if view.answer(""):
            return
        if view.sending:  # not handed to the agent yet: stopped once it is (`send_turn`)
            view.stopping = view.stop_after_send = True
            return
        if conn.running(state.key):
            view.stopping = True
            conn.send_nowait("/stop", state.key, state.agent)

    def arm() -> None:
        loop.add_signal_handler(signal.SIGINT, interrupt)

    arm()
    try:
        with _no_echoed_ctrl_c():
            yield arm
    finally:
        loop.remove_signal_handler(signal.SIGINT)


@contextmanager
def _no_echoed_ctrl_c() -> Iterator[None]:
    """In line mode a terminal echoes Ctrl-C as "^C" where the cursor is, in the middle of the
    reply or before "Stopped."; the chat says itself what the key did, so the echo is turned
    off while it runs (the terminal's ECHOCTL flag; a prompt keeps what it finds and puts it
    back) and restored when it ends."""
    try:
        import termios
    except ImportError:  # not POSIX: nothing echoes
        yield
        return
    try:
        fd = sys.stdin.fileno()
        before = termios.tcgetattr(fd)
    except (OSError, ValueError, termios.error):  # not a terminal: nothing echoes
        yield
        return
    quiet = list(before)
    quiet[3] = before[3] & ~termios.ECHOCTL  # the local modes
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        with contextlib.suppress(termios.error):  # a terminal that closed has nothing to restore
            termios.tcsetattr(fd, termios.TCSANOW, before)


async def _settle(conn: InProcessAgent | RemoteAgent) -> None:
    """Wait for the agent, outside the prompt: Ctrl-C stops it (`_ctrl_c_signal`)."""
    await conn.settle()


async def _command(
    text: str,
    engine: Engine | None,
    conn: InProcessAgent | RemoteAgent,
    state: ChatState,
    view: TerminalView,
    session: PromptSession[str],
) -> bool:
    """Chat commands of this terminal; False means the text goes on to the AgentLoop, which
    answers the engine's commands and passes anything else to the model."""
    console = view.console
    name, _, arg = text.strip().partition(" ")
    typo = commands.typo_notice(text, commands.NAMES + LOCAL_COMMANDS)
    if typo is not None:  # a typo of a command: said here, never sent to the model
        console.print(typo, highlight=False)
    elif name == "/help":
        said = commands.help_text(state.embedded) + "\n" + HELP
        console.print(hanging(said, console.width), highlight=False, markup=False)
    elif name == "/resume" and not arg:
        await _resume(engine, conn, state, view, session)
    elif name in ("/model", "/models") and arg and isinstance(conn, InProcessAgent):
        assert engine is not None  # a chat in this process has its engine
        await _switch_model(arg, engine, conn, console)
    elif name == "/show":
        _show(arg, state, console)
    elif name == "/attach":
        # Off the loop (a turn may be streaming): the file is read and a PDF's pages counted.
        said = await asyncio.to_thread(attach_command, arg, state)
        console.print(said, highlight=False, markup=False)
    elif name == "/memory" and arg.strip() == "review":
        await _review_either(engine, conn, console)
    elif name in ("/learn", "/reflect"):
        if await send_turn(conn, state, view, text):
            await _settle(conn)
            await _review_either(engine, conn, console, only_if_waiting=True)
    else:
        return False
    return True


async def _review_either(
    engine: Engine | None,
    conn: InProcessAgent | RemoteAgent,
    console: Console,
    only_if_waiting: bool = False,
) -> None:
    """/memory review here or through serve (after /learn and /reflect: only when their
    suggestions wait)."""
    if engine is None:
        assert isinstance(conn, RemoteAgent)  # no engine here: the chat is a serve's client
        await _review_remote(conn, console, only_if_waiting)
    elif not only_if_waiting or (engine.memory is not None and await _waiting(engine.memory)):
        await _review(engine, console)


async def _review(engine: Engine, console: Console) -> None:
    """/memory review: checklists of up to 10 in a dialog; checked items are kept, the rest of
    that checklist dropped; Esc leaves it and every later one waiting."""
    if engine.memory is None:
        console.print(commands.NO_MEMORY)
        return
    loop = asyncio.get_running_loop()

    def choose(batch: list[Suggestion]) -> set[int] | None:  # on the worker thread
        pairs = [(s.id, s.describe()) for s in batch]
        return asyncio.run_coroutine_threadsafe(_checklist(pairs), loop).result()

    text = await asyncio.to_thread(memory_command, engine.memory, "review", choose=choose)
    console.print(visible(text), markup=False, highlight=False)


async def _review_remote(conn: RemoteAgent, console: Console, only_if_waiting: bool) -> None:
    """/memory review through serve: the same checklists, shown here, decided by the serve
    (heron/serve/control.py), which prints back what the in-process review prints."""
    waiting = await conn.ask({"type": "memory_waiting"})
    items = [(int(i["id"]), str(i["line"])) for i in waiting.get("items") or []]
    if only_if_waiting and not items:
        return
    if not waiting.get("memory"):
        said = visible(str(waiting.get("text") or commands.NO_MEMORY))
        console.print(said, markup=False, highlight=False)
        return
    size = int(waiting.get("batch") or 10)
    shown: list[int] = []
    keep: set[int] = set()
    for start in range(0, len(items), size):
        batch = items[start : start + size]
        picked = await _checklist(batch)
        if picked is None:  # Esc: this checklist and every later one stay waiting
            break
        shown += [i for i, _ in batch]
        keep |= picked
    done = await conn.ask({"type": "memory_review", "shown": shown, "keep": sorted(keep)})
    console.print(visible(str(done.get("text") or "")), markup=False, highlight=False)


async def _checklist(batch: list[tuple[int, str]]) -> set[int] | None:
    """One checklist: (id, line) pairs; the ids to keep, or None for Esc, q or Cancel."""
    from heron.channels.memory_cli import checklist

    picked = await checklist(batch).run_async()
    return None if picked is None else set(picked)


def _show(arg: str, state: ChatState, console: Console) -> None:
    """/show N: the call and its whole result (the model may have read only part of it: the
    rest is kept under HERON_HOME, heron/saved.py `keep_whole`)."""
    count = len(state.results)
    if not count:
        console.print(  # numbered as this chat shows them: a resumed chat starts at 1
            "No tool calls shown in this chat yet: /show N opens the Nth one it shows. "
            f"Earlier ones: heron conversations show {state.key}",
            markup=False,
            highlight=False,
        )
        return
    if not arg.strip().isdigit() or not 1 <= int(arg) <= count:
        console.print(
            f"Give a tool call number from 1 to {count}."
            if count > 1
            else "There is one tool call: /show 1."
        )
        return
    pill = state.results[int(arg) - 1]
    whole = read_whole(state.home, pill.result) if state.home is not None else None
    name, args = escape(visible(pill.call.name)), escape(json.dumps(pill.call.args))
    console.print(f"[cyan]{name}[/cyan] {args}", highlight=False)
    console.print(visible(whole or pill.result.content), markup=False, highlight=False)


async def _waiting(memory: MemoryService) -> bool:
    """Whether memory suggestions wait for review (counted off the loop)."""
    return await asyncio.to_thread(memory.count_waiting) > 0


async def send_turn(
    conn: InProcessAgent | RemoteAgent,
    state: ChatState,
    view: TerminalView,
    text: str,
    with_files: bool = False,
) -> bool:
    """Sends what starts a turn (a message, or a command the AgentLoop answers); False when
    config.toml broke since the chat opened: then the chat says why, as `heron run` would,
    and sends nothing (the /attach files stay for the next message). The same with a serve
    or without: a serve keeps the config it started with, and an in-process chat the one it
    opened with, so the file is read again here (once per change). Through a serve, a file
    that loads but changed since the serve started is said once (RemoteAgent.news). A Ctrl-C
    pressed before the message is handed to the agent (right after Enter) stops the turn it
    opens, sent once the message is: sent before it, the stop would find nothing to stop."""
    stop = text.strip() == "/stop"  # never refused: a broken file must not keep a turn going
    view.stopping = view.stopping or text.strip() in ("/stop", "/new")  # said by their replies
    view.sending += 1
    try:
        problem = await state.config.problem() if state.config is not None and not stop else None
        if problem is None:
            for said in conn.news():  # through a serve: config.toml changed since it started
                view.console.print(said, style="yellow", markup=False, highlight=False)
            files = state.take_files() if with_files else ()
            await conn.send(text, state.key, state.agent, files)
    finally:
        view.sending -= 1
    if problem is not None:
        said = problem.args[0] if problem.args else str(problem)
        told = f"{said}\n{problem.hint}" if problem.hint else said
        view.message(OutboundMessage(CHANNEL, view.chat_id, state.key, told, "error"))
    if view.stop_after_send and not view.sending:
        view.stop_after_send = False
        if problem is None:
            conn.send_nowait("/stop", state.key, state.agent)
    return problem is None


async def _resume(
    engine: Engine | None,
    conn: InProcessAgent | RemoteAgent,
    state: ChatState,
    view: TerminalView,
    session: PromptSession[str],
) -> None:
    console = view.console
    if engine is not None:
        found = await engine.store.call(engine.store.conversations, 20)
        rows = [(c.key, c.title) for c in found]
    else:
        rows = await conn.conversations(20)  # type: ignore[union-attr]
    if not rows:
        console.print("No earlier conversations.")
        return
    for i, (key, title) in enumerate(rows, 1):
        console.print(f"{i:3}. {key}  [dim]{escape(visible(title or ''))}[/dim]", highlight=False)
    picked = await _pick(session, console, len(rows), state.key)
    if isinstance(picked, str):  # a message typed at the list's prompt: sent, not lost
        await send_turn(conn, state, view, picked, with_files=True)
    elif picked is not None:
        await send_turn(conn, state, view, f"/resume {rows[picked - 1][0]}")


async def _pick(
    session: PromptSession[str], console: Console, count: int, key: str
) -> int | str | None:
    """The number picked from the /resume list, asked until it is one of the list; None when
    the person closes the list (Enter, Ctrl-C). Words that are no number (at least two, or a
    question) are a message typed there: the list closes and they are returned, to be sent in
    the conversation still open (they were thrown away). /exit and /quit (and Ctrl-D) leave the
    chat from here as from the prompt: EOFError, which the chat loop takes as Ctrl-D."""
    while True:
        try:
            choice = (
                await session.prompt_async("Number to resume (Enter closes the list): ")
            ).strip()
        except KeyboardInterrupt:
            choice = ""
        if choice in ("/exit", "/quit"):
            raise EOFError
        if not choice:
            console.print(f"Closed the list; still in {key}.", markup=False, highlight=False)
            return None
        if choice.isdigit() and 1 <= int(choice) <= count:
            return int(choice)
        if not choice.startswith("/") and (len(choice.split()) > 1 or choice.endswith("?")):
            console.print(f"Closed the list; sending that in {key}.", markup=False, highlight=False)
            return choice
        console.print(
            f"{choice} is not on the list: type a number from 1 to {count}, or Enter to close it.",
            markup=False,
            highlight=False,
        )
