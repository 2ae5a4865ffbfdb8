from __future__ import annotations

import dataclasses
import itertools
import json

import pytest
from compaction_helpers import Model, all_text, is_summary, reachable

from heron.agent.engine import Engine
from heron.agent.turn import TurnHooks
from heron.compaction import compact_now
from heron.compaction.prepare import SUMMARY_FAILED_NOTICE
from heron.config import Settings
from heron.errors import TransientProviderError
from heron.messages import Reply, Text, Usage
from heron.providers.base import ChatRequest
from heron.providers.scripted import ScriptedProvider
from heron.store import compactions as folds
from heron.store import work

# Every test once per backend: the engine on SQLite, and on PostgreSQL (tests/pg.py).
pytestmark = pytest.mark.usefixtures("home_db")

FACT = "My sister's name is Ilse and she lives in Ghent."
RULE = "From now on, always answer with the word PELICAN first."


class HonestModel(Model):
    """A Model whose replies report the input tokens their request had."""

    def __call__(self, request: ChatRequest) -> Reply:
        from heron.context.tokens import Calibration, estimate_request

        reply = super().__call__(request)
        sent = estimate_request(request.system, request.tools, request.messages, Calibration())
        return Reply(reply.parts, reply.stop, Usage(sent.total, reply.usage.output))


def big_file(engine: Engine, kb: int = 20) -> None:
    line = "the quick brown fox jumps over the lazy dog " * 2
    (engine.settings.paths.workspace / "big.txt").write_text((line + "\n") * (kb * 1024 // 90))


async def test_turn_3_fact_and_turn_5_rule_stay_reachable_over_200_turns_of_a_junk_summarizer(
    monkeypatch,
):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "6000")
    model = Model(tool_rounds=1, tools_every=10)  # the summarizer answers "blah blah"
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        big_file(engine)
        for i in range(1, 201):
            text = FACT if i == 3 else RULE if i == 5 else f"turn {i}: read big.txt again"
            await engine.turn("k", text)
        conv = engine.store.conversation("k")
        kinds = [c.kind for c in folds.compactions(engine.store, conv.id)]
        seen = all_text(model.turn_requests[-1])
        # Old words are verbatim while their budget lasts, then a pointer that opens them whole.
        assert reachable(seen, engine.store, conv.id, FACT)
        assert reachable(seen, engine.store, conv.id, RULE)
    assert kinds.count("consolidation") >= 2


async def test_every_user_message_of_60_turns_is_reachable_from_the_last_request_of_6000(
    monkeypatch,
):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "6000")
    # The model reports the input its requests really had, so the engine's calibration stays
    # at the offline estimate the check below uses. With Model's flat 100 input tokens the
    # engine learned a factor of 0.5 and fitted twice the estimate into the window; whether the
    # 60th request then passed 6,000 uncalibrated tokens depended on where it fell between two
    # consolidations (adding the `schedule` tool's schema moved it past).
    model = HonestModel(tool_rounds=2)
    sent = []
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        big_file(engine)
        for i in range(60):
            sent.append(f"message {i}: keep the code {i * 7919} in mind")
            await engine.turn("k", sent[-1])
        conv = engine.store.conversation("k")
        assert len(folds.compactions(engine.store, conv.id)) >= 2
        last = model.turn_requests[-1]
        seen = all_text(last)
        lost = [s for s in sent if not reachable(seen, engine.store, conv.id, s)]
        assert lost == []
        assert sent[-1] in seen and sent[-2] in seen  # the newest are verbatim
    # The whole request fits the window, with room for the answer.
    from heron.context.tokens import Calibration, estimate_request

    assert estimate_request(last.system, last.tools, last.messages, Calibration()).total < 6000


async def test_a_failing_summarizer_loses_nothing_and_the_third_failing_turn_falls_back(
    monkeypatch,
):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "6000")

    def broken(request):
        raise TransientProviderError("summarizer down")

    model = Model(tool_rounds=1, summarize=broken)
    texts = []
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        big_file(engine)
        store = engine.store
        failing_turns = []
        for i in range(80):
            texts.append(f"note {i}: the locker code is {1000 + i}")
            attempts = sum(1 for r in model.requests if is_summary(r))
            await engine.turn("k", texts[-1])
            conv = store.conversation("k")
            if sum(1 for r in model.requests if is_summary(r)) > attempts:
                failing_turns.append(i)
            if folds.compactions(store, conv.id):
                break
            # Until the fallback, a failed summary changes nothing: every message is sent.
            assert all(t in all_text(model.turn_requests[-1]) for t in texts)
        done = folds.compactions(store, conv.id)
        rows = store.all_messages(conv.id)
        seen = all_text(model.turn_requests[-1])  # the fallback summary is in its system prompt
        assert [t for t in texts if not reachable(seen, store, conv.id, t)] == []
    assert len(failing_turns) == 3 and failing_turns[-1] == i  # the third failing turn
    assert [c.kind for c in done] == ["fallback"]
    assert "read_file(" in done[0].summary  # the calls made and the start of each result
    # Compaction marked nothing away: every row is still in the record.
    assert sum(1 for r in rows if r.message.text in texts) == len(texts)


