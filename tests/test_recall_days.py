"""A day named in a recall query ("last Tuesday", "yesterday", "on 2026-12-01", "December 1")
selects the messages written that day, on both backends (docs/memory.md, "A day named in the
query"); a message opened by its id says where and when it was said, as a hit does."""

from __future__ import annotations

import calendar
import datetime as dt
from pathlib import Path

import pytest

from heron.channels.memory_cli import print_recall
from heron.memory import auto
from heron.memory.recall import Recall
from heron.messages import assistant, user
from heron.store import Store
from heron.tools.context import TurnServices
from heron.tools.memory_tools import recall_history
from heron.tools.registry import ToolContext

NOW = calendar.timegm((2026, 12, 5, 12, 0, 0))  # Saturday 5 December 2026, noon UTC


def _at(store: Store, cid: int, text: str, when: str, said_by: str = "user") -> int:
    """A message of `said_by` written at `when` (UTC, "YYYY-MM-DD HH:MM")."""
    message = store.append(cid, user(text) if said_by == "user" else assistant(text))
    created = calendar.timegm(dt.datetime.strptime(when, "%Y-%m-%d %H:%M").timetuple())
    store.conn.execute("UPDATE messages SET created = ? WHERE id = ?", (created, message.id))
    return message.id


@pytest.fixture
def week(db: str | Path):
    """A conversation over a week: chatter, a booking on Tuesday 1 December, another booking
    the day after, and a passport note in another conversation."""
    store = Store(db)
    c = store.open_conversation("long")
    ids = {
        "monday": _at(store, c.id, "Chatter about the garden and the weather", "2026-11-30 10:00"),
        "tuesday 1": _at(store, c.id, "Chatter about the cat", "2026-12-01 09:00"),
        "tuesday ok": _at(store, c.id, "ok", "2026-12-01 09:01", "assistant"),
        "dentist": _at(store, c.id, "I booked the dentist for the 14th", "2026-12-01 17:07"),
        "wednesday": _at(store, c.id, "I booked a table at the bistro", "2026-12-02 19:00"),
        "friday": _at(store, c.id, "Groceries again, nothing else", "2026-12-04 08:00"),
    }
    other = store.open_conversation("other")
    ids["passport"] = _at(store, other.id, "Passport renewal booked", "2026-11-20 11:00")
    yield store, ids
    store.close()


def test_the_days_a_query_names() -> None:
    from heron.memory.days import named_days

    today = dt.date(2026, 12, 5)  # a Saturday
    tuesday = {dt.date(2026, 12, 1)}
    for query in [
        "what did I say last Tuesday",
        "what did I say on 2026-12-01",
        "December 1",
        "Dec 1st",
        "the 1st of December",
        "what did I say on Tuesday",
        "4 days ago",
        "what did I say on the 1st",  # qa22v L4: a day of the month alone
        "on the 1st",
    ]:
        assert named_days(query, today).days == tuesday, query
    # a day of the month still to come is the last month's
    assert named_days("what did I say on the 14th", today).days == {dt.date(2026, 11, 14)}
    assert named_days("yesterday", today).days == {dt.date(2026, 12, 4)}
    assert named_days("what did I say last Tuesday", today).rest == "what did I say"
    # a day and month with no year is the latest not after today
    assert named_days("December 25", today).days == {dt.date(2025, 12, 25)}
    assert named_days("on 1 February, 2023", today).days == {dt.date(2023, 2, 1)}
    # "last Saturday" on a Saturday is a week ago
    assert named_days("last Saturday", today).days == {dt.date(2026, 11, 28)}
    for query in [
        "my appointment on Friday",  # the next one as often: only a past question reads it
        "my appointment on the 14th",
        "what did I say about the 2nd floor?",
        "may 5 people come",  # the verb
        "what happened in May 2023",  # a month, `Cue`'s
        "12/01",  # which day depends on the country
        "version 2026-12-01b",
        "February 30",
    ]:
        assert named_days(query, today).days == set(), query


@pytest.mark.parametrize(
    "query",
    [
        "what did I say last Tuesday",
        "what did I say on 2026-12-01",
        "December 1",
        "what did I say on the 1st",
    ],
)
def test_a_query_that_is_only_a_day_lists_what_the_person_wrote_that_day(week, query):
    store, ids = week
    recall = Recall(store, zone="UTC", now=lambda: NOW)
    hits = recall.search(query, 10, standing=True)
    assert [h.message_id for h in hits] == [ids["tuesday 1"], ids["dentist"]]


def test_yesterday_is_read_in_the_agents_zone(week):
    store, ids = week
    utc = Recall(store, zone="UTC", now=lambda: NOW)
    assert [h.message_id for h in utc.search("yesterday")] == [ids["friday"]]
    # In Honolulu it is 02:00 on Saturday, and Friday's 08:00 UTC was 22:00 on Thursday there
    honolulu = Recall(store, zone="Pacific/Honolulu", now=lambda: NOW)
    assert honolulu.search("yesterday") == []
    assert [h.message_id for h in honolulu.search("the day before yesterday")] == [ids["friday"]]


