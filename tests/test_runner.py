from __future__ import annotations

import asyncio

import pytest

from heron.agent.runner import CONTINUE, RetryFilter, RunHooks, RunLimits, Runner
from heron.context.repair import INTERRUPTED, is_well_formed, repair_tool_pairs
from heron.errors import AuthError, TransientProviderError
from heron.messages import Message, Reply, Text, ToolCall, ToolResult, Usage, user
from heron.providers.base import RetryPolicy
from heron.providers.profiles import ModelProfile
from heron.providers.scripted import ScriptedProvider
from heron.request import StreamEvent
from heron.tools.context import ToolContext
from heron.tools.registry import ToolRegistry, tool

INFLIGHT = {"now": 0, "peak": 0}  # slow_echo's calls in flight; reset by make_runner


@tool
async def slow_echo(ctx: ToolContext, text: str, seconds: float = 0.2) -> str:
    """Echo text after a pause.

    Args:
        text: What to echo.
        seconds: How long to wait.
    """
    INFLIGHT["now"] += 1
    INFLIGHT["peak"] = max(INFLIGHT["peak"], INFLIGHT["now"])
    try:
        await asyncio.sleep(seconds)
    finally:
        INFLIGHT["now"] -= 1
    return f"echo: {text}"


@tool
def explode(ctx: ToolContext) -> str:
    """Always fails."""
    raise RuntimeError("boom")


def make_runner(script, limits=RunLimits(), profile=ModelProfile()):
    INFLIGHT.update(now=0, peak=0)
    provider = ScriptedProvider(script)
    runner = Runner(
        provider,
        ToolRegistry([slow_echo, explode]),
        profile,
        limits,
        RetryPolicy(attempts=3, base_delay=0.0),
    )
    return provider, runner


def ctx(tmp_path):
    return ToolContext(workspace=tmp_path)


def call(id_, name, **args):
    return ToolCall(id_, name, args)


async def test_tools_run_concurrently_and_results_feed_back(tmp_path):
    provider, runner = make_runner(
        [
            Reply(
                [
                    Text("Checking."),
                    call("a", "slow_echo", text="x"),
                    call("b", "slow_echo", text="y"),
                ],
                "tool",
                Usage(10, 5),
            ),
            Reply([Text("Both done.")], "done", Usage(20, 3)),
        ]
    )
    saved, progress = [], []

    async def on_message(m):
        saved.append(m)

    result = await runner.run(
        "sys",
        [user("go")],
        ctx(tmp_path),
        RunHooks(on_message=on_message, on_progress=progress.append),
    )
    assert INFLIGHT["peak"] == 2  # the two tools in flight together, not one after the other
    assert result.stop == "done" and result.text == "Both done."
    assert result.usage == Usage(30, 8)
    assert progress == ["Checking."]
    assert saved == result.messages
    results = result.messages[1].tool_results
    assert [r.content for r in results] == ["echo: x", "echo: y"]
    # The second request carried the call and its results.
    second = provider.requests[1].messages
    assert second[-1].tool_results[0].call_id == "a"
    provider.assert_complete()


async def test_one_reply_runs_at_most_eight_tools_at_once(tmp_path):
    calls = [call(f"c{i}", "slow_echo", text=str(i), seconds=0.01) for i in range(20)]
    _, runner = make_runner(
        [Reply(calls, "tool", Usage(10, 5)), Reply([Text("All done.")], "done", Usage(20, 3))]
    )
    result = await runner.run("sys", [user("go")], ctx(tmp_path), RunHooks())
    assert INFLIGHT["peak"] == 8
    assert [r.content for r in result.messages[1].tool_results] == [f"echo: {i}" for i in range(20)]
    assert result.text == "All done."


async def test_tool_error_is_a_result_not_a_crash(tmp_path):
    _, runner = make_runner(
        [
            Reply([call("a", "explode"), call("b", "nope")], "tool"),
            Reply([Text("I see the errors.")], "done"),
        ]
    )
    result = await runner.run("", [user("go")], ctx(tmp_path), RunHooks())
    errs = result.messages[1].tool_results
    assert all(r.is_error for r in errs)
    assert "boom" in errs[0].content and "unknown tool" in errs[1].content
    assert result.stop == "done"


