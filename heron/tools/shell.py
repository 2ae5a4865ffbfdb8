"""The bash tool: one command in the workspace, in the sandbox, in its own process group.

The command line and environment come from heron/tools/sandbox.py: confined, the command runs
under bubblewrap in its own pid namespace, so whatever it starts ends with it (and with Heron).
The group is what gets killed on timeout or cancellation, so a command's children (a server it
started, a pipeline) die with it. Output is kept as head and tail while it streams, so a command
that prints gigabytes costs no more memory than a few megabytes: the model reads the head and
tail that fit its result budget, and the person's `/show N` up to WHOLE_CAP characters of it
(kept by the registry outside the workspace, heron/saved.py). Binary output is counted, not
sent (`without_binary`).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import signal
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from heron.errors import ToolError
from heron.saved import WHOLE_CAP
from heron.tools.context import ToolContext
from heron.tools.registry import ToolOutput, tool
from heron.tools.sandbox import Sandbox

MAX_TIMEOUT = 3600
KILL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL
DRAIN_GRACE = 0.5  # seconds to wait for output after the command itself has exited


class HeadTail:
    """Collects text keeping only the first and last `limit // 2` characters (or so), and
    renders it at that limit or at a smaller one: the person's copy of a command's output and
    the model's come from one collector. The tail is a queue of the chunks read, trimmed from
    the left, so a command printing gigabytes costs one pass over them."""

    def __init__(self, limit: int, marker: str = "") -> None:
        self.limit = limit
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.marker = marker  # said after the count of characters left out at `limit`
        self.head = ""
        self.tail: deque[str] = deque()
        self.tail_len = 0
        self.total = 0
        self.size = 0  # bytes decoded into it, when a byte stream feeds it (`_pump`)

    def add(self, text: str) -> None:
        self.total += len(text)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += text[:room]
            text = text[room:]
        if not text:
            return
        self.tail.append(text)
        self.tail_len += len(text)
        while self.tail and self.tail_len - len(self.tail[0]) >= self.tail_limit:
            self.tail_len -= len(self.tail.popleft())

    @property
    def omitted(self) -> int:
        return max(0, self.total - self.limit)

    def text(self, limit: int | None = None) -> str:
        """All of it when it fits `limit` (default: the collector's), else its first and last
        characters around a line saying how many were left out."""
        limit = self.limit if limit is None else min(limit, self.limit)
        kept = "".join(self.tail)
        if self.total <= self.limit:
            kept = self.head + kept  # nothing dropped: the end may lie within the head
        if self.total <= limit:
            return kept
        head_limit = limit // 2
        tail = kept[-(limit - head_limit) :] if limit > head_limit else ""
        marker = self.marker if limit == self.limit else ""
        return (
            f"{self.head[:head_limit]}\n[... {self.total - limit} characters omitted{marker} "
            f"...]\n{tail}"
        )


async def _pump(stream: asyncio.StreamReader, sink: HeadTail) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while chunk := await stream.read(65536):
        sink.size += len(chunk)
        sink.add(decoder.decode(chunk))
    sink.add(decoder.decode(b"", final=True))


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def _exited(proc: asyncio.subprocess.Process) -> int:
    """The exit code, as soon as the process has exited. Not `proc.wait()`: on Python 3.11 that
    also waits for the pipes to close, which a background child can hold open for ever."""
    # Fine polling while most commands end (a sandboxed `true` takes tens of milliseconds, and
    # a coarse step would round that up to the next one), coarse after a second.
    delay, polls = 0.001, 0
    while proc.returncode is None:
        await asyncio.sleep(delay)
        polls += 1
        delay = min(delay * 2, 0.005 if polls < 200 else 0.05)
    return proc.returncode


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the group, then SIGKILL it if the leader has not gone within the grace."""
    _signal_group(proc.pid, signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(_exited(proc), KILL_GRACE)
    # Children may ignore SIGTERM even when the leader has gone; they must not outlive us.
    _signal_group(proc.pid, signal.SIGKILL)


@dataclass
class Captured:
    """A command's output: `text` within the model's limit, `whole` (up to WHOLE_CAP) when
    `text` had to leave some of it out, the exit code (None: it timed out) and the bytes it
    printed."""

    text: str
    whole: str | None
    code: int | None
    size: int = 0


async def run_command(
    command: str,
    sandbox: Sandbox,
    timeout: float,
    limit: int,
    stopped: Callable[[str], None] | None = None,
) -> Captured:
    """Run `command` with bash in `sandbox`; its output within `limit` characters (head and
    tail) and, when that cut it, within WHOLE_CAP too. Cancelled, it kills the command and
    hands `stopped` what it had printed, within `limit`."""
    sandbox.prepare()
    proc, cancelled = await _start(command, sandbox)
    assert proc.stdout is not None
    sink = HeadTail(max(limit, WHOLE_CAP), f": the person's copy keeps {WHOLE_CAP:,} characters")
    pump = asyncio.create_task(_pump(proc.stdout, sink))
    code: int | None = None
    try:
        if cancelled:  # stopped while it was being started: what it printed meanwhile counts
            raise asyncio.CancelledError
        code = await asyncio.wait_for(_exited(proc), timeout)
    except TimeoutError:
        await _kill_group(proc)
    except asyncio.CancelledError:
        cancelled = True
        raise
    finally:
        if proc.returncode is None:  # cancelled: leave nothing running
            await _kill_group(proc)
        lingered = await _drain(proc, pump)
        if cancelled and stopped is not None:
            stopped(sink.text(limit))
    note = ""
    if lingered:
        note = (
            "\n[background processes still writing to the output were stopped; what a command "
            "starts ends with it, so start a server and use it in the same command]"
        )
    whole = sink.text() + note if sink.total > limit else None
    return Captured(sink.text(limit) + note, whole, code, sink.size)


# ---- binary output ---------------------------------------------------------------------------

# Characters of text output besides the printable: tab, newline, carriage return, escape (colour
# codes), backspace and form feed. U+FFFD (a byte that is not UTF-8), NUL, DEL and the other
# control characters are what binary output decodes to.
_TEXT_CONTROLS = frozenset("\t\n\r\x1b\x08\x0c")
BINARY_SHARE = 10  # output (or a line of it) with more than 1 in 10 such characters is binary


def _not_text(text: str) -> int:
    return sum(1 for c in text if c in "\ufffd\x7f" or (c < " " and c not in _TEXT_CONTROLS))


def _binary_line(line: str) -> bool:
    return _not_text(line) * BINARY_SHARE > len(line)


def without_binary(text: str, size: int) -> str:
    """`text` (a command's output, `size` bytes in all) with its binary part replaced by one
    line saying how many bytes were not shown, when that part is more than a tenth of it: the
    text lines before and after are kept (a build's messages around a dump). Random bytes cost
    the model tokens and tell it nothing, as read_file refuses a binary file."""
    if _not_text(text) * BINARY_SHARE <= len(text):
        return text
    lines = text.split("\n")
    binary = [i for i, line in enumerate(lines) if _binary_line(line)]
    before, after = lines[: binary[0]], lines[binary[-1] + 1 :]
    shown = len("\n".join([*before, ""]).encode()) + len("\n".join(after).encode())
    said = (
        f"[binary output: {max(0, size - shown):,} bytes that are not text, not shown; redirect "
        "it to a file (command > out.bin) and look at it with xxd or file]"
    )
    return "\n".join([*before, said, *after])


async def _start(command: str, sandbox: Sandbox) -> tuple[asyncio.subprocess.Process, bool]:
    """Start `command` in `sandbox`, in its own process group (killed as one); the filter's
    fd (sandbox.seccomp) stays open until bwrap has been started with it. True with the
    process: the call was cancelled while it was set up. It runs already and may have printed
    (a busy event loop finishes the setup well after the command has started), so the caller
    still reads its output, then kills it."""
    with sandbox.seccomp() as fd:
        spawn = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                *sandbox.wrap(["/bin/bash", "-c", command], seccomp=fd),
                cwd=sandbox.workspace,
                env=sandbox.environment(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                pass_fds=() if fd is None else (fd,),
            )
        )
        try:
            return await asyncio.shield(spawn), False
        except FileNotFoundError as error:
            raise ToolError(
                f"the command could not start: {error.filename or error} is missing",
                hint="Commands run under bubblewrap; install it (apt-get install bubblewrap).",
            ) from None
        except asyncio.CancelledError:
            return await spawn, True


async def _drain(proc: asyncio.subprocess.Process, pump: asyncio.Task[None]) -> bool:
    """Wait for the output to end. A background child holding the pipe open would make that
    for ever: it is stopped instead (it would die of SIGPIPE on its next write anyway), and
    True says so."""
    try:
        await asyncio.wait_for(asyncio.shield(pump), DRAIN_GRACE)
        return False
    except TimeoutError:
        pass
    await _kill_group(proc)  # the leader has gone; this reaches the rest of its group
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(pump, DRAIN_GRACE)
    return True


@tool(writes=True)
async def bash(ctx: ToolContext, command: str, timeout: int = 120) -> ToolOutput:
    """Run a bash command in the workspace; returns its output (stdout and stderr) and exit code.

    Args:
        timeout: Seconds before the command is killed.
    """
    seconds = max(1, min(timeout, MAX_TIMEOUT))
    # Leave room under the result budget for the status line.
    sandbox = ctx.sandbox or Sandbox(ctx.workspace)
    limit = max(ctx.result_budget - 200, 1000)
    out = await run_command(command, sandbox, seconds, limit, ctx.leave_partial)
    code = out.code
    ctx.record_effect({"kind": "command", "command": command, "exit": code})
    if code is None:
        status = (
            f"[timed out after {seconds} s; the command and its child processes were killed. "
            "Output so far is above.]"
        )
    else:
        status = f"[exit code {code}]"
    whole = None if out.whole is None else out.whole.rstrip("\n") + "\n" + status
    body = without_binary(out.text, out.size).rstrip("\n") or "(no output)"
    return ToolOutput(f"{body}\n{status}", is_error=code != 0, whole=whole)
