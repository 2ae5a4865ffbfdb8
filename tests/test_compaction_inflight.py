from __future__ import annotations

import dataclasses

import pytest
from compaction_helpers import Model, is_checkpoint, report_registry

from heron.agent.engine import Engine
from heron.agent.turn import INFLIGHT_NOTICE, TurnHooks
from heron.compaction import compact_idle, compact_now
from heron.config import Settings
from heron.context.tokens import Calibration, estimate_request
from heron.messages import Reply, Text, ToolCall, Usage
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest
from heron.store import compactions as folds
from heron.tools.context import ToolContext
from heron.tools.registry import ToolRegistry, tool

# Every test once per backend: the engine on SQLite, and on PostgreSQL (tests/pg.py).
pytestmark = pytest.mark.usefixtures("home_db")


def big_file(engine: Engine) -> None:
    (engine.settings.paths.workspace / "big.txt").write_text(
        ("lorem ipsum dolor " * 5 + "\n") * 200
    )


async def test_after_inflight_compaction_the_next_turn_starts_with_the_view_it_ended_with(
    monkeypatch,
):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "8000")
    model = Model(
        tool="fetch_report",
        args={"n": 1},
        tool_rounds=30,
        checkpoint="## Request\nread big.txt\n## Current step\nround 20",
    )
    notices: list[str] = []
    async with Engine.open(
        Settings.load(), provider=ScriptedProvider(model), registry=report_registry()
    ) as engine:
        big_file(engine)
        first = await engine.turn("k", "read big.txt 30 times", TurnHooks(on_notice=notices.append))
        # /compact after it: nothing to fold, and why (it said "the conversation is already
        # short" at half the window)
        nothing = await compact_now(engine, engine.store.conversation("k"))
        ended_with = model.turn_requests[-1].messages
        model.tool_rounds = 0
        await engine.turn("k", "and now?")
        starts_with = model.turn_requests[-1].messages
        conv = engine.store.conversation("k")
        done = folds.compactions(engine.store, conv.id)
        marks = folds.marks(engine.store, conv.id)
        rows = engine.store.all_messages(conv.id)
    assert first.ok and [c.kind for c in done][:1] == ["inflight"]
    # each in-flight compaction is told to the channel (the terminal showed none of them)
    inflight = sum(c.kind == "inflight" for c in done)
    assert notices == [INFLIGHT_NOTICE.format(n=n) for n in range(1, inflight + 1)]
    assert nothing == (
        "Nothing to compact: everything since the last summary is one turn, and the latest "
        "turn is kept whole (its earlier steps are already folded into checkpoints)."
    )
    assert any(is_checkpoint(r) for r in model.requests)
    assert starts_with[: len(ended_with)] == ended_with
    assert "round 20" in starts_with[0].parts[-1].text  # the request row carries the checkpoint
    compacted = {mid for mid, found in marks.items() if any(m == "compacted" for _, m in found)}
    assert compacted and compacted <= {r.id for r in rows}  # marked, never deleted
    assert len(rows) == 2 + 2 * 30 + 1 + 1


async def read_reports(rounds: int, text: str, max_model_calls: int = 200) -> Model:
    """One turn of `rounds` report reads in an 8,000-token window; the model that answered."""
    model = Model(tool="fetch_report", args={"n": 1}, tool_rounds=rounds)
    async with Engine.open(
        Settings.load(), provider=ScriptedProvider(model), registry=report_registry()
    ) as engine:
        engine.limits = dataclasses.replace(engine.limits, max_model_calls=max_model_calls)
        big_file(engine)
        await engine.turn("k", text)
    return model


async def test_checkpoint_request_is_the_same_request_plus_one_instruction(monkeypatch):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "8000")
    model = await read_reports(30, "read big.txt 30 times")
    i = next(i for i, r in enumerate(model.requests) if is_checkpoint(r))
    asked, before = model.requests[i], model.requests[i - 1]
    assert asked.tools == before.tools and asked.system == before.system
    # Every message of the previous request is in it, in order, then the new tool round.
    assert asked.messages[: len(before.messages)] == before.messages