async def test_ceiling_ends_in_a_wrap_up_that_keeps_the_tools_for_the_cache(tmp_path):
    provider, runner = make_runner(
        [
            *(
                Reply([call(f"c{i}", "slow_echo", text="again", seconds=0)], "tool")
                for i in range(3)
            ),
            Reply([Text("Summary: done A, pending B.")], "done"),
        ],
        RunLimits(max_model_calls=3),
    )
    result = await runner.run("", [user("go")], ctx(tmp_path), RunHooks())
    assert result.stop == "wrapup"
    assert result.model_calls == 4  # three turns, then the wrap-up
    wrap, before = provider.requests[-1], provider.requests[-2]
    assert wrap.tools == before.tools != []  # the same tools: the cached prefix holds
    assert wrap.messages[: len(before.messages)] == before.messages
    assert "limit of 3 model calls" in wrap.messages[-1].text
    assert "Do not call tools" in wrap.messages[-1].text
    assert result.text == "Summary: done A, pending B."


async def test_a_wrap_up_that_calls_a_tool_is_asked_again_without_tools(tmp_path):
    loop_forever = lambda req: (  # noqa: E731
        Reply([Text("Summary: done A, pending B.")], "done")
        if not req.tools
        else Reply([call(f"c{len(req.messages)}", "slow_echo", text="again", seconds=0)], "tool")
    )
    provider, runner = make_runner(loop_forever, RunLimits(max_model_calls=3))
    events: list[StreamEvent] = []
    result = await runner.run("", [user("go")], ctx(tmp_path), RunHooks(on_event=events.append))
    assert result.stop == "wrapup"
    assert result.model_calls == 5  # three turns, the wrap-up that called a tool, the retry
    assert provider.requests[-2].tools != [] and provider.requests[-1].tools == []
    assert provider.requests[-1].messages == provider.requests[-2].messages
    assert result.text == "Summary: done A, pending B."
    assert not result.messages[-1].tool_calls  # the reply that called a tool is not kept
    # the set-aside reply (a tool call, no text) is marked as taken back, text and all
    assert [e.text for e in events if e.kind == "retry"] == [""]


async def test_token_ceiling(tmp_path):
    provider, runner = make_runner(
        [
            Reply([call("a", "slow_echo", text="x", seconds=0)], "tool", Usage(900, 200)),
            Reply([Text("wrapped")], "done"),
        ],
        RunLimits(max_tokens_total=1000),
    )
    result = await runner.run("", [user("go")], ctx(tmp_path), RunHooks())
    assert result.stop == "wrapup" and "1000 tokens" in provider.requests[1].messages[-1].text


async def test_empty_reply_is_retried_once(tmp_path):
    provider, runner = make_runner([Reply([], "done"), Reply([Text("hi")], "done")])
    result = await runner.run("", [user("go")], ctx(tmp_path), RunHooks())
    assert result.text == "hi" and len(provider.requests) == 2
    assert len(result.messages) == 1  # the empty reply is not kept


async def test_cut_reply_asks_to_continue(tmp_path):
    provider, runner = make_runner(
        [
            Reply([Text("part one ")], "length"),
            Reply([Text("part two")], "done"),
        ]
    )
    result = await runner.run("", [user("go")], ctx(tmp_path), RunHooks())
    assert provider.requests[1].messages[-1].text == CONTINUE
    assert result.stop == "done" and result.text == "part two"


async def test_transient_errors_retried_auth_ends_run(tmp_path):
    _, runner = make_runner(
        [
            TransientProviderError("503"),
            Reply([Text("ok")], "done"),
        ]
    )
    assert (await runner.run("", [user("go")], ctx(tmp_path), RunHooks())).text == "ok"
    _, runner = make_runner([AuthError("bad key", hint="Set ANTHROPIC_API_KEY")])
    result = await runner.run("", [user("go")], ctx(tmp_path), RunHooks())
    assert result.stop == "error" and isinstance(result.error, AuthError)


