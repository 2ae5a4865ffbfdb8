"""An engine process of its own, for tests/test_engine_processes.py: the store it opens is the
one `Settings.load()` names (HERON_HOME's file, or HERON_DATABASE_URL), as `heron run` would.

`python tests/engine_child.py MODE ...`, one mode per scenario:

- `turns KEY PREFIX COUNT UNTIL`: turns on one conversation against the model HERON_BASE_URL
  names, COUNT of them (or until the conversation has UNTIL turns), saying "ready" once open
  and "saved ID" once each message is committed.
- `load NAME CONVERSATIONS TURNS LATENCY`: an AgentLoop sending TURNS messages to each of the
  conversations c0..c{N-1}, the next after the answer to the previous one, to a scripted model
  that takes LATENCY seconds; waits for a line on stdin before it starts; prints one JSON line.
- `gate KEY TEXT`: one turn whose model calls `quick` and `wait_gate` (which returns once the
  file HERON_HOME/gate exists), then answers "gate done"; prints the turn's outcome.
- `say KEY TEXT`: one turn (a slash command or a message to a scripted model that answers
  "ok"); prints "busy" when it has to wait, then the reply and the messages the model saw.
- `mail KEY`: an AgentLoop whose turn in KEY waits on the gate (never opened); a follow-up
  mailed into it and a message with a file queued behind it; prints what the loop told the
  two senders (a JSON list: "mail", "queued"), then waits for the parent's kill -9.
- `maintain KEY`: a maintenance run (kind `learn`) in conversation KEY whose first model call
  answers and whose second never does; prints "calling" once the first is recorded, so the
  parent kills it in the middle of the run.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

from heron.agent.engine import Engine, TurnHooks
from heron.agent.loop import AgentLoop
from heron.bus import Dispatcher, InboundMessage, MessageBus, Outbound, TurnEvent
from heron.config import Settings
from heron.messages import File, Message, Reply, Text, ToolCall, Usage
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest
from heron.tools.context import ToolContext
from heron.tools.registry import ToolRegistry, tool


async def turns(key: str, prefix: str, count: int, until: int) -> None:
    async with Engine.open(Settings.load()) as engine:
        print("ready", flush=True)  # the parent's kill instants count from here
        hooks = TurnHooks(
            on_busy=lambda note: print(note, file=sys.stderr, flush=True),
            on_saved=lambda row: print(f"saved {row}", flush=True),
        )
        n = 0
        while True:
            conv = engine.store.conversation(key)
            done = len(engine.store.turns(conv.id)) if conv else 0
            if (until and done >= until) or (count and n >= count):
                return
            result = await engine.turn(key, f"{prefix} {done if until else n}", hooks)
            assert result.ok, result.run.error
            n += 1


async def load(name: str, conversations: int, turns: int, latency: float) -> None:
    inflight: dict[str, int] = defaultdict(int)
    overlaps: list[str] = []

    async def answer(request: ChatRequest) -> Reply:
        conv = request.messages[0].text.split()[0]
        inflight[conv] += 1
        overlaps.extend([conv] if inflight[conv] > 1 else [])
        await asyncio.sleep(latency)
        inflight[conv] -= 1
        return Reply([Text(f"ok {request.messages[-1].parts[0].text}")], "done", Usage(10, 2))

    answers: dict[str, list[str]] = defaultdict(list)
    errors: list[str] = []
    busy = 0
    bus = MessageBus()
    dispatcher = Dispatcher(bus)
    lean = ToolRegistry([])
    async with Engine.open(
        Settings.load(), provider=ScriptedProvider(answer), registry=lean
    ) as engine:
        loop = AgentLoop(engine, bus)

        async def on_out(out: Outbound) -> None:
            nonlocal busy
            text = getattr(out, "text", "")
            if getattr(out, "kind", "") == "notice" and "busy in another session" in text:
                busy += 1
            if getattr(out, "kind", "") == "error":
                errors.append(text)
            if getattr(out, "kind", "") != "answer":
                return
            answers[out.chat_id].append(text)
            if len(answers[out.chat_id]) < turns:
                n = len(answers[out.chat_id])
                await loop.dispatch(InboundMessage("test", out.chat_id, f"{out.chat_id} {name}{n}"))

        dispatcher.register("test", on_out)
        pump = asyncio.create_task(dispatcher.run())
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # both processes start together
        for i in range(conversations):
            await loop.dispatch(InboundMessage("test", f"c{i}", f"c{i} {name}0"))
        while True:  # until no turn runs and no answer waits to send the next message
            await loop.wait_idle()
            await bus.outbound.join()
            if not loop.busy:
                break
        pump.cancel()
    report = {"answers": answers, "overlaps": overlaps, "busy": busy, "errors": errors}
    print(json.dumps(report), flush=True)


@tool
def quick(ctx: ToolContext, n: int) -> str:
    """Return at once.

    Args:
        n: a number.
    """
    return f"quick {n} done"


def _gate_tools() -> ToolRegistry:
    gate = Path(os.environ["HERON_HOME"]) / "gate"

    @tool
    async def wait_gate(ctx: ToolContext) -> str:
        """Wait until the test opens the gate."""
        while not gate.exists():
            await asyncio.sleep(0.02)
        return "gate passed"

    return ToolRegistry([wait_gate, quick])


async def gate(key: str, text: str) -> None:
    calls = [ToolCall("a", "quick", {"n": 1}), ToolCall("b", "wait_gate", {})]
    provider = ScriptedProvider([Reply(calls, "tool"), Reply([Text("gate done")], "done")])
    async with Engine.open(Settings.load(), provider=provider, registry=_gate_tools()) as engine:
        result = await engine.turn(key, text)
    print(json.dumps({"outcome": result.outcome.value, "reply": result.reply}), flush=True)


async def say(key: str, text: str) -> None:
    provider = ScriptedProvider(lambda request: Reply([Text("ok")], "done"))
    hooks = TurnHooks(on_busy=lambda note: print("busy", flush=True))
    async with Engine.open(Settings.load(), provider=provider, registry=_gate_tools()) as engine:
        result = await engine.turn(key, text, hooks)
    seen = [_described(m) for m in provider.requests[0].messages] if provider.requests else []
    print(json.dumps({"reply": result.reply, "seen": seen}), flush=True)


MAILED = "MAIL: also make it blue"
QUEUED = "QUEUED: read the notes"
NOTES = File("text/plain", b"the attached line\n", name="notes.txt")


async def mail(key: str) -> None:
    provider = ScriptedProvider([Reply([ToolCall("g", "wait_gate", {})], "tool")])
    bus = MessageBus()
    async with Engine.open(Settings.load(), provider=provider, registry=_gate_tools()) as engine:
        loop = AgentLoop(engine, bus)
        await loop.dispatch(InboundMessage("terminal", "chat", "start the job", key, events=True))
        while not provider.requests:
            await asyncio.sleep(0.01)
        await loop.dispatch(InboundMessage("terminal", "chat", MAILED, key, events=True))
        queued = InboundMessage("web", "tab", QUEUED, key, events=True, files=(NOTES,))
        await loop.dispatch(queued)
        told = []
        while not bus.outbound.empty():
            item = bus.outbound.get_nowait()
            if isinstance(item, TurnEvent) and item.kind in ("mail", "queued"):
                told.append(item.kind)
        print(json.dumps(told), flush=True)
        await asyncio.Event().wait()  # the parent kills the process here


async def maintain(key: str) -> None:
    from heron.agent.maintenance import maintenance

    never = asyncio.Event()

    async def answer(request: ChatRequest) -> Reply:
        if len(provider.requests) > 1:
            await never.wait()  # the parent kills the process here
        return Reply([Text("reviewed")], "done", Usage(300, 30))

    provider = ScriptedProvider(answer)
    async with Engine.open(Settings.load(), provider=provider, registry=ToolRegistry([])) as engine:
        conversation = engine.store.open_conversation(key)
        async with maintenance(engine, conversation.id, "learn") as run:
            reviewer = run.provider(provider, "review")
            request = ChatRequest(provider.model, "review", [Message("user", [Text("review")])])
            await reviewer.chat(request)
            print("calling", flush=True)
            await reviewer.chat(request)


def _described(message: Message) -> dict[str, object]:
    return {
        "role": message.role,
        "text": message.text,
        "results": [[r.call_id, r.content, r.is_error] for r in message.tool_results],
    }


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "turns":
        asyncio.run(turns(args[0], args[1], int(args[2]), int(args[3])))
    elif mode == "load":
        asyncio.run(load(args[0], int(args[1]), int(args[2]), float(args[3])))
    elif mode == "gate":
        asyncio.run(gate(args[0], args[1]))
    elif mode == "say":
        asyncio.run(say(args[0], args[1]))
    elif mode == "mail":
        asyncio.run(mail(args[0]))
    elif mode == "maintain":
        asyncio.run(maintain(args[0]))
    else:
        raise SystemExit(f"unknown mode {mode}")
