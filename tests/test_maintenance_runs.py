"""Model calls Heron makes outside any turn (/compact, idle compaction, /learn, the review a
chat starts as it closes, /new's, the nightly review) are recorded as maintenance runs: in
`heron usage`, `heron trace ls|show|export`, a conversation's cost; never in its turn count;
refused by `trace replay` with the reason (docs/traces.md)."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from heron.agent.engine import Engine
from heron.agent.replay import replay
from heron.cli import app
from heron.compaction import compact_idle
from heron.compaction.summary import SUMMARY_SYSTEM
from heron.config import Settings
from heron.errors import ProviderError, StoreError
from heron.memory.entries import EntryPath
from heron.memory.extract import FACTS_SYSTEM, TIDY_SYSTEM
from heron.messages import Reply, Text, Usage, dumps
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest
from heron.store import Store
from heron.trace.recorder import trace_cache
from heron.trace.records import last_request_ref

# Every test once per backend: the engine on SQLite, and on PostgreSQL (tests/pg.py).
pytestmark = pytest.mark.usefixtures("home_db")

TURN = Usage(100, 10)
SUMMARY = Usage(7_001, 71, cache_read=3_000)
FACTS = Usage(503, 13)
TIDY = Usage(307, 17)


@pytest.fixture(autouse=True)
def no_embeddings(monkeypatch):
    monkeypatch.setenv("HERON_EMBEDDINGS", "0")


class Model:
    """Each kind of call answered with its own known usage; the kinds in `failing` fail."""

    def __init__(self) -> None:
        self.failing: set[str] = set()
        self.sent: dict[str, list[ChatRequest]] = {}

    def __call__(self, request: ChatRequest) -> Reply:
        kind = {SUMMARY_SYSTEM: "summary", FACTS_SYSTEM: "facts", TIDY_SYSTEM: "tidy"}.get(
            request.system, "turn"
        )
        self.sent.setdefault(kind, []).append(request)
        if kind in self.failing:
            raise ProviderError(f"the {kind} model is down")
        if kind == "summary":
            return Reply([Text("## Facts\nF1\n## Working state\nW1")], "done", SUMMARY)
        if kind == "facts":
            return Reply([Text('{"facts": []}')], "done", FACTS)
        if kind == "tidy":
            return Reply([Text('{"removals": []}')], "done", TIDY)
        return Reply([Text("ok")], "done", TURN)


def usage_rows(output: str) -> dict[str, list[int]]:
    """`heron usage`'s first table (by day) as name -> [turns, in, out, cache rd, cache wr]."""
    rows: dict[str, list[int]] = {}
    for line in output.split("\n\n")[0].splitlines()[1:]:
        name = "maintenance" if line.startswith("maintenance") else line.split()[0]
        figures = line[32:].split()[:5]
        rows[name] = [int(f.replace(",", "")) for f in figures]
    return rows


def ls_lines(key: str) -> list[str]:
    shown = CliRunner().invoke(app, ["trace", "ls", "--conversation", key])
    assert shown.exit_code == 0, shown.output
    return shown.stdout.splitlines()[1:]


async def talk(engine: Engine, key: str, turns: int) -> None:
    for i in range(turns):
        await engine.turn(key, f"hello {i} " + "words to fold " * 10)


def runs_of(store: Store, key: str) -> list:
    conv = store.conversation(key)
    return [t for t in store.turns(conv.id, maintenance=True) if t.maintenance]


