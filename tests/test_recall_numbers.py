"""Numbers, ids, codes and versions are what people ask recall for ("item 5", "ticket 4711",
"QX-99812", "v2.3.1", "PR #88"): the message that says the number next to the words the
question says it with comes first, in auto-recall and in recall_history, and a number or a
code matches only whole."""

from __future__ import annotations

import random
from pathlib import Path

from heron.memory import auto
from heron.memory.recall import (
    Recall,
    held_by,
    held_terms,
    match_expression,
    search_terms,
    terms,
)
from heron.messages import Message, ToolCall, ToolResult, assistant, user
from heron.store import Store
from heron.tools.context import TurnServices
from heron.tools.memory_tools import recall_history
from heron.tools.registry import ToolContext

ITEMS = 35


def _item(n: int) -> str:
    return f"Fact number {n}: my item {n} is called UNIQ-WORD-{n}."


def _numbered_items(store: Store, conversation_id: int) -> dict[int, int]:
    """The tester's conversation in small: 35 numbered items between plain turns. The first
    items ran a tool whose output, a column of numbers, the reply quotes, as do the replies
    of the plain turns (so "5" is in many messages); to the later items the model replied by
    quoting an earlier item back (as it does with what auto-recall showed it), never item 5.
    The last plain turns are what the view still holds. Returns item -> its message id."""
    rng = random.Random(17)
    numbers = "\n".join(str(k) for k in range(1, 151))
    ids: dict[int, int] = {}
    turn = 0
    for n in range(1, ITEMS + 1):
        ids[n] = store.append(conversation_id, user(_item(n))).id
        if n <= 12:
            store.append(conversation_id, Message("assistant", [ToolCall(f"c{n}", "bash", {})]))
            store.append(conversation_id, Message("user", [ToolResult(f"c{n}", numbers)]))
            store.append(conversation_id, assistant(f"Tool said: out-{n}\n{numbers}"))
        else:
            quoted = rng.choice([k for k in range(1, n) if k != 5])
            store.append(conversation_id, assistant(f"You said before: {_item(quoted)}"))
        for _ in range(3):
            turn += 1
            store.append(conversation_id, user(f"bulk {turn}: print the numbers to 150"))
            store.append(conversation_id, assistant(f"Here they are:\n{numbers}"))
    return ids


def test_the_item_asked_for_by_its_number_is_what_auto_recall_and_recall_history_bring(
    tmp_path: Path,
) -> None:
    """On SQLite: BM25 weighs the phrase "item 5" as the rare thing it is. (PostgreSQL's
    ts_rank weighs no word by its rarity: there item 5 matches, and ranks as before.)"""
    store = Store(tmp_path / "h.db")
    conv = store.open_conversation("small")
    ids = _numbered_items(store, conv.id)
    rows = [r.id for r in store.all_messages(conv.id)]
    in_view = set(rows[-40:])  # the items were folded out of view long ago
    assert ids[5] not in in_view
    question = "What did I call item 5? Something with UNIQ-WORD"
    recall = Recall(store)
    # the gate: "item 5" weighs as one more word, held by item 5 alone, so the items that
    # hold only the words fall below the bar (the fused ranking's order, with vectors, puts
    # item 5 first but the others within `Gate.second` of it)
    passing = {i for i, s in auto.shares(recall, question, conv.id).items() if s >= auto.GATE.own}
    assert passing == {ids[5]}
    found = auto.auto_hits(recall, question, conv.id, in_view)
    assert found, "auto-recall should bring something"
    assert [h.hit.message_id for h in found] == [ids[5]], [h.hit.snippet for h in found]
    injected = auto.auto_messages(recall, question, conv.id, in_view)
    assert "UNIQ-WORD-5." in injected[1].parts[0].content  # type: ignore[union-attr]
    # recall_history, as the model calls it in that conversation, whose last request showed
    # the items folded (`view_cuts`: not read whole)
    folded = set(rows) - in_view
    services = TurnServices(recall=recall, conversation_id=conv.id, view_cuts=lambda: folded)
    ctx = ToolContext(workspace=Path("."), services=services)
    first = recall_history.fn(ctx, query=question, limit=3).splitlines()[0]
    assert f"· message {ids[5]} · user]" in first, first
    store.close()


