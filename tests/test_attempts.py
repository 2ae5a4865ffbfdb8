"""The attempts of a durable turn (heron/store/attempts.py), on both backends: the newest
attempt of a workflow's run ids, and whether one of them took a queued message as mail."""

from __future__ import annotations

from pathlib import Path

from heron.agent.control import MAIL_META
from heron.messages import user
from heron.store import attempts
from heron.store.db import Store

BASE = "run_0123456789abcdef"


def _turn(store: Store, key: str, run_id: str, status: str, meta: dict | None = None) -> int:
    conversation = store.open_conversation(key)
    turn_id = store.start_turn(conversation.id, run_id, user_message_id=None, provider=None,
                               model=None)  # fmt: skip
    store.append(conversation.id, user("hi"), turn_id=turn_id, meta=meta)
    if status != "running":
        with store.transaction() as c:
            c.execute("UPDATE turns SET status = ? WHERE id = ?", (status, turn_id))
    return turn_id


def test_no_attempt_yet(db: str | Path) -> None:
    store = Store(db)
    _turn(store, "c", "run_other", "done")
    assert attempts.latest(store, BASE) is None


def test_the_newest_attempt_is_found_past_a_batch(db: str | Path) -> None:
    """Seven attempts (more than one statement's batch of run ids): the last is the newest,
    numbered by its suffix; a run id that only shares the prefix is not one of them."""
    store = Store(db)
    for n in range(7):
        _turn(store, "c", attempts.run_id_of(BASE, n), "interrupted")
    _turn(store, "c", BASE + "0", "done")  # a longer id with the same prefix
    last = attempts.latest(store, BASE)
    assert last is not None
    assert (last.run_id, last.number, last.status, last.open) == (
        BASE + ".6", 6, "interrupted", False,
    )  # fmt: skip
    _turn(store, "c", attempts.run_id_of(BASE, 7), "running")
    again = attempts.latest(store, BASE)
    assert again is not None and (again.number, again.open) == (7, True)


def test_mail_is_found_in_any_attempt_of_its_conversation(db: str | Path) -> None:
    store = Store(db)
    _turn(store, "c", BASE, "interrupted")
    _turn(store, "c", BASE + ".1", "done", {MAIL_META: ["m42"]})
    _turn(store, "d", "run_elsewhere", "done", {MAIL_META: ["m43"]})
    assert attempts.holds_mail(store, "c", BASE, "m42")
    assert not attempts.holds_mail(store, "c", BASE, "m43")  # another run's mail
    assert not attempts.holds_mail(store, "d", BASE, "m42")  # another conversation
    assert not attempts.holds_mail(store, "c", "run_none", "m42")
