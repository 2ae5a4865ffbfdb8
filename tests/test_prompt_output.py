"""The chat's output while its prompt is up (heron/channels/prompt_output.py): whole lines in
the order printed, and what runs after a print (the prompt turning idle) runs once that print
is on the terminal, with the prompt redrawn after it."""

from __future__ import annotations

import asyncio

from prompt_toolkit import PromptSession
from prompt_toolkit.application import create_app_session
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from heron.channels.prompt_output import prompt_output


class Recorded(DummyOutput):
    """An output that keeps what was written to it."""

    def __init__(self) -> None:
        self.written: list[str] = []

    def write(self, data: str) -> None:
        self.written.append(data)

    def write_raw(self, data: str) -> None:
        self.written.append(data)

    def text(self) -> str:
        return "".join(self.written)


async def test_what_runs_after_a_print_finds_it_on_the_terminal_in_order():
    recorded = Recorded()
    idle = False
    at_idle: list[str] = []

    def prompt() -> str:
        return "› " if idle else "working › "

    def turn_idle() -> None:
        nonlocal idle
        idle = True
        at_idle.append(recorded.text())

    with create_pipe_input() as keys, create_app_session(input=keys, output=recorded):
        session: PromptSession[str] = PromptSession()
        asking = asyncio.ensure_future(session.prompt_async(prompt))
        while not session.app.is_running:
            await asyncio.sleep(0)
        async with prompt_output() as out:
            print("first block")
            print("last", end="")  # a line still open is printed with what follows it
            print(" block")
            out.then(turn_idle)
            await out.drain()
            await asyncio.sleep(0)  # the redraw after it
            keys.send_text("\r")
            await asyncio.wait_for(asyncio.shield(asking), 10)
    shown = at_idle[0]
    assert shown.index("first block\n") < shown.index("last block\n")
    assert "working ›" in shown  # the prompt was up while the blocks were printed
    after = recorded.text()[len(shown) :]
    assert "›" in after and "working" not in after  # the idle prompt is drawn after them
