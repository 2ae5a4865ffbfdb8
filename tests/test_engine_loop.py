"""The AgentLoop: conversations concurrent, one turn per conversation, follow-ups in the mailbox,
/stop keeping finished tool work, stale turns writing nothing."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections import defaultdict

import pytest
from engine_child import quick
from waiting import until

from heron.agent import leases
from heron.agent.control import MAIL_LABEL, MAIL_META
from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop
from heron.agent.turn import STOPPED, Outcome
from heron.bus import Dispatcher, InboundMessage, MessageBus, OutboundMessage
from heron.config import Settings
from heron.context.repair import is_well_formed
from heron.messages import Reply, Text, ToolCall, Usage
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest
from heron.store import engine_state as es
from heron.tools.context import ToolContext
from heron.tools.message import with_message_tool
from heron.tools.registry import ToolRegistry, tool
from heron.trace.read import load_run


def _conv_of(request: ChatRequest) -> str:
    return request.messages[0].text.split()[0]


LATENCY, CONVERSATIONS, TURNS = 0.1, 50, 5  # bench/concurrency.py times this


async def test_fifty_conversations_five_turns_concurrently_in_order(tmp_path, monkeypatch):
    """No two turns of one conversation at once, every turn finished, each conversation's answers
    in order. How long it takes is a figure of bench/concurrency.py, never an assertion here."""
    monkeypatch.setenv("HERON_HOME", str(tmp_path / "home"))
    await _fifty_by_five()


async def _fifty_by_five() -> None:
    latency, conversations, turns = LATENCY, CONVERSATIONS, TURNS
    inflight: dict[str, int] = defaultdict(int)
    overlaps: list[str] = []

    async def answer(request: ChatRequest) -> Reply:
        conv = _conv_of(request)
        inflight[conv] += 1
        if inflight[conv] > 1:
            overlaps.append(conv)
        await asyncio.sleep(latency)
        inflight[conv] -= 1
        said = request.messages[-1].parts[0].text  # the user's words, not the runtime block
        return Reply([Text(f"ok {said}")], "done", Usage(10, 2))

    bus = MessageBus()
    dispatcher = Dispatcher(bus)
    answers: dict[str, list[str]] = defaultdict(list)

    lean = ToolRegistry([])  # the loop is under test, not the size of the tool schemas
    async with Engine.open(
        Settings.load(), provider=ScriptedProvider(answer), registry=lean
    ) as engine:
        loop = AgentLoop(engine, bus)

        async def on_answer(out: OutboundMessage) -> None:
            answers[out.chat_id].append(out.text)
            n = len(answers[out.chat_id])
            if n < turns:  # the user answers the answer: next turn of this conversation
                await loop.dispatch(InboundMessage("test", out.chat_id, f"{out.chat_id} t{n}"))

        dispatcher.register("test", on_answer)
        pump = asyncio.create_task(dispatcher.run())
        for i in range(conversations):
            await loop.dispatch(InboundMessage("test", f"c{i}", f"c{i} t0"))
        while sum(len(a) for a in answers.values()) < conversations * turns:
            await asyncio.sleep(0.01)
        pump.cancel()
        store = engine.store
        rows = store.query("SELECT conversation_id, started, ended, status FROM turns")

    assert not overlaps
    assert all(a == [f"ok c{c[1:]} t{j}" for j in range(turns)] for c, a in answers.items())
    assert len(rows) == conversations * turns and {r["status"] for r in rows} == {"done"}
    by_conv: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        by_conv[r["conversation_id"]].append((r["started"], r["ended"]))
    for spans in by_conv.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


async def test_concurrent_turns_on_one_key_are_serialized_by_the_lease():
    inflight = [0]
    peak = [0]

    async def answer(request: ChatRequest) -> Reply:
        inflight[0] += 1
        peak[0] = max(peak[0], inflight[0])
        await asyncio.sleep(0.02)
        inflight[0] -= 1
        return Reply([Text("ok")], "done")

    async with Engine.open(Settings.load(), provider=ScriptedProvider(answer)) as engine:
        results = await asyncio.gather(*(engine.turn("same", f"m{i}") for i in range(6)))
        conv = engine.store.conversation("same")
        rows = engine.store.branch(conv.id)
    assert peak[0] == 1
    assert all(r.ok for r in results)
    # Each turn's answer directly follows its own question: no interleaving.
    assert [r.role for r in rows] == ["user", "assistant"] * 6
    assert all(rows[i].turn_id == rows[i + 1].turn_id for i in range(0, 12, 2))


def _gate_registry() -> tuple[ToolRegistry, asyncio.Event, threading.Event]:
    gate = asyncio.Event()
    thread_gate = threading.Event()

    @tool
    async def wait_gate(ctx: ToolContext) -> str:
        """Wait until the test opens the gate."""
        await gate.wait()
        return "gate passed"

    @tool
    def slow(ctx: ToolContext) -> str:
        """Block a thread until the test releases it (cannot be cancelled)."""
        thread_gate.wait(10)
        return "slow done"

    return with_message_tool(ToolRegistry([wait_gate, quick, slow])), gate, thread_gate


async def test_follow_up_sent_mid_turn_is_answered_in_the_same_turn():
    registry, gate, _ = _gate_registry()
    provider = ScriptedProvider(
        [
            Reply([ToolCall("c1", "wait_gate", {})], "tool"),
            Reply([Text("Done, and yes: blue.")], "done"),
        ]
    )
    bus = MessageBus()
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        loop = AgentLoop(engine, bus)
        await loop.dispatch(InboundMessage("t", "1", "start the job"))
        await until(lambda: len(provider.requests) == 1)
        await loop.dispatch(InboundMessage("t", "1", "also, make it blue"))
        gate.set()
        await loop.wait_idle()
        turns = engine.store.query("SELECT COUNT(*) FROM turns")[0][0]
    out = []
    while not bus.outbound.empty():
        out.append(bus.outbound.get_nowait())
    assert turns == 1
    second = provider.requests[1].messages[-1]
    assert second.tool_results[0].content == "gate passed"
    assert second.text == MAIL_LABEL + "also, make it blue"
    assert [(o.kind, o.text) for o in out] == [("answer", "Done, and yes: blue.")]
    provider.assert_complete()


async def test_a_resume_to_another_conversation_while_a_turn_runs_is_refused_at_once():
    """`/resume KEY` queued behind the running turn left the channel where it was until that
    turn ended, so the next message went to the old conversation as mail (QA22t #2): it is
    refused at once with what to do. A `/resume` without a key (the list) still waits."""
    registry, gate, _ = _gate_registry()
    provider = ScriptedProvider(
        [Reply([ToolCall("c1", "wait_gate", {})], "tool"), Reply([Text("done")], "done")]
    )
    bus = MessageBus()
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        loop = AgentLoop(engine, bus)
        await loop.dispatch(InboundMessage("t", "1", "start the job", events=True))
        await until(lambda: len(provider.requests) == 1)
        await loop.dispatch(InboundMessage("t", "1", "/resume other", events=True))
        assert loop.pending("t:1") == 0
        await loop.dispatch(InboundMessage("t", "1", "/resume", events=True))
        assert loop.pending("t:1") == 1
        gate.set()
        await loop.wait_idle()
    out = [bus.outbound.get_nowait() for _ in range(bus.outbound.qsize())]
    said = [o for o in out if isinstance(o, OutboundMessage) and o.kind == "error"]
    assert len(said) == 1 and "/resume other" in said[0].text
    assert "once this turn ends" in said[0].text and said[0].switch_to is None
    assert loop.routes == {}


async def test_a_workers_mail_joins_the_running_turn_stored_with_its_id():
    """heron/scale/: a follow-up queued in its own right is offered to the turn opened by
    another message (`post_mail`); the turn stores it with its id, by which its own workflow
    later knows it was answered. Offered to a turn that does not run here: refused."""
    registry, gate, _ = _gate_registry()
    provider = ScriptedProvider(
        [Reply([ToolCall("c1", "wait_gate", {})], "tool"), Reply([Text("blue it is")], "done")]
    )
    bus = MessageBus()
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        loop = AgentLoop(engine, bus)
        await loop.dispatch(InboundMessage("t", "1", "start the job", events=True, id="m1"))
        await until(lambda: len(provider.requests) == 1)
        follow_up = InboundMessage("t", "1", "also, make it blue", events=True, id="m2")
        assert not loop.post_mail(follow_up, into="another")
        assert loop.post_mail(follow_up, into="m1")
        gate.set()
        await loop.wait_idle()
        rows = engine.store.query("SELECT parts, meta FROM messages WHERE meta IS NOT NULL")
    kinds = [o.kind for o in [bus.outbound.get_nowait() for _ in range(bus.outbound.qsize())]]
    assert kinds.count("mail") == 1 and "queued" not in kinds
    assert provider.requests[1].messages[-1].text == MAIL_LABEL + "also, make it blue"
    assert [json.loads(r["meta"]) for r in rows] == [{MAIL_META: ["m2"]}]
    assert "tool_result" in rows[0]["parts"]  # the mail rides with the tool's result


async def test_a_workers_mail_the_turn_never_read_is_left_to_its_own_turn():
    """Mail offered once the run passed its last drain is "queued"; mail a /stop overtook is
    not run here (in-process mail would be: it exists nowhere else), since its own workflow
    opens the next turn."""
    registry, _, _ = _gate_registry()
    provider = ScriptedProvider([Reply([ToolCall("c1", "wait_gate", {})], "tool")])
    bus = MessageBus()
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        loop = AgentLoop(engine, bus)
        await loop.dispatch(InboundMessage("t", "1", "start", events=True, id="m1"))
        await until(lambda: len(provider.requests) == 1)
        assert loop.post_mail(InboundMessage("t", "1", "read later", events=True, id="m2"), "m1")
        control = loop.active_control("t:1")
        assert control is not None
        control.accepting_mail = False  # as after the run's last drain
        assert loop.post_mail(InboundMessage("t", "1", "too late", events=True, id="m3"), "m1")
        await loop.dispatch(InboundMessage("t", "1", "/stop"))
        await loop.wait_idle()
        turns = engine.store.query("SELECT COUNT(*) FROM turns")[0][0]
    events = [bus.outbound.get_nowait() for _ in range(bus.outbound.qsize())]
    assert [(e.kind, e.text) for e in events if e.kind in ("mail", "queued")] == [
        ("mail", "read later"),  # what was sent, for the conversation's other clients
        ("queued", "too late"),
    ]
    assert turns == 1 and len(provider.requests) == 1  # no turn opened here for m2 or m3


async def test_stop_during_a_tool_keeps_finished_results_and_the_stale_turn_writes_nothing():
    registry, _, thread_gate = _gate_registry()
    provider = ScriptedProvider(
        [
            Reply([ToolCall("a", "quick", {"n": 1}), ToolCall("b", "slow", {})], "tool"),
            Reply([Text("next turn answer")], "done"),
        ]
    )
    bus = MessageBus()
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        store = engine.store
        loop = AgentLoop(engine, bus)
        await loop.dispatch(InboundMessage("t", "1", "do two things"))
        conv_id = None

        def checkpointed() -> bool:
            return bool(store.query("SELECT 1 FROM checkpoints"))

        await until(checkpointed)
        conv_id = store.conversation("t:1").id
        await loop.dispatch(InboundMessage("t", "1", "/stop"))
        assert not loop.running("t:1")
        snapshot = _dump(store)
        thread_gate.set()  # the uncancellable tool thread now finishes
        await asyncio.sleep(0.1)
        assert _dump(store) == snapshot  # the stale turn wrote nothing after the stop
        await loop.dispatch(InboundMessage("t", "1", "what happened?"))
        await loop.wait_idle()
        branch = store.branch(conv_id)
    outs = [bus.outbound.get_nowait() for _ in range(bus.outbound.qsize())]
    assert ("command", "Stopped. What the turn finished is kept.") in [
        (o.kind, o.text) for o in outs
    ]
    sent = provider.requests[1].messages
    results = {r.call_id: r for m in sent for r in m.tool_results}
    assert results["a"].content == "quick 1 done" and not results["a"].is_error
    assert results["b"].is_error and "interrupted" in results["b"].content
    assert is_well_formed(sent) and is_well_formed([r.wire for r in branch])
    assert snapshot["turns"][0][1] == "interrupted"
    assert not snapshot["checkpoints"]


@pytest.mark.parametrize("gate_opens", [True, False], ids=["tool-ends", "tool-waits"])
async def test_a_turn_stopped_by_another_process_keeps_what_it_finished_and_nothing_after(
    monkeypatch, gate_opens
):
    """/stop from another process only bumps the stored epoch. The turn stops as /stop here
    stops it, whether its tool ends after the bump (its next commit finds it stale) or never
    does (its watch of the epoch notices): the call's result is not written, the record is
    closed as a stopped turn's is, and the turn says what stopped it. The trace keeps the call
    as the conversation does: interrupted (QA21r finding 12)."""
    monkeypatch.setattr(leases, "EPOCH_POLL", 0.05)
    registry, gate, _ = _gate_registry()
    provider = ScriptedProvider([Reply([ToolCall("c1", "wait_gate", {})], "tool", Usage(3, 1))])
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        store = engine.store
        task = asyncio.create_task(engine.turn("k", "go"))
        await until(lambda: len(provider.requests) == 1)
        await until(lambda: len(store.all_messages(store.conversation("k").id)) == 2)
        conv_id = store.conversation("k").id
        es.bump_epoch(store, conv_id, "/stop from heron run (process 1)")  # as that one does
        if gate_opens:
            gate.set()
        result = await asyncio.wait_for(task, 10)  # no gate: only the watch can end it
        after = store.all_messages(conv_id)
        tool_rows = store.query("SELECT result FROM tool_calls")
        (stopped,) = load_run(store, store.turns(conv_id)[0].run_id).tools
        turn = store.turns(conv_id)[0]
        holder = es.lease_holder(store, conv_id)
    assert result.outcome is Outcome.STALE and result.reply is None and not result.ok
    assert result.stopped_by == "/stop from heron run (process 1)"
    assert [m.role for m in after] == ["user", "assistant", "user", "assistant"]
    (closed,) = after[2].message.tool_results
    assert closed.is_error and "interrupted" in closed.content  # never "gate passed"
    assert after[3].message.text == STOPPED
    assert [r[0] for r in tool_rows] == [closed.content] and holder is None
    assert stopped.interrupted
    assert (turn.status, turn.model_calls) == ("interrupted", 1)
    assert is_well_formed([m.wire for m in after])


async def test_soft_break_wraps_up_at_the_next_drain():
    registry, gate, _ = _gate_registry()
    provider = ScriptedProvider(
        [
            Reply([ToolCall("c1", "wait_gate", {})], "tool"),
            Reply([Text("Stopped here: the gate passed, nothing else done.")], "done"),
        ]
    )
    bus = MessageBus()
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        loop = AgentLoop(engine, bus)
        await loop.dispatch(InboundMessage("t", "1", "long job"))
        await until(lambda: len(provider.requests) == 1)
        assert loop.request_break("t:1")
        gate.set()
        await loop.wait_idle()
        turn = engine.store.turns(engine.store.conversation("t:1").id)[0]
    wrap = provider.requests[1]
    # The wrap-up keeps the run's tools (the cached prefix holds) and is told not to call them.
    assert wrap.tools == provider.requests[0].tools != []
    assert "asked you to stop" in wrap.messages[-1].text
    assert turn.stop_reason == "wrapup"


async def test_soft_break_escalates_to_hard_when_the_run_never_drains():
    registry, _gate, _ = _gate_registry()
    provider = ScriptedProvider([Reply([ToolCall("c1", "wait_gate", {})], "tool")])
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        loop = AgentLoop(engine, MessageBus(), break_grace=0.05)
        await loop.dispatch(InboundMessage("t", "1", "hang"))
        await until(lambda: len(provider.requests) == 1)
        loop.request_break("t:1")
        await loop.wait_idle()
        conv = engine.store.conversation("t:1")
        turn = engine.store.turns(conv.id)[0]
        branch = engine.store.branch(conv.id)
    assert turn.status == "interrupted"
    assert branch[-1].role == "assistant" and "stopped" in branch[-1].message.text
    assert is_well_formed([r.wire for r in branch])


async def test_outcomes_spoke_via_tool_and_silent():
    registry, _, _ = _gate_registry()
    provider = ScriptedProvider(
        [
            Reply([ToolCall("m1", "message", {"text": "The build broke."})], "tool"),
            Reply([Text("I told the user.")], "done"),
            Reply([Text("Nothing to report.")], "done"),
        ]
    )
    bus = MessageBus()
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        loop = AgentLoop(engine, bus)
        await loop.dispatch(InboundMessage("sched", "1", "check the build", provenance="scheduled"))
        await loop.wait_idle()
        await loop.dispatch(InboundMessage("sched", "2", "check again", provenance="scheduled"))
        await loop.wait_idle()
    outs = [bus.outbound.get_nowait() for _ in range(bus.outbound.qsize())]
    assert [(o.kind, o.text, o.chat_id) for o in outs] == [("message", "The build broke.", "1")]


def _dump(store) -> dict[str, list]:
    return {
        "messages": [tuple(r) for r in store.query("SELECT * FROM messages ORDER BY id")],
        "turns": [tuple(r)[4:6] for r in store.query("SELECT * FROM turns ORDER BY id")],
        "tool_calls": [tuple(r) for r in store.query("SELECT * FROM tool_calls ORDER BY id")],
        "checkpoints": [tuple(r) for r in store.query("SELECT * FROM checkpoints")],
        "model_calls": [r[0] for r in store.query("SELECT id FROM model_calls ORDER BY id")],
    }


async def test_mail_a_stop_overtook_in_a_turn_heron_started_is_kept_as_the_persons():
    """Mail the run never read opens the next turn. It was replayed with the running turn's own
    message: in a goal's nudge turn, the person's words were stored as Heron's synthetic nudge
    (never quotable for memory, titled and counted as the goal's), under the nudge's id."""
    from heron.bus import TurnOptions

    registry, _, _ = _gate_registry()
    provider = ScriptedProvider(
        [Reply([ToolCall("c1", "wait_gate", {})], "tool"), Reply([Text("On it.")], "done")]
    )
    bus = MessageBus()
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        loop = AgentLoop(engine, bus)
        options = TurnOptions(message_meta={"synthetic": True, "goal": 1}, title="Owls")
        nudge = InboundMessage("goal", "g", "[nudge]", "t:1", "goal", options=options, id="n1")
        await loop.dispatch(nudge)
        await until(lambda: len(provider.requests) == 1)
        await loop.dispatch(InboundMessage("web", "w", "also count the bats", "t:1"))
        await loop.dispatch(InboundMessage("web", "w", "/stop", "t:1"))
        await loop.wait_idle()
        rows = engine.store.branch(engine.store.conversation("t:1").id)
    mine = next(r for r in rows if "count the bats" in r.message.text)
    assert mine.author == "user" and not mine.meta.get("synthetic")
    assert len(provider.requests) == 2  # the mail got its turn


async def test_mail_a_stop_overtook_does_not_carry_the_turns_attachments_again():
    from heron.messages import File

    registry, _, _ = _gate_registry()
    provider = ScriptedProvider(
        [Reply([ToolCall("c1", "wait_gate", {})], "tool"), Reply([Text("Fine.")], "done")]
    )
    bus = MessageBus()
    notes = File("text/plain", b"line one\n", name="notes.txt")
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        loop = AgentLoop(engine, bus)
        await loop.dispatch(InboundMessage("t", "1", "read this", files=(notes,)))
        await until(lambda: len(provider.requests) == 1)
        await loop.dispatch(InboundMessage("t", "1", "and be brief"))
        await loop.dispatch(InboundMessage("t", "1", "/stop"))
        await loop.wait_idle()
        rows = engine.store.branch(engine.store.conversation("t:1").id)
    with_file = [r.message.text for r in rows if "line one" in r.message.text]  # sent inline
    assert len(with_file) == 1 and "read this" in with_file[0]
    assert len(provider.requests) == 2


async def test_a_stop_right_after_the_message_keeps_it_stored_with_a_stopped_reply():
    """/stop dispatched right behind the message it stops (the chat's Ctrl-C a moment after
    Enter): the turn was cancelled before it stored the message, so the person's words were
    lost and nothing was left to --retry. The stop now lets the message be stored first."""
    provider = ScriptedProvider([Reply([Text("too late")], "done")], latency_s=60)
    bus = MessageBus()
    async with Engine.open(Settings.load(), provider=provider) as engine:
        loop = AgentLoop(engine, bus)
        await loop.dispatch(InboundMessage("t", "1", "explain"))  # its turn has not run yet
        await loop.dispatch(InboundMessage("t", "1", "/stop"))
        await loop.wait_idle()
        rows = engine.store.branch(engine.store.conversation("t:1").id)
    said = [(r.message.role, r.message.text, bool(r.meta.get("interrupted"))) for r in rows]
    assert said[0][:2] == ("user", "explain")
    assert said[1][0] == "assistant" and said[1][2]  # the minimal stopped reply


async def test_a_stop_while_the_lease_is_busy_elsewhere_says_the_message_was_not_kept():
    """A turn waiting for a lease another session holds may wait for minutes: the stop does not
    wait for its message to be stored, and the person is told it was not kept."""
    from heron.agent.loop import STOPPED_UNSAVED

    held, release = asyncio.Event(), asyncio.Event()

    async def answer(request: ChatRequest) -> Reply:
        held.set()
        await release.wait()
        return Reply([Text("the other session's answer")], "done")

    bus = MessageBus()
    async with Engine.open(Settings.load(), provider=ScriptedProvider(answer)) as engine:
        other = asyncio.create_task(engine.turn("t:1", "a long question"))  # holds the lease
        await held.wait()
        loop = AgentLoop(engine, bus)
        await loop.dispatch(InboundMessage("t", "1", "explain"))
        await until(lambda: bus.outbound.qsize() > 0)  # "busy in another session"
        await loop.dispatch(InboundMessage("t", "1", "/stop"))
        await loop.wait_idle()
        release.set()
        await other
        rows = engine.store.branch(engine.store.conversation("t:1").id)
    said = [bus.outbound.get_nowait().text for _ in range(bus.outbound.qsize())]
    assert said[0].startswith("busy in another session") and STOPPED_UNSAVED in said
    assert [r.message.text for r in rows if r.message.role == "user"] == ["a long question"]


async def test_mail_a_failed_turn_never_read_tells_its_sender_before_that_turns_end():
    """Its sender (`heron run` through a serve) took the failed turn's end for its own answer
    (qa24g M3): it is told "carried", then the next turn answers it."""
    from heron.bus import TurnEvent
    from heron.errors import ProviderError

    release = asyncio.Event()

    async def answer(request: ChatRequest) -> Reply:
        if len(provider.requests) == 1:
            await release.wait()
            raise ProviderError("the model server sent nothing")
        return Reply([Text("reply to: second question")], "done")

    provider = ScriptedProvider(answer)
    bus = MessageBus()
    async with Engine.open(Settings.load(), provider=provider) as engine:
        loop = AgentLoop(engine, bus)
        await loop.dispatch(InboundMessage("script", "a", "first", "m", events=True))
        await until(lambda: len(provider.requests) == 1)
        await loop.dispatch(InboundMessage("script", "b", "second question", "m", events=True))
        release.set()
        await until(lambda: len(provider.requests) == 2)
        await loop.wait_idle()
    said: list[tuple[str, str]] = []
    while not bus.outbound.empty():
        ev = bus.outbound.get_nowait()
        if isinstance(ev, TurnEvent) and ev.kind in ("mail", "carried", "turn_start", "turn_end"):
            said.append((ev.chat_id, ev.kind))
    assert said == [
        ("a", "turn_start"),
        ("b", "mail"),
        ("b", "carried"),
        ("a", "turn_end"),
        ("b", "turn_start"),
        ("b", "turn_end"),
    ]
