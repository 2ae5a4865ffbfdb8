"""The kernel's own stdout/stderr, kept bounded in `.heron/kernel.log`.

ipykernel copies everything written to the kernel's fds 1 and 2 (a subprocess's output,
`os.system`, a C extension's prints, a crash's last words) to the stdout/stderr it started
with, besides sending it to Heron as the cell's output; and a subprocess given `sys.stdout`
writes to that descriptor directly. Given a file, a cell running `yes` wrote 525 MB there in
3 seconds. So the kernel gets the write end of a pipe instead, and a thread of Heron's reads
it: the first HEAD bytes of each kernel's life go to the log as they come (the start-up
lines, an early failure), only the last TAIL bytes after that are held, and they are written
with a count of what was left out when the kernel's end closes the pipe (a crash's traceback
is at the end). A log already past START_OVER at a kernel's start is emptied first, so the
file stays under START_OVER + HEAD + TAIL plus a line."""

from __future__ import annotations

import contextlib
import os
import threading
import time

HEAD = 64 * 1024  # bytes of a kernel's output written as they come
TAIL = 64 * 1024  # bytes of its last output kept and written when it ends
START_OVER = 1024 * 1024  # a log this large at a kernel's start is emptied first
CHUNK = 1024 * 1024  # bytes read at a time: a flood costs a few reads a second


class KernelLog:
    """The reading end of one kernel's stdout/stderr pipe, written bounded to `log_fd`
    (which it owns and closes). `write_end` goes to the kernel and is closed here by
    `started()` once the kernel holds it."""

    def __init__(
        self,
        log_fd: int,
        head: int = HEAD,
        tail: int = TAIL,
        start_over: int = START_OVER,
        whose: str = "",
    ) -> None:
        self.head, self.tail, self.start_over = head, tail, start_over
        self.whose = whose  # whose kernel, on its start line ("conversation personal")
        self._log = log_fd
        self._read, self.write_end = os.pipe2(os.O_CLOEXEC)
        self.left_out = 0  # bytes between the head and the tail, counted, never written
        self._thread = threading.Thread(target=self._run, name="heron-kernel-log", daemon=True)

    def started(self) -> None:
        """The kernel holds the write end now (or failed to start): read until it ends."""
        self._close_write_end()
        if not self._thread.is_alive():
            self._thread.start()

    def close(self) -> None:
        """Nothing started: give up both ends and the log."""
        self._close_write_end()
        for fd in (self._read, self._log):
            with contextlib.suppress(OSError):
                os.close(fd)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _close_write_end(self) -> None:
        fd, self.write_end = self.write_end, -1
        if fd >= 0:
            os.close(fd)

    def _run(self) -> None:
        try:
            self._begin()
            kept = self._copy_head()
            held = self._hold_tail(kept)
            if self.left_out:
                mark = f"\n[heron: {self.left_out} bytes of the kernel's output left out]\n"
                self._write(mark.encode())
            self._write(held)
        except OSError:
            pass  # a log Heron cannot write must not stop the kernel: the pipe is drained
        finally:
            with contextlib.suppress(OSError):
                self._drain()
            os.close(self._read)
            os.close(self._log)

    def _begin(self) -> None:
        if os.fstat(self._log).st_size > self.start_over:
            os.ftruncate(self._log, 0)  # O_APPEND: the next write lands at the start
        # Which kernel start a line belongs to: ipykernel's own lines carry no time.
        # Whose, too: a serve runs a kernel per conversation, all writing to this one file.
        whose = f" for {self.whose}" if self.whose else ""
        self._write(f"--- kernel started {time.strftime('%Y-%m-%d %H:%M:%S')}{whose}\n".encode())

    def _copy_head(self) -> bytes:
        """Write up to `head` bytes as they come; what read past them is returned."""
        written = 0
        while written < self.head:
            chunk = os.read(self._read, CHUNK)
            if not chunk:
                return b""
            room = self.head - written
            self._write(chunk[:room])
            written += min(room, len(chunk))
            if len(chunk) > room:
                return chunk[room:]
        return b""

    def _hold_tail(self, held: bytes) -> bytes:
        """Read to the end, holding the last `tail` bytes and counting the rest."""
        while True:
            if len(held) > self.tail:
                self.left_out += len(held) - self.tail
                held = held[-self.tail :] if self.tail else b""
            chunk = os.read(self._read, CHUNK)
            if not chunk:
                return held
            held += chunk

    def _drain(self) -> None:
        while os.read(self._read, CHUNK):
            pass

    def _write(self, data: bytes) -> None:
        while data:
            data = data[os.write(self._log, data) :]
