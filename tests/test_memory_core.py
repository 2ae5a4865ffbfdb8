"""Memory entries, names, quotes and secrets."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from heron import timefmt
from heron.memory import BadMemoryPath, EntryPath, MemoryRefused, MemoryService
from heron.memory.entries import Entry
from heron.memory.guard import find_secret, strip_request
from heron.memory.section import memory_section
from heron.messages import Message, ToolCall, ToolResult, assistant, user
from heron.store import Store


@pytest.fixture
def store(db: str | Path) -> Store:  # once per backend (tests/pg.py)
    s = Store(db)
    yield s
    s.close()


@pytest.fixture
def service(tmp_path: Path, store: Store) -> MemoryService:
    return MemoryService(tmp_path / "memory", store)


def chat(store: Store, *messages: Message, key: str = "c1") -> int:
    conv = store.open_conversation(key)
    for m in messages:
        store.append(conv.id, m)
    return conv.id


PERSONAL = EntryPath("personal", "always", None, "concise-replies")


def test_save_with_a_quote_from_the_user_writes_a_markdown_file(service, store, tmp_path):
    cid = chat(store, user("Please   remember that I PREFER concise replies, thanks"))
    entry = service.save(cid, PERSONAL, "i prefer concise\nreplies", conversation_key="c1")
    text = (tmp_path / "memory/personal/always/concise-replies.md").read_text()
    assert text.startswith("---\ncreated: ")
    assert 'quote: "i prefer concise\\nreplies"' in text
    assert "origin: user" in text and 'conversation: "c1"' in text
    assert text.rstrip().endswith("\nI prefer concise replies")  # the quote is the text
    assert entry.source.message == 1


def test_the_same_save_run_again_leaves_one_entry(service, store, tmp_path):
    """A call run a second time (--retry after a failure, a killed process's turn redone)
    used to write path-2.md beside the first; a new statement still gets a path of its own."""
    cid = chat(store, user("I prefer concise replies"), user("I prefer concise answers"))
    first = service.save(cid, PERSONAL, "I prefer concise replies")
    again = service.save(cid, PERSONAL, "I prefer concise replies")
    assert (again.path, again.text, again.source) == (first.path, first.text, first.source)
    other = service.save(cid, PERSONAL, "I prefer concise answers")
    assert other.path.slug == "concise-replies-2"
    folder = tmp_path / "memory/personal/always"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["concise-replies-2.md", "concise-replies.md"]


def test_a_quote_not_in_the_users_messages_is_refused(service, store):
    cid = chat(
        store, user("What is the weather in Paris?"), assistant("You prefer tea over coffee.")
    )
    with pytest.raises(MemoryRefused, match="not in anything the user wrote"):
        service.save(cid, PERSONAL, "prefer tea over coffee")
    assert service.entries() == []


def test_a_quote_from_a_tool_result_is_refused(service, store):
    cid = chat(
        store,
        user("Look up my profile page"),
        Message("assistant", [ToolCall("t1", "web_fetch", {"url": "x"})]),
        Message("user", [ToolResult("t1", "Profile: the user is allergic to peanuts")]),
    )
    with pytest.raises(MemoryRefused):
        service.save(cid, PERSONAL, "allergic to peanuts")


def test_an_answer_typed_to_ask_user_is_the_user_s_words_and_can_be_quoted(service, store):
    """The person's answer reaches the record as ask_user's result ("The user answered: …");
    it is theirs. The same words as the output of another tool, or a failed call, are not."""
    asked = ToolCall("t1", "ask_user", {"question": "Which units?"})
    ran = ToolCall("t2", "bash", {"command": "echo"})
    cid = chat(
        store,
        user("convert the recipe"),
        Message("assistant", [asked]),
        Message("user", [ToolResult("t1", "The user answered: I always use metric units")]),
        Message("assistant", [ran]),
        Message("user", [ToolResult("t2", "The user answered: I am allergic to peanuts")]),
    )
    entry = service.save(cid, PERSONAL, "I always use metric units")
    assert entry.source.message == 3 and entry.text == "I always use metric units"
    with pytest.raises(MemoryRefused, match="not in anything the user wrote"):
        service.save(cid, PERSONAL, "I am allergic to peanuts")
    with pytest.raises(MemoryRefused):  # nor the tool's own words around the answer
        service.save(cid, PERSONAL, "The user answered: I always use metric units")


def test_synthetic_user_rows_and_other_conversations_cannot_be_quoted(service, store):
    conv = store.open_conversation("c1")
    store.append(conv.id, user("Subagent task: the user lives in Berlin"), meta={"synthetic": True})
    store.append(conv.id, user("[summary] I live in Berlin"), kind="summary")
    other = chat(store, user("I live in Berlin, near the river"), key="other")
    with pytest.raises(MemoryRefused):
        service.save(conv.id, PERSONAL, "I live in Berlin")
    assert service.save(other, PERSONAL, "I live in Berlin")


def test_a_very_short_quote_is_refused(service, store):
    cid = chat(store, user("I prefer tea"))
    with pytest.raises(MemoryRefused):
        service.save(cid, PERSONAL, "tea")


@pytest.mark.parametrize(
    "secret",
    [
        "my key is sk-proj-AbC123dEf456GhI789jKl012",
        "sk-ant-api03-aaaaBBBBccccDDDDeeee",
        "my password is hunter2",
        "the token: ghp_abcdefghijklmnopqrstuvwxyz0123456789",
        "AKIAIOSFODNN7EXAMPLE",
        "card 4111 1111 1111 1111 exp 12/29",
        "use 9fK2xQ8vL3mZ7pR1tY6wB4nH0jD5sA",
    ],
)
def test_secrets_are_refused(service, store, secret):
    cid = chat(store, user(f"Remember this please: {secret}"))
    with pytest.raises(MemoryRefused, match="secret"):
        service.save(cid, PERSONAL, secret)
    assert find_secret(secret)


@pytest.mark.parametrize(
    "text",
    [
        "I prefer concise replies",
        "My phone number area is 75011 Paris",
        "Use /home/me/projects/heron/docs for notes",
        "Call me at 2pm on 2024-05-01",
    ],
)
def test_ordinary_text_is_not_a_secret(text):
    assert find_secret(text) is None


def test_remember_requests_are_left_out():
    assert strip_request("remember that I like tea") == "I like tea"
    assert strip_request("Please keep in mind that dinner is at 7") == "Dinner is at 7"
    assert strip_request("Don't forget: no meetings on Fridays") == "No meetings on Fridays"
    assert strip_request("I remember that day") == "I remember that day"


@pytest.mark.parametrize(
    "bad",
    [
        "../always/x",
        "personal/../../etc/passwd",
        "/etc/passwd",
        "personal/always/../x",
        "Personal/always/x",
        "personal/always/x y",
        "personal/when/../x",
        "personal/when/a/..",
        "personal/other/x",
        "personal/always",
        "C:/x/always/y",
        "personal\\always\\x",
        "personal/when/topic/../../x",
        "per.sonal/always/x",
        "personal/always/" + "x" * 80,
    ],
)
def test_bad_paths_are_refused(bad):
    with pytest.raises(BadMemoryPath):
        EntryPath.parse(bad)


@pytest.mark.parametrize("field", ["scope", "topic", "slug"])
@pytest.mark.parametrize("value", ["..", ".", "/abs", "a/b", "UPPER", "-x", "", "a" * 65, "é"])
def test_every_name_is_validated(field, value):
    parts = {"scope": "personal", "topic": "cooking", "slug": "no-cilantro"}
    parts[field] = value
    with pytest.raises(BadMemoryPath):
        EntryPath(parts["scope"], "when", parts["topic"], parts["slug"])


def test_a_symlink_out_of_the_tree_is_refused(service, store, tmp_path):
    outside = tmp_path / "outside"
    (outside / "always").mkdir(parents=True)
    (outside / "always" / "stolen.md").write_text("secret file")
    root = tmp_path / "memory"
    root.mkdir()
    os.symlink(outside, root / "evil")
    path = EntryPath("evil", "always", None, "stolen")
    with pytest.raises(BadMemoryPath, match="outside"):
        service.get(path)
    cid = chat(store, user("I prefer concise replies"))
    with pytest.raises(BadMemoryPath):
        service.save(cid, path, "I prefer concise replies")
    assert service.entries() == []  # listing skips the link too
    assert (outside / "always" / "stolen.md").read_text() == "secret file"


def test_hand_edited_and_hand_written_files_are_picked_up(service, store, tmp_path):
    cid = chat(store, user("I prefer concise replies"))
    service.save(cid, PERSONAL, "I prefer concise replies")
    file = tmp_path / "memory/personal/always/concise-replies.md"
    file.write_text(
        file.read_text().replace("I prefer concise replies\n", "Prefers long replies\n")
    )
    hand = tmp_path / "memory/work/when/code-review/run-tests.md"
    hand.parent.mkdir(parents=True)
    hand.write_text("Run the tests before approving.\n")
    (tmp_path / "memory/work/when/code-review/Bad Name.md").write_text("ignored")
    got = {e.path.rel: e for e in service.entries()}
    assert got["personal/always/concise-replies.md"].text == "Prefers long replies"
    assert got["work/when/code-review/run-tests.md"].origin == "hand"
    assert len(got) == 2
    hand.unlink()
    assert [e.path.rel for e in service.entries()] == ["personal/always/concise-replies.md"]


def test_a_file_cut_short_in_its_front_matter_is_read_from_its_quote(service, store, tmp_path):
    """A truncated entry used to become a hand entry whose text was its front matter, which
    then went to the model as a memory."""
    cid = chat(store, user("I prefer concise replies"))
    service.save(cid, PERSONAL, "I prefer concise replies")
    file = tmp_path / "memory/personal/always/concise-replies.md"
    whole = file.read_text()
    file.write_text(whole[: whole.index("\n---", 4)])  # the closing line and the body lost
    [entry] = service.entries()
    assert (entry.text, entry.origin) == ("I prefer concise replies", "user")
    file.write_text(whole[: whole.index("quote:")])  # cut before the quote too
    section = memory_section(service.entries())
    assert "created:" not in section and "origin:" not in section


def test_a_hand_written_file_in_a_legacy_encoding_is_read_not_fatal(service, store, tmp_path):
    """An editor set to Latin-1 saved it: every turn lists memory, so one such file used to
    stop every turn, chat and serve with a UnicodeDecodeError."""
    hand = tmp_path / "memory/personal/always/cafe.md"
    hand.parent.mkdir(parents=True)
    hand.write_bytes("Je préfère le café noir.\n".encode("latin-1"))
    (hand.parent / "raw.md").write_bytes(b"bytes \x81\x8d\x8f\x90\x9d cp1252 leaves undefined\n")
    got = {e.path.rel: e.text for e in service.entries()}
    assert got["personal/always/cafe.md"] == "Je préfère le café noir."
    assert got["personal/always/raw.md"].endswith("cp1252 leaves undefined")
    assert "café noir" in memory_section(service.entries())  # what the model is shown


def test_undoing_a_forget_lifts_its_revocation_and_redoing_it_restores_it(service, store):
    """`heron memory undo` after `forget` brings the entry back; what it said is no longer
    forgotten (the entry can be updated from the same quote), until the forget is redone."""
    if not service.history.available:
        pytest.skip("git is not installed: memory has no history to undo")
    cid = chat(store, user("I prefer concise replies"))
    service.save(cid, PERSONAL, "I prefer concise replies")
    service.forget("personal/always/concise-replies.md", cid)
    service.history.undo()  # the entry is back in force
    assert [e.path.rel for e in service.entries()] == ["personal/always/concise-replies.md"]
    assert service.verify_quote(cid, "I prefer concise replies")  # not refused any more
    service.history.redo()  # the forget made again: forgotten again
    assert service.entries() == []
    with pytest.raises(MemoryRefused, match="forget"):
        service.verify_quote(cid, "I prefer concise replies")


def test_forget_deletes_and_revokes(service, store):
    cid = chat(store, user("I prefer concise replies"))
    service.save(cid, PERSONAL, "I prefer concise replies")
    service.forget("personal/always/concise-replies.md", cid)
    assert service.entries() == []
    with pytest.raises(MemoryRefused, match="forget"):
        service.save(cid, PERSONAL, "I prefer concise replies")
    store.append(cid, user("On second thought: I prefer concise replies"))  # a new statement
    assert service.save(cid, PERSONAL, "I prefer concise replies")


def test_forgetting_a_short_entry_leaves_other_statements_on_its_topic(service, store):
    """qa22x H3: forgetting "I take my coffee black." hid "I take my coffee with oat milk ..."
    from recall and refused to save it: they shared two of its three content words."""
    from heron.memory.recall import Recall

    black = chat(store, user("I take my coffee black."), key="k1")
    oat = chat(store, user("I take my coffee with oat milk when I am at my parents' place."))
    service.save(black, PERSONAL, "I take my coffee black.")
    service.forget(PERSONAL, black)
    said = store.branch(oat)[0].id
    assert Recall(store).revoked([said]) == set()
    where = EntryPath("personal", "when", "parents", "coffee")
    assert service.save(oat, where, "I take my coffee with oat milk when I am at my parents' place")
    with pytest.raises(MemoryRefused, match="forget"):  # the forgotten statement itself
        service.save(black, PERSONAL, "I take my coffee black")


def test_forgetting_a_secret_revokes_its_statement_not_every_message_on_its_topic(
    service, store, tmp_path
):
    """qa24b H1: the forget of "The wifi password is tulips" kept "the wifi" (the secret's
    words left out), which then hid from recall, and barred from memory, every message that
    mentions wifi. The mask keeps its place: only a sentence that gives a secret there says
    the statement again."""
    from heron.memory.guard import overlaps
    from heron.memory.recall import Recall

    said = [
        "Our office wifi drops every afternoon, so I work from cafes after lunch.",
        "I bought a new wifi router, a Fritzbox 7590.",
        "My wifi password is tulips and the router is in the hall.",
        "Thanks.",
    ]
    cid = chat(store, *(user(s) for s in said))
    wifi = tmp_path / "memory/personal/always/wifi.md"
    wifi.parent.mkdir(parents=True)
    wifi.write_text("The wifi password is tulips\n")  # by hand
    service.forget("personal/always/wifi.md", cid)
    ids = [r.id for r in store.branch(cid)]
    assert Recall(store).revoked(ids) == {ids[2]}  # the one that says it again
    office = EntryPath.parse("personal/always/office")
    assert service.save(cid, office, "Our office wifi drops every afternoon")
    assert service.verify_quote(cid, "I bought a new wifi router")
    key = store.query("SELECT quote_key FROM memory_revocations")[0][0]
    assert overlaps("The wifi password is roses.", key)  # another secret in its place
    assert not overlaps("The wifi?", key) and not overlaps("wifi", key)


def test_the_request_to_forget_does_not_hide_the_new_statement_said_with_it(
    service, store, tmp_path
):
    """qa24b M1: "Please forget that I take my coffee black. These days I take my coffee with
    oat milk." was hidden from recall whole, since its request quotes the forgotten statement:
    the person's current word was never recalled."""
    from heron.memory.recall import Recall

    cid = chat(
        store,
        user("I take my coffee black."),
        assistant("OK."),
        user(
            "Please forget that I take my coffee black. These days I take my coffee with oat milk."
        ),
    )
    coffee = tmp_path / "memory/personal/always/coffee.md"
    coffee.parent.mkdir(parents=True)
    coffee.write_text("I take my coffee black.\n")  # by hand
    service.forget("personal/always/coffee.md", cid)
    said, _, asked = (r.id for r in store.branch(cid))
    assert Recall(store).revoked([said, asked]) == {said}
    (hit,) = Recall(store).search("oat milk", 1, standing=True)
    assert hit.message_id == asked


def test_undo_passes_over_a_change_purged_from_the_history_and_takes_back_the_one_before(
    service, store
):
    """qa22x M5: after a forget that purged the history, `undo` stopped for good at its empty
    commit ("holds nothing to undo"), so the forget before it could never be undone."""
    if not service.history.available:
        pytest.skip("git is not installed: memory has no history to undo")
    cid = chat(store, user("I moved to Porto last month. I keep my bike in the cellar."))
    city = service.save(cid, EntryPath.parse("personal/always/city"), "I moved to Porto last month")
    bike = service.save(
        cid, EntryPath.parse("personal/always/bike"), "I keep my bike in the cellar"
    )
    service.forget(city.path, cid)
    service.forget(bike.path, cid, purge=True)  # its commits are left empty
    undone = service.history.undo()
    assert undone is not None and undone.message == "removed personal/always/city.md"
    assert undone.skipped == ("removed personal/always/bike.md",)
    assert [e.path.rel for e in service.entries()] == ["personal/always/city.md"]
    again = service.history.undo()  # then the save of the city, the bike's empty save passed
    assert again is not None and again.message == "saved personal/always/city.md (user)"
    assert again.skipped == ("saved personal/always/bike.md (user)",)
    assert service.entries() == []
    redone = service.history.redo()
    assert redone is not None and [e.path.rel for e in service.entries()] == [city.path.rel]


def _everything_in(store: Store) -> str:
    """Every value of every table of the store's SQLite file, as text (but the full-text
    index's, which holds the words of the person's messages, as the messages do)."""
    tables = [
        r[0]
        for r in store.query("SELECT name FROM sqlite_master WHERE type = 'table'")
        if not r[0].startswith("messages_fts")
    ]
    return "\n".join(
        str(value) for t in tables for row in store.query(f'SELECT * FROM "{t}"') for value in row
    )


def test_a_forget_thaws_every_frozen_section_that_holds_the_entry(service, store):
    """qa22x H1: a conversation whose Memory section was frozen before the forget kept sending
    the forgotten entry with every request, a note after it saying it was removed."""
    from heron.memory.section import frozen_memory

    cid = chat(store, user("I moved to Porto last month. I like trams."))
    city = service.save(cid, EntryPath.parse("personal/always/city"), "I moved to Porto last month")
    service.save(cid, EntryPath.parse("personal/always/trams"), "I like trams")
    other = chat(store, user("hello"), key="c2")
    for conversation in (cid, other):
        assert "Porto" in frozen_memory(store, conversation, service.entries()).section
    service.forget(city.path, cid)
    for conversation in (cid, other):
        after = frozen_memory(store, conversation, service.entries())
        assert "Porto" not in after.section and "I like trams" in after.section
        assert after.note is not None and "removed: personal/always/city.md" in after.note
        again = frozen_memory(store, conversation, service.entries())
        assert again.note is None and again.section == after.section  # frozen again, told once


def test_forgetting_a_secret_keeps_none_of_it_in_the_database(tmp_path):
    """qa22x H2: the purged secret stayed in heron.db, in memory_revocations (the statement)
    and memory_snapshots (the frozen section)."""
    from heron.memory.section import frozen_memory

    store = Store(tmp_path / "t.db")
    try:
        service = MemoryService(tmp_path / "memory", store)
        bank = tmp_path / "memory/personal/always/bank.md"
        bank.parent.mkdir(parents=True)
        bank.write_text("My bank PIN is 4711 and the wifi password is tulips99\n")  # by hand
        cid = chat(store, user("My bank PIN is 4711 and the wifi password is tulips99"))
        assert "tulips99" in frozen_memory(store, cid, service.entries()).section
        service.forget("personal/always/bank.md", cid)
        said = "My bank PIN is 4711 and the wifi password is tulips99"
        kept = _everything_in(store)
        assert said in kept  # the person's own message stays: it is the record
        rest = kept.replace(said, "")
        assert "tulips99" not in rest and "4711" not in rest
        # its other words still revoke it: recall leaves the message out
        from heron.memory.recall import Recall

        assert Recall(store).revoked([store.branch(cid)[0].id])
    finally:
        store.close()


def test_a_statement_revoked_before_keeping_its_secret_is_checked_when_memory_opens(tmp_path):
    """Rows an older Heron stored (migration m031 marks them unchecked) lose the secret too."""
    store = Store(tmp_path / "t.db")
    try:
        with store.transaction() as c:
            c.execute(
                "INSERT INTO memory_revocations (quote_key, path, created, checked)"
                " VALUES ('my bank pin is 4711 and i like tea', 'personal/always/bank.md', 1, 0)"
            )
        MemoryService(tmp_path / "memory", store)
        assert store.query("SELECT quote_key, checked FROM memory_revocations")[0][:] == (
            "my bank … and i like tea",
            1,
        )
    finally:
        store.close()


def test_forgetting_one_of_several_entries_that_say_the_same_leaves_it_in_force(service, store):
    """qa22x M1: recall hid the statement while the save guard let it be saved again, and the
    forget said it was no longer in force though two entries still said it."""
    from heron.memory.recall import Recall

    said = "I prefer tabs over spaces in Python code."
    cid = chat(store, user(said))
    paths = ["work/always/tabs", "personal/always/tabs", "personal/always/tabs-2"]
    for path in paths:
        service.files.write(Entry(EntryPath.parse(path), said))
    gone = service.forget("personal/always/tabs-2.md", cid)
    message = store.branch(cid)[0].id
    assert Recall(store).revoked([message]) == set()  # memory holds it: recall shows it
    assert service.verify_quote(cid, said)  # and the guard agrees
    note = service.still_said(gone)
    assert note is not None
    assert "personal/always/tabs.md, work/always/tabs.md still say the same" in note
    service.forget("personal/always/tabs.md", cid)
    service.forget("work/always/tabs.md", cid)  # now nothing says it: forgotten for good
    assert Recall(store).revoked([message]) == {message}
    with pytest.raises(MemoryRefused, match="forget"):
        service.verify_quote(cid, said)


def test_a_statement_taken_back_in_the_same_message_is_refused(service, store):
    """QA22x M3: "I moved to Porto last month. Scratch that, I moved to Braga." saved Porto."""
    cid = chat(store, user("I moved to Porto last month. Scratch that, I moved to Braga."))
    city = EntryPath("personal", "always", None, "city")
    with pytest.raises(MemoryRefused, match="took this back") as refused:
        service.save(cid, city, "I moved to Porto last month.")
    assert "scratch that, i moved to braga" in str(refused.value)
    assert service.save(cid, city, "I moved to Braga").text == "I moved to Braga"


def test_a_statement_taken_back_at_the_start_of_the_next_message_is_refused(service, store):
    cid = chat(
        store,
        user("I love jazz."),
        assistant("Noted."),
        user("Scratch that, I love blues."),
        user("I moved to Faro. I no longer live in Lisbon. Book me a table."),
        user("Correction: a table for two."),
    )
    with pytest.raises(MemoryRefused, match="took this back"):
        service.save(cid, PERSONAL, "I love jazz")
    # A state that ended is no retraction; the next message speaks of what came last.
    assert service.save(cid, EntryPath("personal", "always", None, "faro"), "I moved to Faro")
    lisbon = EntryPath("personal", "always", None, "lisbon")
    assert service.save(cid, lisbon, "I no longer live in Lisbon")


@pytest.mark.parametrize(
    ("said", "after"),
    [
        ("I moved to Porto last month.", "Actually no, I moved to Braga."),
        ("My car is a red Volvo.", "Wait, no. It is a blue Volvo."),
        ("My car is a red Volvo.", "No wait, it is blue."),
        ("My flight to Oslo leaves yesterday.", "Sorry, I meant tomorrow."),
        ("My flight to Oslo leaves yesterday.", "I meant tomorrow, not yesterday."),
    ],
)
def test_a_statement_taken_back_by_a_common_correction_is_refused(service, store, said, after):
    """qa22v M3: "Actually no, ...", "Wait, no.", "no wait", "Sorry, I meant ...", at the start
    of the next message or the next sentence, saved the statement they take back."""
    entry = EntryPath("personal", "always", None, "said")
    for cid in (
        chat(store, user(said), user(after)),
        chat(store, user(f"{said} {after}"), key="c2"),
    ):
        with pytest.raises(MemoryRefused, match="took this back"):
            service.save(cid, entry, said)


def test_a_correction_in_the_next_messages_second_sentence_or_of_another_subject_stands(
    service, store
):
    """qa24b H2: "Thanks for the tips. Correction: the dentist is on Friday, not Thursday."
    took back "I started learning Portuguese last week." said before it: the next message's
    window was two sentences, and a correction of another subject counted."""
    said = "I started learning Portuguese last week."
    dentist = "Correction: the dentist is on Friday, not Thursday."
    for cid in (
        chat(store, user(said), assistant("Nice!"), user(f"Thanks for the tips. {dentist}")),
        chat(store, user(f"{said} {dentist}"), key="c2"),
        chat(store, user(said), user(dentist), key="c3"),
    ):
        assert service.verify_quote(cid, said)
    for after in ("Correction: I started learning Spanish.", "Scratch that.", "I meant Italian."):
        cid = chat(store, user(said), user(after), key=after)
        with pytest.raises(MemoryRefused, match="took this back"):
            service.verify_quote(cid, said)


def test_a_later_correction_of_another_subject_is_not_shown_under_a_recall_hit(store):
    """qa24b L3: "Also, correction: I moved to Braga ..." was shown as the "later:" of "Last
    week I started learning Portuguese." (its message named Portuguese in another sentence)."""
    from heron.memory.recall import Recall

    chat(
        store,
        user("Last week I started learning Portuguese."),
        assistant("Boa sorte!"),
        user(
            "Please remember the Portuguese thing. Also, correction: I moved to Braga, not Porto."
        ),
        assistant("Noted."),
        user("I started learning Italian in May."),
        user("Scratch that, I started learning Italian in June."),
    )
    hits = {h.snippet: h for h in Recall(store).search("learning", 5, standing=True)}
    assert hits["Last week I started learning Portuguese."].later is None
    italian = hits["I started learning Italian in May."].later
    assert italian is not None and "June" in italian.snippet


@pytest.mark.parametrize(
    "after",
    [
        "Actually, I like it a lot.",
        "Actually no one else drives it.",
        "It was actually no trouble to park.",
        "I meant to tell you: it is for sale.",
        "I meant it, I love that car.",
        "No, wait for me at the garage.",
        "Oh no, I left the keys in it.",
    ],
)
def test_an_ordinary_actually_or_i_meant_takes_nothing_back(service, store, after):
    said = "My car is a red Volvo."
    entry = EntryPath("personal", "always", None, "car")
    for cid in (
        chat(store, user(said), user(after)),
        chat(store, user(f"{said} {after}"), key="c2"),
    ):
        assert service.save(cid, entry, said).text == said
        service.files.delete(entry)


def test_a_delete_without_a_request_to_forget_says_an_update_is_the_way(service, store):
    """QA22x L10: "The weekday vegetarian thing is over, I eat everything now." asks to forget
    nothing; the refusal said only what delete needs, not that an update records the change."""
    cid = chat(store, user("I'm vegetarian on weekdays."))
    veg = service.save(
        cid, EntryPath("personal", "always", None, "veg"), "I'm vegetarian on weekdays"
    )
    store.append(cid, user("The weekday vegetarian thing is over, I eat everything now."))
    with pytest.raises(MemoryRefused, match="asks for none") as refused:
        service.delete(cid, veg.path, "The weekday vegetarian thing is over")
    assert "update the entry with that quote (action=update, path=personal/always/veg.md)" in str(
        refused.value
    )


def test_forgetting_an_entry_names_another_that_says_a_slice_of_it(service, store):
    """qa22v M2: "I prefer tabs over spaces." stayed in force after its longer statement was
    forgotten, the forget did not name it, and recall hid the message it stood on (the check
    compared whole statements, the revocation reads `overlaps`)."""
    from heron.memory.recall import Recall

    long, short = "I prefer tabs over spaces in Python code.", "I prefer tabs over spaces."
    cid = chat(store, user(long), assistant("ok"), user(short))
    service.files.write(Entry(EntryPath.parse("work/always/tabs"), long))
    service.files.write(Entry(EntryPath.parse("personal/always/tabs-short"), short))
    gone = service.forget("work/always/tabs.md", cid)
    note = service.still_said(gone)
    assert note is not None and "personal/always/tabs-short.md still says it, or part" in note
    said = [m.id for m in store.branch(cid) if m.message.role == "user"]
    assert Recall(store).revoked(said) == set()  # memory holds it: recall shows them
    service.forget("personal/always/tabs-short.md", cid)  # now nothing says it
    assert Recall(store).revoked(said) == set(said)


def test_recall_says_how_many_matches_a_forget_left_out(service, store):
    """qa22v L5: a message that says a forgotten fact among other things is left out whole,
    and "toast and jam" then found nothing, as if it was never said; the result says so."""
    from heron.memory.recall import Recall

    said = "In the mornings I usually take my coffee black with a slice of toast and some jam."
    cid = chat(store, user(said))
    service.files.write(Entry(EntryPath.parse("personal/always/coffee"), "I take my coffee black."))
    service.forget("personal/always/coffee.md", cid)
    hits = Recall(store).search("toast and jam", standing=True)
    assert list(hits) == [] and hits.forgotten == 1
    note = hits.forgotten_note("you")
    assert note is not None and "1 more message matched but is not shown" in note
    assert Recall(store).search("toast and jam").forgotten == 0  # a search of the record


def test_a_tool_save_and_update_stamp_the_day_their_quote_was_said(service, store, monkeypatch):
    """The tool may quote a message of days ago, and an update kept the first save's day
    (`created`), so "last month" of the new words was read from the old statement's day."""
    day = 86_400.0
    now = time.time()

    @contextlib.contextmanager
    def at(when: float) -> Iterator[None]:  # the clock of the store and the service
        with monkeypatch.context() as m:
            m.setattr(time, "time", lambda: when)
            yield

    cid = chat(store)
    path = EntryPath("personal", "always", None, "city")
    with at(now - 40 * day):
        store.append(cid, user("I moved to Porto last month."))
    with at(now - 10 * day):  # a save quoting what was said thirty days before
        saved = service.save(cid, path, "I moved to Porto last month.")
    assert saved.source.said == int(now - 40 * day)  # whole seconds, as the file keeps it
    assert f"said {timefmt.when(now - 40 * day, 'UTC', timefmt.DAY)})" in memory_section([saved])
    with at(now - 2 * day):
        store.append(cid, user("I moved to Lisbon last week."))
    updated = service.update(cid, path, "I moved to Lisbon last week.")
    assert isinstance(updated, Entry)
    assert service.get(path).source.said == int(now - 2 * day)  # the new words', not the first's
    shown = memory_section(service.entries())
    assert f"said {timefmt.when(now - 2 * day, 'UTC', timefmt.DAY)})" in shown
