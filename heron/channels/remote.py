"""A channel's connection to a running `heron serve`, over its control socket.

The same calls as heron/channels/inprocess.py's `InProcessAgent` (send, send_nowait, running,
settle), and what comes back is handed to the channel's deliver function as the same
TurnEvents and OutboundMessages, so `heron run` and `heron chat` render one way whatever runs
the loop. It imports the standard library and Heron's pure data modules (heron/bus.py,
heron/messages.py) only: no provider SDK, no engine, no store, which is what makes a message
through serve cheap to send.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import secrets
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast, get_args

from heron import versions
from heron.bus import (
    KEEPING_CODE,
    STOP_ANSWER_CODE,
    UNANSWERED_CODE,
    ApprovalAsk,
    Deliver,
    Outbound,
    OutboundMessage,
    OutKind,
    Provenance,
    TurnEnd,
    TurnEvent,
)
from heron.messages import File, ToolCall, ToolResult, Usage

if TYPE_CHECKING:  # a type only: the thin client loads no tool at run time
    from heron.tools.context import Approver

SOCKET_NAME = "serve.sock"  # heron/serve/lock.py names the same file
CONFIG_NAME = "config.toml"  # heron.config.Paths names the same file
LINE_LIMIT = 64 * 1024 * 1024
USAGE_FIELDS = ("input", "output", "cache_read", "cache_write")


def home_dir() -> Path:
    """HERON_HOME as heron.config.home_from_env finds it (repeated here: importing the config
    module costs the model profiles, which a thin client does not need)."""
    return Path(os.environ.get("HERON_HOME") or Path.home() / ".heron").expanduser()


def serve_socket(home: Path | None = None) -> Path | None:
    """The control socket of a serve on this home, when there is one to try."""
    path = (home or home_dir()) / SOCKET_NAME
    return path if path.is_socket() else None


def beside_serve(home: Path, model: str | None, what: str) -> str | None:
    """What to say when a serve runs on `home` but this `heron run` or `heron chat` runs its
    turns in its own process (it asked for another model, or to keep nothing, which a serve
    cannot give): the serve's clients see from its lease that a turn runs, and its rows once it
    ends, never its stream (heron/serve/elsewhere.py); an ephemeral one's, nothing at all (it
    stores nothing in the home). None: no serve."""
    from heron.store.home_lock import other_serve

    who = other_serve(home)
    if who is None:
        return None
    said = f"heron: heron serve runs on {home} ({who}); "
    if model is not None:
        return said + (
            f"--model runs this {what} in this process instead: the browser and the serve's "
            "other clients see that its turns run and what they stored once they end, not "
            "their stream."
        )
    return said + (
        f"--ephemeral runs this {what} in this process instead, so the browser and the serve's "
        "other clients do not see its turns."
    )


def serve_welcome(
    key: str, home: Path | None = None, timeout: float = 2.0
) -> dict[str, Any] | None:
    """The welcome a serve on this home gives a client of `key` (its model, window...), read
    and left at once; None when no serve answers."""
    hello = {"type": "hello", "conversation": key, "last_seq": None, "channel": "cli"}
    return _ask_once(hello, "welcome", home, timeout)


def serve_login(home: Path | None = None, timeout: float = 5.0) -> str | None:
    """A fresh one-time login address for a browser, from the serve on this home (`heron
    web`); None when no serve answers."""
    offered = login_offer(home, timeout)
    return offered[0] if offered else None


def login_offer(home: Path | None = None, timeout: float = 5.0) -> tuple[str, int] | None:
    """The serve's fresh login address and the minutes it works for (the serve says: its
    codes' life is the serve's to set); None when no serve answers."""
    answer = _ask_once({"type": "login"}, "login", home, timeout)
    url = answer.get("url") if answer else None
    if not isinstance(url, str) or answer is None:
        return None
    minutes = answer.get("minutes")
    return url, minutes if isinstance(minutes, int) else 2


def serve_jobs_changed(home: Path | None = None, timeout: float = 2.0) -> bool:
    """Tell the serve on this home that a job changed (`heron jobs`), so its scheduler looks
    now, not at its next poll; whether a serve's scheduler was told."""
    answer = _ask_once({"type": "jobs_changed"}, "jobs_changed", home, timeout)
    return bool(answer and answer.get("scheduled"))


