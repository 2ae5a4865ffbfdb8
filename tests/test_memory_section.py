"""The memory and recent-history sections, and freezing per conversation."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

from heron.memory import (
    Entry,
    EntryPath,
    HistoryEntry,
    frozen_memory,
    memory_section,
    recent_history_section,
)
from heron.memory.entries import Source, _stamp, parse, render
from heron.memory.section import history_floor, set_history_floor
from heron.memory.service import MemoryService
from heron.store import Store


def entry(rel: str, text: str) -> Entry:
    return Entry(EntryPath.parse(rel), text)


def test_memory_section_lists_everything_in_a_fixed_order():
    long_text = "Line one of a long rule.\n" + "zebra " * 2000
    entries = [
        entry("work/when/code-review/run-tests", "Run the tests first"),
        entry("personal/when/cooking/no-cilantro", "No cilantro"),
        entry("personal/always/concise", "Concise replies"),
        entry("personal/always/long", long_text),
    ]
    section = memory_section(entries)
    assert section == memory_section(list(reversed(entries)))  # order does not depend on input
    assert section.index("## Preferences") < section.index("Concise replies")
    assert section.index("Concise replies") < section.index("## Situational preferences")
    assert "- [when: cooking] No cilantro (personal/when/cooking/no-cilantro.md)" in section
    assert section.index("[when: code-review]") < section.index("[when: cooking]")
    # An entry over the cap (hand-written: saves are capped) shows its head and a pointer.
    assert 0 < section.count("zebra") < 60
    assert 'view_memory("personal/always/long.md") reads it whole' in section
    assert memory_section([]) == ""


def test_past_the_memory_budget_when_entries_are_listed_by_title():
    always = [entry(f"personal/always/rule-{i}", f"Rule {i}: " + "be kind " * 20) for i in range(3)]
    when = [
        entry(f"personal/when/topic-{i}/tip", f"Tip {i} for this topic. " + "detail " * 40)
        for i in range(40)
    ]
    unbounded = memory_section(always + when)
    section = memory_section(always + when, tokens=800)
    assert len(section) // 4 <= 800 < len(unbounded) // 4
    assert all(f"Rule {i}: " + "be kind " * 20 in section.replace("\n  ", " ") for i in range(3))
    assert "Tip 0 for this topic. detail" in section  # whole while the budget lasts
    titled = [i for i in range(40) if f"- [when: topic-{i}] Tip {i} for this topic." in section]
    assert titled and "detail " * 40 not in section.split(f"Tip {titled[-1]} ")[1]
    # what no longer fits even by title is counted, and view_memory lists it
    if len(titled) < 40:
        assert "more entries are not shown: view_memory lists every entry." in section


def test_section_is_frozen_and_changes_are_announced_once(tmp_path: Path, db: str | Path):
    store = Store(db)  # once per backend: the frozen section's save is an upsert there
    service = MemoryService(tmp_path / "memory", store)
    cid = store.open_conversation("c").id
    service.files.write(entry("personal/always/tea", "Drinks tea"))
    first = frozen_memory(store, cid, service.entries())
    assert "Drinks tea" in first.section and first.note is None
    service.files.write(entry("personal/always/coffee", "Drinks coffee"))
    service.files.write(entry("personal/always/tea", "Drinks green tea"))
    second = frozen_memory(store, cid, service.entries())
    assert second.section == first.section  # the cached prefix does not move
    assert "saved: Drinks coffee" in second.note and "changed: Drinks green tea" in second.note
    third = frozen_memory(store, cid, service.entries())
    assert third.note is None and third.section == first.section  # announced once
    service.mark_thawed(cid)  # compaction or /new
    fresh = frozen_memory(store, cid, service.entries())
    assert "Drinks coffee" in fresh.section and "Drinks green tea" in fresh.section
    # A removal (by hand here) thaws it: no request carries a removed entry (qa22x H1).
    service.files.delete(EntryPath.parse("personal/always/tea"))
    gone = frozen_memory(store, cid, service.entries())
    assert "tea" not in gone.section and "Drinks coffee" in gone.section
    assert gone.note is not None and "removed: personal/always/tea.md" in gone.note
    store.close()


def test_recent_history_respects_floor_and_budgets(db: str | Path):
    entries = [HistoryEntry(float(i), f"event {i}") for i in range(1, 101)]
    entries.append(HistoryEntry(200.0, "what /new archived", memory_only=True))
    text = recent_history_section(entries, timezone_fmt=lambda ts: f"t{int(ts)}")
    assert text.startswith("# Recent History\n- [t51] event 51")
    assert text.count("\n- ") == 50 and "archived" not in text
    assert "event 100" in recent_history_section(entries, floor=95.0, timezone_fmt=str)
    assert "event 95" not in recent_history_section(entries, floor=95.0, timezone_fmt=str)
    small = recent_history_section(entries, max_tokens=30, estimate=lambda s: 10)
    assert small.count("\n- ") == 3 and "event 100" in small
    assert recent_history_section(entries, floor=1e9) == ""
    store = Store(db)
    cid = store.open_conversation("c").id
    assert history_floor(store, cid) == 0.0
    set_history_floor(store, cid, 42.0)
    assert history_floor(store, cid) == 42.0
    store.close()


def test_memory_list_flags_an_entry_over_the_cap(tmp_path: Path, monkeypatch):
    from typer.testing import CliRunner

    from heron.cli import app

    monkeypatch.setenv("HERON_HOME", str(tmp_path))
    folder = tmp_path / "memory" / "personal" / "always"
    folder.mkdir(parents=True)
    (folder / "long.md").write_text("My whole life story. " + "and then " * 200_000)
    (folder / "short.md").write_text("Short answers.")
    out = CliRunner().invoke(app, ["memory", "list"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    flagged = [i for i, line in enumerate(lines) if line.strip().startswith("!")]
    assert len(flagged) == 1 and "long.md" in lines[flagged[0] - 1]
    assert "1,800,020 characters, over the 1,000 the prompt shows" in lines[flagged[0]]  # stripped


def test_memory_list_keeps_its_columns_aligned_for_a_long_path(tmp_path: Path, monkeypatch):
    from typer.testing import CliRunner

    from heron.cli import app

    monkeypatch.setenv("HERON_HOME", str(tmp_path))
    long = tmp_path / "memory" / "personal" / "when" / "coding"
    long.mkdir(parents=True)
    (long / "always-run-the-tests-before-committing-anything-at-all.md").write_text("Tests.")
    short = tmp_path / "memory" / "personal" / "always"
    short.mkdir(parents=True)
    (short / "short.md").write_text("Short answers.")
    out = CliRunner().invoke(app, ["memory", "list"])
    assert out.exit_code == 0, out.output
    rows = [line for line in out.output.splitlines() if line.startswith("  ")]
    assert len(rows) == 3  # the header and two entries
    assert len({line.index("ORIGIN" if "ORIGIN" in line else "hand") for line in rows}) == 1


def test_an_entry_telling_a_relative_time_shows_the_day_it_was_saved():
    """QA22x M3: "I moved to Porto last month" in always/ read months later still said "last
    month", with no date anywhere; an entry without a relative time is shown as before."""
    saved = 1_793_000_000.0  # 2026-10-26 07:33 UTC, the evening before in Honolulu
    city = Entry(EntryPath("personal", "always", None, "city"), "I moved to Porto last month.")
    tea = Entry(EntryPath("personal", "always", None, "tea"), "I prefer tea", created=saved)
    section = memory_section([replace(city, created=saved), tea], zone="Pacific/Honolulu")
    assert "- I moved to Porto last month. (personal/always/city.md, saved 2026-10-25)" in section
    assert "- I prefer tea (personal/always/tea.md)" in section