def _apart(store: Store, texts: list[str]) -> list[int]:
    """Each text a message of a conversation of its own: no neighbour lends it a score."""
    out = []
    for text in texts:
        conv = store.open_conversation(
            f"c{store.query('SELECT count(*) FROM conversations')[0][0]}"
        )
        out.append(store.append(conv.id, user(text)).id)
    return out


def test_numbers_and_codes_match_only_whole(db: str | Path) -> None:
    """ "ticket 4711" is not "ticket 47110"; a code is not its parts in another order, nor in
    another code. Each decoy comes first, so a tie would pick it."""
    store = Store(db)
    ticket = _apart(
        store, ["ticket 47110 is about the printer", "ticket 4711 is about the printer"]
    )
    code = _apart(store, ["QX 12 and 99812 rows: the QX board", "QX-99812 is the printer fix"])
    version = _apart(
        store,
        [
            "we shipped v2.1.3 with the login fix",
            "version 1.3.1 of v2 tools shipped the login fix",
            "we shipped v2.3.1 with the login fix",
        ],
    )
    recall = Recall(store)
    assert recall.search("ticket 4711")[0].message_id == ticket[1]
    assert [h.message_id for h in recall.search("4711")] == [ticket[1]]
    assert recall.search("what was QX-99812 about?", 1)[0].message_id == code[1]
    assert recall.search("what shipped in v2.3.1?", 1)[0].message_id == version[2]
    # auto-recall: the code is one of the question's words, held only where it is whole
    conv = store.message(version[2]).conversation_id
    found = auto.auto_hits(recall, "which login fix shipped in v2.3.1?", conv)
    assert [h.hit.message_id for h in found][:1] == [version[2]]
    store.close()


def test_a_number_next_to_its_word_comes_first(tmp_path: Path) -> None:
    """ "room 5" is the room, not a message that says room and, elsewhere, 5 (on SQLite, where
    BM25 weighs the phrase by its rarity; PostgreSQL's ts_rank does not)."""
    store = Store(tmp_path / "h.db")
    room = _apart(store, ["the room was booked for 5 people, room 12", "we booked room 5 for Oslo"])
    pr = _apart(store, ["PR 12 changed 88 files of the parser", "PR #88 changed the parser"])
    recall = Recall(store)
    assert recall.search("who was in room 5", 1)[0].message_id == room[1]
    assert recall.search("what did PR #88 change", 1)[0].message_id == pr[1]
    store.close()


def test_a_query_reads_codes_whole_and_pairs_numbers_with_their_word() -> None:
    assert terms("status of QX-99812?") == ["status", "qx-99812"]
    assert terms("what is in v2.3.1") == ["v2.3.1"]
    assert terms('"v2.3.1" or o\'neil-5') == ["v2.3.1", "neil-5"]  # no quote in a term
    assert terms("What did I call item 5? Something") == ["call", "item", "5", "something"]
    # a number pairs with the content word next to it, in its clause only
    assert search_terms("What did I call item 5? Something") == [
        "call",
        "item",
        "5",
        "something",
        "item 5",
    ]
    assert search_terms("did PR #88 change") == ["pr", "88", "change", "pr 88", "88 change"]
    assert search_terms("the 4 of us, 2 years ago") == ["4", "us", "2", "years", "ago", "2 years"]
    # a number is never a prefix; a long word still is; from 1,000 on, a number is also
    # searched grouped ("4,711": FTS5 reads it as the words "4" and "711")
    assert match_expression("ticket 4711") == (
        '"ticket"* OR ("4711" OR "4,711") OR ("ticket 4711" OR "ticket 4,711" OR "ticket4711")'
    )
    assert match_expression("item 5") == '"item"* OR "5" OR ("item 5" OR "item5")'


