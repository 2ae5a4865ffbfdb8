"""Memory files and forgets behave as the person expects (QA pass 8: M2, M3, M4, L4-L8)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import test_memory_core

from heron.memory import EntryPath, MemoryRefused, MemoryService
from heron.messages import user
from heron.store import Store

# The fixtures of the memory tests: a store (per backend) and the service on it.
store, service, chat = test_memory_core.store, test_memory_core.service, test_memory_core.chat


def _write(root: Path, rel: str, text: str = "I love olives\n") -> None:
    file = root / rel
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(text)


def test_a_file_renamed_outside_the_rules_is_warned_of_once_with_a_valid_name(
    service, caplog, tmp_path
):
    """`Olives Love.md` (renamed by hand), a folder deeper than its topic, a .markdown file and
    a capitalised scope silently left memory: the model was told the entry was removed."""
    root = tmp_path / "memory"
    _write(root, "personal/when/food/olives.md")
    _write(root, "personal/when/food/Olives Love.md")
    _write(root, "personal/when/food/italian/pasta.md")
    _write(root, "personal/always/tea.markdown")
    _write(root, "Work/always/tests.md")
    with caplog.at_level(logging.WARNING, logger="heron.memory.entries"):
        assert [e.path.rel for e in service.entries()] == ["personal/when/food/olives.md"]
        service.files.root.joinpath("personal/always/new.md").write_text("x")  # a new walk
        service.entries()
        service.entries("personal")
    warned = [r.getMessage() for r in caplog.records]
    expected = {
        "personal/when/food/Olives Love.md": "personal/when/food/olives-love.md",
        "personal/when/food/italian/pasta.md": "personal/when/food-italian/pasta.md",
        "personal/always/tea.markdown": "personal/always/tea.md",
        "Work/always/tests.md": "work/always/tests.md",
    }
    assert len(warned) == len(expected)  # once each
    for bad, good in expected.items():
        [line] = [w for w in warned if f"memory file {bad} is not read" in w]
        assert line.endswith(f"rename it {good}") and "<scope>/always/<slug>.md" in line


def test_a_statement_memory_holds_under_another_path_is_not_queued_nor_kept_twice(service, store):
    """/learn queued personal/always/replies.md although short-replies.md already said the
    same, and accepting it kept both: the statement went to the model twice a request."""
    cid = chat(store, user("I prefer replies under five sentences."), user("Yes: I like tea."))
    short = EntryPath("personal", "always", None, "short-replies")
    service.save(cid, short, "I prefer replies under five sentences.")
    other = EntryPath("personal", "always", None, "replies")
    assert service.suggest_fact(cid, other, "i prefer replies under five sentences") is None
    # queued before the entry appeared (or before this check): accepting drops it, saying why
    number = service.suggest_fact(cid, EntryPath("personal", "always", None, "tea"), "I like tea.")
    assert number is not None
    service.save(cid, EntryPath("personal", "when", "food", "tea"), "I like tea.")
    decision = service.accept(number)
    assert decision.status == "dropped"
    assert "personal/when/food/tea.md already says this" in decision.message
    assert sorted(e.path.rel for e in service.entries()) == [
        "personal/always/short-replies.md",
        "personal/when/food/tea.md",
    ]


def test_a_forget_after_an_update_revokes_every_statement_the_entry_had(service, store):
    """Saved, updated, then forgotten: only the latest wording was revoked, and recall then
    showed the statement the person had replaced ("I always fly with Lufthansa") as current,
    with no correction ("I no longer fly Lufthansa" did not count as taking it back)."""
    from heron.memory.recall import Recall

    said = "I always fly with Lufthansa when I can."
    cid = chat(store, user(said))
    path = EntryPath("personal", "when", "travel", "airline")
    service.save(cid, path, said)
    store.append(cid, user("Update: I no longer fly Lufthansa. These days I fly with SAS."))
    service.update(cid, path, "These days I fly with SAS.")
    [hit] = [h for h in Recall(store).search("which airline do I fly", 10, standing=True)
             if "Lufthansa when I can" in h.snippet]  # fmt: skip
    assert hit.later is not None and "no longer fly Lufthansa" in hit.later.snippet
    store.append(cid, user("Please forget which airline I fly, it changes too often."))
    service.delete(cid, path, "Please forget which airline I fly")
    shown = " ".join(h.snippet for h in Recall(store).search("airline fly", 10, standing=True))
    assert "Lufthansa" not in shown and "SAS" not in shown
    assert "Please forget which airline I fly" in shown


def test_an_update_to_the_entrys_own_words_changes_nothing_and_commits_nothing(service, store):
    """manage_memory update with the entry's own quote said "Updated" and committed the same
    text (the file's stamp, in whole seconds, was older than the message it was saved from)."""
    from heron.tools.memory_tools import _change

    said = "I always fly with Lufthansa when I can."
    cid = chat(store, user(said))
    path = EntryPath("personal", "when", "travel", "airline")
    service.save(cid, path, said)
    before = [c.message for c in service.history.log()]
    reply = _change(service, cid, "c1", "update", path, said)
    assert reply.startswith("Nothing changed: personal/when/travel/airline.md already says")
    assert [c.message for c in service.history.log()] == before
    store.append(cid, user(said))  # said again, later: still nothing to change
    with pytest.raises(MemoryRefused, match="already says this"):
        service.update(cid, path, said)


def test_a_malformed_front_matter_is_warned_of_and_show_prints_the_file_as_it_is(
    service, caplog, tmp_path
):
    """`origin: [auto` was listed as origin "[auto" and `message: twenty-nine` dropped, with no
    warning; `heron memory show` printed a rendering without that line."""
    from typer.testing import CliRunner

    from heron.cli import app

    text = "---\norigin: [auto\nmessage: twenty-nine\ncreated: last week\n---\nI love olives\n"
    _write(tmp_path / "heron-home" / "memory", "personal/always/olives.md", text)
    with caplog.at_level(logging.WARNING, logger="heron.memory.entries"):
        result = CliRunner().invoke(app, ["memory", "show", "personal/always/olives.md"])
        [entry] = MemoryService(tmp_path / "heron-home" / "memory", service.store).entries()
    assert result.exit_code == 0, result.output
    assert result.stdout == text
    assert entry.origin == "hand" and entry.source.message is None and entry.created > 0
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "memory file personal/always/olives.md: origin '[auto' is not one of" in warned
    assert "message 'twenty-nine' is not a message number" in warned
    assert "created 'last week' is not a date" in warned


def test_undo_twice_walks_back_two_changes_and_redo_makes_them_again(service, store, tmp_path):
    """Undo toggled the last change (two forgets could not be undone one after the other, the
    log piled up "undo: undo: undo: ..."), and `heron memory redo` did not exist."""
    from typer.testing import CliRunner

    from heron.cli import app

    if not service.history.available:
        pytest.skip("git is not installed: memory has no history to undo")
    cid = chat(store, user("I like tea."), user("I like jazz."))
    for slug, said in (("tea", "I like tea."), ("jazz", "I like jazz.")):
        service.save(cid, EntryPath("personal", "always", None, slug), said)
    for slug in ("tea", "jazz"):
        service.forget(f"personal/always/{slug}.md", cid)
    _write(tmp_path / "memory", "personal/always/hand.md", "Written by hand.\n")  # not undone

    def held() -> list[str]:
        return sorted(e.path.slug for e in service.entries())

    assert service.history.undo().message == "removed personal/always/jazz.md"
    assert service.history.undo().message == "removed personal/always/tea.md"
    assert held() == ["hand", "jazz", "tea"]
    assert service.history.redo().message == "undo: removed personal/always/tea.md"
    assert held() == ["hand", "jazz"]
    assert service.history.undo().message == "redo: removed personal/always/tea.md"
    assert held() == ["hand", "jazz", "tea"]
    subjects = [c.message for c in service.history.log(4)]
    assert subjects == [
        "undo: removed personal/always/tea.md",
        "redo: removed personal/always/tea.md",
        "undo: removed personal/always/tea.md",
        "undo: removed personal/always/jazz.md",
    ]
    result = CliRunner().invoke(app, ["memory", "redo"])
    assert result.exit_code == 0 and "Nothing to redo" in result.output, result.output


def test_a_pick_of_the_users_words_outside_what_the_pass_read_says_so(service, store):
    """The nightly review said "4 not the user's words" of quotes that were the user's words,
    in messages before the review's cursor."""
    from heron.memory.extract import NOT_THEIRS, UNREAD, _queue_picks

    cid = chat(store, user("I drink green tea every morning."), user("I walk to work."))
    rows = store.all_messages(cid)
    picks = {
        "facts": [
            {"path": "personal/always/tea", "quote": "I drink green tea every morning."},
            {"path": "personal/always/coffee", "quote": "The user drinks coffee."},
        ]
    }
    refused: list[str] = []
    assert _queue_picks(service, cid, picks, rows, {rows[1].id}, refused) == []
    assert refused == [UNREAD, NOT_THEIRS]
    assert UNREAD == "not among the messages this pass read"


def test_control_characters_of_a_hand_file_are_left_out_with_a_warning(service, caplog, tmp_path):
    """QA22x L9: `binary.md` holding NUL and C1 bytes reached the model as-is (`ÿþ\\u0000
    bytes \\u0081\\u008d`): the Windows-1252 fallback warned, but passed the controls on."""
    file = tmp_path / "memory/personal/always/binary.md"
    file.parent.mkdir(parents=True)
    file.write_bytes(b"\xff\xfe\x00 bytes\x07 \x81\x8d\tand a tab\r\nline two\n")
    with caplog.at_level(logging.WARNING, logger="heron.memory.entries"):
        [entry] = service.entries()
    assert entry.text == "ÿþ bytes \tand a tab\r\nline two"
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "memory file personal/always/binary.md is not UTF-8" in warned
    assert (
        "memory file personal/always/binary.md holds 4 control character(s) "
        "(U+0000, U+0007, U+0081, U+008D): read without them" in warned
    )


def test_symbolic_links_left_out_of_memory_are_warned_of_once(service, caplog, tmp_path):
    """QA22x L1: a link to a file outside, a dangling link and a scope folder linked out were
    left out of `heron memory list` and of turns without a word (renamed files were warned)."""
    root = tmp_path / "memory"
    _write(root, "personal/always/tea.md")
    outside = tmp_path / "outside"
    _write(outside, "notes.md")
    _write(outside, "ext/always/x.md")
    (root / "personal/always/link.md").symlink_to(outside / "notes.md")
    (root / "personal/always/gone.md").symlink_to(root / "personal/always/missing.md")
    (root / "ext").symlink_to(outside / "ext")
    (root / "personal/always/alias.md").symlink_to(root / "personal/always/tea.md")  # inside
    with caplog.at_level(logging.WARNING, logger="heron.memory.entries"):
        listed = [e.path.rel for e in service.entries()]
        service.files.root.joinpath("personal/always/new.md").write_text("x")  # a new walk
        service.entries()
    assert listed == ["personal/always/alias.md", "personal/always/tea.md"]
    warned = sorted(r.getMessage() for r in caplog.records)
    assert warned == [
        f"memory file personal/always/gone.md is not read: it is a symbolic link to nothing "
        f"({root}/personal/always/missing.md)",
        f"memory file personal/always/link.md is not read: it is a symbolic link that leads "
        f"outside the memory folder ({outside}/notes.md), where Heron never reads; copy it into "
        "the memory folder instead",
        f"memory folder ext is not read: it is a symbolic link that leads outside the memory "
        f"folder ({outside}/ext), where Heron never reads; copy it into the memory folder "
        "instead",
    ]


def test_accept_files_a_suggestion_elsewhere_and_keeps_a_clause_of_its_quote(home_db, tmp_path):
    """QA22x L8: a fact queued under the wrong scope or path could only be rejected (for good)
    or accepted and moved by hand; `accept --path` files it, `--quote` keeps one clause."""
    from typer.testing import CliRunner

    from heron.cli import app

    store = Store(home_db)
    home = MemoryService(tmp_path / "heron-home" / "memory", store)
    cid = chat(store, user("I always cycle to work, even in winter."))
    wrong = EntryPath("work", "always", None, "cycling")
    number = home.suggest_fact(cid, wrong, "I always cycle to work, even in winter.")
    runner = CliRunner()
    refused = runner.invoke(app, ["memory", "accept", str(number), "--quote", "I cycle to work"])
    assert refused.exit_code == 1
    assert "is not a whole clause of what suggestion" in refused.output
    assert home.waiting()[0].id == number  # still waiting, nothing lost
    args = ["--path", "personal/when/commute/cycling", "--quote", "I always cycle to work"]
    kept = runner.invoke(app, ["memory", "accept", str(number), *args])
    assert kept.exit_code == 0, kept.output
    assert f"#{number} kept: saved personal/when/commute/cycling.md" in kept.output
    [entry] = home.entries()
    assert (entry.path.rel, entry.text) == (
        "personal/when/commute/cycling.md",
        "I always cycle to work",
    )
    assert entry.source.quote == "I always cycle to work" and entry.origin == "auto"
    store.close()
