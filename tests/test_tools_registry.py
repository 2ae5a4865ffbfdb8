from __future__ import annotations

import asyncio
import functools
import subprocess
import sys
import threading
from pathlib import Path
from typing import Literal

import pytest

from heron.errors import ToolError
from heron.messages import ToolCall
from heron.saved import read_whole
from heron.tools.builtin import default_registry
from heron.tools.context import TurnServices
from heron.tools.registry import (
    MAX_PARALLEL_TOOLS,
    Tool,
    ToolContext,
    ToolOutput,
    ToolRegistry,
    bounded_gather,
    parse_docstring,
    tool,
)


async def together(registry: ToolRegistry, calls: list[ToolCall], ctx: ToolContext) -> list:
    """The calls of one reply, run as the runner runs them: at once, at most eight at a time."""
    return await bounded_gather([functools.partial(registry.call, c, ctx) for c in calls])


def sample(
    ctx: ToolContext,
    path: str,
    count: int = 3,
    tags: list[str] | None = None,
    mode: Literal["fast", "slow"] = "fast",
) -> str:
    """Do a sample thing
    over two lines.

    More detail the model never sees.

    Args:
        path: Where to look.
        count (int): How many
            to take.

    Returns:
        Something.
    """
    return f"{path}:{count}:{tags}:{mode}"