def test_an_entry_telling_a_relative_time_shows_the_day_it_was_said_over_the_day_saved():
    """S23: a fact accepted from the review queue weeks after the person said it showed the
    accept day, so "last month" was read from the wrong day. `said` (the quote's message time)
    wins; an entry without it (hand-written, older) still shows the day it was saved."""
    said, saved = 1_790_000_000.0, 1_793_000_000.0  # 2026-09-21, 2026-10-26 UTC
    city = Entry(
        EntryPath("personal", "always", None, "city"),
        "I moved to Porto last month.",
        created=saved,
        source=Source("c1", 7, "I moved to Porto last month.", said),
    )
    old = replace(city, path=EntryPath("personal", "always", None, "old"), source=Source())
    section = memory_section([city, old])
    assert "- I moved to Porto last month. (personal/always/city.md, said 2026-09-21)" in section
    assert "- I moved to Porto last month. (personal/always/old.md, saved 2026-10-26)" in section


def test_the_said_stamp_round_trips_and_a_file_without_it_loads_as_before(caplog):
    path = EntryPath("personal", "always", None, "city")
    said = 1_790_000_000.0
    kept = Entry(
        path,
        "I moved to Porto last month.",
        "user",
        1.0e9,
        1.0e9,
        Source("c1", 7, "I moved to Porto last month.", said),
    )
    text = render(kept)
    assert text.index("message:") < text.index("\nsaid: ") < text.index("quote:")  # by its message
    assert parse(path, text) == kept
    # An older file, or one written by hand, has no said line: it loads unchanged, its digest
    # too (a frozen section's digests must not move on upgrade).
    stamp = _stamp(1_793_000_000.0)  # 2026-10-26 UTC, written in this process's zone
    before = (
        f"---\ncreated: {stamp}\nupdated: {stamp}\norigin: user\n---\n"
        "I moved to Porto last month.\n"
    )
    old = parse(path, before)
    assert old.source.said is None and render(old) == before
    assert "saved 2026-10-26" in memory_section([old])
    # A said line that is not a date is warned of and left out: the entry shows its saved day.
    with caplog.at_level(logging.WARNING, logger="heron.memory.entries"):
        odd = parse(path, before.replace("origin: user\n", "origin: user\nsaid: last week\n"))
    assert odd.source.said is None and "said 'last week' is not a date" in caplog.text


def test_a_said_in_the_future_is_warned_of_and_left_out(caplog):
    """A year typed wrong by hand ("said: 2027-05-01" in 2026) was taken silently, and the
    model read "I ran a marathon last month." as April 2027 (qa24b L2). A said more than a day
    ahead of now is warned of and read as not known; within a day (clocks that differ) it is
    kept."""
    path = EntryPath("personal", "always", None, "marathon")
    now = time.time()
    head = f"---\ncreated: {_stamp(now)}\nupdated: {_stamp(now)}\norigin: user\n"
    body = "---\nI ran a marathon last month.\n"
    ahead = _stamp(now + 400 * 86400)
    with caplog.at_level(logging.WARNING, logger="heron.memory.entries"):
        future = parse(path, f"{head}said: {ahead}\n{body}")
    assert future.source.said is None
    assert f"said '{ahead}' is in the future" in caplog.text and "left out" in caplog.text
    assert "saved " in memory_section([future]) and "said " not in memory_section([future])
    soon = parse(path, f"{head}said: {_stamp(now + 3600)}\n{body}")
    assert soon.source.said == float(int(now + 3600))