def test_a_day_lifts_its_messages_above_the_same_words_on_other_days(week):
    store, ids = week
    recall = Recall(store, zone="UTC", now=lambda: NOW)
    found = [h.message_id for h in recall.search("what did I book last Tuesday", 3)]
    assert found[0] == ids["dentist"], found
    assert set(found[1:]) <= {ids["wednesday"], ids["passport"]}  # other days after it
    found = [h.message_id for h in recall.search("what did I book on Wednesday", 3)]
    assert found[0] == ids["wednesday"], found


def test_recall_history_reads_the_day_and_says_which_it_read(week):
    store, ids = week
    recall = Recall(store, zone="UTC", now=lambda: NOW)
    ctx = ToolContext(workspace=Path("."), services=TurnServices(recall=recall))
    said = recall_history.fn(ctx, query="what did I say last Tuesday").splitlines()
    assert f"· message {ids['dentist']} · user]" in said[1], said
    nothing = recall_history.fn(ctx, query="what did I say last Thursday")
    assert nothing == "Nothing found for 'what did I say last Thursday' (read as Thu 2026-12-03)."


def test_memory_recall_says_which_day_it_read(week, capsys, monkeypatch):
    store, _ = week
    monkeypatch.setattr("heron.memory.recall.time.time", lambda: NOW)
    print_recall(store, "what did I say last Thursday", 5, zone="UTC", standing=True)
    out = capsys.readouterr().out
    assert "Thu 2026-12-03" in out and "embeddings" not in out, out


def test_auto_recall_reads_no_day(week):
    """A message that names a day is most often a statement ("yesterday I booked..."), not a
    question about what was written that day: auto-recall's order is by words alone."""
    store, _ = week
    recall = Recall(store, zone="UTC", now=lambda: NOW)
    conv = store.conversation("long")
    assert conv is not None
    text = "what did I say last Tuesday"
    assert recall.ranked(text, 5, conv.id, by_day=False) == Recall(store).ranked(
        "what did I say", 5, conv.id
    )
    assert auto.auto_hits(recall, text, conv.id) == []


def test_a_message_opened_by_its_id_says_where_and_when_it_was_said(week):
    store, ids = week
    recall = Recall(store, zone="UTC")
    ctx = ToolContext(workspace=Path("."), services=TurnServices(recall=recall))
    opened = recall_history.fn(ctx, message_id=ids["dentist"]).splitlines()
    assert opened == [
        f"[long · 2026-12-01 17:07 · message {ids['dentist']} · user]",
        "I booked the dentist for the 14th",
    ]


def test_a_day_listing_cut_by_its_limit_says_how_many_there_are(week, capsys, monkeypatch):
    store, ids = week
    recall = Recall(store, zone="UTC", now=lambda: NOW)
    ctx = ToolContext(workspace=Path("."), services=TurnServices(recall=recall))
    said = recall_history.fn(ctx, query="what did I say last Tuesday", limit=1).splitlines()
    assert f"· message {ids['tuesday 1']} · user]" in said[0], said
    assert said[-1] == (
        "The first 1 of the 2 messages the person wrote on Tue 2026-12-01, oldest first: "
        "limit=2 lists more, or add words to search within that day."
    )
    whole = recall_history.fn(ctx, query="what did I say last Tuesday", limit=2)
    assert "The first" not in whole
    monkeypatch.setattr("heron.memory.recall.time.time", lambda: NOW)
    print_recall(store, "December 1", 1, zone="UTC", standing=True)
    out = capsys.readouterr().out
    assert "The first 1 of the 2 messages you wrote on Tue 2026-12-01" in out, out
    assert "--limit 2 lists all" in out


class _DogEmbedder:
    """Sentence vectors that know a puppy is a dog, as the real model does."""

    name = "fake"

    def encode(self, texts: list[str]) -> list[list[float]]:
        return [
            [1.0, 0.0] if "dog" in t.lower() or "puppy" in t.lower() else [0.0, 1.0] for t in texts
        ]


def test_the_days_messages_keep_the_order_the_fused_ranking_gives_them(db: str | Path) -> None:
    """A day narrows where to look; it does not make BM25 alone judge which of that day's
    messages answers (ordered by BM25 alone, one tuning question fell out of the top 5 on the
    fused path)."""
    store = Store(db)
    c = store.open_conversation("c")
    words = _at(
        store, c.id, "The lake trip: trip plans, trip snacks, trip maps", "2026-12-01 09:00"
    )
    meant = _at(store, c.id, "A lake trip with the puppy would be fun", "2026-12-01 10:00")
    _at(store, c.id, "A trip to the shops", "2026-12-02 10:00")
    recall = Recall(store, _DogEmbedder(), zone="UTC", now=lambda: NOW)
    assert recall.search("a dog trip", 1)[0].message_id == meant  # the vectors' doing
    dated = [h.message_id for h in recall.search("a dog trip last Tuesday", 3)]
    assert dated[:2] == [meant, words], dated
    store.close()