def test_the_gate_holds_a_code_only_whole() -> None:
    bodies = ["we shipped V2.3.1 today", "v2.3.10 is out", "v2 then 3.1", "4711", "47110"]
    words = ["v2.3.1", "v2", "4711"]
    expected = [{"v2.3.1", "v2"}, {"v2"}, {"v2"}, {"4711"}, set()]
    assert [held_terms(b, words) for b in bodies] == expected
    assert held_by(bodies, words) == expected
    # a code's match never runs from one body into the next
    assert held_by(["ends with v2", "3.1 starts this"], ["v2.3.1"]) == [set(), set()]
    assert held_by(["QX 99812", "qx_99812"], ["qx-99812"]) == [{"qx-99812"}, {"qx-99812"}]


def test_a_number_with_its_word_is_kept_when_its_words_are_too_common(db: str | Path) -> None:
    """`selective_terms` drops the commonest words once the rarer match its budget; the phrase
    "item 5" is counted as itself (here 1), so it is searched first, not bounded by its
    words' counts and dropped with them."""
    store = Store(db)
    conv = store.open_conversation("c")
    for n in range(20):
        store.append(conv.id, user(f"item {n + 10} is on the shelf"))
        store.append(conv.id, user(f"5 apples and {n} pears"))
        store.append(conv.id, user(f"5 pears and {n} apples"))
    wanted = store.append(conv.id, user("item 5 is the blue one"))
    recall = Recall(store)
    assert recall.selective_terms("item 5", budget=10) == ["item 5"]
    assert [i for i, _ in recall.bm25("item 5", 1, budget=10)] == [wanted.id]
    store.close()


# One amount in the ways people write it, each said in a conversation of its own, and decoys:
# other numbers that hold its digits or its groups.
AMOUNT_FORMS = {
    "comma": "the invoice was 48,250 for the roof",
    "bare": "the invoice was 48250 for the fence",
    "dollars": "the invoice came to $48,250.00 in total",
    "european": "die Rechnung: 48.250,00 EUR",
    "spaced": "invoice 48 250 kr paid",
    "swiss": "Rechnung 48'250 CHF",
}
AMOUNT_DECOYS = {
    "million": "the grant was 48,250,000 in all",
    "longer": "number 1,048,250 on the list",
    "digits": "ticket 482501 was closed",
    "list": "scores: 48, 250 and 12",
}


def test_a_number_is_found_in_any_grouping_of_its_digits(db: str | Path) -> None:
    """ "what was the 48250 invoice" finds "48,250", and the reverse, on both backends: a
    number is searched in each grouping (FTS5 and PostgreSQL read "48,250", "48.250" and
    "48250" as different words)."""
    store = Store(db)
    ids = dict(zip(AMOUNT_FORMS, _apart(store, list(AMOUNT_FORMS.values())), strict=True))
    decoys = dict(zip(AMOUNT_DECOYS, _apart(store, list(AMOUNT_DECOYS.values())), strict=True))
    recall = Recall(store)
    for query in ["what was the 48250 invoice", "48,250", "the 48 250 invoice", "$48,250.00",
                  "48.250", "48'250 invoice"]:  # fmt: skip
        found = {h.message_id for h in recall.search(query, 20)}
        missing = [k for k, i in ids.items() if i not in found]
        assert not missing, (query, missing)
        # a longer number that holds the digits is not this one
        assert decoys["longer"] not in found and decoys["digits"] not in found, query
    store.close()


def test_lists_decimals_and_years_stay_as_typed(db: str | Path) -> None:
    """ "1,2,3" is a list and "3.14" a decimal, not the numbers 123 and 314; "2023" written
    bare is a year, searched as it is."""
    store = Store(db)
    listed, joined, decimal, whole, year, grouped = _apart(
        store,
        ["we counted 1,2,3 apples", "we counted 123 apples", "pi is 3.14 or so",
         "pi is 314 or so", "it was 2023 then", "it was 2,023 then"],
    )  # fmt: skip
    recall = Recall(store)
    assert [h.message_id for h in recall.search("1,2,3")] == [listed]
    assert [h.message_id for h in recall.search("123")] == [joined]
    assert [h.message_id for h in recall.search("3.14")] == [decimal]
    assert [h.message_id for h in recall.search("314")] == [whole]
    assert [h.message_id for h in recall.search("2023")] == [year]
    assert {h.message_id for h in recall.search("2,023")} == {year, grouped}
    store.close()


