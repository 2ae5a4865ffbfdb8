"""Memory wired into the engine: tools, the frozen prompt section and its note, /new,
compaction's extraction pass, auto-recall, the chat commands, the end-of-chat review pass and
recall over a conversation the engine ran."""

from __future__ import annotations

import asyncio
import json
import random
import re

import pytest
from typer.testing import CliRunner

from heron.agent.engine import Engine
from heron.compaction.summary import SUMMARY_SYSTEM
from heron.config import Settings
from heron.context.tokens import estimate_text, estimate_tools
from heron.errors import TransientProviderError
from heron.memory.extract import FACTS_SYSTEM, TIDY_SYSTEM
from heron.memory.queue import waiting
from heron.memory.wiring import RECALL_FLAG
from heron.messages import Reply, Text, ToolCall, assistant, user
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest
from heron.store import compactions as folds
from heron.tools.registry import ToolRegistry

# Every test once per backend: the engine on SQLite, and on PostgreSQL (tests/pg.py).
pytestmark = pytest.mark.usefixtures("home_db")

PREF = "I prefer short answers without bullet points"


@pytest.fixture(autouse=True)
def no_embeddings(monkeypatch):
    # The sentence model takes seconds to load; these tests are about the wiring.
    monkeypatch.setenv("HERON_EMBEDDINGS", "0")


class Model:
    """Turn replies in order; extraction, tidy and summary calls answered by kind."""

    def __init__(self, turns: list[Reply], facts: list[dict] | None = None) -> None:
        self.turns = list(turns)
        self.facts = facts or []
        self.requests: list[ChatRequest] = []
        self.kinds: list[str] = []

    def __call__(self, request: ChatRequest) -> Reply:
        if request.system == FACTS_SYSTEM:
            self.kinds.append("facts")
            return Reply([Text(json.dumps({"facts": self.facts}))], "done")
        if request.system == TIDY_SYSTEM:
            self.kinds.append("tidy")
            return Reply([Text('{"removals": []}')], "done")
        if request.system == SUMMARY_SYSTEM:
            self.kinds.append("summary")
            return Reply([Text("## Facts\nthey talked")], "done")
        self.kinds.append("turn")
        self.requests.append(request)
        return self.turns.pop(0) if self.turns else Reply([Text("ok")], "done")


def said(text: str) -> Reply:
    return Reply([Text(text)], "done")


def save_call(quote: str = PREF) -> Reply:
    args = {
        "action": "create",
        "path": "personal/always/short-answers",
        "quote": quote,
    }
    return Reply([ToolCall("m1", "manage_memory", args)], "tool")


def last_user_text(request: ChatRequest) -> str:
    return "\n".join(getattr(p, "text", "") for p in request.messages[-1].parts)


async def test_engine_opens_memory_registers_its_tools_and_loads_no_model(monkeypatch):
    monkeypatch.setenv("HERON_EMBEDDINGS", "1")
    async with Engine.open(Settings.load(), provider=ScriptedProvider([])) as engine:
        assert engine.memory is not None
        for name in ("manage_memory", "view_memory", "propose_lesson", "recall_history"):
            assert engine.registry.get(name) is not None
        embedder = engine.recall.embedder
        assert embedder is None or embedder._model is None  # never loaded at start-up
    async with Engine.open(Settings.load(), provider=ScriptedProvider([]), ephemeral=True) as e:
        assert e.memory is None
        assert e.registry.get("recall_history") is not None
        assert e.registry.get("manage_memory") is None


async def test_a_save_is_announced_once_and_the_system_prompt_does_not_move():
    model = Model([save_call(), said("Saved."), said("Sure."), said("Yes.")])
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        await engine.turn("c", f"{PREF}. Remember that.")
        entry = engine.memory.get("personal/always/short-answers.md")
        assert entry.source.conversation == "c" and entry.source.quote == PREF
        await engine.turn("c", "What is 2 + 2?")
        await engine.turn("c", "And 3 + 3?")
    first, _, second, third = model.requests
    assert first.system == second.system == third.system  # frozen: the cache prefix holds
    assert "short-answers" not in first.system
    assert f"saved: {PREF} (personal/always/short-answers.md)" in last_user_text(second)
    assert "Memory changed" not in last_user_text(third)  # announced once
    # the note went with the stored message: the next request replays it byte for byte
    assert any(f"saved: {PREF}" in last_user_text_of(m) for m in third.messages)


