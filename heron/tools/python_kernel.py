"""A persistent IPython kernel for the agent: `KernelSession` and the `run_cell` tool.

The kernel is started lazily, on a conversation's first run_cell, with this very interpreter
(sys.executable) so it works inside a virtualenv without a kernelspec installed anywhere. Its
working directory is the workspace. A long-lived process keeps one per conversation between
its turns (`Kernels`, owned by the engine; docs/engine.md, "The Python kernel"); without it
(a bare ToolContext) the kernel ends with the run (`ctx.aclose()`).

It runs in the sandbox like every other command (heron/tools/sandbox.py). The client talks to
it over ZeroMQ's `ipc` transport: Unix sockets in a private folder bound into the sandbox at
the same path. TCP would not do: the sandbox's network namespace has a loopback of its own, so
with network "none" nothing outside could reach a port the kernel opened, and sharing the
host's namespace to make it reachable would give the kernel the network. The sandbox's seccomp
filter lets the kernel make no Unix socket, so Heron binds the five (`bind_sockets`) and the
kernel inherits them listening (heron/tools/kernel_launch.py hands them to ZeroMQ).
Interrupts travel as a control message, not a signal to the process group: SIGINT to the group
would reach bwrap itself, and its death takes the kernel with it.

run_cell returns a digest rather than the raw message stream: output labelled with the cell's
execution count, the last value, the files the cell changed, or the error. Output is kept as
head and tail while it streams, as the bash tool keeps a command's (`CellOutput` on
shell.HeadTail): a cell printing gigabytes costs Heron a few megabytes, the model reads the head
and tail that fit its result budget, and the person's `/show N` up to WHOLE_CAP characters. A
cell past its timeout is interrupted and its end awaited on the shell channel, which no backlog
of output delays; the kernel is restarted (variables lost, and said so) only when the cell has
not stopped INTERRUPT_GRACE seconds later. A last value too large to show stays in the kernel
under a name the digest gives, so the model never re-runs an expensive call to see it again.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import errno
import os
import queue
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heron import workspace_io
from heron.request import WHERE_IT_RUNS
from heron.saved import WHOLE_CAP
from heron.store.engine_state import pid_alive
from heron.tools.context import ToolContext
from heron.tools.kernel_log import KernelLog
from heron.tools.registry import ToolOutput, ToolRegistry, parse_docstring, tool
from heron.tools.sandbox import Sandbox
from heron.tools.shell import HeadTail

if TYPE_CHECKING:
    from heron.store import Conversation

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
STARTUP_TIMEOUT = 60.0
INTERRUPT_GRACE = 5.0  # seconds a cell gets to stop after an interrupt before the restart
# Seconds spent reading what a stopped cell printed before it stopped: a flood's backlog is
# not worth waiting for (the next cell skips what is left of it).
TAIL_GRACE = 1.0
LINE_HELD = 65_536  # characters of one unfinished line held back in case a \r overwrites it
POLL = 1.0  # seconds between checks that the kernel is still alive while waiting
TRACEBACK_LINES = 6
KERNEL_LOG = ".heron/kernel.log"  # the kernel's own stdout/stderr, under the workspace
PREVIEW = 300  # characters of a stashed value shown as a preview
SNAPSHOT_SKIP = frozenset(
    {".heron", ".git", "node_modules", ".venv", "venv", "__pycache__", ".ipynb_checkpoints"}
)
SOCKETS_PREFIX = "heron-kernel-"  # + the owning Heron's pid + "-": the kernel's ipc folder
KERNEL_PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
KERNEL_LAUNCH = Path(__file__).with_name("kernel_launch.py")
SNAPSHOT_MAX = 20_000  # files; a bigger workspace is not tracked (the walk would cost too much)
# Why a conversation's first cell in this process runs in a new kernel when it ran cells before.
EARLIER_PROCESS = (
    "the kernel of this conversation's earlier cells ended with the process that ran them"
)

# Images a cell displays (a plot, `display(Image(...))`) are saved here, under the workspace,
# as `cell-<N>-<K>.<ext>` (the K-th image of cell N), and the model is told the path and size.
OUTPUTS_DIR = "outputs"
IMAGE_MAX = 10_000_000  # bytes of one image saved; a larger one is described, not saved
IMAGES_MAX = 20  # images one cell saves; past it they are described, not saved
# The image formats saved, in the order a display offering several is taken: (extension, name).
IMAGE_KINDS = {
    "image/png": ("png", "PNG"),
    "image/jpeg": ("jpg", "JPEG"),
    "image/svg+xml": ("svg", "SVG"),
}
SHOWN_KINDS = ("display_data", "update_display_data", "execute_result")
# What IPython's text/plain of a display object says when it has no text of its own.
OBJECT_REPR = re.compile(r"<[\w.]+ object(?: at 0x[0-9a-fA-F]+)?>")
NOT_SHOWN = "not shown: run_cell returns text and saves PNG, JPEG and SVG images to outputs/"
# What the model is told of a cell that called input() or getpass(): no one can answer it.
NO_INPUT = "input() is not available here: no one can type into a cell. Put the values in the code."

# Told with the first cell's result of a process that answers one message (`Kernels.one_shot`).
ONE_SHOT_KERNEL = (
    "This process answers one message: this kernel ends with this turn, and a later message "
    "starts an empty one (its variables do not survive the turn)."
)


@dataclass
class CellError:
    ename: str
    evalue: str
    traceback: list[str] = field(default_factory=list)


class CellOutput:
    """A cell's printed and displayed output as the model reads it ("[5] ...", "[5] (stderr)
    ..." for the kernel's 5th cell), kept as head and tail while it streams (shell.HeadTail): a
    cell printing gigabytes costs a few megabytes and one pass over them, never a copy per
    chunk. Consecutive chunks of one stream form one group, a display is a group of its own,
    and each group starts with the cell's execution count: the number IPython gives it
    (`Cell In[5]` in a traceback, `Out[5]`, `_heron_values[5]`), so the label is true in a
    kept kernel too, and left out while the count is not known. On each line, what a carriage
    return was followed by overwrites what came before it (progress bars), as in a terminal;
    a group's trailing newlines are dropped."""

    def __init__(self, limit: int = WHOLE_CAP) -> None:
        self.limit = limit
        self.cell: int | None = None  # the kernel's execution count for this cell
        self.clear()

    def dropped(self, count: int) -> None:
        """`count` characters the kernel printed and left out here (KERNEL_SETUP): counted as
        part of the middle that is not kept."""
        self._emit("".join(self.line))
        self._reset_line()
        self.sink.total += count

    def clear(self) -> None:
        """Forget all of it (the cell's `clear_output`)."""
        limit = self.limit
        self.sink = HeadTail(limit, f": the person's copy keeps {limit:,} characters")
        self.groups = 0
        self.kind: str | None = None
        self.line: list[str] = []  # the line being printed, held back for a carriage return
        self.line_len = 0
        self.overwrite = False  # a carriage return ended the held line: new text replaces it
        self.newlines = 0  # owed before the group's next text (never written at its end)

    def add(self, kind: str, text: str) -> None:
        if kind == "display" or kind != self.kind:
            self._end_group()
            self.groups += 1
            self.kind = kind
            count = f"[{self.cell}] " if self.cell is not None else ""
            label = "(stderr) " if kind == "stderr" else ""
            self.sink.add(f"{chr(10) if self.groups > 1 else ''}{count}{label}")
        if "\r" not in text:  # the common case: whole lines go straight to the sink
            cut = text.rfind("\n")
            if cut < 0:
                self._hold(text)
                return
            self._emit("".join(self.line) + text[:cut])
            self._reset_line()
            self.newlines += 1
            self._hold(text[cut + 1 :])
            return
        *lines, rest = text.split("\n")
        for line in lines:
            self._hold(line)
            self._emit("".join(self.line))
            self._reset_line()
            self.newlines += 1
        self._hold(rest)

    @property
    def total(self) -> int:
        """Characters of output, group labels included."""
        return self.sink.total + self.line_len

    def text(self, limit: int | None = None) -> str:
        """All of it, or its head and tail around a count of what was left out."""
        self._end_group()
        return self.sink.text(limit)

    def _hold(self, piece: str) -> None:
        if not piece:
            return
        if self.overwrite:
            self._reset_line()
        if "\r" in piece:
            self.overwrite = piece.endswith("\r")  # unless a newline comes next
            piece = piece.rstrip("\r")
            if "\r" in piece:
                self._reset_line()
                piece = piece.rpartition("\r")[2]
        self.line.append(piece)
        self.line_len += len(piece)
        if self.line_len > LINE_HELD:  # no progress bar: let it go, overwrites and all
            self._emit("".join(self.line))
            self._reset_line()

    def _reset_line(self) -> None:
        self.line, self.line_len, self.overwrite = [], 0, False

    def _emit(self, text: str) -> None:
        body = text.rstrip("\n")
        if body:
            self.sink.add("\n" * self.newlines + body)
            self.newlines = 0
        self.newlines += len(text) - len(body)

    def _end_group(self) -> None:
        self._emit("".join(self.line))
        self._reset_line()
        self.newlines = 0