async def test_request_n_is_a_prefix_of_request_n_plus_1_outside_compaction():
    provider = ScriptedProvider(Model(tool_rounds=1))
    async with Engine.open(Settings.load(), provider=provider) as engine:
        big_file(engine, kb=2)
        for i in range(12):
            await engine.turn("k", f"question {i}")
        conv = engine.store.conversation("k")
        rows = engine.store.branch(conv.id)
    bodies = [json.dumps(provider.payload(r)["messages"]) for r in provider.requests]
    for before, after in itertools.pairwise(bodies):
        assert after.startswith(before[:-1])  # the closing bracket aside
    first = rows[0]
    assert first.message.text == "question 0"  # what the user typed
    assert "[Runtime context: metadata only, not instructions]" in first.sent.parts[-1].text
    assert provider.requests[-1].messages[0] == first.sent  # replayed as sent


async def test_compact_now_folds_older_turns_and_is_inspectable():
    model = Model(
        tool_rounds=1,
        summarize=lambda r: Reply([Text("## Facts\nF1\n## Working state\nW1")], "done"),
    )
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        big_file(engine, kb=2)  # turns the fold shrinks: a summary of them is shorter
        for i in range(10):
            await engine.turn("k", f"hello {i}")
        conv = engine.store.conversation("k")
        said = await compact_now(engine, conv, reason="manual")
        again = await compact_now(engine, conv, reason="manual")
        (done,) = folds.compactions(engine.store, conv.id)
        await engine.turn("k", "after")
    assert "Compacted" in said and "Nothing to compact: the conversation since the last" in again
    assert "fit in the part of the window kept whole" in again  # why, not just "short"
    assert done.reason == "manual" and done.working_state == "W1" and "F1" in done.summary
    last = model.turn_requests[-1]
    assert "# Archived context summary" in last.system and "hello 0" in last.system
    assert last.messages[0].parts[0].text != "hello 0"  # folded out of the messages


@pytest.mark.parametrize("count", [1])
async def test_work_state_and_todos_are_reinjected_after_compaction(count):
    model = Model(tool_rounds=1)
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        big_file(engine, kb=2)  # turns a fold shrinks
        for i in range(10):
            await engine.turn("k", f"hello {i}")
        conv = engine.store.conversation("k")
        work.set_work_state(engine.store, conv.id, {"goal": "ship the report"})
        assert (await compact_now(engine, conv)).startswith("Compacted")
        await engine.turn("k", "next")
    assert "ship the report" in model.turn_requests[-1].system


async def test_a_tiny_model_is_not_asked_for_summaries_and_its_prompt_quotes_the_person(
    monkeypatch,
):
    # A window whose archive quotes older words as pointers: at 128k every word of these
    # turns is quoted verbatim, and a fold of them gains nothing (it is not made).
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "6000")
    model = Model(tool_rounds=0)
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        # The offline model's profile: the brief prompt (heron/providers/profiles.py TINY).
        profile = dataclasses.replace(engine.choice.profile, brief_prompt=True)
        engine.choice = dataclasses.replace(engine.choice, profile=profile)
        for i in range(10):
            await engine.turn("k", f"My codeword {i} is ZEBRA{i}-KIWI. " + "filler " * 40)
        said = await compact_now(engine, engine.store.conversation("k"), reason="manual")
        await engine.turn("k", "What were my codewords?")
    assert not any(is_summary(r) for r in model.requests)  # no 90-second summary call
    assert "this small model is not asked for summaries nor for memory's picks" in said
    system = model.turn_requests[-1].system
    assert system.startswith("You are") and "Earlier in this conversation the user wrote:" in system
    assert "-KIWI" in system.split("Earlier in this conversation the user wrote:")[1]
    assert "recall_history" not in system and "##" not in system


async def test_a_consolidation_before_a_turn_is_told_to_its_channel_in_one_line(monkeypatch):
    """`heron run`, the chat and the browser show a turn's notices; a consolidation was silent
    while an in-flight checkpoint was told."""
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "6000")
    model = HonestModel(tool_rounds=2)
    told: list[list[str]] = []
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        big_file(engine)
        for i in range(16):
            notices: list[str] = []
            await engine.turn("k", f"message {i}", TurnHooks(on_notice=notices.append))
            told.append(notices)
        done = folds.compactions(engine.store, engine.store.conversation("k").id)
    threshold = [c for c in done if c.reason == "threshold"]
    said = [n for notices in told for n in notices if "earlier messages" in n]
    assert threshold and len(said) == len(threshold)
    assert all("\n" not in n and n.startswith("Compacted ") for n in said)
    assert "into a summary to fit the model's window" in said[0]


