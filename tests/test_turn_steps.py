"""The turn's steps: the transition table is what their return annotations say, the driver
refuses any other move, and RUN leaves the final reply for SAVE's one transaction."""

from __future__ import annotations

import typing

import pytest

from heron.agent import turn as turn_module
from heron.agent.engine import Engine
from heron.agent.turn import STEPS, TRANSITIONS, PendingSave, State
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall, Usage
from heron.providers.scripted import ScriptedProvider


def test_every_state_but_done_has_a_step_and_the_table_follows_the_annotations():
    assert set(STEPS) == set(State) - {State.DONE}
    for state, step in STEPS.items():
        returned = typing.get_type_hints(step)["return"]
        kinds = typing.get_args(returned) or (returned,)
        assert TRANSITIONS[state] == {kind.next for kind in kinds}, state
    assert TRANSITIONS[State.RUN] == {State.RUN, State.SAVE}
    assert TRANSITIONS[State.COMMAND] == {State.BUILD, State.RESPOND}
    assert "COMPACT" not in State.__members__  # compaction runs inside BUILD and RUN


def test_each_result_is_frozen_and_names_one_next_state():
    kinds = {
        kind
        for step in STEPS.values()
        for kind in typing.get_args(typing.get_type_hints(step)["return"])
        or (typing.get_type_hints(step)["return"],)
    }
    for kind in kinds:
        assert kind.__dataclass_params__.frozen, kind
        assert isinstance(kind.next, State), kind


async def test_the_driver_refuses_a_move_the_table_does_not_allow(monkeypatch):
    async def restore_then_jump(t, _):
        return turn_module.Answered("skipped the build")  # RESTORE may only lead to COMMAND

    monkeypatch.setitem(STEPS, State.RESTORE, restore_then_jump)
    provider = ScriptedProvider([])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        with pytest.raises(RuntimeError, match="illegal turn transition RESTORE -> RESPOND"):
            await engine.turn("k", "hello")


async def test_run_hands_save_the_final_reply_uncommitted(monkeypatch):
    """RUN's PendingSave carries the final reply; only SAVE's transaction stores it."""
    seen: list[tuple[int, int, int]] = []
    save = STEPS[State.SAVE]

    async def observed_save(t, pending: PendingSave):
        stored = await t.engine.store.call(t.engine.store.branch, t.conversation.id)
        seen.append((len(pending.final), len(stored), pending.figures.tool_calls))
        return await save(t, pending)

    monkeypatch.setitem(STEPS, State.SAVE, observed_save)
    call = ToolCall("c1", "read_file", {"path": "notes.txt"})
    answer = Reply([Text("It says hi.")], "done", Usage(12, 3))
    provider = ScriptedProvider([Reply([call], "tool_use", Usage(10, 2)), answer])
    settings = Settings.load()
    settings.paths.ensure()
    (settings.paths.workspace / "notes.txt").write_text("hi\n")
    async with Engine.open(settings, provider=provider) as engine:
        result = await engine.turn("k", "what is in notes.txt?")
        rows = engine.store.branch(result.conversation.id)
        turn = engine.store.turns(result.conversation.id)[-1]
    # Before SAVE: the user's message, the call and its result; the answer waits in `final`.
    assert seen == [(1, 3, 1)]
    assert [r.role for r in rows] == ["user", "assistant", "user", "assistant"]
    assert rows[-1].message.text == "It says hi." and result.reply == "It says hi."
    assert turn.status == "done" and turn.model_calls == 2 and turn.tool_calls == 1