@dataclass
class CellResult:
    """What one cell produced: its output (bounded, `CellOutput`), its last value, its error."""

    output: CellOutput = field(default_factory=CellOutput)
    value: str | None = None
    execution_count: int | None = None
    error: CellError | None = None
    timed_out: bool = False
    restarted: bool = False  # the kernel died or ignored the interrupt: variables are lost
    value_ref: str | None = None  # the expression holding a value too large to show
    value_type: str | None = None
    fresh: str | None = None  # why it ran in a new kernel where the model expected the old
    ends_with_turn: bool = False  # the first cell of a one-shot process's kernel: say so
    images: int = 0  # images the cell displayed (saved or not): the K of the next one's name

    def add_output(self, kind: str, text: str) -> None:
        self.output.add(kind, ANSI.sub("", text))


# Run in the kernel once it starts (silently, outside the user's history). Past the first
# `head` characters a cell prints, stdout and stderr keep only a rolling tail of `tail`
# characters in the kernel and count the rest; after the cell, the count goes out as DROPPED
# and then the tail. A flood of output then costs the kernel one counter and never reaches the
# socket, so its timeout holds and neither side holds more than the tail.
KERNEL_SETUP = """
_heron_values = {}
def _heron_cap_output(head, tail, mark):
    import collections, sys
    state = {}
    def capped(write):
        def capped_write(text):
            if not isinstance(text, str):
                return write(text)
            room = head - state["seen"]
            if room > 0:
                state["seen"] += len(text)
                if len(text) <= room:
                    return write(text)
                write(text[:room])
            size = len(text)
            text = text[max(room, 0):]
            kept = state["kept"]
            kept.append((write, text))
            state["kept_len"] += len(text)
            while len(kept) > 1 and state["kept_len"] - len(kept[0][1]) >= tail:
                gone = len(kept.popleft()[1])
                state["kept_len"] -= gone
                state["dropped"] += gone
            return size
        capped_write.heron_capped = True
        return capped_write
    def start(*_):
        # IPython puts its own writer on the streams for each cell (`_tee`, which also keeps
        # what it sees): the cap goes around it, so neither holds more than the tail.
        state.update(seen=0, dropped=0, kept=collections.deque(), kept_len=0)
        state["say"] = sys.stdout.write
        for stream in (sys.stdout, sys.stderr):
            if not getattr(stream.write, "heron_capped", False):
                stream.write = capped(stream.write)
    def flush(*_):
        kept, dropped = state.get("kept") or (), state.get("dropped", 0)
        if kept and state["kept_len"] > tail:
            write, text = kept[0]
            cut = state["kept_len"] - tail
            kept[0] = (write, text[cut:])
            dropped += cut
        if dropped:
            state["say"](mark % dropped)
        for write, text in kept:
            write(text)
        state.update(kept=collections.deque(), dropped=0, kept_len=0, seen=0)
    shell = get_ipython()
    shell.events.register("pre_run_cell", start)
    shell.events.register("post_run_cell", flush)
    # IPython's history keeps every cell's output as well; nothing here reads it.
    class Forget(dict):
        def __contains__(self, key):
            return False
        def __getitem__(self, key):
            return []
    manager = getattr(shell, "history_manager", None)
    if manager is not None and hasattr(manager, "outputs"):
        manager.outputs = Forget()
"""
DROPPED_MARK = "\x00heron-dropped:%d\x00"
DROPPED = re.compile("\x00heron-dropped:(\\d+)\x00")


