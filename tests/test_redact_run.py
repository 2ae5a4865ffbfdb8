"""Heron's own key never reaches the record: a run through the engine, against the fake OpenAI
server on 127.0.0.1 configured with a key, whose tools print the environment, config.toml and a
workspace .env holding the key, leaves the key in zero bytes of the database, its WAL, the trace
export, the requests the server received and the memory folder. Provider errors that echo the
key are scrubbed before they are stored or shown."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from heron.agent.engine import Engine
from heron.cli import app
from heron.config import Settings
from heron.store import Store
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

KEY = "sk-test-9f8e7d6c5b4a39281706f5e4d3c2b1a0"
CONFIG_KEY = "cfg-Zq7Xw2Lp9Rt4Vb6Nm8Kj3Hg5Fd1Sa0Qe"


def _home() -> Path:
    return Path(os.environ["HERON_HOME"])


def _setup(monkeypatch: Any, base_url: str, redact: bool = True) -> Settings:
    home = _home()
    (home / "workspace").mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f'[providers.openai]\napi_key = "{CONFIG_KEY}"\n\n[tools]\nredact = {str(redact).lower()}\n'
    )
    (home / "workspace" / ".env").write_text(f"OPENAI_API_KEY={KEY}\nDEBUG=1\n")
    monkeypatch.setenv("HERON_BASE_URL", base_url)
    monkeypatch.setenv("HERON_MODEL", "fake-model")
    monkeypatch.setenv("HERON_API_KEY", KEY)
    return Settings.load()


def _script(body: dict[str, Any]) -> ServerReply:
    if body["messages"][-1]["role"] == "tool":
        return ServerReply(text="I looked around.")
    config = str(_home() / "config.toml")
    return ServerReply(
        tool_calls=[
            ("c1", "bash", {"command": "env"}),
            ("c2", "bash", {"command": f"cat {config}"}),
            ("c3", "bash", {"command": "cat .env"}),
            ("c4", "read_file", {"path": ".env"}),
        ]
    )


def _bytes_of(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


def test_the_configured_key_is_in_zero_bytes_of_the_record_after_tools_print_it(monkeypatch):
    with FakeOpenAIServer(_script) as server:
        settings = _setup(monkeypatch, server.base_url)

        async def run() -> tuple[Any, bytes]:
            async with Engine.open(settings) as engine:
                result = await engine.turn("leak", "Look at the environment and the config.")
                wal = Path(f"{settings.paths.db}-wal")
                return result, wal.read_bytes() if wal.exists() else b""

        result, wal = asyncio.run(run())
    assert result.ok, result.run.error
    requests = repr(server.requests).encode()
    # The tools did print it: the model saw the marks where the key was.
    assert b"[redacted: configured key]" in requests
    assert b"DEBUG=1" in requests  # the rest of the output is untouched
    export = CliRunner().invoke(app, ["trace", "export", result.run_id])
    assert export.exit_code == 0, export.output
    store = Store(settings.paths.db)
    dump = "\n".join(store.conn.iterdump()).encode()
    store.close()
    for secret in (KEY, CONFIG_KEY):
        needle = secret.encode()
        assert needle not in settings.paths.db.read_bytes()
        assert needle not in wal
        assert needle not in dump
        assert needle not in export.output.encode()
        assert needle not in requests
        assert needle not in _bytes_of(settings.paths.memory)
        assert needle not in _bytes_of(settings.paths.workspace / ".heron")
    # The key went where it belongs, and only there: the request's Authorization header.
    assert server.headers[0]["authorization"] == f"Bearer {KEY}"


def test_redact_false_turns_the_patterns_off_but_never_the_configured_keys(monkeypatch):
    with FakeOpenAIServer(_script) as server:
        settings = _setup(monkeypatch, server.base_url, redact=False)
        (settings.paths.workspace / ".env").write_text(
            f"OPENAI_API_KEY={KEY}\nOTHER_TOKEN=ghp_abcdefghijklmnopqrstuvwxyz0123\n"
        )

        async def run() -> Any:
            async with Engine.open(settings) as engine:
                return await engine.turn("leak", "Look.")

        result = asyncio.run(run())
    assert result.ok
    requests = repr(server.requests)
    assert KEY not in requests and CONFIG_KEY not in requests
    assert "ghp_abcdefghijklmnopqrstuvwxyz0123" in requests  # patterns off: kept as printed


def test_a_provider_error_echoing_the_key_is_scrubbed_before_it_is_stored_or_shown(monkeypatch):
    echo = {"error": {"message": f"Incorrect API key provided: {KEY}", "type": "invalid"}}
    with FakeOpenAIServer([ServerReply(status=401, error_body=echo)]) as server:
        settings = _setup(monkeypatch, server.base_url)

        async def run() -> Any:
            async with Engine.open(settings) as engine:
                return await engine.turn("bad-key", "hello")

        result = asyncio.run(run())
    assert not result.ok
    assert KEY not in str(result.run.error) and KEY not in (result.reply or "")
    assert "[redacted: configured key]" in str(result.run.error)
    store = Store(settings.paths.db)
    turn = store.turns(store.conversation("bad-key").id)[0]
    store.close()
    assert turn.error and "Incorrect API key provided" in turn.error and KEY not in turn.error
    shown = CliRunner().invoke(app, ["trace", "show", turn.run_id])
    assert "Incorrect API key provided" in shown.output and KEY not in shown.output
    assert KEY.encode() not in settings.paths.db.read_bytes()
