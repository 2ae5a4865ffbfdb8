"""run_cell against a real ipykernel. One kernel is shared by the module (starting one takes
most of a second), so each test uses its own variable names."""

from __future__ import annotations

import functools
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from heron.messages import ToolCall, ToolResult
from heron.saved import WHOLE_CAP, read_whole
from heron.tools.context import ToolContext
from heron.tools.python_kernel import (
    CellError,
    CellOutput,
    CellResult,
    KernelSession,
    changes,
    digest,
)
from heron.tools.python_kernel import run_cell as run_cell_tool
from heron.tools.registry import ToolRegistry, bounded_gather

pytestmark = pytest.mark.slow  # a real Jupyter kernel

shared_loop = pytest.mark.asyncio(loop_scope="module")  # the kernel's sockets live on it


async def together(registry: ToolRegistry, calls: list[ToolCall], ctx: ToolContext) -> list:
    """The calls of one reply, run as the runner runs them: at once, at most eight at a time."""
    return await bounded_gather([functools.partial(registry.call, c, ctx) for c in calls])


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def ctx(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ToolContext]:
    context = ToolContext(workspace=tmp_path_factory.mktemp("kernel-ws"), result_budget=2000)
    started = time.monotonic()
    yield context
    await context.aclose()
    print(f"\nkernel module: {time.monotonic() - started:.2f} s including start and shutdown")


FLOOD = 'while True: print("y" * 10000)'
LABEL = re.compile(r"^\[(\d+)\] ", re.M)


def one_cell(text: str) -> str:
    """`text` with its output labels as `[N] `, once checked that they all name one cell (the
    count depends on how many cells the module's shared kernel ran before)."""
    assert len(set(LABEL.findall(text))) <= 1, text
    return LABEL.sub("[N] ", text)


async def run(ctx: ToolContext, code: str, timeout: int = 30) -> ToolResult:
    call = ToolCall("c1", "run_cell", {"code": code, "timeout": timeout})
    return await ToolRegistry([run_cell_tool]).call(call, ctx)


@shared_loop
async def test_variables_persist_and_cwd_is_the_workspace(ctx: ToolContext) -> None:
    first = await run(ctx, "persisted = 41")
    assert not first.is_error
    assert first.content == "(no output)"
    assert isinstance(ctx.kernel, KernelSession)
    second = await run(ctx, "import os\nprint(os.getcwd())\npersisted + 1")
    assert one_cell(second.content) == f"[N] {ctx.workspace}\nLast value: 42"


@shared_loop
async def test_each_group_of_output_is_labelled_with_the_cells_execution_count(
    ctx: ToolContext,
) -> None:
    code = "import sys\nprint('a')\nprint('b')\ndisplay('shown')\nprint('oops', file=sys.stderr)"
    result = await run(ctx, code)
    assert one_cell(result.content) == "[N] a\nb\n[N] 'shown'\n[N] (stderr) oops"
    # The label is the kernel's own count, one more each cell: the N of a traceback's
    # `Cell In[N]` and of `Out[N]` (`_heron_values[N]`).
    count = int(LABEL.findall(result.content)[0])
    after = await run(ctx, "print('next')\n1 / 0")
    assert after.content.startswith(f"[{count + 1}] next\nZeroDivisionError")
    assert f"Cell In[{count + 1}], line 2" in after.content


@shared_loop
async def test_exception_is_an_error_result(ctx: ToolContext) -> None:
    result = await run(ctx, "print('before')\ndef broken():\n    return 1 / 0\nbroken()")
    assert result.is_error
    lines = result.content.splitlines()
    assert one_cell(lines[0]) == "[N] before"
    assert lines[1] == "ZeroDivisionError: division by zero"
    assert "return 1 / 0" in result.content
    assert "\x1b[" not in result.content
    assert len(lines) <= 2 + 6


@shared_loop
async def test_large_value_collapses_to_a_stub(ctx: ToolContext) -> None:
    result = await run(
        ctx,
        "calls = 0\ndef expensive():\n    global calls\n    calls += 1\n"
        "    return 'x' * 50_000\nexpensive()",
    )
    assert not result.is_error
    assert len(result.content) < 1000
    assert "str of length 50000" in result.content
    assert "do not re-run" in result.content
    ref = re.search(r"`(_heron_values\[\d+\])`", result.content)
    assert ref is not None
    again = await run(ctx, f"len({ref.group(1)}), calls")
    assert again.content == "Last value: (50000, 1)"


