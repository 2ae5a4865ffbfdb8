"""Running one tool call through the engine, as a model would ask for it (tests/test_sandbox*)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from heron.agent.engine import Engine
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall, ToolResult, Usage
from heron.providers.scripted import ScriptedProvider
from heron.tools.context import Approver

CONFIG_KEY = "sk-test-configkey-0123456789abcdef"
ENV_KEY = "sk-test-envkey-fedcba9876543210"
MEMORY_SECRET = "MEMORY-SECRET-7f3a"


def child_env(home: Path, confined: bool) -> dict[str, str]:
    """The environment of a Heron child process, sandboxed or unconfined (bwrap off, its
    commands allowed without asking, as no one is there to answer)."""
    env = dict(os.environ)
    if not confined:
        env["HERON_BWRAP"] = "off"
        (home / "config.toml").write_text('[tools]\napproval = "allow"\n')
    return env


def seed_home(home: Path, tools: str = "") -> None:
    """A config with a key and a [tools] section, and a memory entry with a secret in it."""
    (home / "config.toml").write_text(
        f'[providers.openai]\napi_key = "{CONFIG_KEY}"\n\n[tools]\n{tools}\n', encoding="utf-8"
    )
    entry = home / "memory" / "personal" / "always" / "x.md"
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_text(f"The user's secret is {MEMORY_SECRET}.\n", encoding="utf-8")


def settings(confined: bool) -> Settings:
    """Settings as `heron` would load them, with keys in the environment; unconfined is
    Heron's own way to say bwrap cannot run (HERON_BWRAP=off)."""
    env = {**os.environ, "OPENAI_API_KEY": ENV_KEY, "HERON_API_KEY": ENV_KEY}
    if not confined:
        env["HERON_BWRAP"] = "off"
    return Settings.load(env)


async def call_tool(
    name: str, args: dict[str, Any], *, confined: bool = True, approve: Approver | None = None
) -> ToolResult:
    """One turn whose model asks for `name(args)`; the result the model got back. `approve`
    stands for the channel that asks the person (Engine.approve)."""
    provider = ScriptedProvider(
        [
            Reply([ToolCall("c1", name, args)], "tool", Usage(10, 5)),
            Reply([Text("done")], "done", Usage(20, 5)),
        ]
    )
    async with Engine.open(settings(confined), provider=provider) as engine:
        engine.approve = approve
        await engine.turn("attack", "go")
    sent = provider.requests[1].messages[-1]
    results = [p for p in sent.parts if isinstance(p, ToolResult)]
    assert results, sent
    return results[0]


def connect_command(host: str, port: int) -> str:
    """Connect, then wait for the listener's greeting: printed only once the host side has
    accepted (through pasta a connection is first made inside the command's namespace)."""
    greeted = "read -t 60 reply <&3 && echo NET-CONNECTED $reply"
    return f"(exec 3<>/dev/tcp/{host}/{port} && {greeted}) 2>&1"


@contextmanager
def listener(host: str = "127.0.0.1") -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server on `host`; yields its port and the connections it accepted."""
    server = socket.socket()
    server.bind((host, 0))
    server.listen()
    server.settimeout(0.2)
    accepted: list[bytes] = []
    stop, got = threading.Event(), threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            accepted.append(b"connection")
            got.set()
            with contextlib.suppress(OSError):  # the far end may have gone already
                conn.sendall(b"HELLO\n")  # a reply proves the host side of the connection
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], accepted
    finally:
        # Through pasta the host side of a connection can arrive just after the command saw
        # its own end connect: give it a moment before counting (a test that expects none
        # waits these 2 s for nothing).
        got.wait(2)
        stop.set()
        thread.join(2)
        server.close()