async def test_a_model_that_calls_tools_instead_gets_a_deterministic_checkpoint(monkeypatch):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "8000")
    model = Model(tool="fetch_report", args={"n": 1}, tool_rounds=30)
    stubborn = model.__call__

    def answer(request):
        if is_checkpoint(request) or "You write checkpoints" in request.system:
            model.requests.append(request)
            return Reply([ToolCall("x", "read_file", {"path": "big.txt"})], "tool")
        return stubborn(request)

    async with Engine.open(
        Settings.load(), provider=ScriptedProvider(answer), registry=report_registry()
    ) as engine:
        result = await engine.turn("k", "read big.txt 30 times")
        conv = engine.store.conversation("k")
        done = folds.compactions(engine.store, conv.id)
    assert result.ok and done and done[0].kind == "inflight"
    assert "fetch_report(" in done[0].summary and "read big.txt 30 times" not in done[0].summary
    transcript_tries = [r for r in model.requests if "You write checkpoints" in r.system]
    assert len(transcript_tries) == 1 and transcript_tries[0].tools == []


async def test_idle_compaction_folds_a_quiet_conversation_and_retries_after_a_failure():
    fail = {"on": True}

    def answer(request):
        if request.system.startswith("You compact"):
            if fail["on"]:
                raise RuntimeError("down")
            return Reply([Text("## Facts\nidle facts")], "done")
        return Reply([Text("ok")], "done")

    async with Engine.open(Settings.load(), provider=ScriptedProvider(answer)) as engine:
        for i in range(10):
            await engine.turn("k", f"hello {i}")
        conv = engine.store.conversation("k")
        later = conv.updated + 16 * 60
        (failed,) = await compact_idle(engine, now=later)
        assert failed.kind == "failed" and folds.compactions(engine.store, conv.id) == []
        fail["on"] = False
        assert await compact_idle(engine, now=later + 60) == []  # waits ten minutes
        (done,) = await compact_idle(engine, now=later + 601)
        assert await compact_idle(engine, now=later + 1200) == []  # nothing new to fold
        (record,) = folds.compactions(engine.store, conv.id)
    assert done.kind == "consolidation" and record.reason == "idle"
    assert "idle facts" in record.summary and "hello 0" in record.summary


async def test_cli_lists_compactions_and_prints_the_model_view(monkeypatch):
    from typer.testing import CliRunner

    from heron.cli import app

    # The view is the model's this command would run (the engine's is the scripted one's).
    monkeypatch.setenv("HERON_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("HERON_MODEL", "scripted")
    monkeypatch.setenv("HERON_API_KEY", "dummy")
    model = Model(tool_rounds=0)
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        for key in ("other", "k"):  # another conversation's compaction comes first
            for i in range(10):
                await engine.turn(key, f"hello {i}")
            await compact_now(engine, engine.store.conversation(key), reason="manual")
    runner = CliRunner()
    listed = runner.invoke(app, ["conversations", "show", "k", "--compactions"])
    # numbered within the conversation ("compaction 50..61" in a one-turn one), the id after
    assert "── compaction 1 (id 2) · " in listed.output and "compaction 2" not in listed.output
    view = runner.invoke(app, ["conversations", "show", "k", "--model-view"])
    assert listed.exit_code == 0 and "consolidation · why: manual" in listed.output
    assert "[#21] hello 0" in listed.output
    assert view.exit_code == 0 and "── system" in view.output
    assert "# Archived context summary" in view.output and "hello 9" in view.output


@tool
def long_manual(ctx: ToolContext, topic: str) -> str:
    """Look a topic up in the manual. The manual covers every part of the system in depth, and
    this description is long on purpose: the tool schemas take most of a small window.

    Args:
        topic: The topic.
    """
    return "manual"


@tool
def print_lines(ctx: ToolContext, n: int) -> str:
    """Print n lines.

    Args:
        n: How many.
    """
    return "line of output text here\n" * 60


def crowded_registry() -> ToolRegistry:
    """print_lines (about 400 tokens a result) and a tool whose description fills the window."""
    long = " ".join([long_manual.description, "The manual is thorough and complete. " * 280])
    return ToolRegistry([print_lines, dataclasses.replace(long_manual, description=long)])


async def test_a_window_the_fixed_part_nearly_fills_gets_one_notice_not_a_checkpoint_a_step(
    monkeypatch,
):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "6000")
    model = Model(tool="print_lines", args={"n": 60}, tool_rounds=20)
    notices: list[str] = []
    async with Engine.open(
        Settings.load(), provider=ScriptedProvider(model), registry=crowded_registry()
    ) as engine:
        result = await engine.turn("k", "print many lines", TurnHooks(on_notice=notices.append))
        done = folds.compactions(engine.store, engine.store.conversation("k").id)
    assert result.ok
    # No checkpoint costs a model call: one could not land below the trigger.
    assert not any(is_checkpoint(r) for r in model.requests)
    assert len(model.requests) == 21
    inflight = [c for c in done if c.kind == "inflight"]
    assert inflight
    # Each checkpoint builds on the previous one's body: no checkpoint nested in the next.
    last = inflight[-1].summary
    assert last.count("[Checkpoint of this turn") == 1 and "print_lines(" in last
    assert len(notices) == 1 and "does not fit the model's window well" in notices[0]
    assert "HERON_CONTEXT_WINDOW" in notices[0]


