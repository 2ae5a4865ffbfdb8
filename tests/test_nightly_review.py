"""The nightly review of memory: it proposes, never writes; it is bounded; a no-op proposal is
dropped; the memory folder is a git repository whose last change `memory undo` takes back."""

from __future__ import annotations

from typer.testing import CliRunner

from heron.agent.engine import Engine
from heron.cli import app
from heron.config import Settings
from heron.memory import EntryPath
from heron.memory.entries import Source
from heron.messages import Reply, Text, Usage, assistant, user
from heron.proactive.review import nightly_review
from heron.providers.base import ChatRequest
from heron.providers.scripted import ScriptedProvider
from heron.store import review_state

FACT = (
    '{"facts": [{"path": "personal/always/tea", "quote": "I drink green tea every morning."}],'
    ' "lessons": [{"topic": "coding", "rule": "Run the tests before committing.",'
    ' "mistake": "broken commits"}]}'
)


class Model:
    """The review's model: facts for a review request, nothing for the tidy pass."""

    def __init__(self) -> None:
        self.requests: list[ChatRequest] = []

    def __call__(self, request: ChatRequest) -> Reply:
        self.requests.append(request)
        body = FACT if "QUOTABLE" in request.messages[0].text else "{}"
        return Reply([Text(body)], "done", Usage(500, 50))


def _tree(root) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in root.rglob("*.md")}


def _talk(store, key: str, said: str) -> int:
    conv = store.open_conversation(key)
    store.append(conv.id, user(said))
    store.append(conv.id, assistant("Noted."))
    return conv.id


async def test_it_proposes_and_never_writes_and_reads_each_message_once(heron_home):
    model = Model()
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        _talk(engine.store, "chat-1", "I drink green tea every morning. Help me plan the week.")
        _talk(engine.store, "subagent:ab12", "I drink green tea every morning.")  # internal
        root = engine.memory.files.root
        before, log_before = _tree(root), engine.memory.history.log()
        report = await nightly_review(engine)
        after, log_after = _tree(root), engine.memory.history.log()
        waiting = engine.memory.waiting()
        calls = len(model.requests)
        again = await nightly_review(engine)
    assert after == before and log_after == log_before  # nothing written, nothing committed
    assert sorted(s.kind for s in waiting) == ["fact", "lesson"]
    assert report.conversations == 1 and report.left == 0  # the subagent's is not reviewed
    assert calls == 1  # one review call (an empty memory has nothing to tidy)
    assert again.conversations == 0 and len(model.requests) == calls  # nothing new to read
    assert report.model_calls == 1 and report.tokens > 0


async def test_it_is_bounded_and_the_next_pass_goes_on():
    model = Model()
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        ids = [_talk(engine.store, f"chat-{i}", f"Note {i}: I like plan {i}.") for i in range(5)]
        first = await nightly_review(engine, model_calls=2)
        unread = review_state.unreviewed(engine.store)
        second = await nightly_review(engine, model_calls=10)
        tight = await nightly_review(engine, tokens=10)  # nothing fits: nothing sent
    assert first.model_calls == 2 and first.conversations == 2 and first.left == 3
    assert unread == ids[2:]  # their cursors did not move
    assert second.conversations == 3 and second.left == 0
    assert tight.model_calls == 0


async def test_a_no_op_proposal_is_dropped():
    model = Model()
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        service = engine.memory
        lesson = EntryPath("personal", "when", "coding", "tests-first")
        service._write(lesson, "Run the tests before committing.", "lesson", Source())
        _talk(engine.store, "chat-1", "Hello there.")  # no quotable fact
        report = await nightly_review(engine)
        waiting = service.waiting()
    assert report.dropped == 1 and waiting == []  # the lesson memory already holds


async def test_accepted_changes_are_commits_and_memory_undo_restores_the_folder():
    model = Model()
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        _talk(engine.store, "chat-1", "I drink green tea every morning.")
        await nightly_review(engine)
        service = engine.memory
        root = service.files.root
        before = _tree(root)
        (fact,) = [s for s in service.waiting() if s.kind == "fact"]
        assert service.accept(fact.id).status == "accepted"
        kept = _tree(root)
    cli = CliRunner()
    log = cli.invoke(app, ["memory", "log"])
    undo = cli.invoke(app, ["memory", "undo"])
    restored = _tree(root)
    log_after = cli.invoke(app, ["memory", "log"])
    redo = cli.invoke(app, ["memory", "redo"])
    assert len(kept) == len(before) + 1
    assert "saved personal/always/tea.md (auto)" in log.output
    assert undo.exit_code == 0 and "Undid" in undo.output
    assert restored == before
    assert "undo: saved personal/always/tea.md" in log_after.output.splitlines()[0]
    assert redo.exit_code == 0 and _tree(root) == kept  # what was undone, made again