def _ask_once(
    message: dict[str, Any], kind: str, home: Path | None, timeout: float
) -> dict[str, Any] | None:
    """One message to the serve's control socket, and its first answer when it is a `kind`."""
    import socket

    path = serve_socket(home)
    if path is None:
        return None
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            sock.sendall(json.dumps(message).encode() + b"\n")
            line = sock.makefile("rb").readline(LINE_LIMIT)
        answer = json.loads(line)
    except (OSError, ValueError):
        return None
    return answer if isinstance(answer, dict) and answer.get("type") == kind else None


STOPPED_CODE = "serve_stopped"  # the `error` a serve sends every client as it shuts down
SERVE_STOPPED = "heron serve stopped"  # the error of a turn its shutdown cut (serve/hub.py)
REFUSED_CODE = "refused"  # the `error` answering a message the serve did not take
# A notice that the message is queued with no worker alive to take it soon
# (heron/scale/front.py): the client stops waiting for its turn.
NO_WORKER_CODE = "no_worker"


class ServeGone(ConnectionError):
    """The serve closed the socket (it was stopped) while this client waited."""


class ServeDiffers(ConnectionRefusedError):
    """The serve answers, but this run's environment asks for what it cannot give (another
    model or window, `serve_differs`): the client runs in its own process, as it does when
    no serve answers (every caller already falls back on ConnectionRefusedError), and says so
    (`notice`): otherwise the person would not know their run left the serve."""

    def notice(self) -> str:
        return (
            f"heron: {self}: running in this process instead, with this shell's settings"
            " (unset the variable to go through the serve)."
        )


# Per-run environment overrides a serve cannot honour for one client: the serve's own value
# (its welcome's field) against what this client's environment asks.
OVERRIDES: tuple[tuple[str, str], ...] = (
    ("HERON_MODEL", "model_name"),
    ("HERON_CONTEXT_WINDOW", "window"),
    ("HERON_BASE_URL", "base_url"),
)


def serve_differs(welcome: dict[str, Any], env: Mapping[str, str] | None = None) -> str | None:
    """Which of this run's environment overrides the serve runs with another value of (None:
    none does, or the serve does not say, an older one). Unset in the environment, the
    serve's value applies, as documented; set, it must be the serve's, else the run would
    silently get what it did not ask for."""
    env = os.environ if env is None else env
    for variable, field in OVERRIDES:
        asked, has = (env.get(variable) or "").strip(), welcome.get(field)
        if not asked or field not in welcome:
            continue
        if not _same(variable, asked, has):
            return f"{variable}={asked} (the serve runs with {has})"
    return None


def _same(variable: str, asked: str, has: object) -> bool:
    if variable == "HERON_CONTEXT_WINDOW":  # a bad value is refused in-process, clearly
        return asked.isdigit() and int(asked) == has
    if variable == "HERON_BASE_URL":
        return asked.rstrip("/") == str(has or "").rstrip("/")
    if asked.endswith(".gguf") or asked.startswith("local:"):  # served as the file's stem
        return Path(asked.removeprefix("local:")).expanduser().stem == has
    return asked == has


def serve_news(welcome: Mapping[str, Any], home: Path) -> list[str]:
    """What a client should tell the person about the serve it goes through, though the
    serve can answer: it is another Heron than this command (an upgrade installed while it
    runs: its welcome's `schema`, the newest migration it knows, or none from a serve older
    than this check), or config.toml changed since it loaded the file (`config_digest`), so
    it still answers with the settings it started with. It never reloads them itself: the
    model, its provider and keys, the tools' sandbox and the jobs are set up once per serve,
    and a turn may be running with them (docs/serve.md)."""
    news = []
    ours, theirs = versions.newest_step(), welcome.get("schema")
    if theirs is None or (isinstance(theirs, str) and theirs < ours):
        which = f"its newest migration is {theirs}" if theirs else "too old to say which"
        news.append(
            f"heron: heron serve runs an older Heron than this command ({which}; this "
            f"one's newest is {ours}): restart heron serve (stop it, then start it again) "
            "to run this Heron; until then it answers with its own code."
        )
    elif theirs != ours:
        news.append(
            f"heron: heron serve runs a newer Heron than this command (its newest migration "
            f"is {theirs}; this one's is {ours}): upgrade this Heron."
        )
    if "config_digest" in welcome:
        now = versions.file_digest(home / CONFIG_NAME)
        if now != welcome["config_digest"]:
            news.append(
                f"heron: {CONFIG_NAME} changed since heron serve started; it still answers "
                f"with the settings it started with (model {welcome.get('model')}): restart "
                "heron serve to use the file as it is now."
            )
    return news


