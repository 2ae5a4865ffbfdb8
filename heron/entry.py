"""The `heron` command's entry point: `heron run` straight to a running serve, else the CLI.

A message through `heron serve` should cost little more than starting Python. The typer CLI
(heron/cli.py) costs more than that before it runs anything (typer builds pydantic adapters
for every option), so `heron run` with only the options read here (a message or '-',
`--conversation KEY`, `--agent NAME`, `--retry`) goes to the serve's control socket without
it. Any other option, `--help`, a message this parser doubts, or no serve on the home: the
full CLI handles the command, as it always does.

The cyclic garbage collector is off for the first seconds of the process (`_collect_later`):
importing an SDK builds tens of thousands of objects and no garbage, and the collections they
set off cost CPU for nothing (the OpenAI SDK's import 0.68 s -> 0.58 s of CPU, a whole `heron
run` 1.20 s -> 1.10 s: medians of ten and eight interleaved runs, session 23). A short command
ends before it comes back on; a serve, a chat or a worker collects as usual from then on.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from heron.errors import HeronError


# Seconds from the start of the process before the cyclic garbage collector runs again.
COLLECT_AFTER_S = 5.0


def main() -> None:
    _collect_later()
    argv = sys.argv[1:]
    closed = _reopen_closed()
    if argv[:1] == ["run"]:
        if 1 in closed:  # `heron run ... >&-`: as a Unix tool, fail at once, not after a turn
            sys.stderr.write(f"heron: {STDOUT_CLOSED}\n")
            sys.exit(2)
        from heron.channels.early import catch_early_signals  # before any heavy import

        catch_early_signals()  # a timeout's SIGTERM or a Ctrl-C while Python starts is kept
        code = _fast_run(argv[1:])
        if code is not None:
            sys.exit(code)
    from heron.cli import main as cli_main

    cli_main()


def _collect_later() -> None:
    """The cyclic collector off now, on again COLLECT_AFTER_S from now (a daemon timer: a
    process that ends first never waits for it)."""
    import gc
    import threading

    gc.disable()
    timer = threading.Timer(COLLECT_AFTER_S, gc.enable)
    timer.daemon = True
    timer.start()


STDOUT_CLOSED = (
    "stdout is closed, so the reply could go nowhere; nothing was sent "
    "(>/dev/null discards the reply)"
)


def _reopen_closed() -> set[int]:
    """stdin, stdout and stderr that the caller closed (`>&-`), each opened on /dev/null now.
    Left closed, the next file opened takes the number, and whatever writes to stdout (a
    child process inheriting it) would write into that file: the database, say."""
    import os

    closed = set()
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.add(fd)
    for fd in sorted(closed):  # open() takes the lowest free number: the first closed one
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
    if closed:  # Python found them closed at start and set these to None
        sys.stdin = sys.stdin or open(0, closefd=False)  # noqa: SIM115
        sys.stdout = sys.stdout or open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = sys.stderr or open(2, "w", closefd=False)  # noqa: SIM115
    return closed


def parse_run(args: list[str]) -> dict[str, str | bool | None] | None:
    """`heron run`'s arguments when they are all ones this parser knows, else None."""
    found: dict[str, str | bool | None] = {"message": None, "conversation": None}
    found.update(agent="default", retry=False)
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        name, eq, value = arg.partition("=")
        if name in ("--conversation", "--agent"):
            if not eq:
                if not rest:
                    return None
                value = rest.pop(0)
            found[name[2:]] = value
        elif arg == "--retry":
            found["retry"] = True
        elif arg == "--":
            if len(rest) != 1 or found["message"] is not None:
                return None
            found["message"] = rest.pop(0)
        elif (arg.startswith("-") and arg != "-") or found["message"] is not None:
            return None  # an option of the full CLI, or a second message
        else:
            found["message"] = arg
    if found["conversation"] is not None:
        from heron.messages import key_problem

        if key_problem(str(found["conversation"])) is not None:
            return None  # the full CLI refuses it, as without a serve
    if found["retry"]:
        if found["message"] is not None or found["conversation"] is None:
            return None
        found["message"] = "/retry unanswered"  # heron.bus.RETRY_UNANSWERED, not imported
    return found if found["message"] is not None else None


def _fast_run(args: list[str]) -> int | None:
    parsed = parse_run(args)
    if parsed is None:
        return None
    from heron.channels.remote import ServeDiffers, serve_socket

    path = serve_socket()
    if path is None:
        return None
    text = _text(str(parsed["message"]))
    if text is None:
        return None  # empty: the full CLI says so
    import asyncio

    from heron.channels.script import RunCut, run_remote
    from heron.errors import HeronError

    agent, given = str(parsed["agent"]), parsed["conversation"]
    key = str(given) if given else None
    try:
        ok = asyncio.run(run_remote(path, text, agent, key, sys.stdout, sys.stderr))
    except ServeDiffers as differs:  # this shell asks for what the serve cannot give: said
        sys.stderr.write(differs.notice() + "\n")
        return _in_process(text, agent, key)
    except (ConnectionRefusedError, FileNotFoundError):
        return _in_process(text, agent, key)  # the socket of a serve that is gone
    except HeronError as e:  # the serve refused the message (its config.toml broke)
        return _failed(e)
    except RunCut as cut:  # a signal, or the reader of stdout gone
        return cut.code
    return 0 if ok else 1


def _text(message: str) -> str | None:
    from heron.channels.script import message_from

    text, bad = message_from(message)
    if bad:
        sys.stderr.write(
            f"heron: the message had {bad} invalid UTF-8 sequence(s); each is kept as \ufffd\n"
        )
    from heron.messages import oversized

    # Empty or too large: the full CLI says so, the same with a serve or without.
    return text if text.strip() and oversized(text) is None else None


def _in_process(text: str, agent: str, key: str | None) -> int:
    import asyncio

    from heron.channels.script import RunCut, run_once
    from heron.config import Settings
    from heron.errors import HeronError

    try:
        ok = asyncio.run(run_once(Settings.load(), text, agent, key, None, False))
    except HeronError as e:
        return _failed(e)
    except RunCut as cut:
        return cut.code
    return 0 if ok else 1


def _failed(error: HeronError) -> int:
    """As heron.channels.common.fail ends a command: the error, then 2 or 1."""
    from heron.channels.visible import for_stream
    from heron.errors import ConfigError

    sys.stderr.write(for_stream(f"heron: {error}\n", sys.stderr))
    return 2 if isinstance(error, ConfigError) else 1
