"""`heron run`: one message in, the reply streamed to stdout, progress and errors to stderr.

The message goes through the AgentLoop like every channel's: the one of a running `heron serve`
when its control socket answers (heron/channels/remote.py), else one started in this process
(heron/channels/inprocess.py). This module only prints what comes back, the same either way.
The engine, the config and the providers are imported only on the in-process path, so a
message through serve costs no SDK import.

It ends as a Unix tool does when what it runs under ends it: SIGINT and SIGTERM stop the turn
as /stop does (what it finished is kept, the JSON object still printed), and a reader of
stdout that went away (`heron run ... | head -1`) ends the run quietly (exit 141, as SIGPIPE
would), its turn kept: finished by the serve, or stopped as Ctrl-C stops it in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import signal
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, BinaryIO, Protocol, TextIO

from heron.bus import (
    ALREADY_ANSWERED,
    KEEPING_CODE,
    MAIL_BREAK,
    NOTHING_SINCE_NEW,
    NOTHING_TO_RETRY,
    RETRY_MARKER,
    UNANSWERED_CODE,
    Outbound,
    OutboundMessage,
    TurnEnd,
    TurnEvent,
    needs_model,
)
from heron.channels.early import _EARLY, signalled_again, taken
from heron.channels.visible import command_shown, is_terminal, visible
from heron.messages import File, ToolCall, new_key

if TYPE_CHECKING:
    from pathlib import Path

    from heron.config import Settings
    from heron.errors import HeronError
    from heron.providers.base import Provider

EMBEDDED_BANNER = (
    "Offline demo model (SmolLM2-135M, no tools, short answers) for trying Heron out; for real "
    "work set ANTHROPIC_API_KEY, OPENAI_API_KEY or HERON_BASE_URL (see README)."
)
# Through a serve on the offline model, a key set in this shell does not reach it: the way out
# is a restart (the browser's copy of the notice says so too, heron/web/static/app.js).
SERVED_BANNER = EMBEDDED_BANNER.replace(
    "HERON_BASE_URL (see README)", "HERON_BASE_URL and start heron serve again (see README)"
)
# ...and when this shell's settings already name a real model, which one.
SERVED_OTHER = (
    "heron serve runs the offline demo model (SmolLM2-135M, no tools, short answers); this "
    "shell's settings name {named}: restart heron serve to use it."
)
CHANNEL = "script"
NOT_RETRIED = (
    NOTHING_TO_RETRY,
    NOTHING_SINCE_NEW,
    ALREADY_ANSWERED,
)  # --retry's answers when it answered nothing
STOP_WAIT = 10.0  # seconds a stopped turn has to say it ended before heron run leaves anyway
PIPE_CLOSED = 128 + signal.SIGPIPE  # 141: the status of a tool whose reader went away
READER_GONE = "a closed stdout"  # what stopped an in-process turn whose reader went away


class RunCut(Exception):
    """A signal or a closed stdout ended `heron run` before its turn did; what could be
    printed is printed, and the process exits with `code` (128 + the signal's number)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _Agent(Protocol):
    """What `heron run` uses of its connection, in this process or to a serve."""

    async def send(
        self, text: str, key: str, agent: str = "default", files: tuple[File, ...] = ()
    ) -> None: ...

    async def settle(self) -> None: ...


class ReplyPrinter:
    """The reply's text on stdout; tool calls, notices and errors on stderr. A terminal sees
    the reply as it streams; a pipe or a file gets it whole when the turn ends (`hold`), so a
    script reads only the reply as stored, never an attempt a cut stream started and its
    retry replaced (a terminal is shown that attempt and the retry's marker)."""

    def __init__(
        self,
        out: TextIO,
        err: TextIO,
        as_json: bool = False,
        key: str = "",
        served: bool = False,
        stream: bool = False,
    ) -> None:
        self.out, self.err = out, err
        self.key, self.served = key, served  # for how to answer a question (`question_note`)
        self.as_json = as_json  # hold the reply for one JSON object at the end (_finish)
        # Hold the reply to write it at the end: for the JSON object, or for a stdout that
        # is not a terminal (what was written cannot be taken back when a stream restarts),
        # unless `heron run --stream` asks to see it live there anyway.
        self.hold = as_json or not (stream or is_terminal(out))
        # A terminal is shown the reply with its control characters made visible (an escape
        # sequence the model wrote would repaint the screen or write the clipboard); a pipe or
        # a file gets the exact text, as stored (heron/channels/visible.py).
        self.out_shown = is_terminal(out)
        self.err_shown = is_terminal(err)
        self.reply: list[str] = []
        # Without a serve the run waits for the turns its own one started (a subagent's result
        # announced, a goal's nudges): their answers, each printed as a paragraph of its own.
        self.later: list[str] = []
        self.wrote = False
        self.at_line_start = True
        self.end: TurnEnd | None = None
        self.asked: dict[str, str] = {}  # approval id -> its command (approval_end names none)
        # Through a face with no worker alive: the notice saying the message waits queued.
        self.unstaffed: str | None = None
        # The serve stopped with the message unread: the notice saying where it is kept.
        self.unanswered: str | None = None
        # What ends the wait for the turn early: a signal, or the reader of stdout gone.
        self.signal: signal.Signals | None = None
        self.signalled_at = 0.0  # time.monotonic() of the signal
        self.reader_gone = False
        self.watched: int | None = None  # stdout's descriptor, watched for its reader (_cuts)
        self.cut = asyncio.Event()
        self.sent = False  # the message went out (a signal before that: nothing was stored)
        self.cut_short = False  # the turn was stopped (or left to the serve) for `cut`
        self.stored = False  # its message is known to be in the store (`saved`)
        self.serve_gone = False  # the serve stopped before the turn's end was heard
        self.workers = False  # that serve runs turns on workers: one may go on without it
        # Where the record's part of the reply ends: text streamed before a tool call is
        # stored with the call; what streamed since (`unkept`) only when the turn saves.
        self.kept_at = 0  # characters of the held reply
        self.unkept = False
        # Through a serve, once this run's message went to the running turn as mail: what
        # that turn streams until it reads the mail answers another message (`_before_mail`).
        self.before_mail: list[str] | None = None
        # The offline model's notice, through a serve: said when a turn takes the message, not
        # before a refusal (a broken config.toml: nothing ran, no model answered).
        self.banner: str | None = None

    async def deliver(self, item: Outbound) -> None:
        if isinstance(item, TurnEvent):
            self.event(item)
        else:
            self.message(item)

    def event(self, ev: TurnEvent) -> None:
        if ev.kind == "saved" or (ev.kind == "turn_start" and ev.message_id is not None):
            self.stored = True  # in-process `saved`; through a serve, its start names the row
        if self.banner is not None and ev.kind in ("turn_start", "mail", "queued"):
            self.note(self.banner)
            self.banner = None
        if self.before_mail is not None and self._before_mail(ev):
            return
        if ev.kind == "delta" and ev.text:
            self.write(ev.text)
            self.unkept = True
        elif ev.kind == "tool_end" and ev.call is not None and ev.result is not None:
            self.line_break()
            self.kept_at, self.unkept = len("".join(self.reply)), False
            status = "error" if ev.result.is_error else "ok"
            self.note(f"[{ev.call.name} {status} {ev.seconds:.1f}s{call_brief(ev.call)}]")
        elif ev.kind == "retry":
            self.note(f"[retrying in {ev.seconds:.1f}s: {ev.text}]")
        elif ev.kind == "restart":  # the stream was cut; what follows is the reply anew
            self.restart(ev.text)
        elif ev.kind == "mail":  # through serve: the conversation's turn was running
            self.note("heron: the conversation is busy; your message went to the running turn")
            self.before_mail = []
            # The serve wrote it to disk before saying so (heron/store/held.py): a serve
            # killed before the turn stored it shows it, after its restart, unanswered.
            self.stored = True
        elif ev.kind == "queued":
            self.note("heron: the conversation is busy; your message waits for the running turn")
        elif ev.kind == "carried":  # that turn ended unread: the next one answers it
            self.before_mail = None
            self.note(
                "heron: the running turn ended without reading your message; "
                "the next turn answers it"
            )
        elif ev.kind == "approval" and ev.approval is not None:  # through serve: others answer
            from heron.tools.approval import approval_label

            asked = ev.approval
            self.asked[asked.id] = asked.command
            label = approval_label(asked.tool, asked.confined)
            shown, after = command_shown(label, asked.command)
            self.note(
                f"heron: the agent wants to run ({label}):\n{shown}\n{after}\n"
                "  waiting for an answer from the browser or a heron chat on this conversation"
            )
        elif ev.kind == "approval_end" and ev.approval is not None:
            command = ev.approval.command or self.asked.pop(ev.approval.id, "")
            what = repr(command) if command else "the command waiting for approval"
            self.note(f"heron: {what} {ev.approval.outcome()}")
        elif ev.kind == "turn_end":
            self.end = ev.end

    def _before_mail(self, ev: TurnEvent) -> bool:
        """Whether `ev` is the running turn's before it read this run's mail: held, not shown
        (it answers another message, and would start mid-word). The mail is read after a
        tool phase, or after a reply, where the run streams `MAIL_BREAK`: what follows is
        shown. A turn that ends with neither seen read it just before streaming what is
        held (the mail came between a tool phase's end and its read): that is shown."""
        held = self.before_mail
        assert held is not None
        if ev.kind == "tool_end" or (ev.kind == "delta" and ev.text == MAIL_BREAK):
            self.before_mail = None  # the mail is read here: what follows answers it
            return True
        if ev.kind == "delta":
            held.append(ev.text)
        if ev.kind in ("delta", "tool_start"):
            return True
        if ev.kind == "restart":  # a cut stream starts again: it takes back what it streamed
            text = "".join(held)
            kept = text[: len(text) - len(ev.text)] if text.endswith(ev.text) else ""
            self.before_mail = [kept]
            return True
        if ev.kind == "turn_end":
            self.before_mail = None
            if "".join(held):
                self.write("".join(held))
        return False

    def message(self, m: OutboundMessage) -> None:
        if m.kind == "command" and self.cut_short:
            return  # the answer to the /stop a signal sent: the end says it
        if m.kind == "command" and self.end is None:  # answered at once beside a running
            self.end = TurnEnd(True, "command", reply=m.text)  # turn: no turn_end of its own
        if m.kind == "notice" and m.code == KEEPING_CODE:
            return  # its message is being kept: the `unanswered` notice that follows says so
        if m.kind == "notice" and m.code == UNANSWERED_CODE:  # the serve stopped first
            self.unanswered = m.text
            if not self.as_json:  # said once, at the end, with the JSON object
                if not self.hold:
                    self.line_break()
                self.note(f"heron: {m.text}")
        elif m.kind == "notice":  # after the reply's line (a goal parked as its turn ended):
            if not self.hold:  # in a terminal stdout and stderr share the screen
                self.line_break()
            self.note(m.text)
        elif m.kind in ("message", "question"):  # the agent spoke (`message`) or asks
            self.line_break()
            self.write(m.text + "\n")
            if m.kind == "question":
                self.note(question_note(self.key, self.served))
        elif m.kind == "answer" and self._after_own_turn():
            self.later_answer(m.text)
        elif m.kind != "error" and not self.wrote:  # an answer that did not stream
            self.write(m.text)

    def _after_own_turn(self) -> bool:
        """Whether an answer now is a later turn's: in this process, after the run's own turn
        ended (through a serve the run ends with its turn, so none comes)."""
        return not self.served and self.end is not None and self.end.outcome != "command"

    def later_answer(self, text: str) -> None:
        """A later turn's answer (`later`): a paragraph after the reply; in --json, its own
        field, so `reply` stays the run's own turn's."""
        self.later.append(text)
        if self.as_json:
            return
        if self.wrote:
            self.line_break()
            self.write("\n")
        self.write(text)

    def restart(self, taken_back: str) -> None:
        """A stream that starts again: a held reply drops what the dead attempt streamed (the
        event's text); a terminal, which has shown it, is told with the marker."""
        held = "".join(self.reply)
        if self.hold and held.endswith(taken_back):
            kept = held[: len(held) - len(taken_back)]
            self.reply = [kept] if kept else []
            self.wrote, self.at_line_start = bool(kept), kept.endswith("\n") or not kept
            return
        self.line_break()  # (held text that does not end so is left, and marked, as shown)
        self.write(RETRY_MARKER + "\n")

    def write(self, text: str) -> None:
        if self.hold:
            self.reply.append(text)
        else:
            self.emit(text)
        self.wrote = True
        self.at_line_start = text.endswith("\n")

    def emit(self, text: str) -> None:
        """`text` on stdout now, unless its reader went away (`left`)."""
        if self.reader_gone:
            return
        try:
            self.out.write(visible(text) if self.out_shown else text)
            self.out.flush()
        except BrokenPipeError:  # `| head -1` has read its line and left
            self.left()

    def left(self) -> None:
        """Nobody reads stdout any more: stop writing there, and end the run (`_exchange`)."""
        self.unwatch()  # before the descriptor is pointed at /dev/null
        self.reader_gone = True
        to_null(self.out)
        self.cut.set()

    def unwatch(self) -> None:
        if self.watched is not None:
            asyncio.get_running_loop().remove_reader(self.watched)
            self.watched = None

    def signalled(self, number: int) -> None:
        """SIGINT, SIGTERM or SIGHUP: stop the turn (`_exchange`). A second one ends the
        process at once, as the signal would have without this handler."""
        if self.signal is not None:
            signalled_again(number, self.signalled_at)
            return
        self.signal, self.signalled_at = signal.Signals(number), time.monotonic()
        if number == signal.SIGHUP:
            self.hung_up()
        self.cut.set()

    def hung_up(self) -> None:
        """SIGHUP: a terminal that closed fails every write (EIO), so stdout and stderr go to
        /dev/null where they are one; a file or a pipe still gets the rest (the JSON line)."""
        for stream in (self.out, self.err):
            with contextlib.suppress(OSError, ValueError):
                if stream.isatty():
                    to_null(stream)

    def line_break(self) -> None:
        if not self.at_line_start:
            self.write("\n")

    def note(self, text: str) -> None:
        try:
            self.err.write((visible(text) if self.err_shown else text) + "\n")
            self.err.flush()
        except BrokenPipeError:  # nobody reads stderr either: nothing to tell
            to_null(self.err)


BRIEF_CHARS = 40  # of a tool call's first argument on its stderr line


def call_brief(call: ToolCall) -> str:
    """`: "<first argument>"`, cut to BRIEF_CHARS: enough to tell apart the calls of one
    reply, whose lines come in the order they finish. Control characters are shown escaped
    whatever stderr is: the model wrote them, and the line is a label, not its content."""
    if not call.args:
        return ""
    first = next(iter(call.args.values()))
    text = first if isinstance(first, str) else json.dumps(first, ensure_ascii=False)
    text = visible(" ".join(text.split()))  # one line
    cut = text if len(text) <= BRIEF_CHARS else text[: BRIEF_CHARS - 1].rstrip() + "…"
    return f': "{cut}"'


def to_null(stream: TextIO) -> None:
    """Point `stream`'s descriptor at /dev/null, so that what its buffer still holds (and the
    interpreter's flush at exit) goes nowhere instead of raising BrokenPipeError again."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return  # not a descriptor (a test's StringIO): nothing flushes it at exit
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


@contextmanager
def _cuts(printer: ReplyPrinter) -> Iterator[None]:
    """While heron run waits on its turn: SIGINT and SIGTERM go to `printer.signalled` (the
    handlers before, asyncio.run's own for SIGINT or the default, are put back after), and a
    pipe on stdout whose reader closed it calls `printer.left` at once, not at the next write
    (a long tool call writes nothing for minutes)."""
    loop = asyncio.get_running_loop()
    before = {number: signal.getsignal(number) for number in taken()}
    if _EARLY:
        printer.signalled(_EARLY[0][0])
        printer.signalled_at = _EARLY[0][1]
    try:
        for number in before:
            loop.add_signal_handler(number, printer.signalled, number)
    except (RuntimeError, ValueError):  # not the main thread: signals are not ours to take
        before = {}
    _watch_reader(printer)
    try:
        yield
    finally:
        printer.unwatch()
        for number, handler in before.items():
            loop.remove_signal_handler(number)
            signal.signal(number, handler)


def _watch_reader(printer: ReplyPrinter) -> None:
    """When stdout is a pipe, watch it for its reader going away: epoll says so on the write
    end, as an error, which asyncio hands to a reader callback."""
    import stat

    try:
        fd = printer.out.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
    except (OSError, ValueError, AttributeError):  # a test's StringIO
        return
    asyncio.get_running_loop().add_reader(fd, printer.left)
    printer.watched = fd


async def _exchange(
    conn: _Agent,
    printer: ReplyPrinter,
    stop: Callable[[str], Awaitable[object]],
    message: tuple[str, str, str, tuple[File, ...]],
    *,
    served: bool,
) -> None:
    """Send the message and wait for its turn to end, unless a signal or the reader of
    stdout gone cuts the wait short: then `stop` stops the turn as /stop does (its message
    and what it finished kept), except that a serve finishes a turn whose reader left."""
    if printer.cut.is_set():  # a signal, or no reader, before the message went out
        printer.cut_short = True  # nothing is sent or stored
        return
    text, key, agent, files = message
    await conn.send(text, key, agent, files)
    printer.sent = True
    settled = asyncio.ensure_future(conn.settle())
    cut = asyncio.ensure_future(printer.cut.wait())
    await asyncio.wait({settled, cut}, return_when=asyncio.FIRST_COMPLETED)
    cut.cancel()
    if settled.done():
        return settled.result()  # a ServeGone raises here
    printer.cut_short = True
    if printer.signal is None and served:
        settled.cancel()  # the serve finishes the turn and keeps it whole; the run leaves
        return None
    with contextlib.suppress(ConnectionError, OSError):  # a serve gone: nothing to stop
        await stop(printer.signal.name if printer.signal is not None else READER_GONE)
    with contextlib.suppress(TimeoutError, ConnectionError):
        await asyncio.wait_for(settled, STOP_WAIT)
    return None


def question_note(key: str, served: bool) -> str:
    """How a question (ask_user) is answered when the run is a script, which reads nothing
    from the person: from another client of the conversation, which only a serve lets in."""
    if served:
        where = f"answer it from `heron chat -c {key}` or the browser (heron serve's page)"
    else:
        where = (
            "no other client reaches this run without `heron serve`: only the deadline, "
            f"Ctrl-C or `heron runs cancel` end the wait (with a serve, `heron chat -c {key}` "
            "or the browser answers)"
        )
    return f"heron: the agent waits for an answer this script cannot give; {where}."


def message_from(message: str, stdin: BinaryIO | None = None) -> tuple[str, int]:
    """The message of `heron run` and the count of bytes that were not UTF-8 (each kept as
    U+FFFD): '-' is stdin; an argument with stdin piped in is the argument, then stdin as a
    fenced block (`echo ctx | heron run "summarise"`)."""
    from heron.messages import decode_text, scrub_text

    stdin = stdin if stdin is not None else sys.stdin.buffer
    if message == "-":
        return decode_text(stdin.read())
    text, bad = scrub_text(message)
    piped = _piped(stdin)
    if piped:
        block, more = decode_text(piped)
        if block.strip():
            fence = "`" * max(3, _longest_backticks(block) + 1)
            text = f"{text}\n\n{fence}\n{block.rstrip()}\n{fence}"
        bad += more
    return text, bad


def _piped(stdin: BinaryIO) -> bytes:
    """What a pipe or a redirected file on stdin holds; nothing from a terminal, /dev/null or
    a socket (a terminal would wait for the person to type)."""
    import os
    import stat

    try:
        mode = os.fstat(stdin.fileno()).st_mode
    except (OSError, ValueError):  # no descriptor: a test's BytesIO is read as given
        return stdin.read() if not stdin.isatty() else b""
    return stdin.read() if stat.S_ISFIFO(mode) or stat.S_ISREG(mode) else b""


def _longest_backticks(text: str) -> int:
    import re

    return max((len(run) for run in re.findall("`+", text)), default=0)


async def run_message(
    load_settings: Callable[[], Settings],
    text: str,
    agent: str,
    key: str | None,
    model: str | None,
    ephemeral: bool,
    out: TextIO | None = None,
    err: TextIO | None = None,
    *,
    as_json: bool = False,
    files: tuple[File, ...] = (),
    stream: bool = False,
) -> bool:
    """Through a running serve when one answers (and the run asks for nothing it cannot give:
    another model, or keeping nothing), else in this process."""
    out = sys.stdout if out is None else out  # read now: a caller may have swapped it
    err = sys.stderr if err is None else err
    if model is None and not ephemeral:
        from heron.channels.remote import ServeDiffers, serve_socket

        path = serve_socket()
        if path is not None:
            try:
                return await run_remote(
                    path, text, agent, key, out, err, as_json=as_json, files=files, stream=stream
                )
            except ServeDiffers as differs:
                print(differs.notice(), file=err)
            except ConnectionRefusedError:
                pass  # a socket left by a serve that is gone: run here
    settings = load_settings()
    if model is not None or ephemeral:
        from heron.channels.remote import beside_serve

        note = beside_serve(settings.paths.home, model, "message")
        if note is not None:
            print(note, file=err)
    return await run_once(
        settings,
        text,
        agent,
        key,
        model,
        ephemeral,
        out,
        err,
        as_json=as_json,
        files=files,
        stream=stream,
    )


def attached_files(paths: list[str], load_settings: Callable[[], Settings]) -> tuple[File, ...]:
    """`heron run -a PATH ...` as attachments, each once, each and all within the caps of
    `[attachments]`; an AttachmentError names the first that is not."""
    if not paths:
        return ()
    from heron.attachments import check_total, from_path, once

    caps = load_settings().config.attachments
    files = once([from_path(p, caps) for p in paths])  # -a X -a X: X goes once
    check_total(files, caps)
    return tuple(files)


def served_banner(settings: Settings | None = None) -> str:
    """The offline notice for a run or a chat through a serve on the offline model: what this
    shell's settings (`settings`, else loaded now) name instead when they name a real model, as
    `heron status` compares them; else how to get one (set a key, then restart the serve)."""
    from heron.config import Settings
    from heron.errors import HeronError

    try:
        choice = (settings or Settings.load()).model()
    except HeronError:  # nothing else configured, or config.toml broken: the general way out
        return SERVED_BANNER
    if choice.embedded:
        return SERVED_BANNER
    return SERVED_OTHER.format(named=f"{choice.provider}/{choice.model}")


async def run_remote(
    path: Path,
    text: str,
    agent: str,
    key: str | None,
    out: TextIO,
    err: TextIO,
    *,
    as_json: bool = False,
    files: tuple[File, ...] = (),
    stream: bool = False,
) -> bool:
    from heron.channels.remote import ServeGone, connect_remote

    key = key or new_key("run")
    printer = ReplyPrinter(out, err, as_json, key, served=True, stream=stream)
    # Only what answers this message: another turn of the conversation (someone else's, a
    # goal's nudge) is not this run's output.
    opened = connect_remote(path, CHANNEL, printer.deliver, key, agent, own_only=True)
    with _cuts(printer):
        async with opened as conn:
            if conn.embedded and needs_model(text):  # not for a /stop: no model answers it
                printer.banner = served_banner()  # said once a turn takes the message

            async def stop(by: str) -> None:  # the serve names it "/stop from heron run"
                await conn.send("/stop", key, agent)

            try:
                await _exchange(conn, printer, stop, (text, key, agent, files), served=True)
            except ServeGone:  # `_said` tells it, with what became of the turn
                printer.serve_gone = True
                printer.workers = "workers" in conn.welcome  # only a face with workers says so
    if conn.refusals:  # as the same input fails in-process: the message and exit 2
        from heron.errors import ConfigError

        refusal = conn.refusals[0]
        raise ConfigError(str(refusal.get("message")), hint=refusal.get("hint") or None)
    if conn.unstaffed and printer.end is None:  # queued, no worker to run it (printed): exit 1
        printer.unstaffed = conn.unstaffed[0]
    ended = _finish(printer, key)
    # Said after the reply (_finish ended its last line): the serve is another Heron, or runs
    # an older config.toml. Never for a refused message: a file broken since is refused
    # above, as in-process, and nothing more is said of it.
    for said in conn.news():
        printer.note(said)  # a closed stderr too: nothing to tell, no BrokenPipeError
    return ended


async def run_once(
    settings: Settings,
    text: str,
    agent: str,
    key: str | None,
    model: str | None,
    ephemeral: bool,
    out: TextIO | None = None,
    err: TextIO | None = None,
    provider: Provider | None = None,
    *,
    as_json: bool = False,
    files: tuple[File, ...] = (),
    stream: bool = False,
) -> bool:
    out = sys.stdout if out is None else out  # read now: a caller may have swapped it
    err = sys.stderr if err is None else err
    from heron.agent.engine import Engine
    from heron.channels.inprocess import connect
    from heron.tools.approval import start_notice

    key = key or new_key("run")
    printer = ReplyPrinter(out, err, as_json, key, stream=stream)
    # One message and the process ends: no kernel outlives the turn (through `heron serve`,
    # it is kept for the conversation's later turns). A command no model answers (/stop,
    # /new) neither loads the offline model (seconds, then its stop) nor names it.
    model_needed = needs_model(text)
    one = Engine.open(
        settings,
        model=model,
        ephemeral=ephemeral,
        provider=provider,
        one_shot=True,
        start_model=model_needed,
    )
    with _cuts(printer):
        async with one as engine:
            if engine.choice.embedded and model_needed:
                printer.note(EMBEDDED_BANNER)
            notice = start_notice(engine.registry, engine.sandbox)
            if notice:
                printer.note(f"heron: {notice}")
            approve = functools.partial(approve_in_terminal, err)
            opened = connect(engine, CHANNEL, "stdin", printer.deliver, idle=False, approve=approve)
            async with opened as conn:
                stop = functools.partial(conn.loop.stop, key)
                await _exchange(conn, printer, stop, (text, key, agent, files), served=False)
        end = printer.end
        # Worked out as the serve's turn_end does; a usage not all counted has no cost.
        if end is not None and end.cost_usd is None and not end.usage_unknown:
            from heron.trace.prices import PriceTable

            prices = PriceTable.from_config(settings.config.prices)
            choice = engine.choice
            cost = prices.known_cost(choice.model, end.usage, choice.provider)
            printer.end = dataclasses.replace(end, cost_usd=cost)
    return _finish(printer, key)


def _finish(printer: ReplyPrinter, key: str) -> bool:
    """End the output; say why the turn failed, if it did, and how to answer it again. Then a
    run a signal stopped, or whose reader went away, raises RunCut with its exit status."""
    ok = _said(printer, key)
    if printer.reader_gone:
        raise RunCut(PIPE_CLOSED)
    if printer.signal is not None and printer.cut_short and not ok:
        raise RunCut(128 + printer.signal)
    return ok


def _said(printer: ReplyPrinter, key: str) -> bool:
    """The JSON object, or the end of the reply and, on stderr, why it is not whole."""
    if printer.as_json:
        result = result_json(printer, key)
        printer.emit(json.dumps(result, ensure_ascii=False) + "\n")
        return bool(result["ok"])  # the exit code says what `ok` says
    gone = printer.end is None and printer.serve_gone
    open_line = printer.wrote and not printer.at_line_start
    if printer.hold:  # the reply as stored, written now that the turn ended
        shown = stored_reply(printer)
        printer.emit(shown)
        open_line = bool(shown) and not shown.endswith("\n")
    if open_line:
        printer.emit("\n")
    if printer.reader_gone:
        return False  # quietly, as a tool SIGPIPE ends: its turn is kept (module docstring)
    end = printer.end
    if end is None and printer.unstaffed is not None:
        return False  # the notice said why and what to do; the message is not lost
    if end is None and printer.unanswered is not None:
        return False  # kept unanswered as the serve stopped: the notice said where
    if end is not None and end.ok:
        return True
    error, hint = _why(printer, key)
    if _stopped_by(printer) is None and not gone:
        error = f"the turn failed: {error}"
    elif printer.sent and not gone:
        error = f"the turn was {error}. What it finished is kept."
    printer.note(f"heron: {error}\n{hint}")
    return False


def stored_reply(printer: ReplyPrinter) -> str:
    """The held reply as the record keeps it. A turn that failed, or whose serve went away,
    keeps none of what streamed since its last tool call (a cut stream's last attempt, say):
    that part is left out. A stopped turn keeps it, marked as stopped."""
    held = "".join(printer.reply)
    end = printer.end
    # Failed, not stopped: a stop (a signal, /stop, a serve shutting down) keeps what streamed.
    failed = end is not None and end.stop == "error" and _stopped_by(printer) is None
    gone = end is None and printer.serve_gone
    return held[: printer.kept_at] if gone or (failed and printer.unkept) else held


def _stopped_by(printer: ReplyPrinter) -> str | None:
    """What stopped the turn, when something did: this run's signal, or /stop, /new from
    another client (`TurnEnd.stopped_by`)."""
    if printer.signal is not None and printer.cut_short:
        return printer.signal.name
    end = printer.end
    return end.stopped_by if end is not None and not end.ok else None


def _why(printer: ReplyPrinter, key: str) -> tuple[str, str]:
    """A turn that did not end well: what happened (`error`) and what to do (`hint`)."""
    end, stopped = printer.end, _stopped_by(printer)
    if stopped is not None and not printer.sent:
        return f"stopped by {stopped} before the message was sent", UNSENT
    if stopped is not None:
        hint = after_stop(stopped, key) if end is not None or printer.stored else unknown(key)
        return f"stopped by {stopped}", hint
    if end is None and printer.serve_gone:
        return serve_gone(printer, key)
    error = end.error if end is not None and end.error else "it was stopped"
    return error, failed_hint(end, key) if end is not None or printer.stored else unknown(key)


UNSENT = "Nothing was sent or stored; run it again."
GONE = "heron serve stopped before the turn ended"


def serve_gone(printer: ReplyPrinter, key: str) -> tuple[str, str]:
    """The serve went away (killed, crashed) before the turn's end came. On workers the turn
    goes on without the face; without them nothing finishes it: the next serve closes it as
    interrupted, what streamed since the last tool call is not in the record, and only
    --retry answers the message."""
    if printer.workers:
        said = f"{GONE}; on a worker of the serve it may still finish"
        return said, f"`heron conversations show {key}` shows its answer once it has one."
    since = " since its last tool call" if printer.kept_at else ""
    said = f"{GONE}; what streamed{since} was not saved" if printer.unkept else GONE
    if not printer.stored:
        return said, unknown(key)
    return said, f"Start heron serve again; `heron run --retry -c {key}` answers your message."


def failed_hint(end: TurnEnd | None, key: str) -> str:
    """How to answer a failed turn's message again: --retry when it is stored; when the turn
    failed before storing it (a full disk), that it is lost and must be sent again, since
    --retry would find an earlier message, already answered."""
    if end is not None and end.unsaved:
        return (
            f"Your message was not saved in conversation {key!r}: send it again "
            f"(`heron run -c {key} ...`) once this is fixed."
        )
    from heron.agent.commands import retry_hint

    return retry_hint(key)


def unknown(key: str) -> str:
    """The hint for a turn whose end was not heard and whose message was never said to be
    stored: it may or may not be, and the person can see which."""
    return (
        f"Your message may not be saved: `heron conversations show {key}` shows whether it "
        f"is. If it is, `heron run --retry -c {key}` answers it; if not, send it again."
    )


def not_retried_hint(said: str, key: str) -> str:
    """What to do when --retry answered nothing: send a message first, or, when the last one
    already has its answer, ask again in heron chat (`/retry` there branches)."""
    if said in (NOTHING_TO_RETRY, NOTHING_SINCE_NEW):
        return f"Send a message first: heron run -c {key} TEXT"
    return f"Nothing was run again; `/retry` in `heron chat -c {key}` answers it on a new branch."


def after_stop(stopped: str, key: str) -> str:
    """What the person can do about a turn another session stopped: answer it again (a /stop),
    or, after a /new, ask again in the fresh context, where --retry would not answer it."""
    from heron.agent.commands import retry_hint
    from heron.bus import started_afresh

    if started_afresh(stopped):
        return (
            f"The model starts afresh in conversation {key!r} from here; send your message "
            "again to ask it there."
        )
    return retry_hint(key)


def result_json(printer: ReplyPrinter, key: str) -> dict[str, object]:
    """`heron run --json`: the turn as one object, the same in-process and through serve. A
    failed turn's reply is what the record keeps of it, the text before its last tool call
    (never the error's text, which is in `error`), and `hint` says how to answer it again;
    --retry with nothing to retry is not ok either (`error` says so), as nothing was
    answered."""
    end = printer.end
    usage = end.usage if end is not None else None
    streamed = "".join(printer.reply)
    out = _json_object(key)
    out["later"] = list(printer.later)
    if end is not None and end.ok and end.command == "retry" and end.reply in NOT_RETRIED:
        out.update(error=end.reply, hint=not_retried_hint(end.reply, key))
        return out
    if end is None and printer.unstaffed is not None:  # queued: neither failed nor answered
        why, _, then = printer.unstaffed.removeprefix("heron: ").partition("\n")
        out.update(error=why, hint=then)
        return out
    if end is None and printer.unanswered is not None:  # kept unanswered: the serve stopped
        why, _, then = printer.unanswered.partition(". ")
        out.update(error=why, hint=then)
        return out
    if end is None and printer.serve_gone:  # `reply`: only what the record holds
        error, hint = _why(printer, key)
        unsaved = streamed[printer.kept_at :]
        out.update(reply=streamed[: printer.kept_at], error=error, hint=hint)
        out.update(unsaved_reply=unsaved or None)
    elif end is None or not end.ok:
        error, hint = _why(printer, key)
        out.update(reply=stored_reply(printer), error=error, hint=hint)
    else:
        out.update(reply=streamed or end.reply or "", ok=True)
    if end is not None:
        out.update(run_id=end.run_id, cost_usd=end.cost_usd, stop=end.stop)
    if usage is not None:
        out["usage"] = {name: getattr(usage, name) for name in USAGE_FIELDS}
    return out


REFUSED = "Nothing was sent or stored; `heron run --help` lists the options."


def refusal_json(error: HeronError, key: str | None) -> dict[str, object]:
    """`heron run --json` when the message was refused before any turn (a broken config.toml,
    a message over 8 MB, a missing one, a bad option): the same object, not ok, the error and
    its hint (`REFUSED` for an error that has none)."""
    out = _json_object(key)
    why = str(error.args[0]) if error.args else str(error)
    out.update(error=why, hint=error.hint or REFUSED)
    return out


USAGE_FIELDS = ("input", "output", "cache_read", "cache_write")


def _json_object(key: str | None) -> dict[str, object]:
    """Every field of `heron run --json`, as for a turn that did nothing."""
    return {
        "reply": "",
        "conversation": key,
        "run_id": "",
        "ok": False,
        "error": None,
        "hint": None,
        "usage": dict.fromkeys(USAGE_FIELDS, 0),
        "cost_usd": None,
        "later": [],
        "stop": None,
        "unsaved_reply": None,
    }


async def approve_in_terminal(err: TextIO, tool: str, command: str, confined: bool) -> str | None:
    """Approval in `heron run`: asked on the terminal when there is one; refused (and said to
    the person) when the run has none."""
    from heron.tools.approval import DECLINED, NO_TERMINAL, approval_label

    label = approval_label(tool, confined)
    shown, after = command_shown(label, command)  # whole, visible, the question after it
    if not (sys.stdin.isatty() and err.isatty()):
        err.write(
            f"heron: refused to run {tool} without your approval (no terminal to ask in):\n"
            f"{textwrap.indent(shown, '  ')}\n  Run it in `heron chat`, install bubblewrap, or set "
            'approval = "allow" under [tools] in config.toml.\n'
        )
        return NO_TERMINAL
    err.write(f"heron: the agent wants to run ({label}):\n{shown}\n{after}\nRun it? [y/N] ")
    err.flush()
    answer = await asyncio.to_thread(sys.stdin.readline)
    return None if answer.strip().lower() in ("y", "yes") else DECLINED