class RemoteAgent:
    """A channel's chat on a serve: sends messages, delivers what comes back."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        channel: str,
        deliver: Deliver,
        approve: Approver | None = None,
        own_only: bool = False,
    ) -> None:
        self.reader, self.writer = reader, writer
        # `heron run`: deliver only what answers this client's messages (their turns, the
        # turn they joined as mail, commands' replies), never another turn of the conversation.
        self.own_only = own_only
        self.channel, self.deliver = channel, deliver
        # Asks the person about a command the serve's turn wants to run (the terminal's y/n);
        # None: this client leaves approvals to the conversation's other clients.
        self.approve = approve
        self._approving: dict[str, asyncio.Task[None]] = {}  # asked here, by approval id
        self.key: str | None = None
        self.chat_id: str | None = None  # ours, as the serve names it in events
        self.model: str | None = None
        self.embedded = False  # the serve talks to the offline demo model
        self.welcome: dict[str, Any] = {}  # the serve's latest welcome
        self.home: Path | None = None  # the serve's HERON_HOME (where its socket is)
        self._told: set[str] = set()  # the `news` already said
        self.busy: dict[str, bool] = {}
        # Our messages not yet answered, oldest first: "sent", then "own" (its turn runs),
        # "mail" (the running turn answers it) or "queued" (a later turn will); "stop" for a
        # /stop until its answer comes.
        self._waiting: deque[str] = deque()
        # A /stop asked before the turn of our message said it started: sent at that start
        # (the serve tells it once the message is stored), so the stop keeps the message.
        self._stop_at_start = False
        self._settled = asyncio.Event()
        self._settled.set()
        self._welcomed: asyncio.Event = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self.ended = 0  # turn_ends seen, of any client's turns
        self._ended = asyncio.Condition()
        self._lists: deque[asyncio.Future[list[tuple[str, str | None]]]] = deque()
        # Requests answered by an event of the same type (the memory review), oldest first.
        self._asks: dict[str, deque[asyncio.Future[dict[str, Any]]]] = {}
        # The arguments of each tool call started and not ended: a `tool_end` names only the
        # call's id and name, and the pill and /show print what the call was asked to do.
        self._args: dict[str, Any] = {}
        self.gone = False
        self.refusals: list[dict[str, Any]] = []  # errors answering messages not taken
        self.unstaffed: list[str] = []  # notices that no worker will take our messages soon
        # Notices that no turn will answer a message of ours (the serve is stopping): kept
        # in its conversation unanswered, or, a command, not run (UNANSWERED_CODE).
        self.unanswered: list[str] = []
        # Our message that opened the running turn is stored (its turn_start named its row);
        # and our last turn was cut by the serve's shutdown, its message stored unanswered.
        self._stored_open = False
        self._cut_short = False
        self.on_gone: Callable[[], None] | None = None  # chat: leave the prompt

    # ---- the InProcessAgent calls ---------------------------------------------------------

    async def send(
        self, text: str, key: str, agent: str = "default", files: tuple[File, ...] = ()
    ) -> None:
        self.send_nowait(text, key, agent, files)
        await self.writer.drain()

    def send_nowait(
        self, text: str, key: str, agent: str = "default", files: tuple[File, ...] = ()
    ) -> None:
        """`files` (attachments, heron/attachments.py) go first, each as an `upload` line
        with its bytes; the serve checks them against its caps again and the `send` names
        them, so a message and its files arrive as one."""
        if key != self.key:
            self._write({"type": "hello", "conversation": key, "last_seq": None, "agent": agent})
            self.key = key
        # /stop is answered after the end of the turn it stops, never by a turn of its own
        stop = text.strip() == "/stop" and not files
        early = stop and not self.busy.get(key, False) and "sent" in self._waiting
        self._waiting.append("stop" if stop else "sent")
        self._settled.clear()
        if early:  # sent now, it would cancel the turn before its message is stored
            self._stop_at_start = True
            return
        refs = [self._upload(f) for f in files]
        kind = "command" if text.startswith("/") and not files else "send"
        self._write({"type": kind, "text": text, **({"files": refs} if refs else {})})

    def _upload(self, file: File) -> dict[str, str]:
        upload_id = secrets.token_hex(12)
        data = base64.b64encode(file.data or b"").decode("ascii")
        name, mime = file.name or "file", file.media_type
        self._write(
            {"type": "upload", "upload_id": upload_id, "name": name, "mime": mime, "data": data}
        )
        return {"upload_id": upload_id, "name": name, "mime": mime}

    def running(self, key: str) -> bool:
        """A turn runs on `key`, or a message this client sent there has not started one
        yet (the serve tells a turn's start once its message is stored: the first turn of a
        serve takes a second to get there). A /stop sent meanwhile waits for that start
        (`send_nowait`), then stops the turn with the message kept: the chat's Ctrl-C right
        after Enter is not taken for "nothing runs"."""
        return self.busy.get(key, False) or (key == self.key and "sent" in self._waiting)

    async def settle(self) -> None:
        """Until every message this chat sent has been answered (or the serve went away)."""
        await self._settled.wait()
        if self.gone and self._waiting:
            raise ServeGone("heron serve stopped before the turn ended")

    async def conversations(self, limit: int = 20) -> list[tuple[str, str | None]]:
        """(key, title) of the conversations /resume offers, newest first."""
        answer: asyncio.Future[list[tuple[str, str | None]]]
        answer = asyncio.get_running_loop().create_future()
        self._lists.append(answer)
        self._write({"type": "conversations", "limit": limit})
        await self.writer.drain()
        return await answer

    async def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send a request only the control socket answers; its answer has the same type."""
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._asks.setdefault(str(message["type"]), deque()).append(answer)
        self._write(message)
        await self.writer.drain()
        return await answer

    def news(self) -> list[str]:
        """`serve_news` this client has not said yet: each is said once."""
        if self.home is None:
            return []
        fresh = [said for said in serve_news(self.welcome, self.home) if said not in self._told]
        self._told.update(fresh)
        return fresh

    # ---- the socket -----------------------------------------------------------------------

    async def hello(self, key: str, agent: str = "default") -> None:
        self._write({"type": "hello", "conversation": key, "last_seq": None, "agent": agent})
        self.key = key
        await self.writer.drain()
        await self._welcomed.wait()

    def _write(self, message: dict[str, Any]) -> None:
        message.setdefault("channel", self.channel)
        self.writer.write(json.dumps(message, ensure_ascii=False).encode() + b"\n")

    async def read(self) -> None:
        try:
            while line := await self.reader.readline():
                await self._event(json.loads(line))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.gone = True
            self._settled.set()
            self._welcomed.set()
            for answer in self._lists:
                answer.set_exception(ServeGone("heron serve stopped"))
            for waiting in self._asks.values():
                for asked in waiting:
                    asked.set_exception(ServeGone("heron serve stopped"))
            if self.on_gone is not None:
                self.on_gone()

    async def _event(self, event: dict[str, Any]) -> None:
        key = event.get("conversation") or self.key or ""
        kind = event.get("type")
        if kind == "conversations":
            items = [(str(i["key"]), i.get("title")) for i in event.get("items", [])]
            if self._lists:
                self._lists.popleft().set_result(items)
            return
        if isinstance(kind, str) and self._asks.get(kind):
            self._asks[kind].popleft().set_result(event)
            return
        if kind == "error" and event.get("code") == STOPPED_CODE:
            return  # the socket closes next: read() ends, and ServeGone says it
        if kind == "error" and event.get("code") == REFUSED_CODE:
            self.refusals.append(event)  # no turn will answer it: stop waiting for one
            if self._stop_at_start:  # the message it was to stop is refused: nothing to stop
                self._stop_at_start = False
                self._waiting.remove("stop")
            self._advance(("sent", "stop"), "refused")
            self._waiting = deque(s for s in self._waiting if s != "refused")
            if not self._waiting:
                self._settled.set()
        ours = event.get("chat_id") == self.chat_id
        if kind == "message" and event.get("code") == KEEPING_CODE:
            if ours:  # being kept: the turn it mailed into may end first, its notice follows
                self._advance(("sent", "mail", "queued", "carried"), "keeping")
            return
        if kind == "message" and event.get("code") == UNANSWERED_CODE:
            if not ours:
                return  # another client's message kept at shutdown: its notice is for it
            self.unanswered.append(str(event.get("text") or ""))
            self._advance(("sent", "mail", "queued", "carried", "keeping"), "unanswered")
            self._waiting = deque(s for s in self._waiting if s != "unanswered")
            if not self._waiting:
                self._settled.set()
        if kind == "message" and event.get("code") == NO_WORKER_CODE and ours:
            self.unstaffed.append(str(event.get("text") or ""))  # queued; nobody runs it soon
            self._waiting = deque(s for s in self._waiting if s == "stop")
            if not self._waiting:
                self._settled.set()
        if kind == "welcome":
            self.welcome = event
            self.busy[key] = bool(event.get("busy"))
            self.model = event.get("model") or self.model
            self.embedded = bool(event.get("embedded"))
            self.chat_id = event.get("chat_id") or self.chat_id
            self._welcomed.set()
            running = event.get("elsewhere")  # another process's turn runs there now
            if isinstance(running, dict) and not self.own_only:
                for told in elsewhere_items({**running, "running": True}, self.channel, key):
                    await self.deliver(told)
            return
        if kind == "elsewhere":  # another process's turn: none of this client's to wait for
            for told in [] if self.own_only else elsewhere_items(event, self.channel, key):
                await self.deliver(told)
            return
        self._track(key, event)
        if kind in ("approval", "approval_end"):
            self._approval(event)
        theirs_stopped = kind == "message" and event.get("code") == STOP_ANSWER_CODE and not ours
        if theirs_stopped or (self.own_only and not self._answers_us(event)):
            # Another client's "Stopped.": the turn's end already said who stopped it here.
            await self._after(event)
            return
        others = kind == "status" and event.get("chat_id") not in (None, self.chat_id)
        if others and (event.get("state") != "mail" or not event.get("text")):
            return  # another client's queued message: its turn shows it as it starts
        if kind == "tool_start":
            self._args[str(event.get("call_id"))] = event.get("args") or {}
        elif kind == "tool_end" and "args" not in event:
            event = {**event, "args": self._args.pop(str(event.get("call_id")), {})}
        item = to_outbound(event, self.channel, key)
        if item is not None:
            await self.deliver(item)
        await self._after(event)

    async def _after(self, event: dict[str, Any]) -> None:
        """What a delivered (or, for `own_only`, passed over) event settles."""
        kind = event.get("type")
        if kind == "turn_end" or (kind == "message" and event.get("kind") == "command"):
            self._resolve(event)
        if kind == "turn_end":
            async with self._ended:
                self.ended += 1
                self._ended.notify_all()

    def _answers_us(self, event: dict[str, Any]) -> bool:
        """Whether `event` answers one of this client's messages: said to this client (a
        command's reply, its message's mail or queued status), or part of a turn its message
        opened or joined as mail. Another turn of the conversation (someone else's, a goal's
        nudge) streams past unseen."""
        kind, said = event.get("type"), event.get("kind")
        if event.get("chat_id") == self.chat_id and kind in ("message", "status", "error"):
            return True
        if kind == "status" and event.get("state") in ("mail", "queued"):
            return False  # another client's message
        if kind == "message" and said == "command":
            return False  # another client's command answered
        return "own" in self._waiting or "mail" in self._waiting

    def _approval(self, event: dict[str, Any]) -> None:
        """A command waits for approval: asked here (the first answer from any client of the
        conversation decides); its end, however it came, stops asking here."""
        approval_id = str(event.get("id") or "")
        if event["type"] == "approval_end":
            asking = self._approving.pop(approval_id, None)
            if asking is not None:
                asking.cancel()  # answered elsewhere, stopped, or past its deadline
        elif self.approve is not None and approval_id not in self._approving:
            task = asyncio.create_task(self._answer(self.approve, event))
            self._approving[approval_id] = task

    async def _answer(self, approve: Approver, event: dict[str, Any]) -> None:
        """Ask the person and send the answer; a serve gone meanwhile has nobody to tell."""
        tool, command = str(event.get("tool") or ""), str(event.get("command") or "")
        reason = await approve(tool, command, bool(event.get("confined")))
        with contextlib.suppress(ConnectionError, OSError):
            self._write({"type": "approve", "id": event["id"], "allow": reason is None})
            await self.writer.drain()

    async def wait_ended(self, count: int) -> None:
        """Until `count` turns (anyone's) have ended on the attached conversation."""
        async with self._ended:
            await self._ended.wait_for(lambda: self.ended >= count or self.gone)

    def _track(self, key: str, event: dict[str, Any]) -> None:
        kind, mine = event.get("type"), event.get("chat_id") == self.chat_id
        if kind == "turn_start":
            self.busy[key] = True
            # Mail the last turn never read opens this one, whoever's message leads it (the
            # unread follow-ups of several clients are joined, heard where the first was typed).
            self._advance(("carried",), "own")
            if mine:
                self._advance(("sent", "queued"), "own")
                self._stored_open = isinstance(event.get("message_id"), int)
            if mine and self._stop_at_start:  # its message is stored: now it can stop
                self._stop_at_start = False
                self._write({"type": "command", "text": "/stop"})
        elif kind == "status" and event.get("state") in ("mail", "queued") and mine:
            self._advance(("sent",), event["state"])
        elif kind == "status" and event.get("state") == "carried" and mine:
            self._advance(("mail",), "carried")  # its turn ended unread: the next answers it
        elif kind == "status" and event.get("state") == "idle":
            self.busy[key] = False

    def _advance(self, before: tuple[str, ...], after: str) -> None:
        for i, state in enumerate(self._waiting):
            if state in before:
                self._waiting[i] = after
                return

    def kept_unanswered(self) -> bool:
        """Whether a message of ours is kept with no answer as the serve goes: stored by the
        turn it opened (running when the serve was killed, or stopped by its shutdown), or
        mail or queued behind a turn, which the serve holds on disk (heron/store/held.py) and
        moves into the conversation when it, or the next turn there, starts. `--retry` then
        answers it. One only sent, never acknowledged, is not promised."""
        waiting = any(s in ("mail", "queued", "carried", "keeping") for s in self._waiting)
        return self._stored_open or self._cut_short or waiting

    def _resolve(self, event: dict[str, Any]) -> None:
        if event["type"] == "turn_end":
            self._cut_short = self._stored_open and event.get("error") == SERVE_STOPPED
            self._stored_open = False
            self._waiting = deque(s for s in self._waiting if s not in ("own", "mail"))
        elif event.get("chat_id") == self.chat_id and "stop" in self._waiting:
            self._waiting.remove("stop")  # "Stopped...", after the turn_end of what it stopped
        elif self._waiting and self._waiting[0] == "sent" and self.busy.get(self.key or ""):
            self._waiting.popleft()  # a command answered at once beside the running turn
        if not self._waiting:
            self._settled.set()

    async def close(self) -> None:
        for asking in self._approving.values():
            asking.cancel()
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