async def test_a_hand_edit_gets_its_own_commit_and_survives_an_undo():
    async with Engine.open(Settings.load(), provider=ScriptedProvider(Model())) as engine:
        service = engine.memory
        root = service.files.root
        conv = _talk(engine.store, "chat-1", "I drink green tea. I wake up early.")
        service.save(conv, EntryPath("personal", "always", None, "tea"), "I drink green tea.")
        hand = root / "personal" / "always" / "tea.md"
        hand.write_text(hand.read_text().replace("green", "black"))
        service.save(conv, EntryPath("personal", "always", None, "mornings"), "I wake up early.")
        messages = [c.message for c in service.history.log()]
        service.history.undo()
    assert messages[:2] == ["saved personal/always/mornings.md (user)", "edited by hand"]
    assert "black" in hand.read_text() and not (root / "personal/always/mornings.md").exists()


async def test_a_pass_cut_by_its_bound_keeps_what_it_read_and_the_next_goes_on(monkeypatch):
    """A small window: one conversation takes several calls. The bound stopping the pass
    midway keeps the cursor past what the answered calls read (not back at the start, to be
    read and proposed again, nor at the end, never read)."""
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "8000")
    model = Model()
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        conv = engine.store.open_conversation("home")
        for n in range(60):
            engine.store.append(conv.id, user(f"Turn {n}: " + "I water the basil daily. " * 12))
        first = await nightly_review(engine, model_calls=1)
        read = [int(i) for i in _ids_quoted(model.requests[0])]
        cursor = review_state_cursor(engine.store, conv.id)
        second = await nightly_review(engine)
        later = [int(i) for r in model.requests[1:] for i in _ids_quoted(r)]
    assert first.left == 1 and first.conversations == 0 and read
    assert cursor == read[-1]
    assert later and later[0] > read[-1]  # on from there, nothing read twice
    assert second.conversations == 1 and second.left == 0


def _ids_quoted(request: ChatRequest) -> list[str]:
    import re

    text = request.messages[0].text
    if "QUOTABLE" not in text:
        return []
    return re.findall(r"^\[#(\d+)\] ", text.split("QUOTABLE")[1], re.MULTILINE)


def review_state_cursor(store, conversation_id: int) -> int:
    from heron.memory import records

    return records.reviewed_up_to(store, conversation_id)


async def test_the_run_counts_only_suggestions_it_newly_queued():
    """The run's line said 10 queued when 3 were new: picks the queue already held (from
    another conversation, or waiting since an earlier night) were counted again (QA19i #8)."""
    model = Model()
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        for key in ("chat-1", "chat-2"):
            _talk(engine.store, key, "I drink green tea every morning.")
        first = await nightly_review(engine)
        _talk(engine.store, "chat-1", "I drink green tea every morning.")
        second = await nightly_review(engine)
        waiting = engine.memory.waiting()
    assert len(waiting) == 2  # the fact and the lesson, once each
    assert sorted(first.suggested) == sorted(s.id for s in waiting)
    assert "2 suggestion(s) queued" in first.text()
    assert second.suggested == [] and "0 suggestion(s) queued" in second.text()


class Olives(Model):
    """A review model that takes the words the person quoted from their sister for theirs."""

    def __call__(self, request: ChatRequest) -> Reply:
        self.requests.append(request)
        body = (
            '{"facts": [{"path": "personal/always/hates-olives", "quote": "I hate olives"}]}'
            if "QUOTABLE" in request.messages[0].text
            else "{}"
        )
        return Reply([Text(body)], "done", Usage(500, 50))


async def test_words_the_person_quoted_from_someone_else_are_refused_and_the_run_says_why():
    async with Engine.open(Settings.load(), provider=ScriptedProvider(Olives())) as engine:
        _talk(engine.store, "prefs", 'My sister said "I hate olives" but I love olives.')
        report = await nightly_review(engine)
        waiting = engine.memory.waiting()
    assert waiting == [] and report.suggested == []
    assert report.refused == ["in quotation marks (someone else's words)"]
    assert "1 pick(s) refused (1 in quotation marks (someone else's words))" in report.text()


async def test_rows_heron_wrote_are_labelled_heron_in_the_context_never_user():
    """A reminder's prompt and a monitor's message are stored with role user and author heron:
    the review's model reads them labelled as Heron's, so it draws no lesson from them taken
    for the person's words (qa24e M4)."""
    model = Model()
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        conv = _talk(engine.store, "chat-1", "I drink green tea every morning.")
        monitor = engine.store.append(conv, user("build is RED (monitor)"), author="heron")
        engine.store.append(conv, assistant("The build is red."))
        await nightly_review(engine)
    (review,) = [r for r in model.requests if "QUOTABLE" in r.messages[0].text]
    text = "\n".join(m.text for m in review.messages)
    assert f"[heron #{monitor.id}] build is RED (monitor)" in text
    assert "[user #" not in text