async def test_compact_is_a_run_of_its_own_counted_in_usage_not_in_turns():
    model = Model()
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        await talk(engine, "k", 10)
        said = await engine.turn("k", "/compact")
        store = engine.store
        conv = store.conversation("k")
        (run,) = runs_of(store, "k")
        count, every = store.turn_count(conv.id), store.turns(conv.id)
        status = await engine.turn("k", "/status")
    assert "Compacted" in said.reply
    assert run.kind == "compact" and run.status == "done" and run.usage == SUMMARY
    assert run.model_calls == 1 and run.user_message_id is None
    # the conversation's turns are the ten the person typed (commands make no turn row)
    assert count == 10 and len(every) == 10 and "(10 turns)" in status.reply
    output = CliRunner().invoke(app, ["usage"]).stdout
    rows = usage_rows(output)
    day = next(k for k in rows if k[0].isdigit())
    # no price for "scripted": the share is of the tokens, 7,072 of 8,172
    assert "\nmaintenance (87% of tokens) " in output
    assert rows["maintenance"] == [1, SUMMARY.input, SUMMARY.output, SUMMARY.cache_read, 0]
    assert rows["total"][:3] == [10, 10 * TURN.input + SUMMARY.input, 10 * TURN.output + 71]
    assert rows[day] == rows["total"]
    (top, *_) = ls_lines("k")  # newest first
    assert top.startswith(run.run_id) and "done (compact)" in top
    shown = CliRunner().invoke(app, ["trace", "show", run.run_id])
    assert shown.exit_code == 0 and "compact: a maintenance run" in shown.stdout
    assert "#1 summary" in shown.stdout and "you:" not in shown.stdout
    doc = json.loads(CliRunner().invoke(app, ["trace", "export", run.run_id]).stdout)
    assert doc["turn"]["kind"] == "compact" and doc["model_calls"][0]["purpose"] == "summary"
    # the request recorded is the one sent: recording built its body beside it
    sent = model.sent["summary"][0]
    assert doc["model_calls"][0]["request"] == json.loads(dumps(ScriptedProvider([]).payload(sent)))
    stats = CliRunner().invoke(app, ["trace", "show", "k", "--stats"]).stdout
    (row,) = [line for line in stats.splitlines() if run.run_id in line]
    assert row.endswith("compact")
    assert "conversation: 10 turns and 1 maintenance run" in stats


async def test_replay_refuses_a_maintenance_run_and_says_why():
    async with Engine.open(Settings.load(), provider=ScriptedProvider(Model())) as engine:
        await talk(engine, "k", 10)
        await engine.turn("k", "/compact")
        (run,) = runs_of(engine.store, "k")
        with pytest.raises(StoreError, match="is a compact run, made outside any turn") as no:
            await replay(engine.store, run.run_id)
    assert "recorded for its usage and cost but not replayed" in str(no.value)
    assert "heron trace show RUN" in (no.value.hint or "")


async def test_a_failed_compact_is_a_failed_run_with_its_error_row():
    model = Model()
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        await talk(engine, "k", 10)
        model.failing = {"summary"}
        said = await engine.turn("k", "/compact")
        (run,) = runs_of(engine.store, "k")
    assert "Compaction failed" in said.reply
    assert run.status == "failed" and "the summary model is down" in (run.error or "")
    shown = CliRunner().invoke(app, ["trace", "show", run.run_id]).stdout
    assert "✗ ProviderError('the summary model is down')" in shown
    assert "failed (compact)" in ls_lines("k")[0]


async def test_idle_compaction_records_its_summary_and_extraction():
    async with Engine.open(Settings.load(), provider=ScriptedProvider(Model())) as engine:
        await talk(engine, "k", 10)
        (report,) = await compact_idle(engine, now=time.time() + 3 * 3600)
        (run,) = runs_of(engine.store, "k")
    assert report.kind == "consolidation"
    assert run.kind == "idle-compact" and run.usage == SUMMARY + FACTS and run.model_calls == 2
    rows = usage_rows(CliRunner().invoke(app, ["usage"]).stdout)
    assert rows["maintenance"][:3] == [1, SUMMARY.input + FACTS.input, 71 + 13]
    assert rows["total"][1] == 10 * TURN.input + SUMMARY.input + FACTS.input
    assert "done (idle-compact)" in ls_lines("k")[0]


def remember(engine: Engine, key: str, quote: str) -> None:
    """An entry in memory (the tidy pass asks the model only when memory holds one)."""
    conv = engine.store.conversation(key)
    engine.memory.save(conv.id, EntryPath.parse("personal/always/this"), quote)


