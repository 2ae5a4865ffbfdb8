"""A typed word that no message holds ("Caroleine") is searched as the nearest word the
history holds, within a small edit distance, by recall_history and `heron memory recall`,
which say so; auto-recall never guesses (docs/memory.md, "A typo is searched as the nearest
word the history holds")."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from heron.channels.memory_cli import print_recall
from heron.memory import auto, spelling
from heron.memory.recall import Recall
from heron.messages import assistant, user
from heron.store import Store
from heron.tools.context import TurnServices
from heron.tools.memory_tools import recall_history
from heron.tools.registry import ToolContext


def _edits(a: str, b: str) -> int:
    """The optimal string alignment distance, the whole table (the textbook's)."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(
                d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])
            )
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[-1][-1]


def test_the_nearest_word_is_the_one_the_whole_table_finds() -> None:
    """The trie walk (a prefix's row shared, a prefix too far ruling out its words) chooses as
    computing every word's whole table does: fewest edits, most messages, first in order."""
    rng = random.Random(3)
    for _ in range(400):
        vocabulary = [
            ("".join(rng.choice("abc") for _ in range(rng.randint(1, 7))), rng.randint(1, 3))
            for _ in range(rng.randint(0, 30))
        ]
        stem = "".join(rng.choice("abc") for _ in range(rng.randint(1, 7)))
        most = rng.randint(1, 2)
        near = [(_edits(stem, w), -n, w) for w, n in vocabulary if w != stem]
        best = min((c for c in near if c[0] <= most), default=None)
        assert spelling.nearest(stem, vocabulary, most) == (best and best[2]), (stem, vocabulary)
    assert spelling.nearest("melain", [("melani", 1)], 1) == "melani"  # a swap is one edit


def test_how_far_a_word_may_be_respelled() -> None:
    assert [spelling.allowance(w) for w in ["tabl", "olivs", "caroline", "caroleine"]] == [
        0,
        1,
        2,
        2,
    ]
    assert spelling.allowance("48251") == 0 and spelling.allowance("qx-99812") == 0
    vocabulary = [("carolin", 3), ("carol", 9), ("oliv", 2), ("olive", 1), ("48250", 5)]
    assert spelling.nearest("carolein", vocabulary, 2) == "carolin"
    assert spelling.nearest("olivs", vocabulary, 1) == "oliv"  # fewest edits first
    assert spelling.nearest("zebra", vocabulary, 1) is None
    assert spelling.nearest("48251", vocabulary, 1) is None  # never a number
    assert spelling.replace("What did Caroleine say", "caroleine", "caroline") == (
        "What did Caroline say"
    )


def _history(store: Store) -> tuple[int, dict[str, int]]:
    conv = store.open_conversation("friends")
    ids = {
        "caroline": store.append(conv.id, user("Caroline: I will travel to Oslo in June.")).id,
        "olives": store.append(conv.id, user("I love green olives on pizza.")).id,
    }
    store.append(conv.id, assistant("Noted."))
    store.append(conv.id, user("The weather is grey today."))
    return conv.id, ids


def test_a_word_no_message_holds_is_searched_as_the_nearest_one(db: str | Path) -> None:
    store = Store(db)
    _, ids = _history(store)
    recall = Recall(store)
    assert recall.respelled("Where will Caroleine travel?") == (
        "Where will Caroline travel?",
        [("caroleine", "caroline")],
    )
    assert recall.respelled("who loves olivse") == ("who loves olives", [("olivse", "olives")])
    # held words, short words and numbers stay as typed; so does a word far from any
    for query in ["Caroline travel", "olve pizza", "ticket 48251", "quantum physics"]:
        assert recall.respelled(query) == (query, []), query
    searched, _ = recall.respelled("Caroleine")
    assert [h.message_id for h in recall.search(searched, 1)] == [ids["caroline"]]
    store.close()


def test_recall_history_says_what_it_searched_and_auto_recall_never_guesses(
    db: str | Path,
) -> None:
    store = Store(db)
    conv, ids = _history(store)
    recall = Recall(store)
    question = "where will Caroleine travel"
    # auto-recall: "travel" alone is held, and a hit must hold two words: nothing is shown
    assert auto.auto_hits(recall, question, conv) == []
    folded = {r.id for r in store.all_messages(conv)}
    services = TurnServices(recall=recall, conversation_id=conv, view_cuts=lambda: folded)
    ctx = ToolContext(workspace=Path("."), services=services)
    said = recall_history.fn(ctx, query=question, limit=3).splitlines()
    assert said[0] == "no message holds 'caroleine'; searched 'caroline'", said
    assert f"· message {ids['caroline']} · user]" in said[1], said
    store.close()


def test_memory_recall_says_what_it_searched(
    db: str | Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`heron memory recall` (and `conversations search`): the note first, on stderr with
    --json, whose stdout stays one JSON array."""
    store = Store(db)
    _, ids = _history(store)
    print_recall(store, "Caroleine in Oslo", 3, standing=True)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "no message holds 'caroleine'; searched 'caroline'", out
    assert f"· message {ids['caroline']} · you]" in out[1], out
    print_recall(store, "Caroleine in Oslo", 3, as_json=True)
    printed = capsys.readouterr()
    assert json.loads(printed.out)[0]["message_id"] == ids["caroline"]
    assert "searched 'caroline'" in printed.err
    store.close()