@asynccontextmanager
async def connect_remote(
    path: Path,
    channel: str,
    deliver: Deliver,
    key: str,
    agent: str = "default",
    approve: Approver | None = None,
    own_only: bool = False,
) -> AsyncIterator[RemoteAgent]:
    """Attached to `key` on the serve behind `path`; raises OSError when none answers there.
    `approve` asks the person about the commands the serve's turns want to run; `own_only`
    delivers only what answers this client's messages (RemoteAgent.own_only)."""
    reader, writer = await asyncio.open_unix_connection(str(path), limit=LINE_LIMIT)
    agent_conn = RemoteAgent(reader, writer, channel, deliver, approve, own_only)
    agent_conn.home = path.parent
    agent_conn._reader = asyncio.create_task(agent_conn.read())
    try:
        await agent_conn.hello(key, agent)
        differs = serve_differs(agent_conn.welcome)
        if differs is not None:
            raise ServeDiffers(f"the serve cannot honour {differs}")
        yield agent_conn
    finally:
        await agent_conn.close()


_STATES = ("retry", "restart", "mail", "queued", "carried", "busy")  # as TurnEvents of their kind


def to_outbound(event: dict[str, Any], channel: str, key: str) -> Outbound | None:
    """A protocol event as the bus item the channels render (None: nothing to show)."""
    kind = event.get("type")
    chat = str(event.get("chat_id") or "")
    if kind == "message":
        said = event.get("kind")
        said_kind = cast(OutKind, said) if said in get_args(OutKind) else "answer"
        code, by = event.get("code"), event.get("by")
        text = event.get("text", "")
        return OutboundMessage(
            channel, chat, key, text, said_kind, code if code else None, str(by) if by else None
        )
    if kind == "error":
        text = event.get("message", "")
        hint = event.get("hint")
        return OutboundMessage(channel, chat, key, f"{text}\n{hint}" if hint else text, "error")
    base = TurnEvent(channel, chat, key, "delta")
    if kind in ("delta", "reasoning"):
        return _replace(base, kind=kind, text=event.get("text", ""))
    if kind == "turn_start":
        origin = str(event.get("channel") or channel)  # where the message was typed
        said = event.get("provenance")
        by = cast(Provenance, said) if said in get_args(Provenance) else "user"
        text = event.get("text", "")
        files = tuple(str(f) for f in event.get("files") or ())
        stored = event.get("message_id")  # set once the message is in the store (the hub)
        return _replace(
            base, kind="turn_start", text=text, channel=origin, provenance=by, files=files,
            message_id=stored if isinstance(stored, int) else None,
        )  # fmt: skip
    if kind == "tool_start":
        call = ToolCall(event["call_id"], event["name"], event.get("args") or {})
        return _replace(base, kind="tool_start", call=call)
    if kind == "tool_end":
        call = ToolCall(event["call_id"], event["name"], event.get("args") or {})
        result = ToolResult(event["call_id"], event.get("result", ""), bool(event.get("is_error")))
        seconds = float(event.get("seconds") or 0.0)
        return _replace(base, kind="tool_end", call=call, result=result, seconds=seconds)
    if kind == "status" and event.get("state") in _STATES:
        seconds = float(event.get("seconds") or 0.0)
        origin = str(event.get("channel") or channel)  # mail: where it was typed
        text = event.get("text", "")
        return _replace(base, kind=event["state"], text=text, seconds=seconds, channel=origin)
    if kind == "turn_end":
        return _replace(base, kind="turn_end", end=_turn_end(event))
    if kind in ("approval", "approval_end"):
        return _replace(base, kind=kind, approval=_approval_of(event))
    return None