def last_user_text_of(message) -> str:
    return "\n".join(getattr(p, "text", "") for p in message.parts)


async def test_new_thaws_the_section_and_floors_recent_history():
    model = Model([save_call(), said("Saved."), said("Fresh start.")])
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        await engine.turn("c", f"{PREF}. Remember that.")
        reply = await engine.turn("c", "/new")
        assert reply.command == "new"
        cid = engine.store.conversation("c").id
        floor = engine.store.query(
            "SELECT history_floor FROM memory_cursors WHERE conversation_id = ?", (cid,)
        )
        assert floor and floor[0][0] > 0
        await engine.turn("c", "hello again")
    after_new = model.requests[-1]
    assert "## Preferences" in after_new.system
    assert f"{PREF} (personal/always/short-answers.md)" in after_new.system
    assert "Memory changed" not in last_user_text(after_new)


async def test_compaction_runs_the_extraction_pass_which_only_queues(monkeypatch):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "2500")
    facts = [{"path": "personal/always/short-answers", "text": "Short answers.", "quote": PREF}]
    model = Model([], facts=facts)
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        await engine.turn("c", PREF + ". " + "And some padding words here " * 20)
        for i in range(12):
            await engine.turn("c", f"message {i} " + "lorem ipsum dolor sit amet " * 20)
        assert "summary" in model.kinds and "facts" in model.kinds
        assert model.kinds.index("facts") < model.kinds.index("summary") + 2
        queued = waiting(engine.store)
        assert [s.quote for s in queued] == [PREF]
        assert engine.memory.entries() == []  # nothing saved: only the queue
        # a manual /compact makes no extraction call
        before = model.kinds.count("facts")
        await engine.turn("c", "/compact")
        assert model.kinds.count("facts") == before


async def _prompt_tokens() -> int:
    """What the system prompt and the tool schemas of a first request take (estimated)."""
    model = Model([said("ok")])
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        await engine.turn("probe", "hello")
    first = model.requests[0]
    return estimate_text(first.system) + estimate_tools(first.tools)


async def test_compaction_thaws_the_frozen_section(monkeypatch):
    # A small window, measured from what the prompt and tools take (about 2,600 tokens), with
    # room for the messages to fold within the twelve (1,400 to 3,000 do) whatever the tools'
    # descriptions grow to: a fixed 4,000 failed once they grew by 25 tokens.
    window = await _prompt_tokens() + 2_000
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", str(window))
    model = Model([save_call(), said("Saved.")])
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        await engine.turn("c", f"{PREF}. Remember that.")
        for i in range(12):
            await engine.turn("c", f"message {i} " + "lorem ipsum dolor sit amet " * 20)
    assert "summary" in model.kinds
    assert "short-answers" not in model.requests[0].system
    assert "short-answers" in model.requests[-1].system  # thawed at the fold


def _filler(engine: Engine) -> None:
    words = re.findall(
        r"\w+",
        "meeting project garden dinner recipe weekend train budget report music guitar "
        "concert coffee bakery bicycle repair office email deadline movie series holiday "
        "beach hiking trail kitchen paint wall sofa library novel chapter school football",
    )
    rng = random.Random(7)
    store = engine.store
    old = store.open_conversation("old")
    for _ in range(150):
        store.append(old.id, user(" ".join(rng.choice(words) for _ in range(12))))
        store.append(old.id, assistant(" ".join(rng.choice(words) for _ in range(12))))
    store.append(old.id, user("My passport expires on 12 March 2031, it is in the blue folder."))


async def test_a_model_without_tools_gets_no_auto_recall_call_to_imitate():
    # The offline model has no tools: a synthetic recall_history pair taught it to answer with
    # a fenced tool call as text (qa20o #3).
    model = Model([said("In March 2031.")])
    async with Engine.open(
        Settings.load(), provider=ScriptedProvider(model), registry=ToolRegistry([])
    ) as engine:
        _filler(engine)
        await engine.turn("new", "When does my passport expire?")
        rows = engine.store.all_messages(engine.store.conversation("new").id)
    (request,) = model.requests
    assert not request.tools
    assert [m.role for m in request.messages] == ["user"]
    assert not any(m.tool_calls or m.tool_results for m in request.messages)
    assert [r.role for r in rows] == ["user", "assistant"]