class HonestModel(Model):
    """A Model whose replies report the input their request had (estimated): the calibration
    stays at 1, so each turn of the same work is as tight as the first."""

    def __call__(self, request: ChatRequest) -> Reply:
        reply = super().__call__(request)
        sent = estimate_request(request.system, request.tools, request.messages, Calibration())
        return Reply(reply.parts, reply.stop, Usage(sent.total, 10))


async def test_the_tight_notice_is_said_once_per_conversation_and_kept_in_each_trace(
    monkeypatch,
):
    """Every tool turn of a small window printed the three-line notice again (qa21q L9)."""
    from heron.trace.prices import PriceTable
    from heron.trace.read import load_run
    from heron.trace.render import render_show

    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "6000")
    model = HonestModel(tool="print_lines", args={"n": 60}, tool_rounds=6)
    told: list[list[str]] = []
    shown: list[str] = []
    async with Engine.open(
        Settings.load(), provider=ScriptedProvider(model), registry=crowded_registry()
    ) as engine:
        for i, key in enumerate(("k", "k", "other")):
            notices: list[str] = []
            hooks = TurnHooks(on_notice=notices.append)
            result = await engine.turn(key, f"print many lines ({i})", hooks)
            told.append([n for n in notices if "does not fit the model's window well" in n])
            run = load_run(engine.store, result.run_id)
            shown.append("\n".join(render_show(engine.store, run, PriceTable(), "UTC")))
    assert [len(t) for t in told] == [1, 0, 1]  # once per conversation
    assert "■ notice: This turn's work does not fit" in shown[0]
    assert "■ notice (told before, not shown again): This turn's work" in shown[1]


async def test_checkpoint_calls_count_toward_max_model_calls(monkeypatch):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "8000")
    model = await read_reports(1000, "read reports forever", max_model_calls=30)
    assert any(is_checkpoint(r) for r in model.requests)
    # 30 calls, checkpoints among them; a checkpoint asked just before the last call (its
    # ceiling was checked before); the wrap-up, asked twice (this model calls a tool in the
    # first, which is set aside).
    assert len(model.requests) <= 30 + 1 + 2


def test_a_mechanical_checkpoint_counts_every_step_it_left_out_so_far():
    """qa24f M3: at window 6000 the tight turn's checkpoint said "[3 earlier lines left out]"
    at calls 40, 120 and 200: each checkpoint re-split the previous one, its marker counted as
    a line. The count is carried forward, so the model can tell how far the turn has got."""
    import re

    from heron.compaction.governor import _mechanical
    from heron.compaction.summary import checkpoint_text
    from heron.messages import Message, ToolResult

    previous, made = "", 0
    for _fold in range(50):  # 50 folds of 4 calls each, as a long tight turn makes them
        messages = []
        for _ in range(4):
            made += 1
            call = ToolCall(f"c{made}", "bash", {"command": f"step {made}"})
            messages.append(Message("assistant", [call]))
            messages.append(Message("user", [ToolResult(f"c{made}", f"line{made} " + "y" * 300)]))
        body = _mechanical(messages, previous, 120)
        previous = checkpoint_text(body, [], "")
        (marker,) = re.findall(r"\[(\d+) earlier calls left out; the record keeps them\]", body)
        shown = re.findall(r"^- bash\(", body, re.M)
        assert int(marker) + len(shown) == made  # every call: shown, or in the count
        assert f'step {made}"' in body  # the newest call is shown
    assert made == 200 and int(marker) > 190
