"""The review queue, the agent's bash refused, extraction passes, forgetting with revocation."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from heron import timefmt
from heron.memory import Entry, EntryPath, MemoryService, memory_section
from heron.memory.commands import learn, memory_command, memory_digests, opening_line
from heron.memory.extract import compaction_pass, review_pass, tidy_pass
from heron.messages import Reply, Text, assistant, user
from heron.providers.scripted import ScriptedProvider
from heron.store import Store


@pytest.fixture
def setup(heron_home: Path, home_db: str | Path):  # once per backend (tests/pg.py)
    store = Store(home_db)
    service = MemoryService(heron_home / "memory", store)
    conv = store.open_conversation("chat-1")
    yield store, service, conv.id
    store.close()


def say(*texts: str) -> ScriptedProvider:
    return ScriptedProvider([Reply([Text(t)], "done") for t in texts])


def tree(root: Path) -> dict[str, str]:
    return (
        {str(p.relative_to(root)): p.read_text() for p in root.rglob("*.md")}
        if root.exists()
        else {}
    )


FACT = (
    '{"facts": [{"path": "personal/when/cooking/no-cilantro", "text": "No cilantro in recipes",'
    ' "quote": "I hate cilantro"},'
    ' {"path": "personal/always/made-up", "text": "Likes jazz", "quote": "I love jazz"}],'
    ' "lessons": [{"topic": "cooking", "rule": "Ask about allergies first", "mistake": "x"}]}'
)


async def test_every_extraction_pass_writes_only_to_the_queue(setup, heron_home):
    store, service, cid = setup
    store.append(cid, user("I hate cilantro, never put it in anything"))
    store.append(cid, assistant("Noted. I love jazz too."))
    root = heron_home / "memory"
    service.files.write(Entry(EntryPath("personal", "always", None, "tea"), "Drinks tea"))
    before = tree(root)
    folded = [m.id for m in store.all_messages(cid)]
    ids = await compaction_pass(say(FACT), service, cid, folded)
    ids += await review_pass(say(FACT), service, cid)
    ids += await tidy_pass(
        say(
            '{"removals": [{"path": "personal/always/tea", "reason": "stale"}],'
            ' "rewrites": [{"path": "personal/always/tea", "text": "reworded"}]}'
        ),
        service,
        cid,
    )
    assert tree(root) == before  # nothing saved by any pass
    kinds = sorted(s.kind for s in service.waiting())
    # facts only from the user's words (the model's "I love jazz" is refused), lessons, a
    # removal; the rewrite of a fact that is not a lesson is ignored
    assert "fact" in kinds and "lesson" in kinds and "removal" in kinds
    assert all(s.quote != "I love jazz" for s in service.waiting())
    assert not any(s.kind == "amendment" for s in service.waiting())
    assert set(ids) == {s.id for s in service.waiting()}  # the same fact is queued once


async def test_compaction_pass_quotes_only_folded_messages(setup):
    store, service, cid = setup
    kept = store.append(cid, user("I hate cilantro"))
    folded = store.append(cid, user("what should I cook tonight?"))
    await compaction_pass(say(FACT), service, cid, [folded.id])
    assert kept.id and [s.kind for s in service.waiting()] == ["lesson"]  # no fact: not folded


async def test_forget_with_revocation_stops_re_extraction(setup):
    store, service, cid = setup
    store.append(cid, user("I hate cilantro, never put it in anything"))
    service.save(cid, EntryPath("personal", "when", "cooking", "no-cilantro"), "I hate cilantro")
    service.forget("personal/when/cooking/no-cilantro.md", cid)
    ids = await review_pass(say(FACT), service, cid)
    assert [s.kind for s in service.waiting()] == ["lesson"]
    assert len(ids) == 1


async def test_review_pass_does_not_read_the_same_messages_twice(setup):
    store, service, cid = setup
    store.append(cid, user("I hate cilantro"))
    provider = say(FACT)
    await review_pass(provider, service, cid)
    assert await review_pass(provider, service, cid) == []  # no call: nothing new
    provider.assert_complete()


def test_review_checklists_keep_checked_drop_rest_and_esc_leaves_waiting(setup):
    _store, service, _cid = setup
    for i in range(23):
        service.suggest_lesson(EntryPath("personal", "when", "t", f"l{i}"), f"rule {i}", "m")
    seen: list[int] = []

    def choose(batch):
        seen.append(len(batch))
        if len(seen) == 3:
            return None  # Esc on the third checklist
        return {batch[0].id}

    decisions = service.review(choose, env={})
    assert seen == [10, 10, 3]
    assert sum(d.status == "accepted" for d in decisions) == 2
    assert sum(d.status == "rejected" for d in decisions) == 18  # the person's no: it lasts
    assert service.count_waiting() == 3
    assert len(service.entries()) == 2 and service.entries()[0].origin == "lesson"


@pytest.mark.parametrize("keys", ["\x1b", "q"], ids=["esc", "q"])
async def test_esc_and_q_leave_the_review_checklist_with_everything_waiting(keys):
    from prompt_toolkit.application import create_app_session
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from heron.channels.memory_cli import CHECKLIST_TEXT, checklist

    assert "Esc, q or Cancel" in CHECKLIST_TEXT  # what the dialog says is what it does
    with create_pipe_input() as typed, create_app_session(input=typed, output=DummyOutput()):
        app = checklist([(7, "rule a"), (8, "rule b")])
        typed.send_text(keys)
        assert await asyncio.wait_for(app.run_async(), 30) is None  # None: leave them waiting
    with create_pipe_input() as typed, create_app_session(input=typed, output=DummyOutput()):
        app = checklist([(7, "rule a"), (8, "rule b")])
        typed.send_text(" \t\r")  # check the first, then Ok
        assert await asyncio.wait_for(app.run_async(), 30) == [7]
    with create_pipe_input() as typed, create_app_session(input=typed, output=DummyOutput()):
        app = checklist([(7, "rule a"), (8, "rule b")])
        typed.send_text(" \r")  # check the first, then Enter: kept (it toggled it back)
        assert await asyncio.wait_for(app.run_async(), 30) == [7]
    with create_pipe_input() as typed, create_app_session(input=typed, output=DummyOutput()):
        app = checklist([(7, "rule a"), (8, "rule b")])
        typed.send_text("\t\t\r")  # Cancel: everything waits
        assert await asyncio.wait_for(app.run_async(), 30) is None


def test_the_line_review_says_the_ids_not_listed_are_dropped(setup, monkeypatch):
    """Piped, `echo 1 | heron memory review` dropped #2 and #3 for good without saying so."""
    import typer

    from heron.channels import memory_cli

    _store, service, _cid = setup
    for i in range(3):
        service.suggest_lesson(EntryPath("personal", "when", "t", f"l{i}"), f"rule {i}", "m")
    asked: list[str] = []

    def answer(text: str, **_: object) -> str:
        asked.append(text)
        return "1"

    monkeypatch.setattr(typer, "prompt", answer)
    picked = memory_cli._line_choose(service.waiting())
    assert picked == {1}
    assert "not listed are dropped for good" in asked[0] and "leaves them waiting" in asked[0]