async def test_mail_is_drained_after_tools_and_after_final_reply(tmp_path):
    mailbox = [[], [Message("user", [Text("also: say bye")])], []]

    async def drain():
        return mailbox.pop(0) if mailbox else []

    provider, runner = make_runner(
        [
            Reply([call("a", "slow_echo", text="x", seconds=0)], "tool"),
            Reply([Text("done with x")], "done"),
            Reply([Text("bye")], "done"),
        ]
    )
    result = await runner.run("", [user("go")], ctx(tmp_path), RunHooks(drain=drain))
    assert result.text == "bye"
    assert provider.requests[2].messages[-1].text == "also: say bye"


async def test_the_answer_to_mail_after_a_final_reply_streams_as_a_paragraph_of_its_own(tmp_path):
    """`heron run` printed "...when it finishes.Echo: ..." (a subagent's result or a
    message read after the reply): the next reply starts a new paragraph."""
    mailbox = [[Message("user", [Text("and this")])]]

    async def drain():
        return mailbox.pop(0) if mailbox else []

    streamed: list[str] = []
    _, runner = make_runner([Reply([Text("first reply.")], "done"), Reply([Text("Echo")], "done")])
    hooks = RunHooks(drain=drain, on_event=lambda e: streamed.append(e.text))
    result = await runner.run("", [user("go")], ctx(tmp_path), hooks)
    assert result.text == "Echo"
    assert "".join(streamed) == "first reply.\n\nEcho"


async def test_history_with_unanswered_call_is_repaired_before_sending(tmp_path):
    crashed = [
        user("run it"),
        Message("assistant", [call("lost", "slow_echo", text="x")]),
        user("hello again"),
    ]
    provider, runner = make_runner([Reply([Text("ok")], "done")])
    await runner.run("", crashed, ctx(tmp_path), RunHooks())
    sent = provider.requests[0].messages
    assert is_well_formed(sent)
    assert sent[2].tool_results[0].content == INTERRUPTED
    assert sent[2].text == "hello again"


def test_repair_drops_orphan_results_and_fills_missing_ones():
    history = [
        Message("user", [ToolResult("ghost", "x"), Text("hi")]),
        Message("assistant", [ToolCall("a", "t", {}), ToolCall("b", "t", {})]),
        Message("user", [ToolResult("b", "fine")]),
        Message("assistant", [ToolCall("c", "t", {})]),
    ]
    fixed = repair_tool_pairs(history)
    assert is_well_formed(fixed)
    assert fixed[0].parts == (Text("hi"),)
    assert [r.call_id for r in fixed[2].tool_results] == ["a", "b"]
    assert fixed[-1].tool_results[0].call_id == "c"


@pytest.mark.parametrize("mode", ["fenced"])
async def test_fenced_mode_parses_tool_block_from_text(tmp_path, mode):
    from heron.providers.fenced import FencedTools

    inner = ScriptedProvider(
        [
            Reply(
                [
                    Text(
                        'Let me echo.\n```tool\n{"name": "slow_echo", "args": {"text": "hi", '
                        '"seconds": 0}}\n```'
                    )
                ],
                "done",
            ),
            Reply([Text("It said hi.")], "done"),
        ]
    )
    runner = Runner(FencedTools(inner), ToolRegistry([slow_echo]), ModelProfile(tool_mode=mode))
    result = await runner.run("base", [user("echo hi")], ctx(tmp_path), RunHooks())
    assert result.text == "It said hi."
    assert result.messages[1].tool_results[0].content == "echo: hi"
    # The tool-weak model never sees native tools: they are described in its system prompt,
    # and the call and its result come back to it as plain text.
    second = inner.requests[1]
    assert second.tools == [] and "slow_echo" in second.system
    assert "echo: hi" in second.messages[-1].text