def elsewhere_items(event: dict[str, Any], channel: str, key: str) -> list[Outbound]:
    """The serve's `elsewhere` event as the channels render it: while another process's turn
    runs, a notice saying where (its stream stays there); once it ended, each turn it stored
    (an `elsewhere` TurnEvent: its message, and its reply in `end`)."""
    where = str(event.get("where") or "another process")
    if event.get("running"):
        said = f"A turn runs in {where}: its reply shows here when it ends."
        return [OutboundMessage(channel, "", key, said, "notice")]
    origin = str(event.get("program") or where)
    items: list[Outbound] = []
    for turn in event.get("turns") or []:
        status = str(turn.get("status") or "")
        end = TurnEnd(status == "done", status, turn.get("error"), str(turn.get("reply") or ""))
        items.append(TurnEvent(origin, "", key, "elsewhere", str(turn.get("text") or ""), end=end))
    return items


def _approval_of(event: dict[str, Any]) -> ApprovalAsk:
    by = event.get("by")
    return ApprovalAsk(
        str(event.get("id") or ""),
        str(event.get("tool") or ""),
        str(event.get("command") or ""),
        float(event.get("deadline") or 0.0),
        bool(event.get("allowed")),
        by if isinstance(by, str) else None,
        str(event.get("reason") or ""),
        bool(event.get("confined")),
    )


def _replace(event: TurnEvent, **changes: Any) -> TurnEvent:
    from dataclasses import replace

    return replace(event, **changes)


def _turn_end(event: dict[str, Any]) -> TurnEnd:
    usage = event.get("usage") or {}
    return TurnEnd(
        bool(event.get("ok")),
        str(event.get("outcome") or ""),
        event.get("error"),
        event.get("reply"),
        event.get("command"),
        event.get("switch_to"),
        str(event.get("run_id") or ""),
        int(event.get("model_calls") or 0),
        Usage(
            **{k: int(usage.get(k) or 0) for k in ("input", "output", "cache_read", "cache_write")}
        ),
        event.get("cost_usd"),
        _text_or_none(event.get("stopped_by")),
        unsaved=bool(event.get("unsaved")),
        stop=_text_or_none(event.get("stop")),
        usage_unknown=bool(event.get("usage_unknown")),
    )


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