def test_amendment_of_a_changed_entry_is_refused_and_stays_waiting(setup, heron_home):
    store, service, cid = setup
    store.append(cid, user("I prefer concise replies. Actually I prefer very short replies"))
    path = EntryPath("personal", "always", None, "replies")
    service.save(cid, path, "I prefer concise replies")
    number = service.suggest_fact(cid, path, "Actually I prefer very short replies")
    file = heron_home / "memory/personal/always/replies.md"
    file.write_text(file.read_text().replace("concise", "Medium"))  # edited by hand meanwhile
    decision = service.accept(number, env={})
    assert decision.status == "waiting" and "changed" in decision.message
    assert service.count_waiting() == 1
    assert "Medium" in service.get(path).text


def test_chat_commands(setup):
    store, service, cid = setup
    assert opening_line(service) is None
    store.append(cid, user("I hate cilantro"))
    number = service.suggest_fact(
        cid, EntryPath("personal", "when", "cooking", "cilantro"), "I hate cilantro"
    )
    assert opening_line(service) == "1 memory suggestion waits for your review: /memory review"
    assert "I hate cilantro" in memory_command(service, "")
    refused = memory_command(service, f"accept {number}", env={"HERON_AGENT_COMMAND": "1"})
    assert "started by the agent" in refused and service.entries() == []
    assert "kept" in memory_command(service, f"accept {number}", env={})
    assert service.get("personal/when/cooking/cilantro.md").origin == "auto"
    assert memory_command(service, "frobnicate").startswith("Usage")
    assert "no suggestion" in memory_command(service, "reject 99")