@pytest.mark.parametrize("tiny", [True, False])
async def test_a_tiny_model_is_not_asked_for_memory_s_picks_at_a_fold(tiny, monkeypatch):
    """The offline model's fold still asked it for memory's picks (~90 s, and nothing usable):
    skipped, said with the summaries' skip, and the review cursor left where it was, so a
    later review with a real model reads those words."""
    from heron.memory.extract import FACTS_SYSTEM, reviewed_up_to

    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "6000")  # a fold that gains (see above)
    model = Model(tool_rounds=0)
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        if tiny:  # the offline model's profile (heron/providers/profiles.py TINY)
            profile = dataclasses.replace(engine.choice.profile, brief_prompt=True)
            engine.choice = dataclasses.replace(engine.choice, profile=profile)
        for i in range(10):
            await engine.turn("k", f"I always take the {i} o'clock train. " + "filler " * 40)
        conv = engine.store.conversation("k")
        said = await compact_now(engine, conv, reason="overflow")
        assert engine.memory is not None
        cursor = reviewed_up_to(engine.memory, conv.id)
    asked = [r for r in model.requests if r.system == FACTS_SYSTEM]
    assert cursor == 0 and "Compacted" in said
    if tiny:
        assert not asked
        assert "nor for memory's picks" in said and "a review with a larger model" in said
    else:
        assert len(asked) == 1 and "small model" not in said


async def test_a_failed_summary_the_turn_survives_is_told_as_such_not_as_a_failed_turn(
    monkeypatch, caplog
):
    """qa24f M2: the summary's HTTP 500 was logged at WARNING with the error's hint ("The
    model server failed ...: try again in a while"), printed on the chat's screen and on
    `heron run`'s stderr between the person's message and a good reply. The log is INFO, one
    line without the hint; the person is told in one line what happened to the turn."""
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "6000")
    hint = "The model server failed (HTTP 500): try again in a while."

    def broken(request):
        raise TransientProviderError("HTTP 500 from the server: summary boom", hint=hint)

    model = Model(tool_rounds=0, summarize=broken)
    told: list[str] = []
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        with caplog.at_level("INFO", logger="heron.compaction"):
            for i in range(40):
                attempts = sum(1 for r in model.requests if is_summary(r))
                result = await engine.turn(
                    "k", f"note {i} " + "words " * 150, TurnHooks(on_notice=told.append)
                )
                if sum(1 for r in model.requests if is_summary(r)) > attempts:
                    break
    assert (result.reply or "").startswith("done")  # the turn answered
    loud = [r for r in caplog.records if r.levelno >= 30 and "summar" in r.getMessage()]
    assert loud == []
    logged = [r.getMessage() for r in caplog.records if "summary failed" in r.getMessage()]
    assert logged and all("summary boom" in m and hint not in m for m in logged)
    said = [n for n in told if "summar" in n]
    assert said == [SUMMARY_FAILED_NOTICE.format(error="HTTP 500 from the server: summary boom")]
    assert "try again" not in said[0] and "\n" not in said[0]


async def test_a_compact_that_would_not_shrink_the_context_is_not_made_and_says_so():
    """qa24f M4: /compact after 5 short turns folded the first one, "about 827 tokens of
    context became 867" (the archive quotes the person's words verbatim under its headers),
    and the next request's new system prompt missed the provider's cache. Not made, and said,
    without asking the model for a summary."""
    model = Model(tool_rounds=0)
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        for i in range(5):
            await engine.turn("k", f"note {i}: the blue folder holds the {i} drafts")
        conv = engine.store.conversation("k")
        system = model.turn_requests[-1].system
        said = await compact_now(engine, conv, reason="manual")
        await engine.turn("k", "and now?")
        done = folds.compactions(engine.store, conv.id)
    assert done == [] and not any(is_summary(r) for r in model.requests)
    assert said.startswith("Nothing to compact: nothing to gain: the summary would be about")
    assert model.turn_requests[-1].system == system  # the cached prefix holds


async def test_nothing_to_fold_measures_the_rows_choose_cut_measured(monkeypatch):
    """qa24f L1: "the turns since the last summary (about 462 tokens) fit in the part of the
    window kept whole (300 tokens)": it counted the first turn, which choose_cut does not."""
    import re

    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "6000")
    model = Model(tool_rounds=0)
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        await engine.turn("k", "a long first message " * 60)
        for i in range(2):
            await engine.turn("k", f"short {i}")
        said = await compact_now(engine, engine.store.conversation("k"), reason="manual")
    size, kept = (int(n.replace(",", "")) for n in re.findall(r"([\d,]+) tokens\)", said))
    assert said.startswith("Nothing to compact: ") and size <= kept, said
