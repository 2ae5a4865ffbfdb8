"""Keys pressed while no prompt is up. Between two prompts (a message being sent, a turn
being settled) prompt_toolkit leaves the terminal in its line mode, where the terminal driver
itself would take Ctrl-D as end of input and drop it; `eof_as_a_key` keeps it a key for the
next prompt. Checked in a real pseudo-terminal, with the gap held open on purpose."""

from __future__ import annotations

import os
import sys

import pexpect
import pytest

pytestmark = pytest.mark.slow

PROGRAM = r"""
import asyncio, sys, time
from prompt_toolkit import PromptSession
from heron.channels.terminal import eof_as_a_key

async def main(guarded):
    session = PromptSession()
    with eof_as_a_key() if guarded else open("/dev/null"):
        await session.prompt_async("one>")
        print("BETWEEN", flush=True)
        time.sleep(1.5)  # no prompt is up: the terminal is in its line mode
        try:
            await session.prompt_async("two>")
            print("TEXT")
        except EOFError:
            print("EOF")

asyncio.run(main(sys.argv[1] == "guarded"))
"""


def _run(mode: str) -> str:
    env = {**os.environ, "PROMPT_TOOLKIT_NO_CPR": "1", "TERM": "xterm"}
    child = pexpect.spawn(
        sys.executable, ["-c", PROGRAM, mode], env=env, encoding="utf-8", timeout=60
    )
    child.expect("one>")
    child.send("\r")
    child.expect("BETWEEN")
    child.sendcontrol("d")  # pressed while no prompt is up
    child.expect("two>")
    # the next prompt, once up, reads a waiting key at once: a few seconds is ample
    found = child.expect(["EOF", "TEXT", pexpect.TIMEOUT], timeout=5)
    child.terminate(force=True)
    return ["EOF", "TEXT", "lost"][found]


def test_ctrl_d_pressed_between_two_prompts_reaches_the_next_one():
    assert _run("guarded") == "EOF"


def test_without_the_guard_the_terminal_drops_it():
    """The control: what the chat did before (so the test above can fail)."""
    assert _run("plain") == "lost"