async def test_auto_recall_injects_before_this_message_and_replays_identically():
    model = Model([said("In March 2031."), said("You're welcome."), said("Pasta?")])
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        _filler(engine)
        await engine.turn("new", "When does my passport expire?")
        await engine.turn("new", "thanks, that's great")
        await engine.turn("new", "what should I cook for dinner tonight")
    first, second, third = model.requests
    call, result, asked = first.messages[-3:]
    assert call.tool_calls[0].name == "recall_history"
    assert "12 March 2031" in result.tool_results[0].content
    assert "· message " in result.tool_results[0].content  # conversation, date and id
    assert last_user_text_of(asked).startswith("When does my passport expire?")
    # the next requests start with exactly what this one sent: the prefix is not broken
    assert second.messages[: len(first.messages)] == first.messages
    assert third.messages[: len(second.messages)] == second.messages
    # unrelated chat fires nothing
    assert not second.messages[-1].tool_results and second.messages[-2].role == "assistant"
    assert sum(1 for m in third.messages if m.tool_calls) == 1


async def test_memory_commands_and_learn_in_chat():
    facts = [{"path": "personal/when/travel/window-seat", "text": "Window seat.", "quote": "I "
              "always book a window seat on planes"}]  # fmt: skip
    model = Model([said("Noted.")], facts=facts)
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        empty = await engine.turn("c", "/memory")
        assert empty.reply == "Nothing waits for review."
        await engine.turn("c", "I always book a window seat on planes.")
        learned = await engine.turn("c", "/learn")
        assert learned.command == "learn" and "1 new suggestion(s)" in learned.reply
        assert engine.memory.entries() == []
        listed = await engine.turn("c", "/memory review")  # no checklist UI here: the list
        number = waiting(engine.store)[0].id
        assert f"#{number} fact" in listed.reply
        kept = await engine.turn("c", f"/memory accept {number}")
        assert "kept" in kept.reply
        assert engine.memory.get("personal/when/travel/window-seat.md").origin == "auto"
        again = await engine.turn("c", "/reflect")
        assert "gained: personal/when/travel/window-seat.md" in again.reply
    async with Engine.open(Settings.load(), provider=ScriptedProvider([]), ephemeral=True) as e:
        off = await e.turn("x", "/memory review")
        assert "ephemeral" in off.reply


async def test_the_end_of_chat_review_pass_writes_only_to_the_queue():
    from heron.channels.memory_cli import run_review_pass

    facts = [{"path": "personal/always/metric", "text": "Use metric units.", "quote": "I use "
              "metric units"}]  # fmt: skip
    async with Engine.open(Settings.load(), provider=ScriptedProvider([said("OK.")])) as engine:
        await engine.turn("chat-1", "I use metric units, never imperial.")
        files_before = sorted(p.name for p in engine.settings.paths.memory.rglob("*"))
    model = Model([], facts=facts)
    queued = await run_review_pass(Settings.load(), ["chat-1", "missing"], ScriptedProvider(model))
    assert len(queued) == 1 and model.kinds == ["facts"]
    settings = Settings.load()
    assert sorted(p.name for p in settings.paths.memory.rglob("*")) == files_before
    async with Engine.open(settings, provider=ScriptedProvider([])) as engine:
        assert [s.quote for s in waiting(engine.store)] == ["I use metric units"]
    # a second pass reviews nothing new
    again = await run_review_pass(settings, ["chat-1"], ScriptedProvider(Model([], facts)))
    assert again == []


def test_chat_end_starts_the_hidden_review_command_and_says_so_with_its_model(monkeypatch):
    from heron.cli import app
    from heron.memory import commands
    from heron.providers.profiles import ModelChoice

    started: list[dict] = []
    monkeypatch.setattr(
        commands.subprocess, "Popen", lambda argv, **kw: started.append({"argv": argv, **kw})
    )
    said: list[str] = []
    choice = ModelChoice("openai", "chat-model", "http://127.0.0.1:1/v1", "k")
    settings = Settings.load()
    assert commands.review_on_close(settings, "chat-model", choice, ["a", "b"], say=said.append)
    argv = started[0]["argv"]
    assert argv[1:] == [
        "-P", "-m", "heron", "memory", "review-pass", "--model", "chat-model",
        "--conversation", "a", "--conversation", "b",
    ]  # fmt: skip
    assert started[0]["start_new_session"] is True
    assert said == [commands.closing_notice(choice)]
    assert "openai/chat-model" in said[0] and "review_on_close = false" in said[0]
    assert not commands.review_on_close(settings, None, choice, [], say=said.append)
    settings.paths.config.write_text("[memory]\nreview_on_close = false\n")
    assert not commands.review_on_close(Settings.load(), None, choice, ["a"], say=said.append)
    assert len(started) == 1 and len(said) == 1
    shown = CliRunner().invoke(app, ["memory", "--help"])
    assert "review-pass" not in shown.output  # hidden