def test_a_verbatim_phrase_holds_a_number_in_any_grouping(db: str | Path) -> None:
    store = Store(db)
    comma, bare = _apart(store, [AMOUNT_FORMS["comma"], AMOUNT_FORMS["bare"]])
    recall = Recall(store)
    assert recall.verbatim("the invoice was 48250") == [comma, bare]
    assert recall.verbatim("The invoice was 48,250.00") == [comma, bare]
    assert [h.message_id for h in recall.exact("invoice was 48 250")] == [bare, comma]
    store.close()


def test_the_gate_holds_a_number_in_any_grouping_and_only_whole() -> None:
    bodies = [*AMOUNT_FORMS.values(), *AMOUNT_DECOYS.values()]
    held = [bool(h) for h in held_by(bodies, ["48250"])]
    assert held == [True] * len(AMOUNT_FORMS) + [False] * len(AMOUNT_DECOYS)
    assert [bool(held_terms(b, ["48,250"])) for b in bodies] == held
    # with the word next to it, as auto-recall weighs "invoice 48250"
    assert held_by(bodies, ["invoice 48250"])[4] == {"invoice 48250"}


def test_auto_recall_and_recall_history_find_the_number_typed_another_way(
    db: str | Path,
) -> None:
    """The question types the amount without its comma: the gate counts its number as held
    by the message that wrote it with one, and recall_history finds it."""
    store = Store(db)
    conv = store.open_conversation("money")
    for amount in ("3,100", "12,900", "7,450"):  # first: a tie would pick one of them
        store.append(conv.id, user(f"The roof invoice was {amount}, paid in March."))
        store.append(conv.id, assistant("Noted."))
    wanted = store.append(conv.id, user("The roof invoice was 48,250, paid in March.")).id
    for n in range(6):
        store.append(conv.id, assistant(f"Noted, item {n} of the roof."))
        store.append(conv.id, user(f"The roof needs {n + 2} more tiles."))
    recall = Recall(store)
    question = "what was the roof invoice of 48250 about?"
    found = auto.auto_hits(recall, question, conv.id)
    assert [h.hit.message_id for h in found][:1] == [wanted]
    # recall_history, as the model calls it once the conversation was folded out of view
    folded = {r.id for r in store.all_messages(conv.id)}
    services = TurnServices(recall=recall, conversation_id=conv.id, view_cuts=lambda: folded)
    ctx = ToolContext(workspace=Path("."), services=services)
    first = recall_history.fn(ctx, query="48250 invoice", limit=3).splitlines()[0]
    assert f"· message {wanted} · user]" in first, first
    store.close()


# One code in the ways people write it (letters and digits joined by a hyphen, a space or
# nothing), each in a conversation of its own, and decoys: another code that holds its parts,
# its digits in a longer number, a version whose dots are not a code's seams.
CODE_FORMS = {
    "hyphen": "the part QX-99812 fixed the printer",
    "joined": "the part QX99812 fixed the scanner",
    "spaced": "the part QX 99812 fixed the fax",
}
CODE_DECOYS = {
    "other": "the part QX-99813 fixed the copier",
    "longer": "the part QX-998120 fixed the plotter",
    "apart": "QX boards: 99812 of them shipped",
}


def test_a_code_is_found_in_any_spelling_of_its_seam(db: str | Path) -> None:
    """ "QX99812" finds "QX-99812" and "QX 99812", and each finds the others, on both backends
    (FTS5 reads "qx99812" as one word and "qx-99812" as two; PostgreSQL reads all three
    differently)."""
    store = Store(db)
    ids = dict(zip(CODE_FORMS, _apart(store, list(CODE_FORMS.values())), strict=True))
    decoys = dict(zip(CODE_DECOYS, _apart(store, list(CODE_DECOYS.values())), strict=True))
    recall = Recall(store)
    for query in ["QX99812", "QX-99812", "QX 99812", "what fixed QX-99812?", "qx99812 fixed"]:
        found = [h.message_id for h in recall.search(query, 20)]
        assert set(ids.values()) <= set(found), (query, found)
        if " " not in query:  # the code alone: its spellings first, no decoy
            assert set(found[:3]) == set(ids.values()), (query, found)
            assert decoys["other"] not in found and decoys["longer"] not in found, query
    # the verbatim phrase too
    assert recall.verbatim("the part QX99812 fixed") == list(ids.values())
    assert sorted(h.message_id for h in recall.exact("part qx-99812")) == sorted(ids.values())
    store.close()