async def test_learn_records_its_review_and_tidy_passes():
    async with Engine.open(Settings.load(), provider=ScriptedProvider(Model())) as engine:
        await engine.turn("k", "I always book a window seat on planes.")
        remember(engine, "k", "I always book a window seat on planes")
        cid = engine.store.conversation("k").id
        chain = trace_cache(engine.store).chain(cid)
        learned = await engine.turn("k", "/learn")
        # the run's requests are no prefix of the next turn's: the chain the next turn's
        # trace starts from is still the last turn's
        assert chain and trace_cache(engine.store).chain(cid) == chain
        with engine.store.transaction() as conn:
            ref = json.loads(last_request_ref(conn, cid))
        assert ref["messages"][0] == chain[-1][1]
        (run,) = runs_of(engine.store, "k")
        count = engine.store.turn_count(engine.store.conversation("k").id)
    assert learned.command == "learn" and count == 1
    assert run.kind == "learn" and run.usage == FACTS + TIDY and run.model_calls == 2
    rows = usage_rows(CliRunner().invoke(app, ["usage"]).stdout)
    assert rows["maintenance"][:3] == [1, FACTS.input + TIDY.input, 13 + 17]
    assert rows["total"][:2] == [1, TURN.input + FACTS.input + TIDY.input]
    shown = CliRunner().invoke(app, ["trace", "show", run.run_id]).stdout
    assert "#1 review" in shown and "#2 tidy" in shown
    assert "done (learn)" in ls_lines("k")[0]


async def test_the_review_a_closing_chat_starts_is_a_run_of_the_conversation():
    from heron.channels.memory_cli import run_review_pass

    async with Engine.open(Settings.load(), provider=ScriptedProvider(Model())) as engine:
        await engine.turn("chat-1", "I use metric units, never imperial.")
    await run_review_pass(Settings.load(), ["chat-1"], ScriptedProvider(Model()))
    store = Store(Settings.load().database)
    try:
        (run,) = runs_of(store, "chat-1")
    finally:
        store.close()
    assert run.kind == "close-review" and run.usage == FACTS and run.model_calls == 1
    rows = usage_rows(CliRunner().invoke(app, ["usage"]).stdout)
    assert rows["maintenance"][:3] == [1, FACTS.input, FACTS.output]
    assert rows["total"][:2] == [1, TURN.input + FACTS.input]
    assert "done (close-review)" in ls_lines("chat-1")[0]


async def test_a_review_whose_call_fails_is_a_failed_run_with_its_error_row():
    from heron.channels.memory_cli import run_review_pass

    async with Engine.open(Settings.load(), provider=ScriptedProvider(Model())) as engine:
        await engine.turn("chat-1", "I use metric units, never imperial.")
    model = Model()
    model.failing = {"facts"}
    assert await run_review_pass(Settings.load(), ["chat-1"], ScriptedProvider(model)) == []
    store = Store(Settings.load().database)
    try:
        (run,) = runs_of(store, "chat-1")
    finally:
        store.close()
    assert run.kind == "close-review" and run.status == "failed" and run.model_calls == 1
    assert "the facts model is down" in (run.error or "")
    shown = CliRunner().invoke(app, ["trace", "show", run.run_id]).stdout
    assert "#1 review" in shown and "✗ ProviderError('the facts model is down')" in shown
    assert "failed (close-review)" in ls_lines("chat-1")[0]


async def test_new_and_the_nightly_review_record_their_passes():
    from heron.proactive.review import TIDY_CONVERSATION, nightly_review

    async with Engine.open(Settings.load(), provider=ScriptedProvider(Model())) as engine:
        await engine.turn("a", "I use metric units, never imperial.")
        await engine.turn("a", "/new")
        await engine.settle_background()
        await engine.turn("b", "I always book a window seat on planes.")
        remember(engine, "b", "I always book a window seat on planes")
        report = await nightly_review(engine)
        store = engine.store
        kinds_a = [t.kind for t in runs_of(store, "a")]
        (nightly_b,) = runs_of(store, "b")
        (tidy,) = runs_of(store, TIDY_CONVERSATION)
    assert kinds_a == ["new-review"]  # the nightly pass found nothing new in it
    assert nightly_b.kind == "nightly-review" and nightly_b.usage == FACTS
    assert tidy.kind == "nightly-tidy" and tidy.usage == TIDY
    assert report.model_calls == 2
    rows = usage_rows(CliRunner().invoke(app, ["usage"]).stdout)
    assert rows["maintenance"][:2] == [3, 2 * FACTS.input + TIDY.input]