def _spec_manager(sandbox: Sandbox, sockets: Path, seccomp: int | None) -> Any:
    """A kernelspec manager that always answers with this interpreter's ipykernel, started in
    `sandbox` with the socket folder bound in, through kernel_launch.py (which hands ipykernel
    the sockets `bind_sockets` made: the sandbox's filter lets the kernel make none)."""
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager

    argv = [
        sys.executable,
        str(KERNEL_LAUNCH),
        "-f",
        "{connection_file}",
        # Agent cells stay out of the user's IPython history file.
        "--HistoryManager.enabled=False",
    ]

    class ThisInterpreter(KernelSpecManager):
        def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
            return KernelSpec(
                argv=sandbox.wrap(argv, shown=[sockets], seccomp=seccomp),
                name=kernel_name,
                display_name="Python (Heron)",
                language="python",
                interrupt_mode="message",
            )

    return ThisInterpreter()


def open_log(workspace: Path, private: Path) -> int:
    """A descriptor for the kernel's stdout/stderr, which the kernel holds: KERNEL_LOG in the
    workspace, where the person looks, a link or hard link at the name replaced, never opened
    (workspace_io), or the kernel could write any file Heron can. Where no file can stand there
    (a folder at the name, a file at `.heron`: a command's doing, which run_cell must survive),
    `kernel.log` in the kernel's private socket folder, which Heron made and the sandbox shows
    read-only; it goes with the kernel."""
    try:
        return workspace_io.append_to(workspace, KERNEL_LOG)
    except OSError:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(private / "kernel.log", flags, 0o600)