def test_version_dots_and_single_letters_are_not_a_codes_seam(db: str | Path) -> None:
    """A dot between digits is a version's ("v2.3.1" is not "v231"); a single letter next to
    a number stays as typed ("A4" is not "a 4": a stop word, and a word beside a number)."""
    store = Store(db)
    version, joined, paper, spaced = _apart(
        store, ["we shipped v2.3.1 today", "we shipped v231 today", "print it on A4 paper",
                "print a 4 page letter"],
    )  # fmt: skip
    recall = Recall(store)
    assert [h.message_id for h in recall.search("v231")] == [joined]
    assert [h.message_id for h in recall.search("v2.3.1")] == [version]
    assert paper in {h.message_id for h in recall.search("a4")}
    assert spaced not in {h.message_id for h in recall.search("a4")}
    store.close()


def test_the_gate_holds_a_code_in_any_spelling() -> None:
    bodies = [*CODE_FORMS.values(), *CODE_DECOYS.values()]
    expected = [True] * len(CODE_FORMS) + [False] * len(CODE_DECOYS)
    for word in ["qx99812", "qx-99812"]:
        assert [bool(h) for h in held_by(bodies, [word])] == expected, word
        assert [bool(held_terms(b, [word])) for b in bodies] == expected, word
    # a number typed with a space after its letters is the pair "qx 99812": held joined too
    assert [bool(h) for h in held_by(bodies, ["qx 99812"])] == expected
    assert held_by(["COVID-19 rules", "covid19 rules", "covid 2019"], ["covid19"]) == [
        {"covid19"},
        {"covid19"},
        set(),
    ]


def test_auto_recall_finds_the_code_typed_without_its_hyphen(db: str | Path) -> None:
    """The tester's case: the message says "QX-99812", the question "QX99812" (and "QX 99812",
    whose words the joined spelling holds as one)."""
    store = Store(db)
    conv = store.open_conversation("parts")
    joined = store.append(conv.id, user("Also the scanner part AB1234 came today.")).id
    store.append(conv.id, assistant("Noted."))
    for code in ("QX-10450", "QX-23311", "QX-71002"):  # first: a tie would pick one of them
        store.append(conv.id, user(f"The printer part {code} was ordered on Monday."))
        store.append(conv.id, assistant("Noted."))
    wanted = store.append(conv.id, user("The printer part QX-99812 was ordered on Monday.")).id
    for n in range(6):
        store.append(conv.id, assistant("Noted."))
        store.append(conv.id, user(f"The fax needs {n + 2} more sheets."))
    recall = Recall(store)
    for question, message in [
        ("when was the printer part QX99812 ordered?", wanted),
        ("when was the printer part QX 99812 ordered?", wanted),
        ("did the scanner part AB 1234 come?", joined),
        ("did the scanner part AB-1234 come?", joined),
    ]:
        found = auto.auto_hits(recall, question, conv.id)
        assert [h.hit.message_id for h in found][:1] == [message], question
    store.close()


def test_another_conversations_code_written_joined_passes_for_the_spaced_question(
    db: str | Path,
) -> None:
    """ "AB 1234" asked in a new conversation: the words "ab" and "1234" are nowhere else, but
    the code is, written "AB1234" (the index's one word), so the other conversations' bar is
    reached by its words as it is for "AB-1234"."""
    store = Store(db)
    (joined,) = _apart(store, ["the scanner part AB1234 came today"])
    _apart(store, ["the scanner part XY7788 came yesterday", "a fax came today"])
    asking = store.open_conversation("asking")
    recall = Recall(store)
    found = auto.auto_hits(recall, "the scanner part AB 1234 came today?", asking.id)
    assert [(h.hit.message_id, h.other) for h in found] == [(joined, True)]
    store.close()