async def test_learn_reports_changes_and_suggests(setup):
    store, service, cid = setup
    store.append(cid, user("I hate cilantro"))
    baseline = memory_digests(service)
    service.save(cid, EntryPath("personal", "always", None, "x"), "I hate cilantro")
    model = say(FACT, '{"removals": []}')
    report = await learn(service, (model, model), cid, baseline)  # the review, then the tidy
    assert report.gained == ["personal/always/x.md"]
    assert "gained: personal/always/x.md" in report.text()
    assert report.suggested  # the lesson at least


def _cli(env_extra: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra}
    return subprocess.run(
        [sys.executable, "-m", "heron.cli", "memory", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        input=stdin,
    )


@pytest.mark.slow  # the real CLI in a subprocess
def test_the_agents_bash_cannot_accept_a_suggestion(setup):
    _store, service, _cid = setup
    number = service.suggest_lesson(EntryPath("personal", "when", "t", "rule"), "A rule", "m")
    for args in (("accept", str(number)), ("review",)):
        done = _cli({"HERON_AGENT_COMMAND": "1"}, *args)
        assert done.returncode != 0
        assert "started by the agent" in done.stderr and "HERON_AGENT_COMMAND" in done.stderr
    assert service.count_waiting() == 1 and service.entries() == []
    done = _cli({"HERON_AGENT_COMMAND": ""}, "accept", str(number))
    assert done.returncode == 0, done.stderr
    assert service.entries()[0].origin == "lesson"


async def test_the_agents_bash_tool_is_refused_as_not_the_person(setup, tmp_path):
    from heron.tools.context import ToolContext
    from heron.tools.shell import bash

    _store, service, _cid = setup
    number = service.suggest_lesson(EntryPath("personal", "when", "t", "rule"), "A rule", "m")
    ctx = ToolContext(workspace=tmp_path)
    out = await bash.fn(ctx, f"{sys.executable} -m heron.cli memory accept {number}")
    assert "the person's act; run it in your own terminal" in str(out)
    assert service.count_waiting() == 1


async def test_two_passes_picking_the_same_fact_queue_it_once(setup):
    store, service, cid = setup
    store.append(cid, user("I hate cilantro, never put it in anything"))
    folded = [m.id for m in store.all_messages(cid)]
    first = await compaction_pass(say(FACT), service, cid, folded)
    second = await review_pass(say(FACT), service, cid)
    facts = [s for s in service.waiting() if s.kind == "fact"]
    assert len(facts) == 1 and facts[0].quote == "I hate cilantro"
    assert facts[0].id in first and facts[0].id not in second  # not new the second time


def test_a_memory_pass_prompt_is_cut_to_fit_the_window():
    """Memory's own requests keep the window's invariant: a prompt larger than the room is
    sent as its head and tail, with what was left out said."""
    from heron.context.tokens import estimate_text
    from heron.memory.extract import fit_prompt

    prompt = "start " + "x" * 400_000 + " end"
    fitted = fit_prompt(prompt, 8_000)
    assert estimate_text(fitted) <= 8_000
    assert fitted.startswith("start ") and fitted.endswith(" end")
    assert "characters left out to fit the window" in fitted
    assert fit_prompt("short", 8_000) == "short"


@pytest.mark.slow
def test_esc_leaves_heron_memory_review_in_a_terminal_with_the_suggestion_waiting(heron_home):
    import pexpect

    store = Store(heron_home / "heron.db")
    service = MemoryService(heron_home / "memory", store)
    service.suggest_lesson(EntryPath("personal", "when", "coding", "tests"), "Run tests", "m")
    store.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERON_")}
    env.update(HERON_HOME=str(heron_home), TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1")
    child = pexpect.spawn(
        sys.executable, ["-m", "heron", "memory", "review"], env=env, encoding="utf-8"
    )
    child.expect("Memory review", timeout=120)
    child.expect("Run tests", timeout=30)
    child.send("\x1b")
    child.expect("1 still waiting", timeout=30)
    child.expect(pexpect.EOF, timeout=30)
    store = Store(heron_home / "heron.db")
    assert MemoryService(heron_home / "memory", store).count_waiting() == 1
    store.close()


@pytest.mark.slow  # the real CLI in a subprocess
def test_memory_review_with_no_answers_on_stdin_says_what_to_do(setup):
    """Piped with nothing to read, the review printed the list and then only "Aborted."."""
    _store, service, _cid = setup
    service.suggest_lesson(EntryPath("personal", "when", "coding", "tests"), "Run tests", "m")
    done = _cli({}, "review")
    assert "Aborted" not in done.stdout + done.stderr
    assert "No answer on standard input" in done.stderr and "accept" in done.stderr
    assert "1 still waiting" in done.stdout
    assert service.count_waiting() == 1
    kept = _cli({}, "review", stdin="all\n")
    assert kept.returncode == 0, kept.stderr
    assert service.count_waiting() == 0 and service.entries()[0].origin == "lesson"


async def test_a_compaction_pass_reads_the_replies_of_the_folded_rows_in_a_long_conversation(setup):
    """At an early fold of a long conversation the context is what the folded words were said
    among, not the conversation's tail (a tester saw only rows after the fold)."""
    store, service, cid = setup
    asked = store.append(cid, user("Plan my week; I hate cilantro, by the way"))
    reply = store.append(cid, assistant("Noted: the REPLY-OF-THE-FOLD plan has no cilantro."))
    folded = [asked.id]
    for n in range(60):  # a long conversation after the fold, far over the context's size
        store.append(cid, user(f"later question {n}"))
        store.append(cid, assistant(f"later answer {n} " + "x" * 1_400))
    model = say(FACT)
    await compaction_pass(model, service, cid, folded)
    (request,) = model.requests
    prompt = request.messages[0].text
    context = prompt.split("CONTEXT (do not quote)\n")[1].split("\n\nQUOTABLE")[0]
    assert f"#{reply.id}] Noted: the REPLY-OF-THE-FOLD plan" in context
    assert len(context) <= 24_000 and "later answer 0 " in context
    assert "I hate cilantro" not in context  # quotable words are not repeated as context


async def test_a_review_pass_fits_the_window_the_engine_runs_with(monkeypatch):
    """The pass asks the engine's model within the engine's window (HERON_CONTEXT_WINDOW, a
    config override, what a local GGUF file says), not the built-in profile of its name."""
    from heron.agent.engine import Engine
    from heron.config import Settings
    from heron.context.tokens import estimate_text
    from heron.store.records import CLOSE_REVIEW

    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "8000")
    model = ScriptedProvider(lambda request: Reply([Text('{"facts": []}')], "done"))
    async with Engine.open(Settings.load(), provider=model) as engine:
        conv = engine.store.open_conversation("long")
        for n in range(60):
            engine.store.append(conv.id, user(f"note {n}: " + "words " * 400))
        await engine.review_pass(conv.id, CLOSE_REVIEW)
    assert model.requests  # several calls: 60 long notes do not fit one
    for request in model.requests:
        assert estimate_text(request.system) + estimate_text(request.messages[0].text) < 8_000


def test_a_lesson_already_waiting_is_not_queued_again(setup):
    """The nightly review reads each conversation in turn: eight passes picking one rule
    queued it eight times (QA18g #6)."""
    _store, service, cid = setup
    path = EntryPath("personal", "when", "checks", "fast-checks-first")
    first = service.suggest_lesson(path, "Always run the fast checks first.", "slow feedback")
    again = service.suggest_lesson(path, "always run the fast checks first", "", cid)
    other = service.suggest_lesson(path, "Read the logs before guessing.", "")
    assert again == first and other != first
    assert [s.text for s in service.waiting()] == [
        "Always run the fast checks first.",
        "Read the logs before guessing.",
    ]


def _quoted(request) -> list[str]:
    """The QUOTABLE lines of a facts pass's request (the header must be there)."""
    text = request.messages[0].text
    assert "left out to fit the window" not in text
    return text.split("\n\nQUOTABLE (the user's own words)\n")[1].split("\n")


async def test_a_small_window_review_reads_the_oldest_words_whole_and_the_rest_later(setup):
    """An 8,000-token window: the pass's prompt was cut in the middle (the QUOTABLE header and
    the person's oldest new words dropped) and the cursor still moved to the last row, so those
    words were never reviewed (QA19i #3). Each call now takes the person's words whole from the
    oldest unread on, as many as fit; the cursor moves past what was read, no further."""
    from heron.context.tokens import estimate_text
    from heron.memory.extract import reviewed_up_to

    store, service, cid = setup
    said: dict[int, str] = {}
    for n in range(100):
        text = f"Turn {n}: " + "I grow tomatoes and basil on the balcony this year. " * 6
        said[store.append(cid, user(text)).id] = text
        store.append(cid, assistant(f"Echo {n}: " + "noted " * 50))
    model = ScriptedProvider(lambda request: Reply([Text('{"facts": []}')], "done"))
    await review_pass(model, service, cid, window=8_000, calls=1)
    (request,) = model.requests
    assert estimate_text(request.system) + estimate_text(request.messages[0].text) <= 6_000
    lines = _quoted(request)
    ids = list(said)
    first = ids[: len(lines)]
    assert 10 < len(lines) < 100
    assert lines == [f"[#{i}] {said[i]}" for i in first]  # the oldest, each one whole
    assert [i for i in ids if i > reviewed_up_to(service, cid)] == ids[len(lines) :]
    await review_pass(model, service, cid, window=8_000)  # the next pass reads on to the end
    later = [line for r in model.requests[1:] for line in _quoted(r)]
    assert later == [f"[#{i}] {said[i]}" for i in ids[len(lines) :]]
    assert reviewed_up_to(service, cid) == store.all_messages(cid)[-1].id
    asked = len(model.requests)
    assert await review_pass(model, service, cid, window=8_000) == []
    assert len(model.requests) == asked  # nothing new: no call


async def test_a_review_call_that_fails_leaves_the_cursor_where_it_was(setup):
    """A call that failed (or a bound refused) read nothing: its messages wait for the next
    pass instead of being passed over."""
    from heron.errors import ProviderError
    from heron.memory.extract import reviewed_up_to

    store, service, cid = setup
    store.append(cid, user("I hate cilantro"))

    def down(request):
        raise ProviderError("the model is down")

    assert await review_pass(ScriptedProvider(down), service, cid) == []
    assert reviewed_up_to(service, cid) == 0
    await review_pass(say(FACT), service, cid)
    assert [s.kind for s in service.waiting()] == ["fact", "lesson"]


VOLVO = (
    '{"facts": [{"path": "personal/always/car", "quote": "I drive a blue Volvo XC60"}],'
    ' "lessons": [{"topic": "planning", "rule": "Always list risks before costs.",'
    ' "mistake": "m"}]}'
)


async def test_a_rejected_suggestion_is_not_proposed_again(setup):
    """Rejected #5 came back as #6 at the next fold, and a rejected lesson at every fold and
    night (QA19i #4): the queue compared with waiting suggestions only. The same statement
    (wherever a pass files it, however it is cased) and the same rule stay turned down; the
    person saying it again later is a new statement."""
    from heron.memory import records
    from heron.memory.entries import MemoryRefused

    store, service, cid = setup
    store.append(cid, user("I drive a blue Volvo XC60."))
    for number in await review_pass(say(VOLVO), service, cid):
        assert service.reject(number).status == "rejected"
    again = VOLVO.replace("personal/always/car", "personal/always/vehicle").replace(
        "I drive a blue Volvo XC60", "i drive a blue volvo xc60"
    )
    folded = [m.id for m in store.all_messages(cid)]
    assert await compaction_pass(say(again), service, cid, folded) == []
    records.set_reviewed_up_to(store, cid, 0)  # read again from the start
    assert await review_pass(say(VOLVO), service, cid) == []
    assert service.waiting() == []
    lesson = EntryPath("personal", "when", "planning", "risks")
    with pytest.raises(MemoryRefused, match="turned this down before"):
        service.suggest_lesson(lesson, "always list risks before costs", "m", cid)
    store.append(cid, user("I drive a blue Volvo XC60."))  # said again since
    await review_pass(say(VOLVO), service, cid)
    assert [(s.kind, s.quote) for s in service.waiting()] == [("fact", "I drive a blue Volvo XC60")]


async def test_a_rejected_removal_waits_until_the_entry_changes(setup):
    _store, service, cid = setup
    path = EntryPath("personal", "always", None, "tea")
    service.files.write(Entry(path, "Drinks tea"))
    remove = '{"removals": [{"path": "personal/always/tea", "reason": "stale"}]}'
    (number,) = await tidy_pass(say(remove), service, cid)
    service.reject(number)
    assert await tidy_pass(say(remove), service, cid) == []
    service.files.write(Entry(path, "Drinks green tea"))  # changed since: a new question
    assert len(await tidy_pass(say(remove), service, cid)) == 1


async def test_learn_counts_only_what_it_newly_queued(setup):
    """/learn said 3 new when 2 were: the lesson already waiting was counted again (QA19i #8)."""
    store, service, cid = setup
    waiting = service.suggest_lesson(
        EntryPath("personal", "when", "cooking", "allergies"), "Ask about allergies first", "x"
    )
    store.append(cid, user("I hate cilantro"))
    model = say(FACT, '{"removals": []}')
    report = await learn(service, (model, model), cid, memory_digests(service))
    (fact,) = [s.id for s in service.waiting() if s.kind == "fact"]
    assert report.suggested == [fact] and waiting not in report.suggested
    assert "1 new suggestion(s) from this review." in report.text()


CYCLING = (
    '{"facts": [{"path": "personal/always/cycling", "quote": "I always cycle to work"},'
    ' {"path": "personal/always/cycling-winter",'
    ' "quote": "I always cycle to work, even in winter."}]}'
)


async def test_a_sentence_and_its_own_clause_picked_by_one_review_queue_one_suggestion(setup):
    """QA22x M2: /learn queued "I always cycle to work, even in winter." and its clause "I
    always cycle to work" as #1 and #2, and accepting both kept two entries saying one thing."""
    store, service, cid = setup
    store.append(cid, user("I always cycle to work, even in winter."))
    ids = await review_pass(say(CYCLING), service, cid)
    assert [service.waiting()[0].text] == ["I always cycle to work, even in winter."]
    assert len(ids) == 1 and len(service.waiting()) == 1


def test_accepting_a_clause_of_a_kept_entry_drops_it(setup):
    store, service, cid = setup
    store.append(cid, user("I always cycle to work, even in winter."))
    clause = service.suggest_fact(
        cid, EntryPath("personal", "always", None, "a"), "I always cycle to work"
    )
    service.save(
        cid, EntryPath("personal", "always", None, "b"), "I always cycle to work, even in winter."
    )
    decision = service.accept(clause, env={})
    assert decision.status == "dropped"
    assert decision.message == f"#{clause} dropped: personal/always/b.md already says this"
    assert len(service.entries()) == 1


CYCLE = "I always cycle to work, even in winter."


def test_accept_quote_refuses_a_clause_that_says_nothing_alone(setup):
    """QA22v L3: `accept N --quote "even in winter"` kept "Even in winter" as an entry; the
    tools' whole-clause test now refuses it, and the refusal names what to keep instead."""
    store, service, cid = setup
    store.append(cid, user(CYCLE))
    number = service.suggest_fact(cid, EntryPath("personal", "always", None, "cycle"), CYCLE)
    decision = service.accept(number, env={}, quote="even in winter")
    assert decision.status == "waiting" and not service.entries()
    assert "'even in winter' is only a piece of the sentence" in decision.message
    assert "'I always cycle to work'" in decision.message  # the clause that stands alone
    kept = service.accept(number, env={}, quote="I always cycle to work")
    assert kept.status == "accepted"
    assert [e.text for e in service.entries()] == ["I always cycle to work"]


def test_a_sentence_kept_after_its_own_clause_updates_that_entry(setup):
    """QA22x: a clause kept first and its longer sentence accepted later were two entries."""
    store, service, cid = setup
    store.append(cid, user(CYCLE))
    sentence = service.suggest_fact(cid, EntryPath("personal", "always", None, "winter"), CYCLE)
    service.save(cid, EntryPath("personal", "always", None, "bike"), "I always cycle to work")
    decision = service.accept(sentence, env={})
    assert decision.message == (
        f"#{sentence} kept: updated personal/always/bike.md (it said only part of this)"
    )
    assert [(e.path.rel, e.text) for e in service.entries()] == [("personal/always/bike.md", CYCLE)]


def test_a_sentence_suggested_after_its_own_clause_is_one_suggestion(setup):
    store, service, cid = setup
    store.append(cid, user(CYCLE))
    clause = service.suggest_fact(
        cid, EntryPath("personal", "always", None, "bike"), "I always cycle to work"
    )
    sentence = service.suggest_fact(cid, EntryPath("personal", "always", None, "winter"), CYCLE)
    assert [s.id for s in service.waiting()] == [sentence] and sentence != clause
    # A sentence whose clause memory holds is queued as a change of that entry, both shown.
    service.reject(sentence)
    store.append(cid, user(CYCLE))
    service.save(cid, EntryPath("personal", "always", None, "bike"), "I always cycle to work")
    again = service.suggest_fact(cid, EntryPath("personal", "always", None, "winter"), CYCLE)
    [waiting] = service.waiting()
    assert (waiting.id, waiting.kind, waiting.path) == (
        again,
        "amendment",
        "personal/always/bike.md",
    )
    assert waiting.reason == "I always cycle to work"


DAY = 86_400.0


def _said_days_ago(store: Store, cid: int, text: str, days: float, monkeypatch) -> None:
    """A message of the person's stored as if typed `days` ago."""
    then = time.time() - days * DAY
    with monkeypatch.context() as m:
        m.setattr(time, "time", lambda: then)
        store.append(cid, user(text))


def _day(days: float) -> str:
    return timefmt.when(time.time() - days * DAY, "UTC", timefmt.DAY)


def test_a_fact_accepted_weeks_after_it_was_said_shows_the_day_it_was_said(setup, monkeypatch):
    """S23: a fact waits in the queue (a nightly review, a compaction pass) and is kept days
    later; the entry showed the accept day, so "last month" was read a month off. It shows the
    day of the message it quotes, kept whole or narrowed (`accept --quote`)."""
    store, service, cid = setup
    _said_days_ago(store, cid, "I moved to Lisbon last month.", 30, monkeypatch)
    _said_days_ago(store, cid, "My sister visited yesterday, and we cooked.", 12, monkeypatch)
    city = service.suggest_fact(
        cid, EntryPath.parse("personal/always/city"), "I moved to Lisbon last month."
    )
    sister = service.suggest_fact(
        cid,
        EntryPath.parse("personal/always/sister"),
        "My sister visited yesterday, and we cooked.",
    )
    assert service.accept(city, env={}).status == "accepted"
    assert service.accept(sister, env={}, quote="My sister visited yesterday").status == "accepted"
    section = memory_section(service.entries(), zone="UTC")
    assert f"(personal/always/city.md, said {_day(30)})" in section
    assert f"(personal/always/sister.md, said {_day(12)})" in section


def test_an_amendment_kept_takes_the_day_its_new_statement_was_said(setup, heron_home, monkeypatch):
    store, service, cid = setup
    hand = heron_home / "memory/personal/always/city.md"
    hand.parent.mkdir(parents=True)
    hand.write_text("I live in Porto since last spring.\n")
    long_ago = time.time() - 60 * DAY  # written by hand before the person said what changed
    os.utime(hand, (long_ago, long_ago))
    _said_days_ago(store, cid, "I moved to Lisbon last month.", 20, monkeypatch)
    number = service.update(
        cid, EntryPath.parse("personal/always/city"), "I moved to Lisbon last month."
    )
    assert isinstance(number, int)  # a hand-written entry: the change waits for review
    assert service.accept(number, env={}).status == "accepted"
    assert f"(personal/always/city.md, said {_day(20)})" in memory_section(service.entries())