def test_the_review_on_close_uses_the_chat_s_model(monkeypatch):
    from heron.channels.memory_cli import run_review_pass
    from heron.testing.fake_openai import FakeOpenAIServer
    from heron.testing.script import ServerReply

    async def chat() -> None:
        async with Engine.open(Settings.load(), provider=ScriptedProvider([said("OK.")])) as e:
            await e.turn("chat-1", "I use metric units, never imperial.")

    asyncio.run(chat())
    with FakeOpenAIServer([ServerReply(text='{"facts": []}')]) as server:
        monkeypatch.setenv("HERON_BASE_URL", server.base_url)
        monkeypatch.setenv("HERON_MODEL", "configured-model")
        asyncio.run(run_review_pass(Settings.load(), ["chat-1"], model="chat-model"))
    assert [r["model"] for r in server.requests] == ["chat-model"]


async def test_recall_finds_a_message_the_engine_stored():
    model = Model([said("Got it.")])
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        result = await engine.turn("trip", "The wifi password hint is the name of our heron statue")
        rows = engine.store.branch(result.conversation.id)
        typed = next(r for r in rows if r.role == "user")
    from heron.cli import app

    out = CliRunner().invoke(app, ["memory", "recall", "heron statue wifi"])
    assert out.exit_code == 0, out.output
    line = out.output.splitlines()[0]
    assert line.startswith("[trip · ") and f"· message {typed.id} · you]" in line
    assert "heron statue" in line


async def test_auto_recall_searches_on_its_own_thread_while_turns_overlap(monkeypatch):
    """Two turns at once: the search runs through the RecallReader (a second connection on a
    thread of its own) and still injects exactly what the inline search would; a lone turn
    searches inline."""
    from heron.memory import wiring

    asked: list[str] = []
    real = wiring.RecallReader.strong

    async def counted(self, text: str, conversation_id: int, own: bool = True) -> bool:
        asked.append(text)
        return await real(self, text, conversation_id, own)

    monkeypatch.setattr(wiring.RecallReader, "strong", counted)
    model = Model([said("Pasta?"), said("In March 2031.")])
    provider = ScriptedProvider(model, latency_s=0.05)
    async with Engine.open(Settings.load(), provider=provider) as engine:
        _filler(engine)
        await asyncio.gather(  # the second starts while the first runs
            engine.turn("a", "what should I cook for dinner tonight"),
            engine.turn("b", "When does my passport expire?"),
        )
        assert asked == ["When does my passport expire?"]
        await engine.turn("c", "When does my passport expire, again?")
        assert len(asked) == 1  # alone: inline
    by_question = {last_user_text_of(r.messages[-1]).split("\n")[0]: r for r in model.requests}
    passport = by_question["When does my passport expire?"].messages
    assert passport[-3].tool_calls[0].name == "recall_history"
    assert "12 March 2031" in passport[-2].tool_results[0].content
    dinner = by_question["what should I cook for dinner tonight"].messages
    assert not any(m.tool_calls for m in dinner)
    alone = by_question["When does my passport expire, again?"].messages
    assert alone[-3].tool_calls[0].name == "recall_history"  # the inline search found it too


