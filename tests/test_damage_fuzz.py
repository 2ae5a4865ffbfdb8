"""Property: whatever damage a row or a trace blob takes, every read path still runs (`run`,
`conversations show`, `--model-view`, `conversations search` and `export`, `trace
show/export/replay`, `memory recall`): no exception escapes the command, and the damaged row
is left as it was.

Each example copies a recorded home (two turns, one with a tool call, against the fake OpenAI
server) and writes one random value into one stored column, then runs the commands in process
through the CLI (typer's runner)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, assume, example, given, settings
from hypothesis import strategies as st
from strength import examples
from typer.testing import CliRunner

from heron.channels.script import run_once
from heron.cli import app
from heron.config import Settings
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

# (table, column) pairs a read path decodes: message rows, and every part of a trace.
TARGETS = [
    ("messages", "parts"),
    ("messages", "sent_parts"),
    ("messages", "meta"),
    ("trace_blobs", "body"),
    ("trace_runs", "start"),
    ("trace_runs", "fingerprints"),
    ("model_calls", "reply"),
    ("model_calls", "request_ref"),
    ("tool_calls", "effects"),
]

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@st.composite
def damage(draw: Any) -> tuple[str, str, int, Any, str]:
    """(table, column, which row, value, how it is stored)."""
    table, column = draw(st.sampled_from(TARGETS))
    row = draw(st.integers(min_value=0, max_value=40))
    kind = draw(st.sampled_from(["json", "text", "bytes_as_text", "blob", "number", "cut"]))
    if kind == "json":
        value: Any = json.dumps(draw(JSON))
    elif kind == "text":
        value = draw(st.text(max_size=40))
    elif kind in ("bytes_as_text", "blob"):
        value = draw(st.binary(min_size=1, max_size=40))
    elif kind == "number":
        # SQLite stores 64-bit integers: a wider one cannot be written, so no read meets it.
        value = draw(
            st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.floats(allow_nan=False)
        )
    else:
        value = draw(st.integers(min_value=0, max_value=60))  # keep this many characters
    return table, column, row, value, kind


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    def answer(body: dict[str, Any]) -> ServerReply:
        last = body["messages"][-1]
        if last["role"] == "user" and "look" in str(last.get("content")):
            return ServerReply(text="Looking.", tool_calls=[("bash", {"command": "echo hi"})])
        return ServerReply(text="ok")

    with FakeOpenAIServer(answer) as fake:
        yield fake


@pytest.fixture(scope="module")
def recorded(server: FakeOpenAIServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("recorded")
    with _env(home, server.base_url):
        for text in ("please look around", "thanks, and remember the heron"):
            ok, output = _run("k", text)
            assert ok, output
    return home


def _run(key: str, text: str) -> tuple[bool, str]:
    """`heron run -c KEY TEXT` as the command runs it, with its own output streams (run_once's
    default streams are the process's, which the CLI runner swaps out)."""
    out, err = io.StringIO(), io.StringIO()
    ok = asyncio.run(run_once(Settings.load(), text, "default", key, None, False, out, err))
    return ok, out.getvalue() + err.getvalue()


class _env:
    """HERON_HOME and the fake server for the commands run in process."""

    def __init__(self, home: Path, url: str) -> None:
        self.values = {
            "HERON_HOME": str(home),
            "HERON_BASE_URL": url,
            "HERON_API_KEY": "dummy",
            "HERON_MODEL": "fake-model",
        }
        self.saved: dict[str, str | None] = {}

    def __enter__(self) -> None:
        for name, value in self.values.items():
            self.saved[name] = os.environ.get(name)
            os.environ[name] = value

    def __exit__(self, *exc: object) -> None:
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _write(db: Path, table: str, column: str, row: int, value: Any, kind: str) -> Any:
    """Write the damage; returns the row's id (None when the table has no such row)."""
    conn = sqlite3.connect(db)
    try:
        ids = [r[0] for r in conn.execute(f"SELECT rowid FROM {table} ORDER BY rowid")]
        if not ids:
            return None
        rowid = ids[row % len(ids)]
        sql = f"UPDATE {table} SET {column} = ? WHERE rowid = ?"
        if kind == "bytes_as_text":
            sql = f"UPDATE {table} SET {column} = CAST(? AS TEXT) WHERE rowid = ?"
        elif kind == "cut":
            sql = f"UPDATE {table} SET {column} = substr({column}, 1, ?) WHERE rowid = ?"
        try:
            conn.execute(sql, (value, rowid))
        except (sqlite3.IntegrityError, sqlite3.OperationalError):
            # A NOT NULL column, or the search index's trigger (which reads the parts as
            # JSON), refused it: not a state a read can meet.
            return None
        conn.commit()
        return rowid
    finally:
        conn.close()


def _run_ids(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [r[0] for r in conn.execute("SELECT run_id FROM turns ORDER BY id")]
    finally:
        conn.close()


def _snapshot(db: Path, table: str, column: str, rowid: int) -> Any:
    conn = sqlite3.connect(db)
    conn.text_factory = bytes
    try:
        return conn.execute(f"SELECT {column} FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
    finally:
        conn.close()


@settings(
    max_examples=examples(20, fast=8),
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # shrinking a CLI run takes minutes
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(hurt=damage())
# found by the fuzz: a message's meta that is JSON but not an object (a number) made
# `conversations show` raise (AttributeError on `.get`)
@example(hurt=("messages", "meta", 10, 1.8551185934730255e71, "number"))
def test_random_damage_never_stops_a_read_path(
    hurt: tuple[str, str, int, Any, str], recorded: Path, server: FakeOpenAIServer
) -> None:
    table, column, row, value, kind = hurt
    home = Path(tempfile.mkdtemp(prefix="heron-fuzz-"))
    try:
        shutil.copytree(recorded, home, dirs_exist_ok=True)
        db = home / "heron.db"
        rowid = _write(db, table, column, row, value, kind)
        assume(rowid is not None)
        before = _snapshot(db, table, column, rowid)
        run_id = _run_ids(db)[0]
        commands = [
            ["conversations", "show", "k"],
            ["conversations", "show", "k", "--model-view"],
            ["trace", "show", run_id],
            ["trace", "export", run_id],
            ["trace", "replay", run_id],
            ["memory", "recall", "heron"],
            ["conversations", "search", "heron", "-c", "k", "--json"],
            ["conversations", "export", "k"],
            ["conversations", "export", "k", "--format", "json"],
        ]
        with _env(home, server.base_url):
            results = [CliRunner().invoke(app, args) for args in commands]
            ran, output = _run("k", "one more")
        for args, result in zip(commands, results, strict=True):
            # A clean exit or a reported error (exit 1 or 2): never an exception.
            assert result.exception is None or isinstance(result.exception, SystemExit), (
                args,
                result.output,
                result.exception,
            )
            assert result.exit_code in (0, 1, 2), (args, result.output)
        assert ran and output.startswith("ok"), output  # the new turn ran, answered
        assert _snapshot(db, table, column, rowid) == before  # the damage is left as it was
    finally:
        shutil.rmtree(home, ignore_errors=True)