async def test_a_maintenance_run_left_running_is_not_a_turn_to_recover():
    async with Engine.open(Settings.load(), provider=ScriptedProvider(Model())) as engine:
        await engine.turn("k", "hello")
        conv = engine.store.conversation("k")
        engine.store.start_turn(
            conv.id, "run_upkeep", user_message_id=None, provider="p", model="m", kind="learn"
        )
        after = await engine.turn("k", "again")
        upkeep = engine.store.turn("run_upkeep")
        assert engine.store.running_turn_message(conv.id) is None
        assert engine.store.turn_count(conv.id) == 2
    assert after.ok and upkeep is not None and upkeep.status == "running"


async def test_a_process_start_closes_the_runs_of_dead_processes_of_this_host_only():
    """What tells a maintenance run is dead is its row's process (m027): on this host and
    ended. A live process's run, one on another host (time alone never tells) and a turn
    (its lease tells) are left running."""
    import os
    import subprocess
    import sys

    from heron.store.engine_state import HOST

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    settings = Settings.load()
    async with Engine.open(settings, provider=ScriptedProvider(Model())) as engine:
        store = engine.store
        conv = store.open_conversation("k")
        made = {
            name: store.start_turn(
                conv.id,
                f"run_{name}",
                user_message_id=None,
                provider="p",
                model="m",
                kind=kind,
                process=process,
            )
            for name, kind, process in [
                ("dead", "compact", (HOST, dead.pid)),
                ("live", "learn", (HOST, os.getpid())),
                ("away", "compact", ("another-host", dead.pid)),
                ("turn", "turn", None),
            ]
        }
    async with Engine.open(settings, provider=ScriptedProvider(Model())) as engine:
        status = {t.run_id[4:]: t for t in engine.store.turns(conv.id, maintenance=True)}
    assert set(status) == set(made)
    assert status["dead"].status == "interrupted" and status["dead"].usage_unknown
    assert f"its process ({dead.pid}) ended" in (status["dead"].error or "")
    assert {status[n].status for n in ("live", "away", "turn")} == {"running"}


async def test_the_browser_s_status_costs_the_runs_and_counts_the_turns():
    from heron.serve.api import WebState, _status
    from heron.trace.prices import PriceTable

    provider = ScriptedProvider(Model(), model="claude-sonnet-4-5")
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await talk(engine, "k", 10)
        await engine.turn("k", "/compact")
        status = _status(WebState(Settings.load(), engine.store), "k")
    price = PriceTable().cost
    turns, summary = price("claude-sonnet-4-5", TURN), price("claude-sonnet-4-5", SUMMARY)
    assert status["turns"] == 10
    assert status["cost_usd"] == pytest.approx(10 * turns + summary)


async def test_idle_compaction_does_its_heavy_work_off_the_event_loop(monkeypatch):
    """The parts that grow with the conversation (its cut, size and summary prompt; memory's
    prompt over every row; the run's trace writes of a whole transcript) run on worker threads:
    on a long conversation each held a serve's loop, and the person's turn, for 0.1-0.5 s."""
    import threading

    from heron.compaction import consolidate
    from heron.memory import extract
    from heron.trace.recorder import TraceRecorder

    on_loop: dict[str, list[bool]] = {}

    def spy(name: str, fn):
        def watched(*args, **kwargs):
            here = threading.current_thread() is threading.main_thread()
            on_loop.setdefault(name, []).append(here)
            return fn(*args, **kwargs)

        return watched

    monkeypatch.setattr(consolidate, "_plan", spy("plan", consolidate._plan))
    monkeypatch.setattr(extract, "_request", spy("memory prompt", extract._request))
    async with Engine.open(Settings.load(), provider=ScriptedProvider(Model())) as engine:
        await talk(engine, "k", 10)
        monkeypatch.setattr(TraceRecorder, "_write", spy("trace", TraceRecorder._write))
        (report,) = await compact_idle(engine, now=time.time() + 3 * 3600)
    assert report.kind == "consolidation"
    assert on_loop["plan"] == [False] and on_loop["memory prompt"] == [False]
    assert on_loop["trace"] and not any(on_loop["trace"])