@shared_loop
async def test_written_file_shows_up_in_side_effects(ctx: ToolContext) -> None:
    (ctx.workspace / "old.txt").write_text("old")
    code = (
        "open('made.csv', 'w').write('a,b\\n')\n"
        "open('old.txt', 'a').write('er')\n"
        "import os; os.makedirs('.heron', exist_ok=True); open('.heron/x', 'w').write('x')"
    )
    result = await run(ctx, code)
    assert "Files changed: made.csv (new), old.txt (modified)" in result.content
    assert ".heron" not in result.content
    assert {"kind": "file_written", "path": "made.csv"} in ctx.effects
    removed = await run(ctx, "os.remove('made.csv')")
    assert "made.csv (deleted)" in removed.content


@shared_loop
async def test_timeout_interrupts_and_keeps_variables(ctx: ToolContext) -> None:
    await run(ctx, "kept = 'still here'")
    result = await run(ctx, "import time\nprint('going')\ntime.sleep(30)", timeout=1)
    assert result.is_error
    assert "] going\n" in result.content and one_cell(result.content).startswith("[N] going")
    assert "Timed out after 1 s; the cell was interrupted (variables are kept)" in result.content
    after = await run(ctx, "kept")
    assert after.content == "Last value: 'still here'"


@shared_loop
async def test_a_flooding_cell_stops_at_its_timeout_bounded_and_keeps_its_variables(
    ctx: ToolContext, tmp_path: Path
) -> None:
    """QA16b defect 2: `while True: print("y"*10000)` used to be kept whole (gigabytes, a copy
    per chunk), saved whole into the workspace, and often cost the kernel and its variables."""
    ctx.services.home = tmp_path
    try:
        await run(ctx, "flood_kept = 'still here'")
        call = ToolCall("flood", "run_cell", {"code": FLOOD, "timeout": 2})
        result = await ToolRegistry([run_cell_tool]).call(call, ctx)
    finally:
        ctx.services.home = None
    assert result.is_error
    assert len(result.content) <= ctx.result_budget
    lines = result.content.splitlines()
    assert one_cell(lines[0]).startswith("[N] yyyy")
    assert re.search(r"\[\.\.\. \d+ characters omitted \.\.\.\]", result.content)
    assert lines[-1] == "Timed out after 2 s; the cell was interrupted (variables are kept)."
    assert lines[-2].startswith("yyyy")  # the tail, not only the head
    whole = read_whole(tmp_path, result)
    assert whole is not None and len(result.content) < len(whole) <= WHOLE_CAP + 1_000
    assert not (ctx.workspace / ".heron" / "results").exists()  # nothing saved there whole
    after = await run(ctx, "flood_kept")
    assert after.content == "Last value: 'still here'"


@shared_loop
async def test_a_large_print_is_counted_whole_though_the_kernel_sends_head_and_tail(
    ctx: ToolContext,
) -> None:
    """The kernel itself keeps only the head and tail of what a cell prints (KERNEL_SETUP):
    the model reads head and tail around the true count of the middle."""
    result = await run(ctx, "print('a' + 'x' * 5_000_000 + 'z')")
    head, marker, tail = re.split(r"\n\[\.\.\. (\d+) characters omitted \.\.\.\]\n", result.content)
    label = LABEL.match(head)
    assert label is not None and head[label.end() :].startswith("axxx") and tail.endswith("xxxz")
    assert len(head) + int(marker) + len(tail) == label.end() + 5_000_002
    assert len(result.content) <= ctx.result_budget


@shared_loop
async def test_concurrent_cells_are_serialised(ctx: ToolContext) -> None:
    registry = ToolRegistry([run_cell_tool])
    calls = [
        ToolCall("a", "run_cell", {"code": "import time; time.sleep(0.2); 'a'"}),
        ToolCall("b", "run_cell", {"code": "'b'"}),
    ]
    results = await together(registry, calls, ctx)
    assert [r.content for r in results] == ["Last value: 'a'", "Last value: 'b'"]