@tool
async def slow(ctx: ToolContext, seconds: float) -> str:
    """Sleep."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@tool
def boom(ctx: ToolContext) -> str:
    """Fail."""
    raise RuntimeError("kaput")


@tool
def refuse(ctx: ToolContext) -> str:
    """Fail on purpose."""
    raise ToolError("nothing to do", hint="Try something else.")


@tool
def big(ctx: ToolContext, size: int) -> str:
    """Return a lot."""
    return "".join(f"line {i}\n" for i in range(size))


@tool(name="flagged")
def exit_one(ctx: ToolContext) -> ToolOutput:
    """A failure with output."""
    return ToolOutput("output\n[exit code 1]", is_error=True)


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(workspace=tmp_path, result_budget=1000)


@pytest.fixture
def registry() -> ToolRegistry:
    return ToolRegistry([Tool.from_function(sample), slow, boom, refuse, big, exit_one])


def test_schema_from_hints_and_docstring() -> None:
    spec = Tool.from_function(sample).spec
    assert spec.name == "sample"
    assert spec.description == "Do a sample thing over two lines."
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Where to look."},
            "count": {"type": "integer", "default": 3, "description": "How many to take."},
            "tags": {"type": "array", "items": {"type": "string"}},
            "mode": {"type": "string", "enum": ["fast", "slow"], "default": "fast"},
        },
        "required": ["path"],
    }


def test_schema_has_no_titles_anywhere() -> None:
    for spec in default_registry().specs():
        assert "title" not in repr(spec.parameters), spec.name
        assert spec.parameters["type"] == "object"


def test_docstring_parsing_edge_cases() -> None:
    assert parse_docstring(None) == ("", {})
    summary, args = parse_docstring("One line.\n\nArgs:\n    a: first\n    b: second\n")
    assert summary == "One line."
    assert args == {"a": "first", "b": "second"}


def test_a_tool_needs_a_docstring() -> None:
    def nodoc(ctx: ToolContext) -> str:
        return ""

    with pytest.raises(TypeError, match="docstring"):
        Tool.from_function(nodoc)


def test_specs_keep_registration_order(registry: ToolRegistry) -> None:
    names = ["sample", "slow", "boom", "refuse", "big", "flagged"]
    assert registry.names() == names
    assert [s.name for s in registry.specs()] == names
    with pytest.raises(ValueError, match="already registered"):
        registry.add(boom)


def test_default_registry_names() -> None:
    assert default_registry().names() == [
        "read_file",
        "write_file",
        "edit_file",
        "list_files",
        "grep",
        "bash",
        "run_cell",
        "work_state",
        "todos",
        "scratchpad",
    ]


def test_a_tool_stays_callable_directly(ctx: ToolContext) -> None:
    assert big(ctx, 1) == "line 0\n"


async def test_valid_call_coerces_and_defaults(registry: ToolRegistry, ctx: ToolContext) -> None:
    result = await registry.call(ToolCall("c1", "sample", {"path": "a", "count": "5"}), ctx)
    assert result.call_id == "c1"
    assert not result.is_error
    assert result.content == "a:5:None:fast"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({}, "'path' is required"),
        ({"path": "a", "count": "many"}, "'count'"),
        ({"path": "a", "colour": "red"}, "'colour' is not a parameter"),
        ({"path": "a", "mode": "medium"}, "'mode'"),
        ({"_raw": '{"path": "a"'}, "not valid JSON"),
        (["a"], "must be a JSON object"),
    ],
)
async def test_invalid_args_become_error_results(
    registry: ToolRegistry, ctx: ToolContext, args: object, expected: str
) -> None:
    result = await registry.call(ToolCall("c1", "sample", args), ctx)  # type: ignore[arg-type]
    assert result.is_error
    assert expected in result.content
    if not isinstance(args, list) and "_raw" not in args:
        assert "Parameters: path (string, required), count (integer)" in result.content


async def test_unknown_tool_lists_the_available_ones(
    registry: ToolRegistry, ctx: ToolContext
) -> None:
    result = await registry.call(ToolCall("c1", "nope", {}), ctx)
    assert result.is_error
    assert "unknown tool 'nope'" in result.content
    assert "sample, slow" in result.content


async def test_exceptions_become_error_results(registry: ToolRegistry, ctx: ToolContext) -> None:
    crashed = await registry.call(ToolCall("c1", "boom", {}), ctx)
    assert crashed.is_error
    assert "RuntimeError: kaput" in crashed.content
    refused = await registry.call(ToolCall("c2", "refuse", {}), ctx)
    assert refused.is_error
    assert "nothing to do" in refused.content
    assert "Try something else." in refused.content


async def test_tool_output_can_flag_an_error(registry: ToolRegistry, ctx: ToolContext) -> None:
    result = await registry.call(ToolCall("c1", "flagged", {}), ctx)
    assert result.is_error
    assert result.content == "output\n[exit code 1]"


def _overlap_tool() -> tuple[Tool, list[int]]:
    """A tool that yields to the loop a few times, and the peak of its calls in flight."""
    inflight, peak = [0], [0]

    @tool
    async def overlap(ctx: ToolContext, n: int) -> str:
        """Yield a few times, counting the calls in flight."""
        inflight[0] += 1
        peak[0] = max(peak[0], inflight[0])
        for _ in range(3):
            await asyncio.sleep(0)
        inflight[0] -= 1
        return f"done {n}"

    return overlap, peak


async def test_calls_of_one_reply_run_concurrently_in_call_order(ctx: ToolContext) -> None:
    overlap, peak = _overlap_tool()
    calls = [ToolCall("a", "overlap", {"n": 1}), ToolCall("b", "overlap", {"n": 2})]
    results = await together(ToolRegistry([overlap, boom]), [*calls, ToolCall("c", "boom")], ctx)
    assert peak[0] == 2  # both in flight at once, not one after the other
    assert [r.call_id for r in results] == ["a", "b", "c"]
    assert results[0].content == "done 1"
    assert results[2].is_error


async def test_calls_of_one_reply_run_at_most_eight_at_once(ctx: ToolContext) -> None:
    overlap, peak = _overlap_tool()
    calls = [ToolCall(f"c{i}", "overlap", {"n": i}) for i in range(30)]
    results = await together(ToolRegistry([overlap]), calls, ctx)
    assert peak[0] == MAX_PARALLEL_TOOLS == 8
    assert [r.content for r in results] == [f"done {i}" for i in range(30)]


async def test_sync_tools_run_concurrently_too(ctx: ToolContext) -> None:
    # Each call waits for the other: run one after the other, the barrier breaks.
    barrier = threading.Barrier(2, timeout=10)

    @tool
    def nap(ctx: ToolContext) -> str:
        """Meet the other call."""
        barrier.wait()
        return "ok"

    results = await together(ToolRegistry([nap]), [ToolCall("a", "nap"), ToolCall("b", "nap")], ctx)
    assert [r.content for r in results] == ["ok", "ok"]


async def test_before_call_can_veto(registry: ToolRegistry, ctx: ToolContext) -> None:
    seen: list[str] = []

    async def gate(call: ToolCall, _ctx: ToolContext) -> str | None:
        seen.append(call.name)
        return "not allowed here" if call.name == "boom" else None

    registry.before_call = gate
    vetoed = await registry.call(ToolCall("c1", "boom", {}), ctx)
    allowed = await registry.call(ToolCall("c2", "sample", {"path": "p"}), ctx)
    assert vetoed.is_error
    assert "refused: not allowed here" in vetoed.content
    assert not allowed.is_error
    assert seen == ["boom", "sample"]


async def test_oversized_result_is_saved_with_head_tail_and_path(
    registry: ToolRegistry, ctx: ToolContext
) -> None:
    full = big(ctx, 500)
    assert len(full) > ctx.result_budget
    result = await registry.call(ToolCall("call/7", "big", {"size": 500}), ctx)
    assert not result.is_error
    (saved,) = (ctx.workspace / ".heron" / "results").glob("call_7-*.txt")
    assert saved.read_text(encoding="utf-8") == full
    assert result.content.startswith("line 0\nline 1\n")
    assert f".heron/results/{saved.name}" in result.content
    assert result.content.endswith("line 499\n")  # its end too: where a tool says how it ended
    assert f"of {len(full):,} characters left out here" in result.content
    assert len(result.content) < ctx.result_budget + 300


async def test_a_result_cut_for_the_model_is_kept_whole_for_the_person(
    registry: ToolRegistry, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    ctx = ToolContext(tmp_path / "ws", result_budget=1000, services=TurnServices(home=home))
    result = await registry.call(ToolCall("c9", "big", {"size": 500}), ctx)
    assert read_whole(home, result) == big(ctx, 500)  # what /show N prints (run_cell's too)
    within = await registry.call(ToolCall("c10", "big", {"size": 3}), ctx)
    assert read_whole(home, within) is None


async def test_result_within_budget_is_not_saved(registry: ToolRegistry, ctx: ToolContext) -> None:
    result = await registry.call(ToolCall("c1", "big", {"size": 3}), ctx)
    assert result.content == "line 0\nline 1\nline 2\n"
    assert not (ctx.workspace / ".heron").exists()


async def test_cancellation_propagates(registry: ToolRegistry, ctx: ToolContext) -> None:
    task = asyncio.create_task(registry.call(ToolCall("c1", "slow", {"seconds": 5}), ctx))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_aclose_without_kernel_is_a_no_op(ctx: ToolContext) -> None:
    await ctx.aclose()
    assert ctx.kernel is None


def test_a_tool_blocked_in_its_thread_does_not_hold_the_exit(tmp_path: Path) -> None:
    """A sync tool stuck in I/O (here: sleeping) is left behind when its call is cancelled,
    and the process still ends (the default executor's threads would be joined at exit)."""
    script = (
        "import asyncio, time\n"
        "from heron.tools.registry import in_thread\n"
        "async def main():\n"
        "    try:\n"
        "        await asyncio.wait_for(in_thread(time.sleep, 3600), 0.5)\n"
        "    except TimeoutError:\n"
        "        print('cancelled', flush=True)\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout == "cancelled\n", done.stderr
