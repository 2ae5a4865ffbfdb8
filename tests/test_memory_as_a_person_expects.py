"""Memory files and forgets behave as the person expects (QA pass 8: M2, M3, M4, L4-L8)."""

from __future__ import annotations

import logging
from pathlib import Path

import test_memory_core

from heron.memory import EntryPath
from heron.messages import user

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
