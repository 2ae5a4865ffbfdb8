"""Bounded context through the real path: the hard invariant (a request that cannot fit is not
sent, and the turn says why and what to do), a user message larger than its share, a huge
hand-written memory entry, the budgets shown, the [context] section checked, and
recall_history opening a pointed-at message whole."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
from typer.testing import CliRunner

from heron.agent.engine import Engine, TurnHooks
from heron.config import Settings, load_config
from heron.context.tokens import Calibration, estimate_request
from heron.errors import ConfigError, ToolError
from heron.memory.recall import Recall
from heron.messages import Reply, Text, Usage
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest
from heron.tools.context import ToolContext, TurnServices
from heron.tools.memory_tools import recall_history


class Answers:
    """A model that answers every turn, counting the requests it is sent."""

    def __init__(self) -> None:
        self.requests: list[ChatRequest] = []

    def __call__(self, request: ChatRequest) -> Reply:
        self.requests.append(request)
        return Reply([Text("fine")], "done", Usage(100, 5))


def _fits(request: ChatRequest, window: int) -> bool:
    est = estimate_request(request.system, request.tools, request.messages, Calibration())
    return est.total + request.max_tokens <= window or est.total <= window * 3 // 4


async def test_a_request_that_cannot_fit_is_not_sent_and_the_turn_says_what_to_do(monkeypatch):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "8000")
    model = Answers()
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        agents = engine.settings.paths.workspace / "AGENTS.md"
        agents.write_text("# House rules\n" + "Always be thorough in every answer. " * 3_000)
        result = await engine.turn("k", "what are the rules?")
        rows = engine.store.branch(engine.store.conversation("k").id)
    assert model.requests == []  # nothing over the window went out
    assert result.reply is not None
    assert "the request was not sent" in result.reply
    assert "the largest part is workspace files" in result.reply
    assert "Shorten AGENTS.md, SOUL.md or USER.md" in result.reply
    assert "Your message is saved; send /retry" in result.reply
    assert [r.message.text for r in rows if r.role == "user"] == ["what are the rules?"]


async def test_a_message_larger_than_its_share_is_kept_whole_and_shown_by_head_and_tail(
    monkeypatch,
):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "128000")
    model = Answers()
    paste = "START of the log\n" + "".join(f"line {i} of the pasted log\n" for i in range(200_000))
    paste += "END of the log"
    told: list[str] = []
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        hooks = TurnHooks(on_notice=told.append)
        await engine.turn("k", paste, hooks)
        await engine.turn("k", "and what about line 7?", TurnHooks(on_notice=told.append))
        conv = engine.store.conversation("k")
        stored = [r.message.text for r in engine.store.branch(conv.id) if r.role == "user"]
        workspace = engine.settings.paths.workspace
    assert stored[0] == paste  # the record keeps it whole
    assert len(told) == 1  # told once, in the turn that brought it
    assert told[0].startswith("Your message is about 1,") and "tokens" in told[0]
    saved = next((workspace / ".heron" / "messages").iterdir())
    assert saved.read_text() == paste
    for request in model.requests:  # every later request too: head, tail and the path
        sent = request.messages[0].parts[0].text
        assert sent.startswith("START of the log") and sent.endswith("END of the log")
        assert f"saved in .heron/messages/{saved.name}" in sent
        assert _fits(request, 128_000)


async def test_a_megabyte_memory_entry_shows_its_head_and_the_prompt_stays_small(monkeypatch):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "8000")
    model = Answers()
    settings = Settings.load()
    folder = settings.paths.memory / "personal" / "always"
    folder.mkdir(parents=True)
    (folder / "life-story.md").write_text("My life story, in full. " + "and then " * 120_000)
    async with Engine.open(settings, provider=ScriptedProvider(model)) as engine:
        result = await engine.turn("k", "hello")
    assert result.reply == "fine"
    system = model.requests[0].system
    assert len(system) < 8000 * 0.3 * 4  # the system prompt's share of the window
    assert 'view_memory("personal/always/life-story.md") reads it whole' in system


async def test_conversations_show_budget_prints_each_budget_and_its_use(monkeypatch):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "8000")
    async with Engine.open(Settings.load(), provider=ScriptedProvider(Answers())) as engine:
        await engine.turn("k", "hello")
    from heron.cli import app

    out = CliRunner().invoke(app, ["conversations", "show", "k", "--budget"])
    assert out.exit_code == 0, out.output
    text = out.output
    assert "window 8,000 tokens" in text
    for label in (
        "system prompt with memory",
        "archived context",
        "the user's verbatim words in it",
        "recent turns kept whole",
        "one tool result",
        "one recall result",
        "consolidates when history passes",
        "Now:",
    ):
        assert label in text


def test_a_context_share_out_of_range_names_the_file_and_the_key(tmp_path: Path):
    path = tmp_path / "config.toml"
    path.write_text("[context]\nuser_message = 1.5\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert f"{path}: [context] user_message must be a share" in str(e.value)
    path.write_text("[context]\nmemory = 0.05\n")
    assert load_config(path).context.memory == 0.05


async def test_recall_history_opens_a_message_by_its_id():
    async with Engine.open(Settings.load(), provider=ScriptedProvider(Answers())) as engine:
        text = "the locker code is 4471 " + "and more words " * 3_000
        await engine.turn("k", text)
        conv = engine.store.conversation("k")
        row = next(r for r in engine.store.branch(conv.id) if r.role == "user")
        ctx = ToolContext(workspace=Path("."), services=TurnServices(recall=Recall(engine.store)))
        opened = recall_history.fn(ctx, message_id=row.id)
        with pytest.raises(ToolError) as missing:
            recall_history.fn(ctx, message_id=row.id + 1000)
    assert text in opened and opened.startswith("[k · ")
    assert opened.splitlines()[0].endswith(f" · message {row.id} · user]")
    assert "the ids are those in [#N] pointers" in str(missing.value)


async def test_a_consolidation_lands_well_below_its_trigger_so_the_next_is_turns_away(
    monkeypatch,
):
    from compaction_helpers import Model

    from heron.store import compactions as folds

    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "6000")
    model = Model(tool_rounds=1)  # every turn reads big.txt: about 20 KB
    counts = []
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        line = "the quick brown fox jumps over the lazy dog " * 2
        (engine.settings.paths.workspace / "big.txt").write_text((line + "\n") * 230)
        conv = None
        for i in range(60):
            await engine.turn("k", f"turn {i}: read big.txt and tell me what changed")
            conv = conv or engine.store.conversation("k")
            done = [c for c in folds.compactions(engine.store, conv.id) if c.is_consolidation]
            counts.append(len(done))
    assert counts[-1] >= 1  # it did consolidate
    steps = [b - a for a, b in itertools.pairwise(counts)]
    assert all(not (x and y) for x, y in itertools.pairwise(steps))  # never two in a row
    assert counts[-1] <= 60 // 4
    assert all(c.tokens_after < c.tokens_before // 2 for c in done)


async def test_with_a_serve_up_the_budget_is_the_serves_model_s_not_this_command_s():
    """`conversations show --budget` reports the window the serve answers with, unless this
    command's environment asks for another; with no serve, this command's own model's."""
    from serve_helpers import running_serve, ws_client, ws_hello, ws_until

    from heron.cli import app

    def budget(env: dict[str, str] | None = None) -> str:
        shown = CliRunner().invoke(app, ["conversations", "show", "k", "--budget"], env=env)
        assert shown.exit_code == 0, shown.output
        return shown.output.splitlines()[0]

    async with running_serve(ScriptedProvider(Answers())) as serve:
        async with ws_client(serve) as ws:
            window = (await ws_hello(ws, "k"))["window"]
            await ws.send('{"type": "send", "text": "hello"}')
            await ws_until(ws, "idle")
        served = await asyncio.to_thread(budget)
        asked = await asyncio.to_thread(budget, {"HERON_CONTEXT_WINDOW": "7000"})
    alone = budget()
    assert f"window {window:,} tokens" in served
    assert "window 7,000 tokens" in asked  # its own, as a run of it would have
    assert f"window {window:,} tokens" not in alone  # the command's own model: another window


def test_a_part_too_large_alone_says_so_and_that_compacting_cannot_help():
    """A turn after an overflow failed because the tool schemas alone (6,385 tokens) exceed a
    4,000-token window; the error named them the largest part only (QA22x L3)."""
    from heron.context.budget import too_large

    alone = too_large({"tool schemas": 6_385, "messages": 225}, 4_000, 1_000, "gpt-4o")
    assert "the largest part is tool schemas" in str(alone)
    assert "tool schemas; its 6,385 tokens alone do not fit" in str(alone)
    assert "compacting the conversation cannot make the request fit" in str(alone)
    # what the person can do (qa24f M1: "Give this model fewer tools" named nothing they could)
    assert 'tools = false under [models."gpt-4o"]' in (alone.hint or "")
    assert 'context_window under [models."gpt-4o"]' in (alone.hint or "")
    assert "HERON_CONTEXT_WINDOW" in (alone.hint or "")
    shared = too_large({"tool schemas": 2_000, "messages": 2_500}, 4_000, 1_000)
    assert "alone" not in str(shared)
