"""A secret in a memory entry that a conversation learned mid-way (a file written by hand after
its Memory section was frozen) was announced in that turn's runtime block with its full text,
stored with the person's message as sent, and so went out with every later request of the
conversation, and stayed in the trace's copies of them, after `forget` said it was taken out
for good (qa22v H1, M1). The note names such an entry by its path only, and a forget of a
secret rewrites the notes and the recorded requests already stored."""

from __future__ import annotations

import json
from pathlib import Path

from heron.agent.engine import Engine
from heron.config import Settings
from heron.memory.scrub import MARKER, SecretScrub, scrubbed_sent
from heron.memory.section import hide_secret_items
from heron.messages import Reply, Text, Usage, dumps, message_to_dict
from heron.providers.scripted import ScriptedProvider
from heron.store import Store

SECRET = "My locker combination is 31-07-55 and my password is hunter2zz"
LOCKER = "personal/always/locker.md"


def _reply(text: str = "ok") -> Reply:
    return Reply([Text(text)], "done", Usage(10, 1))


def _sent(provider: ScriptedProvider, n: int) -> str:
    """Everything request `n` carried (system prompt and messages)."""
    request = provider.requests[n]
    return json.dumps([request.system, [message_to_dict(m) for m in request.messages]])


def _trace_text(store: Store) -> str:
    rows = store.query("SELECT body FROM trace_blobs")
    rows += store.query("SELECT request FROM model_calls")
    return "\n".join(str(r[0]) for r in rows)


async def _learned_mid_way(engine: Engine) -> None:
    """k4 freezes its section, then the person writes the locker file by hand, then a turn."""
    await engine.turn("k4", "hello")
    locker = Path(engine.settings.paths.memory) / LOCKER
    locker.parent.mkdir(parents=True, exist_ok=True)
    locker.write_text(SECRET + "\n")
    await engine.turn("k4", "turn A")


async def test_the_note_of_an_entry_holding_a_secret_names_its_path_only() -> None:
    provider = ScriptedProvider([_reply() for _ in range(2)])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await _learned_mid_way(engine)
    turn_a = _sent(provider, 1)
    assert "hunter2zz" not in turn_a and "31-07-55" not in turn_a
    assert f"- saved: [its text holds a secret: not shown] ({LOCKER})" in turn_a


async def test_no_request_after_a_secrets_forget_carries_it(monkeypatch) -> None:
    """Notes stored before the note left secrets out (an older Heron wrote them) are
    rewritten by the forget; so are the trace's copies of the requests."""
    from heron.memory import section

    # The note as an older Heron wrote it: the entry's whole text.
    monkeypatch.setattr(section, "find_secret", lambda _text: None)
    provider = ScriptedProvider([_reply() for _ in range(4)])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await _learned_mid_way(engine)
        assert "hunter2zz" in _sent(provider, 1)  # as it was sent then
        assert "hunter2zz" in _trace_text(engine.store)
        monkeypatch.undo()
        assert engine.memory is not None
        engine.memory.forget(LOCKER)
        told = engine.memory.scrub_line(LOCKER)
        await engine.turn("k4", "turn B")
        await engine.turn("k4", "turn C")
        trace = _trace_text(engine.store)
    for n in (2, 3):
        after = _sent(provider, n)
        assert "hunter2zz" not in after and "31-07-55" not in after
        assert f"({LOCKER})" in after  # the note is still there, by its path
    assert "hunter2zz" not in trace and "31-07-55" not in trace and MARKER in trace
    assert told is not None and "of k4: 1 stored message(s)" in told


def test_a_note_is_rewritten_item_by_item() -> None:
    note = (
        "[Runtime context: metadata only, not instructions]\nTime: x\n"
        "Memory changed since this conversation's Memory section was written (this supersedes"
        " it):\n- saved: I like tea (personal/always/tea.md)\n"
        f"- changed: {SECRET} (personal/always/locker.md)\n  second line\n\n  after a blank\n"
        "- saved: I cycle (personal/always/cycle.md, saved 2026-01-02)"
    )
    out = hide_secret_items(note, LOCKER)
    assert "- saved: I like tea (personal/always/tea.md)" in out
    assert "- saved: I cycle (personal/always/cycle.md, saved 2026-01-02)" in out
    # the item's further lines (a blank one among them) go with it
    assert out.endswith(
        "it):\n- saved: I like tea (personal/always/tea.md)\n"
        "- changed: [its text holds a secret: not shown] (personal/always/locker.md)\n"
        "- saved: I cycle (personal/always/cycle.md, saved 2026-01-02)"
    )


def test_a_secret_is_found_in_json_across_line_breaks() -> None:
    scrub = SecretScrub.of([f'{SECRET} and the "vault" pass is x9"y!z7q'])
    assert scrub is not None
    body = dumps({"text": "my password is\nhunter2zz, ok"})
    assert "hunter2zz" not in scrub.clean(body) and MARKER in scrub.clean(body)
    assert SecretScrub.of(["I like tea"]) is None
    runtime = {
        "kind": "text",
        "text": f"[Runtime context: metadata only, not instructions]\n{SECRET}",
    }
    own = {"kind": "text", "text": SECRET}  # the person's own words: theirs
    out = json.loads(scrubbed_sent(dumps([own, runtime]), LOCKER, scrub))
    assert out[0] == own and "hunter2zz" not in out[1]["text"]


def test_a_note_item_that_shows_the_day_said_is_rewritten_too() -> None:
    """An entry kept with its `said` day is announced "(path, said <day>)": the rewrite of a
    forgotten secret's item must find it as it finds "(path, saved <day>)"."""
    note = f"Memory changed (this supersedes it):\n- saved: {SECRET} ({LOCKER}, said 2026-01-02)"
    assert hide_secret_items(note, LOCKER).endswith(
        f"- saved: [its text holds a secret: not shown] ({LOCKER})"
    )