async def test_an_always_empty_reply_fails_the_run_and_says_so(tmp_path):
    provider, runner = make_runner([Reply([], "done"), Reply([Text("  ")], "done")])
    saved = []

    async def on_message(m):
        saved.append(m)

    result = await runner.run("", [user("go")], ctx(tmp_path), RunHooks(on_message=on_message))
    assert result.stop == "error" and len(provider.requests) == 2
    assert "the model sent an empty reply twice (no text and no tool call)" in str(result.error)
    assert saved == []  # nothing empty is stored as an answer


def _filtered(*events: StreamEvent | None) -> list[StreamEvent]:
    """What a RetryFilter passes on; None in `events` stands for a retry."""
    seen: list[StreamEvent] = []
    shown = RetryFilter(seen.append)
    for event in events:
        if event is None:
            shown.retrying()
        else:
            shown(event)
    return seen


def test_a_retry_that_repeats_what_was_shown_prints_only_what_is_new():
    text = lambda s: StreamEvent("text", s)  # noqa: E731
    seen = _filtered(text("Hello "), text("wor"), None, text("Hel"), text("lo wo"), text("rld!"))
    assert seen == [text("Hello "), text("wor"), text("ld!")]


def test_a_retry_that_says_something_else_is_marked_once():
    text = lambda s: StreamEvent("text", s)  # noqa: E731
    seen = _filtered(text("partial text"), None, text("second "), text("try"))
    retry = StreamEvent("retry", "partial text")  # what it takes back
    assert seen == [text("partial text"), retry, text("second "), text("try")]


def test_a_retry_that_repeats_a_start_then_differs_shows_that_start_again():
    """The repeated start was held back: after the mark it is passed on, so the new attempt
    is shown whole (before, only its differing rest followed the mark)."""
    text = lambda s: StreamEvent("text", s)  # noqa: E731
    seen = _filtered(text("Hello wor"), text("ld"), None, text("Hello "), text("there"))
    retry = StreamEvent("retry", "Hello world")
    assert seen == [text("Hello wor"), text("ld"), retry, text("Hello "), text("there")]


async def test_a_stream_cut_and_retried_in_the_runner_is_not_shown_twice(tmp_path):
    calls = [0]

    class Cutting(ScriptedProvider):
        async def chat(self, request, on_event=None):
            calls[0] += 1
            if calls[0] == 1:
                on_event(StreamEvent("text", "The answer"))
                raise TransientProviderError("the stream broke off")
            return await super().chat(request, on_event)

    provider = Cutting([Reply([Text("The answer is 42.")], "done")])
    runner = Runner(
        provider, ToolRegistry([]), ModelProfile(), RunLimits(), RetryPolicy(base_delay=0.0)
    )
    seen: list[StreamEvent] = []
    result = await runner.run("", [user("go")], ctx(tmp_path), RunHooks(on_event=seen.append))
    assert result.text == "The answer is 42."
    assert "".join(e.text for e in seen) == "The answer is 42."
    assert not [e for e in seen if e.kind == "retry"]


@tool(writes=True)
async def slow_write(ctx: ToolContext, text: str) -> str:
    """Write something, slowly.

    Args:
        text: What to write.
    """
    await asyncio.sleep(0.05)
    return f"wrote {text}"


async def test_a_writing_call_is_timed_from_its_own_start_not_from_its_wait(tmp_path):
    """Tools that write run one at a time: the second call's time (its pill's) starts when it
    runs, after the first ended (the bug: from the reply, its wait for the first included)."""
    provider = ScriptedProvider(
        [
            Reply([call("a", "slow_write", text="1"), call("b", "slow_write", text="2")], "tool"),
            Reply([Text("Both written.")], "done"),
        ]
    )
    runner = Runner(provider, ToolRegistry([slow_write]), ModelProfile(), RunLimits())
    records = []

    async def on_tool_call(record):
        records.append(record)

    await runner.run("sys", [user("go")], ctx(tmp_path), RunHooks(on_tool_call=on_tool_call))
    first, second = sorted(records, key=lambda r: r.call.id)
    assert second.started >= first.ended  # it ran after the first, and is timed from then