def test_the_reader_answers_like_the_inline_search(tmp_path):
    from heron.memory.auto import fires
    from heron.memory.recall import Recall
    from heron.memory.wiring import RecallReader
    from heron.store import Store

    store = Store(tmp_path / "heron.db")
    conv = store.open_conversation("k")
    here = store.open_conversation("here").id
    store.append(conv.id, user("My passport expires on 12 March 2031, in the blue folder."))
    for i in range(40):
        store.append(conv.id, assistant(f"note {i} about the garden and the weekend"))
    reader = RecallReader(tmp_path / "heron.db")
    try:
        for text in ["when does my passport expire", "garden weekend", "zebra", "/status", " "]:
            inline = fires(Recall(store), text, here)
            assert asyncio.run(reader.strong(text, here)) == inline, text
            assert inline == (text in ("when does my passport expire", "garden weekend")), text
    finally:
        reader.close()
    again = RecallReader(tmp_path / "heron.db")
    try:
        assert asyncio.run(again.strong("passport expires", here)) is True
    finally:
        again.close()


async def test_retry_and_edit_never_recall_the_branch_the_person_turned_away_from():
    """The answer being retried (and the old text of an edited message) is on a branch the
    person left: auto-recall shows the model none of it, though it matches the words."""
    model = Model(
        [said("The capybara festival is in Lisbon."), said("Porto, then."), said("Faro!")]
    )
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        await engine.turn("br", "where is the capybara festival held")
        await engine.turn("br", "/retry")
        await engine.turn("br", "/edit 1 where is the capybara festival held this year")
    for request in model.requests[1:]:
        recalled = [r.content for m in request.messages for r in m.tool_results]
        assert not any("Lisbon" in r or "Porto" in r for r in recalled), recalled
    texts = [p.text for m in model.requests[1].messages for p in m.parts if hasattr(p, "text")]
    assert not any("Lisbon" in t for t in texts)  # nor anywhere else in the retried request


async def test_recall_history_returns_the_past_not_what_the_model_has_in_view():
    # The asking message and the previous turn hold the query's words best, and the model
    # reads both whole: a search that returned them first crowded out what was said before
    # (here before /new, out of the view).
    ask = Reply([ToolCall("r1", "recall_history", {"query": "locker code at the gym"})], "tool")
    model = Model([said("Noted."), said("Noted."), ask, said("4417.")])
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        await engine.turn("gym", "My locker code at the gym is 4417.")
        await engine.turn("gym", "/new")
        await engine.turn("gym", "The locker code at the gym is now 5521, the gym changed it.")
        await engine.turn("gym", "What was my locker code at the gym before that?")
        rows = engine.store.branch(engine.store.conversation("gym").id)
        texts = {r.id: last_user_text_of(r.message) for r in rows}
    result = model.requests[-1].messages[-1].tool_results[0].content
    lines = result.splitlines()
    assert "4417" in lines[0]
    in_view = [i for i, text in texts.items() if "5521" in text or "before that" in text]
    assert len(in_view) == 2
    assert all(f"message {i} ·" not in result for i in in_view)


async def test_recall_history_finds_a_message_the_view_shows_by_head_and_tail(monkeypatch):
    # A message over its share of a small window is in the view only as its head and tail:
    # what was said in its middle is the past to the model, and the search finds it.
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "8000")
    filler = "lorem ipsum dolor sit amet consectetur " * 150
    long = filler + "The spare key hides under the blue flowerpot by the shed. " + filler
    query = {"query": "spare key blue flowerpot shed"}
    ask = Reply([ToolCall("r1", "recall_history", query)], "tool")
    model = Model([said("Noted."), ask, said("Under the flowerpot.")])
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        await engine.turn("keys", long)
        await engine.turn("keys", "Where did I say the spare key is?")
        rows = engine.store.branch(engine.store.conversation("keys").id)
        kept = next(r for r in rows if "flowerpot" in last_user_text_of(r.message))
    sent = model.requests[-1]
    assert "blue flowerpot" not in "\n".join(last_user_text_of(m) for m in sent.messages[:-1])
    result = sent.messages[-1].tool_results[0].content
    assert f"message {kept.id} ·" in result.splitlines()[0]


async def test_conversations_show_puts_a_turns_auto_recall_under_its_header(capsys):
    """Auto-recall's rows are stored just before the message they answer, outside any turn:
    `show` printed them above `── turn 1` (and a later turn's at the end of the one before)."""
    from heron.channels.info import show_conversation

    model = Model([said("Hello."), said("In March 2031.")])
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        _filler(engine)
        await engine.turn("new", "Good morning to you")
        await engine.turn("new", "When does my passport expire?")
        capsys.readouterr()
        show_conversation(engine.settings, "new")
    lines = capsys.readouterr().out.splitlines()
    recall = next(i for i, line in enumerate(lines) if "recall_history" in line)
    headers = [i for i, line in enumerate(lines) if line.startswith("── turn ")]
    assert len(headers) == 2 and headers[1] < recall
    assert lines[headers[1] + 1].lstrip().startswith("→ recall_history")