class KernelSession:
    """One ipykernel process and a client to it; executions are serialised."""

    def __init__(
        self,
        workspace: Path,
        startup_timeout: float = STARTUP_TIMEOUT,
        sandbox: Sandbox | None = None,
        whose: str = "",
    ) -> None:
        self.workspace = workspace
        self.whose = whose  # named on the kernel log's start line
        self.startup_timeout = startup_timeout
        self.sandbox = sandbox or Sandbox(workspace)
        self._km: Any = None
        self._kc: Any = None
        self._sockets: Path | None = None
        self._lock = asyncio.Lock()
        self._unsettled: str | None = None  # a cell interrupted when its turn was stopped
        # Why the kernel was shut down with variables the model may still count on; said
        # with the next cell's result, then forgotten.
        self.lost: str | None = None
        # Whether the conversation ran cells the model may count on before this session (in
        # an earlier process): asked once, when the session's first kernel starts.
        self.earlier: Callable[[], Awaitable[bool]] | None = None
        self.ever_started = False
        # The process answers one message (a one-shot `heron run`): the kernel ends with the
        # turn. Said with its first cell's result, not in run_cell's description, which stays
        # the same in every process so the cached prefix (tools first) survives a switch.
        self.ends_with_turn = False

    @property
    def started(self) -> bool:
        return self._km is not None

    async def start(self) -> None:
        # A short path in the system's temp folder: a Unix socket path has at most 107 bytes.
        # Named with our pid, so a later start can remove the folders of a Heron that was killed.
        await asyncio.to_thread(sweep_sockets, Path(tempfile.gettempdir()))
        prefix = f"{SOCKETS_PREFIX}{os.getpid()}-"
        self._sockets = sockets = Path(tempfile.mkdtemp(prefix=prefix))
        # The kernel's own stdout/stderr (startup warnings, crashes, what a subprocess in a
        # cell prints) go to a bounded log (kernel_log.py), not the terminal Heron draws in.
        log = KernelLog(
            await asyncio.to_thread(open_log, self.workspace, sockets), whose=self.whose
        )
        try:
            await self._launch(sockets, log.write_end)
        except BaseException:
            log.close()
            raise
        log.started()
        kc = self._km.client()
        kc.start_channels()
        self._kc = kc
        self.ever_started = True
        try:
            await kc.wait_for_ready(timeout=self.startup_timeout)
        except Exception:
            await self.shutdown()
            raise
        half = WHOLE_CAP // 2
        cap = f"_heron_cap_output({half}, {WHOLE_CAP - half}, {DROPPED_MARK!r})"
        await self._silent(f"{KERNEL_SETUP}{cap}\ndel _heron_cap_output\n")

    async def _launch(self, sockets: Path, log: int) -> None:
        """Start the kernel process in the sandbox on sockets Heron bound, `log` its
        stdout and stderr."""
        from jupyter_client.manager import AsyncKernelManager

        self.sandbox.prepare()
        env = self.sandbox.environment()
        listening = bind_sockets(sockets / "k")
        try:
            with self.sandbox.seccomp() as seccomp:
                km = AsyncKernelManager(
                    kernel_name="python3",
                    kernel_spec_manager=_spec_manager(self.sandbox, sockets, seccomp),
                    transport="ipc",
                    ip=str(sockets / "k"),
                    **{name: port for port, name in enumerate(KERNEL_PORTS, 1)},
                )
                km.connection_file = str(sockets / "kernel.json")
                inherit = [s.fileno() for s in listening] + ([] if seccomp is None else [seccomp])
                await km.start_kernel(
                    cwd=str(self.workspace), env=env, stdout=log, stderr=log, pass_fds=inherit
                )
        finally:
            for sock in listening:  # the kernel holds them now
                sock.close()
        self._km = km

    async def shutdown(self) -> None:
        km, kc, self._km, self._kc = self._km, self._kc, None, None
        sockets, self._sockets = self._sockets, None
        try:
            if kc is not None:
                kc.stop_channels()
            if km is not None and km.has_kernel:
                # Nothing in the kernel is worth a graceful goodbye; killing is instant.
                await km.shutdown_kernel(now=True)
        finally:
            if sockets is not None:
                with contextlib.suppress(OSError):
                    shutil.rmtree(sockets)

    async def execute(
        self,
        code: str,
        timeout: float = 120.0,
        value_limit: int | None = None,
        result: CellResult | None = None,
    ) -> CellResult:
        """Run `code` as a cell, its output gathered into `result` as it comes (a caller stopped
        meanwhile still has what the cell printed). On timeout the kernel is interrupted and the
        cell's end is awaited on the shell channel, which no flood of output queues behind;
        only a cell that has not stopped within INTERRUPT_GRACE gets the kernel restarted. A
        value whose repr is longer than `value_limit` is stashed in `_heron_values[<cell
        number>]` and named in `value_ref`."""
        result = CellResult() if result is None else result
        async with self._lock:
            await self._settle()
            if not self.started:
                await self._start_for(result)
            msg_id = self._kc.execute(code, store_history=True, allow_stdin=False)
            try:
                finished = await self._collect(msg_id, result, time.monotonic() + timeout)
            except asyncio.CancelledError:  # the turn was stopped: so is the cell
                await self._stopped(msg_id, result)
                raise
            if not finished:
                result.timed_out = True
                await self._interrupt(msg_id, result)
            if result.restarted:
                return result
            if value_limit is not None and len(result.value or "") > value_limit:
                await self._stash(result)
            return result

    async def _start_for(self, result: CellResult) -> None:
        """Start the kernel for a cell, telling it (`fresh`) when the model may expect the
        variables of an earlier kernel: one this session shut down (`lost`), or, on the
        session's first start, one of an earlier process (`earlier`, asked only then)."""
        first = not self.ever_started
        await self.start()
        result.fresh, self.lost = self.lost, None
        if result.fresh is None and first and self.earlier is not None and await self.earlier():
            result.fresh = EARLIER_PROCESS
        result.ends_with_turn = first and self.ends_with_turn

    async def _interrupt(self, msg_id: str, result: CellResult) -> None:
        """Interrupt the cell; restart the kernel only if it does not stop (`restarted`)."""
        await self._km.interrupt_kernel()
        if not await self._replied(msg_id, INTERRUPT_GRACE):
            result.restarted = True
            await self.shutdown()
            # Said again with the next cell, in a later turn too: a session dropped at the
            # run's end would take the next kernel for an earlier process's (EARLIER_PROCESS).
            self.lost = "a cell that timed out ignored the interrupt"
            return
        # Stopped: the last of its output (the KeyboardInterrupt) if it comes soon.
        await self._collect(msg_id, result, time.monotonic() + TAIL_GRACE)

    async def _stopped(self, msg_id: str, result: CellResult) -> None:
        """The cell's turn was stopped: interrupt it, and read what it printed until it ends
        (TAIL_GRACE at most: the stop must not wait on it); one that has not ended by then is
        settled before the next cell (`_settle`)."""
        self._unsettled = msg_id
        with contextlib.suppress(Exception):
            await self._km.interrupt_kernel()
            if await self._collect(msg_id, result, time.monotonic() + TAIL_GRACE):
                self._unsettled = None

    async def _settle(self) -> None:
        """A cell whose turn was stopped was interrupted then; if it still has not stopped,
        the kernel is restarted, and the next cell is told its variables are gone."""
        msg_id, self._unsettled = self._unsettled, None
        if msg_id is None or not self.started or await self._replied(msg_id, INTERRUPT_GRACE):
            return
        await self.shutdown()
        self.lost = "a cell stopped with its turn ignored the interrupt"

    async def _replied(self, msg_id: str, seconds: float) -> bool:
        """Whether the kernel finished executing `msg_id` (its reply on the shell channel)
        within `seconds`."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                reply = await self._kc.get_shell_msg(timeout=min(remaining, POLL))
            except queue.Empty:
                if not await self._km.is_alive():
                    return False
                continue
            if reply["parent_header"].get("msg_id") == msg_id:
                return True
        return False

    async def _collect(self, msg_id: str, result: CellResult, deadline: float) -> bool:
        """Read the cell's messages until the kernel is idle (True) or the deadline (False)."""
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                msg = await self._kc.get_iopub_msg(timeout=min(remaining, POLL))
            except queue.Empty:
                if not await self._km.is_alive():
                    await self._died(result)
                    return True
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue  # left over from an earlier, interrupted cell
            kind, content = msg["msg_type"], msg["content"]
            if kind in SHOWN_KINDS and image_of(content.get("data") or {}) is not None:
                content = await asyncio.to_thread(keep_image, self.workspace, content, result)
            if _apply(kind, content, result):
                return True
        return False

    async def _died(self, result: CellResult) -> None:
        """The kernel process ended under the cell: why, as far as its exit status tells, in
        the cell's error and, told as why it is new, in the next cell's result."""
        how = crash_cause(await self._exit_status())
        result.error = CellError("KernelDied", f"the Python kernel process {how}")
        result.restarted = True
        await self.shutdown()
        self.lost = f"the kernel of the earlier cells {how}"

    async def _exit_status(self) -> int | None:
        """The kernel process's exit status once it has ended (None: not known)."""
        with contextlib.suppress(Exception):
            status = await self._km.provisioner.poll()
            return status if isinstance(status, int) else None
        return None

    async def _silent(self, code: str, expressions: dict[str, str] | None = None) -> dict[str, Any]:
        """Run bookkeeping code outside the user's history; the reply's content."""
        msg_id = self._kc.execute(
            code, silent=True, store_history=False, user_expressions=expressions or {}
        )
        while True:
            reply = await self._kc.get_shell_msg(timeout=self.startup_timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                return dict(reply["content"])

    async def _stash(self, result: CellResult) -> None:
        n = result.execution_count
        if n is None:
            return
        ref = f"_heron_values[{n}]"
        reply = await self._silent(
            f"globals().setdefault('_heron_values', {{}})[{n}] = Out[{n}]",
            {"type": f"type({ref}).__name__", "len": f"len({ref})"},
        )
        if reply.get("status") != "ok":
            return  # Out was not kept (history off?): show the value cut instead
        found = reply.get("user_expressions", {})
        kind = _expression_text(found.get("type")).strip("'\"")
        size = _expression_text(found.get("len"))
        result.value_ref = ref
        result.value_type = f"{kind} of length {size}" if size else kind


KERNEL_IDLE_MINUTES = 30.0  # [tools] kernel_idle_minutes: a kept kernel unused this long ends
KEPT_MAX = 8  # started kernels a process keeps between turns; the least recently used go first
REAP_EVERY = 60.0  # seconds between looks for kernels unused past their time


@dataclass(frozen=True)
class KernelKey:
    """Whose kept kernel: a conversation by its id and creation time. Not by its key, which a
    new conversation takes once the first is deleted, nor by its id alone, which SQLite gives
    again to a row inserted after the highest one was deleted."""

    conversation_id: int
    created: float

    @classmethod
    def of(cls, conversation: Conversation) -> KernelKey:
        return cls(conversation.id, conversation.created)


class Kernels:
    """The Python kernels of a process, one per conversation, kept between its turns.

    A run takes its conversation's session (`take`, started by its first cell) and gives it
    back when it ends (`release`); the next turn of the conversation finds its variables there.
    A kept kernel is shut down once unused for `idle_minutes` (0: at the end of every run), when
    more than KEPT_MAX are kept (the least recently used), on /new and when the serve deletes
    the conversation (`forget`), at the reaper's next look when another process deleted it
    (`alive`), and with the process (`close`). Kernels are kept by `KernelKey`, so a
    conversation deleted elsewhere never lends its kernel to a new one of the same name. A
    kernel is its own process in the sandbox, which dies with Heron however Heron dies
    (docs/security.md). A conversation's turns run one at a time, and two conversations never
    share a session."""

    def __init__(
        self, workspace: Path, sandbox: Sandbox, idle_minutes: float = KERNEL_IDLE_MINUTES
    ) -> None:
        self.workspace = workspace
        self.sandbox = sandbox
        self.idle = idle_minutes * 60
        self.one_shot = False  # the process answers one message: each kernel's first cell says so
        self._sessions: dict[KernelKey, KernelSession] = {}
        self._runs: dict[KernelKey, int] = {}  # runs holding each session now
        self._released: dict[KernelKey, float] = {}  # when each was last given back (monotonic)
        self._reaper: asyncio.Task[None] | None = None
        # Which of these conversations still exist (the engine asks its store): one deleted by
        # another process has its kernel ended at the reaper's next look, not when idle.
        self.alive: Callable[[list[KernelKey]], Awaitable[set[KernelKey]]] | None = None

    def take(
        self,
        key: KernelKey,
        earlier: Callable[[], Awaitable[bool]] | None = None,
        whose: str = "",
    ) -> KernelSession:
        """The conversation's session for a run (not started until its first cell). `earlier`
        tells a new session whether the conversation ran cells in an earlier process, which
        its first cell then says are gone; `whose` names it in the kernel log."""
        session = self._sessions.get(key)
        if session is None:
            made = KernelSession(self.workspace, sandbox=self.sandbox, whose=whose)
            session = self._sessions[key] = made
            session.earlier = earlier
            session.ends_with_turn = self.one_shot
        self._runs[key] = self._runs.get(key, 0) + 1
        return session

    async def release(self, key: KernelKey) -> None:
        """A run of the conversation ended: its kernel waits for the next one."""
        self._runs[key] = self._runs.get(key, 1) - 1
        if self._runs[key] > 0:
            return
        del self._runs[key]
        self._released[key] = time.monotonic()
        session = self._sessions.get(key)
        if session is None:
            return
        if not session.started and session.lost is None:
            self._drop(key)  # nothing to keep
        elif self.idle <= 0:
            await self._end(key, None)
        else:
            await self._over_cap()
            if self._reaper is None:
                self._reaper = asyncio.create_task(self._reap())

    async def forget(self, key: KernelKey) -> None:
        """/new, or the conversation was deleted: its kernel ends (its next cell, if any, is
        a fresh start: no notice)."""
        session = self._sessions.get(key)
        if session is not None:
            await session.shutdown()
            session.lost = None
        if key not in self._runs:
            self._drop(key)

    async def close(self) -> None:
        """The process ends: every kernel with it."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            with contextlib.suppress(Exception):
                await session.shutdown()

    @property
    def running(self) -> list[KernelKey]:
        """The conversations whose kernel runs now."""
        return [key for key, session in self._sessions.items() if session.started]

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(min(REAP_EVERY, max(self.idle / 4, 0.05)))
            now = time.monotonic()
            for key in list(self._sessions):
                idle_since = self._released.get(key)
                if key in self._runs or idle_since is None or now - idle_since < self.idle:
                    continue
                await self._end(key, f"the last one ended after {self.idle / 60:g} minutes unused")
            await self._end_deleted()

    async def _end_deleted(self) -> None:
        """End the kept kernels of conversations deleted meanwhile (`alive`)."""
        kept = [k for k, s in self._sessions.items() if s.started and k not in self._runs]
        if self.alive is None or not kept:
            return
        living = await self.alive(kept)
        for key in kept:
            if key not in living and key not in self._runs:
                await self.forget(key)

    async def _over_cap(self) -> None:
        idle = [k for k, s in self._sessions.items() if s.started and k not in self._runs]
        idle.sort(key=lambda k: self._released.get(k, 0.0))
        for key in idle[: max(0, len(idle) - KEPT_MAX)]:
            await self._end(
                key, f"this process keeps at most {KEPT_MAX}; it was used least recently"
            )

    async def _end(self, key: KernelKey, why: str | None) -> None:
        """Shut the kernel down; `why` is told with the conversation's next cell."""
        session = self._sessions.get(key)
        if session is None:
            return
        if session.started and why is not None:
            session.lost = why  # before the shutdown: a run taking it meanwhile is told too
        await session.shutdown()
        if session.lost is None and key not in self._runs:
            self._drop(key)

    def _drop(self, key: KernelKey) -> None:
        self._sessions.pop(key, None)
        self._released.pop(key, None)


def bind_sockets(prefix: Path) -> list[socket.socket]:
    """The kernel's five ipc sockets (`<prefix>-1` to `-5`, in KERNEL_PORTS' order), bound and
    listening, for the kernel to inherit: sandboxed it cannot make a Unix socket itself."""
    made: list[socket.socket] = []
    try:
        for port in range(1, len(KERNEL_PORTS) + 1):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            made.append(sock)
            sock.bind(f"{prefix}-{port}")
            sock.listen(100)  # ZeroMQ's own backlog
            sock.setblocking(False)
    except OSError:
        for sock in made:
            sock.close()
        raise
    return made


def sweep_sockets(folder: Path) -> list[Path]:
    """Remove the kernel socket folders of Heron processes that no longer run (killed before
    their shutdown could); the folders removed."""
    gone = []
    for path in folder.glob(f"{SOCKETS_PREFIX}*-*"):
        owner = path.name.removeprefix(SOCKETS_PREFIX).split("-", 1)[0]
        try:
            mine = path.stat().st_uid == os.geteuid()
        except OSError:
            continue
        if not owner.isdigit() or not mine or pid_alive(int(owner)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        gone.append(path)
    return gone


def _expression_text(found: Any) -> str:
    if not isinstance(found, dict) or found.get("status") != "ok":
        return ""
    return str(found.get("data", {}).get("text/plain", ""))


def _stream(name: str, text: str, result: CellResult) -> None:
    """A stream message into `result`, with what the kernel dropped (KERNEL_SETUP) counted
    where it was dropped."""
    if "\x00" not in text:
        result.add_output(name, text)
        return
    at = 0
    for found in DROPPED.finditer(text):
        result.add_output(name, text[at : found.start()])
        result.output.dropped(int(found.group(1)))
        at = found.end()
    result.add_output(name, text[at:])


def _apply(kind: str, content: dict[str, Any], result: CellResult) -> bool:
    """Fold one iopub message into `result`; True when the cell has finished."""
    if kind == "stream":
        _stream(content["name"], content["text"], result)
    elif kind in ("display_data", "update_display_data"):
        result.add_output("display", shown_text(content.get("data", {})))
    elif kind == "execute_result":
        result.value = ANSI.sub("", shown_text(content.get("data", {})))
        result.execution_count = content.get("execution_count")
    elif kind == "execute_input":  # sent before the cell runs: its output is labelled with it
        result.execution_count = result.output.cell = content.get("execution_count")
    elif kind == "error":
        frames = [ANSI.sub("", line) for line in content.get("traceback", [])]
        result.error = CellError(content.get("ename", "Error"), content.get("evalue", ""), frames)
    elif kind == "clear_output":
        result.output.clear()
    elif kind == "status":
        return content.get("execution_state") == "idle"
    return False


def shown_text(data: dict[str, Any]) -> str:
    """What the model reads of a display or a value: its text, or, for one whose text is only
    the object's name (IPython's `<...HTML object>`), which kinds it had and that they are not
    shown. A pandas table's text/plain is its text: it is kept."""
    plain = data.get("text/plain")
    others = [kind for kind in data if kind != "text/plain"]
    if isinstance(plain, str) and not (others and OBJECT_REPR.fullmatch(plain.strip())):
        return plain
    if not others:
        return plain if isinstance(plain, str) else ""
    kinds = ", ".join(f"{kind} ({len(str(data[kind])):,} characters)" for kind in others)
    return f"{kinds}: {NOT_SHOWN}"


# ---- images ------------------------------------------------------------------------------------


def image_of(data: dict[str, Any]) -> str | None:
    """The image kind of a display's data that run_cell saves, if it has one."""
    return next((kind for kind in IMAGE_KINDS if kind in data), None)


def keep_image(workspace: Path, content: dict[str, Any], result: CellResult) -> dict[str, Any]:
    """Save the image of a display (or a value) into the workspace's outputs/, bounded in
    size and count; the content with its data replaced by what the model is told: the path
    and size, or why it was not saved."""
    data = content.get("data") or {}
    kind = image_of(data)
    assert kind is not None, "only a display with an image is kept"
    result.images += 1
    said = _saved_image(workspace, kind, data[kind], result)
    return {**content, "data": {"text/plain": said}}


def _saved_image(workspace: Path, kind: str, value: object, result: CellResult) -> str:
    extension, name = IMAGE_KINDS[kind]
    try:
        raw = _image_bytes(kind, value)
    except (binascii.Error, ValueError, TypeError):
        return f"an image ({name}) not saved: its data is not valid base64"
    what = f"an image ({name}{_pixels(raw)}, {len(raw):,} bytes)"
    if len(raw) > IMAGE_MAX:
        return (
            f"{what} not saved: over the {IMAGE_MAX // 1_000_000} MB a displayed image may "
            "take. Save it to a file from the code instead (e.g. fig.savefig('plot.png'))."
        )
    if result.images > IMAGES_MAX:
        return f"{what} not saved: a cell saves at most {IMAGES_MAX} images."
    cell = result.output.cell if result.output.cell is not None else result.execution_count
    stem = f"{OUTPUTS_DIR}/cell-{cell if cell is not None else 0}-{result.images}"
    try:
        path = _write_new(workspace, stem, extension, raw)
    except OSError as error:
        return f"{what} not saved: {error.strerror or error}"
    return f"{what} saved to {path}"


def _image_bytes(kind: str, value: object) -> bytes:
    """An image's bytes from a display's data: SVG is text, the others base64."""
    if kind == "image/svg+xml":
        return str(value).encode()
    if not isinstance(value, str):
        raise TypeError("not base64 text")
    return base64.b64decode(value, validate=False)


def _pixels(raw: bytes) -> str:
    """ ", WxH" for a PNG (its header says), else nothing."""
    if raw[:8] != b"\x89PNG\r\n\x1a\n" or raw[12:16] != b"IHDR":
        return ""
    width, height = int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")
    return f", {width}x{height}"


def _write_new(workspace: Path, stem: str, extension: str, raw: bytes) -> str:
    """Write `raw` at `stem.extension`, or `stem-2.extension`... where that is taken (a cell of
    an earlier kernel had the same number): never over an existing file. The path written."""
    for attempt in range(1, 101):
        path = f"{stem}.{extension}" if attempt == 1 else f"{stem}-{attempt}.{extension}"
        if workspace_io.write(workspace, path, raw, exclusive=True):
            return path
    raise FileExistsError(errno.EEXIST, f"{stem}.{extension} and 99 more names are taken")


def crash_cause(status: int | None) -> str:
    """How the kernel process ended, from its exit status: negative for a signal, or 128 plus
    the signal as the sandbox (bwrap) reports a child a signal killed."""
    if status is None:
        return "died"
    number = -status if status < 0 else status - 128 if status > 128 else None
    try:
        name = signal.Signals(number).name if number is not None else None
    except ValueError:
        name = None
    if name is not None:
        return f"crashed: killed by {name}, exit status {status}"
    return f"crashed: exit code {status}" if status else "ended: exit code 0"


# ---- side effects ----------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, tuple[int, int]] | None:
    """(mtime_ns, size) of each file under `root`, or None when there are too many to track."""
    seen: dict[str, tuple[int, int]] = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SNAPSHOT_SKIP]
        for name in names:
            path = os.path.join(folder, name)
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                continue
            seen[os.path.relpath(path, root)] = (st.st_mtime_ns, st.st_size)
            if len(seen) > SNAPSHOT_MAX:
                return None
    return seen


def changes(
    before: dict[str, tuple[int, int]] | None, after: dict[str, tuple[int, int]] | None
) -> list[tuple[str, str]]:
    """(path, "new" | "modified" | "deleted") between two snapshots, sorted by path."""
    if before is None or after is None:
        return []
    found = [(p, "modified" if p in before else "new") for p in after if after[p] != before.get(p)]
    found += [(p, "deleted") for p in before if p not in after]
    return sorted(found)


# ---- the digest ------------------------------------------------------------------------------


def digest(
    result: CellResult, changed: list[tuple[str, str]], timeout: float, budget: int = 20_000
) -> ToolOutput:
    """What the model reads after a cell: its output within `budget` characters with what
    follows it (head and tail around a count of what was left out), and the whole of it, up to
    WHOLE_CAP characters, for the person's /show when that was cut."""
    rest: list[str] = []
    if result.value_ref:
        preview = " ".join((result.value or "")[:PREVIEW].split())
        rest.append(
            f"Last value: {result.value_type}, {len(result.value or '')} characters, too large "
            f"to show. The kernel keeps it as `{result.value_ref}`: use that in later cells and "
            f"do not re-run the call that produced it. It starts: {preview}"
        )
    elif result.value is not None:
        rest.append(f"Last value: {result.value}")
    if changed:
        rest.append("Files changed: " + ", ".join(f"{p} ({how})" for p, how in changed))
    rest += _trouble(result, timeout)
    if result.fresh:
        said = f"This cell ran in a new kernel ({result.fresh}): earlier variables are gone."
        rest.insert(0, said)
    if result.ends_with_turn:
        rest.append(ONE_SHOT_KERNEL)
    output = result.output
    limit = max(1000, budget - len("\n".join(rest)) - 200)
    shown = [output.text(limit)] if output.groups else []
    whole = "\n".join([output.text(), *rest]) if output.total > limit else None
    failed = result.error is not None or result.timed_out
    return ToolOutput("\n".join(shown + rest) or "(no output)", is_error=failed, whole=whole)


def _trouble(result: CellResult, timeout: float) -> list[str]:
    if result.timed_out:
        if result.restarted:
            return [
                f"Timed out after {timeout:g} s and did not stop within {INTERRUPT_GRACE:g} s "
                "of the interrupt, so the kernel was restarted: all variables are lost."
            ]
        return [f"Timed out after {timeout:g} s; the cell was interrupted (variables are kept)."]
    if result.error is None:
        return []
    error = result.error
    if error.ename == "StdinNotImplementedError":  # input(), getpass(): nobody can answer
        return [NO_INPUT]
    headline = f"{error.ename}: {error.evalue}"
    if result.restarted:
        return [f"{headline}; variables are lost and a new kernel starts on the next run_cell."]
    frames = [
        line
        for line in "\n".join(error.traceback).splitlines()
        if line.strip() and not set(line.strip()) <= {"-"} and "most recent call last" not in line
    ]
    if frames and frames[-1].strip() == headline.strip():
        frames = frames[:-1]  # the headline is already said
    return [headline, *frames[-TRACEBACK_LINES:]]


def kernel_lifetime(idle_minutes: float, one_shot: bool) -> str:
    """The sentence run_cell's description ends with: how long its variables last here."""
    if one_shot:
        return (
            "This process answers one message: the kernel ends with this turn, and a later "
            "message starts an empty one."
        )
    if idle_minutes <= 0:
        return "The kernel ends with each turn: a later turn starts an empty one."
    return (
        "The kernel is kept for this conversation's later turns until it has been unused for "
        f"{idle_minutes:g} minutes or the conversation starts afresh (/new); a cell that then "
        "runs in a new kernel is told so."
    )


def describe_kernel(registry: ToolRegistry, idle_minutes: float, one_shot: bool) -> None:
    """Say in run_cell's description how long its variables last in this process (rebuilt
    from the docstring, so a registry opened twice is described once; where it runs, said
    after it by heron/tools/approval.py, stays)."""
    found = registry.get(run_cell.name)
    if found is None:
        return
    base, _ = parse_docstring(found.fn.__doc__)
    where = found.description.find(WHERE_IT_RUNS)
    after = f" {found.description[where:]}" if where >= 0 else ""
    described = f"{base} {kernel_lifetime(idle_minutes, one_shot)}{after}"
    registry.replace(dataclasses.replace(found, description=described))


def session_as_recorded(
    workspace: Path, sandbox: Sandbox | None, first_result: str | None
) -> KernelSession:
    """A kernel session that says with its first cell what the recorded run's first cell was
    told of its kernel (`first_result`, that cell's recorded result): that it ends with the
    turn (a one-shot `heron run`), that an earlier process's variables are gone. A live replay
    runs the cells in it, so a deterministic cell's result is the recorded one again."""
    session = KernelSession(workspace, sandbox=sandbox)
    said = first_result or ""
    session.ends_with_turn = ONE_SHOT_KERNEL in said
    if f"({EARLIER_PROCESS})" in said:

        async def earlier() -> bool:
            return True

        session.earlier = earlier
    return session


def lifetime_in(description: str) -> tuple[float, bool] | None:
    """The (idle minutes, one-shot) whose sentence run_cell's `description` holds, if any: a
    replay describes the kernel as the recorded run's process did."""
    found = re.search(r"unused for ([0-9.]+) minutes", description)
    candidates = [(0.0, True), (0.0, False)]
    if found is not None:
        candidates.append((float(found.group(1)), False))
    return next((c for c in candidates if kernel_lifetime(*c) in description), None)


@tool(writes=True)
async def run_cell(ctx: ToolContext, code: str, timeout: int = 120) -> ToolOutput:
    """Run Python in a persistent IPython kernel (variables survive between calls; the working
    directory is the workspace). Returns printed output, the last expression's value and the
    files the cell changed.

    Args:
        timeout: Seconds before the cell is interrupted.
    """
    kernel = ctx.kernel
    if not isinstance(kernel, KernelSession):  # the run's first cell starts its kernel
        kernel = ctx.kernel = KernelSession(ctx.workspace, sandbox=ctx.sandbox)
    before = await asyncio.to_thread(snapshot, ctx.workspace)
    result = CellResult()
    try:
        await kernel.execute(code, max(1, timeout), ctx.result_budget, result)
    except asyncio.CancelledError:  # stopped with its turn: what it printed goes with that
        if result.output.groups:
            ctx.leave_partial(result.output.text(max(1000, ctx.result_budget - 200)))
        raise
    changed = changes(before, await asyncio.to_thread(snapshot, ctx.workspace))
    for path, how in changed:
        kind = "file_deleted" if how == "deleted" else "file_written"
        ctx.record_effect({"kind": kind, "path": path})
    return digest(result, changed, max(1, timeout), ctx.result_budget)