def test_digest_formats_a_dead_kernel_and_progress_lines() -> None:
    died = CellResult(error=CellError("KernelDied", "the Python kernel process died"))
    died.restarted = True
    out = digest(died, [], 10)
    assert out.is_error
    assert "variables are lost" in out.text
    progress = CellResult()
    progress.output.cell = 7
    progress.add_output("stdout", "10%\r50%\r100%\ndone\n")
    assert digest(progress, [], 10).text == "[7] 100%\ndone"


def test_output_groups_and_overwritten_lines_across_chunks() -> None:
    out = CellOutput()
    out.cell = 4
    for kind, text in [
        ("stdout", "a\n"),
        ("stdout", "b\n\n"),
        ("display", "'shown'"),
        ("stderr", "step 1\r"),
        ("stderr", "step 2\rstep 3\r"),
        ("stderr", "\nwin\r\n"),
        ("stdout", "x" * 10 + "\n"),
    ]:
        out.add(kind, text)
    assert out.text() == "[4] a\nb\n[4] 'shown'\n[4] (stderr) step 3\nwin\n[4] xxxxxxxxxx"


def test_output_of_a_cell_whose_count_is_not_known_has_no_number() -> None:
    out = CellOutput()  # no execute_input seen: a number would be made up
    out.add("stdout", "a\n")
    out.add("stderr", "oops\n")
    assert out.text() == "a\n(stderr) oops"


def test_a_flood_of_output_is_kept_as_head_and_tail_in_bounded_memory() -> None:
    """A cell printing 200 MB: what is held stays within the collector's limit, the model's
    text is head and tail around a count of the middle, and no chunk is copied per chunk."""
    out = CellOutput(limit=100_000)
    out.cell = 1
    line = "y" * 9_999 + "\n"
    out.add("stdout", "first line\n")
    for _ in range(20_000):
        out.add("stdout", line)
    out.add("stdout", "last line\n")
    held = len(out.sink.head) + out.sink.tail_len + out.line_len
    assert held <= 100_000 + len(line)
    shown = out.text(2_000)
    assert shown.startswith("[1] first line\nyyy")
    assert shown.endswith("yyy\nlast line")
    omitted = out.total - 2_000
    assert f"[... {omitted} characters omitted ...]" in shown
    assert out.total > 200_000_000


def test_changes_between_snapshots() -> None:
    before = {"a": (1, 1), "b": (1, 1), "c": (1, 1)}
    after = {"a": (1, 1), "b": (2, 1), "d": (1, 1)}
    assert changes(before, after) == [("b", "modified"), ("c", "deleted"), ("d", "new")]
    assert changes(None, after) == []


@shared_loop
async def test_only_a_cell_that_ignores_the_interrupt_costs_the_kernel(ctx: ToolContext) -> None:
    await run(ctx, "doomed_too = 1")
    stubborn = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)"
    result = await run(ctx, stubborn, timeout=1)
    assert result.is_error
    assert result.content == (
        "Timed out after 1 s and did not stop within 5 s of the interrupt, so the kernel was "
        "restarted: all variables are lost."
    )
    fresh = await run(ctx, "'doomed_too' in globals()")
    assert fresh.content == (
        "This cell ran in a new kernel (a cell that timed out ignored the interrupt): earlier "
        "variables are gone.\nLast value: False"
    )


@shared_loop
async def test_a_dead_kernel_is_reported_and_replaced(ctx: ToolContext) -> None:
    # Last in the module: it kills the shared kernel.
    await run(ctx, "doomed = 1")
    died = await run(ctx, "import os; os._exit(1)")
    assert died.is_error
    assert "KernelDied" in died.content
    assert "variables are lost" in died.content
    fresh = await run(ctx, "'doomed' in globals(), 6 * 7")
    assert fresh.content == (  # said again, as in a later turn (QA21r finding 15)
        "This cell ran in a new kernel (the kernel of the earlier cells crashed: exit code 1): "
        "earlier variables are gone.\nLast value: (False, 42)"
    )