async def test_a_fold_before_the_turn_keeps_that_turns_auto_recall(monkeypatch, heron_home):
    """The consolidation that runs before a turn kept its last turn from the person's message
    on, and folded the auto-recall pair stored just before it: the model got the question
    without the evidence found for it (qa21q H1). A turn starts at its recall pair."""
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "8000")
    # A consolidation is due at every turn that has something to fold.
    (heron_home / "config.toml").write_text("[agent]\nconsolidation_ratio = 0.01\n")
    read = Reply([ToolCall("f1", "read_file", {"path": "notes.txt"})], "tool")
    model = Model([read, said("Read."), read, said("Read again."), said("In March 2031.")])
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        _filler(engine)
        # Results larger than the part of the window a fold keeps whole ([context] recent).
        (engine.settings.paths.workspace / "notes.txt").write_text("lorem ipsum dolor " * 400)
        await engine.turn("new", "Please read notes.txt for me")
        await engine.turn("new", "Please read notes.txt once more")
        await engine.turn("new", "When does my passport expire?")
        conv = engine.store.conversation("new")
        (fold, *_) = reversed(folds.compactions(engine.store, conv.id))
        rows = engine.store.branch(conv.id)
    asked = model.requests[-1]
    recalled = [r.content for m in asked.messages for r in m.tool_results]
    assert any("12 March 2031" in r for r in recalled), recalled
    kept = [r for r in rows if r.id > fold.last_row_id]
    assert kept[0].meta.get(RECALL_FLAG) and kept[0].role == "assistant"


async def test_the_memory_pass_at_a_fold_fits_the_calibrated_request_check(monkeypatch):
    """The pass filled the window counted raw, and the request check counts it calibrated:
    at a factor over 1 every full pass was refused unsent, and nothing said so (qa21q M5)."""
    from heron.compaction.records import save_calibration
    from heron.context.tokens import Calibration

    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "8000")
    model = Model([said("Noted. " * 60)] * 40)
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        save_calibration(engine.store, engine.choice.model, Calibration(1.1, 50), 0)
        for i in range(30):
            await engine.turn("c", f"Note {i}: " + "I walk by the river in the evening. " * 30)
    assert "summary" in model.kinds
    assert model.kinds.count("facts") == model.kinds.count("summary")


def _shown(engine: Engine, run_id: str) -> str:
    from heron.trace.prices import PriceTable
    from heron.trace.read import load_run
    from heron.trace.render import render_show

    run = load_run(engine.store, run_id)
    return "\n".join(render_show(engine.store, run, PriceTable(), "UTC"))


class FailingFacts(Model):
    """A model whose memory pass at a fold fails (the server refuses it)."""

    def __call__(self, request: ChatRequest) -> Reply:
        if request.system == FACTS_SYSTEM:
            self.kinds.append("facts")
            raise TransientProviderError("the server answered 503 Service Unavailable")
        return super().__call__(request)


async def test_a_fold_whose_memory_pass_fails_says_so_and_the_trace_keeps_it(monkeypatch):
    """A failed memory pass at a fold was only logged, which `heron run` does not show: the
    person and `trace show` had no way to tell the pass stopped (qa21q M5)."""
    from heron.agent.turn import TurnHooks

    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "2500")
    model = FailingFacts([])
    told: list[tuple[str, list[str]]] = []
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        for i in range(14):
            notices: list[str] = []
            hooks = TurnHooks(on_notice=notices.append)
            result = await engine.turn("c", f"I note {i}: " + "lorem ipsum dolor " * 30, hooks)
            told.append((result.run_id, notices))
        shown = {run_id: _shown(engine, run_id) for run_id, _ in told}
    assert "facts" in model.kinds
    failed = [(run_id, n) for run_id, notices in told for n in notices if "Memory's pass" in n]
    assert len(failed) == model.kinds.count("facts")  # one line at each fold, no more
    run_id, line = failed[0]
    assert "did not run (the server answered 503" in line and "/learn" in line
    assert f"■ notice: {line}" in shown[run_id]
