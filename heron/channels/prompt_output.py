"""What the chat prints while its prompt is up, in the order it was printed.

prompt_toolkit's `patch_stdout` hands each line to a thread that bundles writes 0.2 s apart,
so the prompt could redraw as idle (the turn over) before the reply's last block was on
screen: a quick Ctrl-D left that block under the prompt. Here every line goes above the
prompt through one ordered chain of `run_in_terminal` calls, and `then(fn)` runs `fn` (the
prompt turning idle) after all that was printed before it is on screen, with the prompt
redrawn after it: the order is certain, not just likely."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TextIO, cast

from prompt_toolkit.application import run_in_terminal
from prompt_toolkit.application.current import get_app_session
from prompt_toolkit.output import Output


class PromptOutput:
    """A file for `sys.stdout` and `sys.stderr` (what Rich prints through): whole lines, in
    the order written, above the prompt when one is up, straight out when none is."""

    def __init__(self, loop: asyncio.AbstractEventLoop, original: TextIO | None) -> None:
        self.loop = loop
        self.thread = threading.get_ident()
        self.original = original
        self.session = get_app_session()  # whose app, once running, the prompt is
        self.output: Output = self.session.output
        self.partial: list[str] = []  # the text since the last newline: printed with its line
        self.last: asyncio.Future[None] | None = None  # the chain's newest link

    def write(self, data: str) -> int:
        if threading.get_ident() != self.thread:  # a worker thread's print: on the loop
            self.loop.call_soon_threadsafe(self.write, data)
            return len(data)
        if "\n" in data:
            lines, after = data.rsplit("\n", 1)
            self._print("".join([*self.partial, lines, "\n"]))
            self.partial = [after] if after else []
        elif data:
            self.partial.append(data)
        return len(data)

    def flush(self) -> None:
        if threading.get_ident() != self.thread:
            self.loop.call_soon_threadsafe(self.flush)
        elif self.partial:
            text, self.partial = "".join(self.partial), []
            self._print(text)

    def then(self, fn: Callable[[], None]) -> None:
        """Run `fn` once what was printed before it is on screen; the prompt redraws after."""
        self.flush()
        self._chain(fn)

    async def drain(self) -> None:
        """Wait until everything printed is out (before the chat leaves)."""
        self.flush()
        while self.last is not None and not self.last.done():
            await asyncio.shield(self.last)

    def _print(self, text: str) -> None:
        def out() -> None:
            with contextlib.suppress(OSError):  # a terminal that closed: nobody reads it
                self.output.enable_autowrap()
                self.output.write_raw(text)
                self.output.flush()

        self._chain(out)

    def _chain(self, fn: Callable[[], None]) -> None:
        app = self.session.app
        idle = self.last is None or self.last.done()
        if idle and (app is None or not app.is_running):
            fn()  # no prompt up and nothing waiting to be printed: at once, as print does
            return
        self.last = asyncio.ensure_future(self._after(self.last, fn))

    async def _after(self, before: asyncio.Future[None] | None, fn: Callable[[], None]) -> None:
        if before is not None:
            with contextlib.suppress(Exception):  # a failed link stops nothing after it
                await before
        app = self.session.app
        if app is not None and app.is_running:
            await run_in_terminal(fn, in_executor=False)
        else:
            fn()

    # What Rich and others ask of a file: the terminal's own answers.
    def isatty(self) -> bool:
        return self.original is not None and self.original.isatty()

    def fileno(self) -> int:
        return self.output.fileno()

    @property
    def encoding(self) -> str:
        return self.output.encoding()

    @property
    def errors(self) -> str:
        return "strict"


@asynccontextmanager
async def prompt_output() -> AsyncIterator[PromptOutput]:
    """`sys.stdout` and `sys.stderr` as one PromptOutput for the chat's duration; all it was
    given is out before they are put back."""
    out = PromptOutput(asyncio.get_running_loop(), sys.stdout)
    before = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = cast(TextIO, out)
    try:
        yield out
    finally:
        with contextlib.suppress(asyncio.CancelledError):
            await out.drain()
        sys.stdout, sys.stderr = before
