"""What run_cell makes of a cell's rich outputs, of input() and of a kernel that crashed
(QA21r findings 9 and 15). Images a cell displays (PNG, JPEG, SVG) are saved into the
workspace's outputs/, bounded in size and count, and the model is told the path and size;
other displays whose text is only the object's name (HTML) are named and said not shown;
input() gets a plain sentence, not ipykernel's traceback; and the cell after a crash says the
kernel crashed, with its exit status, not that it "ended with the process"."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from heron.messages import ToolCall
from heron.tools import python_kernel as pk
from heron.tools.context import ToolContext
from heron.tools.python_kernel import (
    EARLIER_PROCESS,
    NO_INPUT,
    CellError,
    CellResult,
    KernelKey,
    Kernels,
    crash_cause,
    digest,
    keep_image,
    shown_text,
)
from heron.tools.registry import ToolRegistry
from heron.tools.sandbox import Sandbox

# A 1x1 PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
SVG = '<svg xmlns="http://www.w3.org/2000/svg" width="2" height="2"/>'


def displayed(kind: str, value: str) -> dict[str, object]:
    return {"data": {kind: value, "text/plain": "<IPython.core.display.Image object>"}}


def cell(number: int) -> CellResult:
    result = CellResult()
    result.output.cell = number
    return result


def test_an_image_display_is_saved_and_the_model_told_its_path_and_size(tmp_path: Path) -> None:
    result = cell(3)
    png = displayed("image/png", base64.b64encode(PNG).decode())
    said = keep_image(tmp_path, png, result)["data"]
    svg = keep_image(tmp_path, displayed("image/svg+xml", SVG), result)["data"]
    assert said == {
        "text/plain": f"an image (PNG, 1x1, {len(PNG)} bytes) saved to outputs/cell-3-1.png"
    }
    assert (tmp_path / "outputs" / "cell-3-1.png").read_bytes() == PNG
    assert svg["text/plain"].endswith("saved to outputs/cell-3-2.svg")
    assert (tmp_path / "outputs" / "cell-3-2.svg").read_text() == SVG
    # A new kernel numbers its cells from 1 again: an earlier image is never overwritten.
    again = keep_image(tmp_path, png, cell(3))["data"]["text/plain"]
    assert again.endswith("saved to outputs/cell-3-1-2.png")
    assert (tmp_path / "outputs" / "cell-3-1.png").read_bytes() == PNG


def test_images_past_the_bounds_are_described_not_saved(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(pk, "IMAGES_MAX", 1)
    result = cell(4)
    png = displayed("image/png", base64.b64encode(PNG).decode())
    keep_image(tmp_path, png, result)
    second = keep_image(tmp_path, png, result)["data"]["text/plain"]
    assert second.endswith("not saved: a cell saves at most 1 images.")
    monkeypatch.setattr(pk, "IMAGE_MAX", 10)
    big = keep_image(tmp_path, png, cell(5))["data"]["text/plain"]
    assert "not saved: over the" in big and "savefig" in big
    assert sorted(p.name for p in (tmp_path / "outputs").iterdir()) == ["cell-4-1.png"]


def test_html_is_named_not_shown_and_a_table_keeps_its_text() -> None:
    html = shown_text(
        {"text/html": "<b>bold</b>", "text/plain": "<IPython.core.display.HTML object>"}
    )
    assert html == f"text/html (11 characters): {pk.NOT_SHOWN}"
    table = {"text/html": "<table>...</table>", "text/plain": "   a\n0  1"}
    assert shown_text(table) == "   a\n0  1"
    assert shown_text({"text/plain": "<object object at 0x7f>"}) == "<object object at 0x7f>"


def test_input_gets_a_sentence_and_a_crash_its_cause() -> None:
    traceback = ["StdinNotImplementedError", "password=False"]
    asked = CellResult(
        error=CellError("StdinNotImplementedError", "raw_input was called", traceback)
    )
    said = digest(asked, [], 30).text
    assert NO_INPUT in said and "password" not in said and "Stdin" not in said
    assert crash_cause(139) == "crashed: killed by SIGSEGV, exit status 139"
    assert crash_cause(-9) == "crashed: killed by SIGKILL, exit status -9"
    assert crash_cause(3) == "crashed: exit code 3"
    assert crash_cause(None) == "died"


async def run(ctx: ToolContext, code: str) -> str:
    registry = ToolRegistry([pk.run_cell])
    return (
        await registry.call(ToolCall("c", "run_cell", {"code": code, "timeout": 60}), ctx)
    ).content


CELL = f"""\
import base64
from IPython.display import HTML, SVG, Image, display
png = base64.b64decode({base64.b64encode(PNG).decode()!r})
display(Image(data=png))
display(HTML('<b>bold</b>'))
display(SVG({SVG!r}))
name = input('name? ')
"""


@pytest.mark.slow  # real Jupyter kernels
async def test_a_real_kernel_saves_images_answers_input_and_says_it_crashed(tmp_path: Path) -> None:
    kernels = Kernels(tmp_path, Sandbox(tmp_path))
    key = KernelKey(1, 0.0)

    async def earlier() -> bool:  # the conversation ran cells before: asked at a first start
        return True

    try:
        ctx = ToolContext(workspace=tmp_path, kernel=kernels.take(key, earlier))
        shown = await run(ctx, CELL)
        died = await run(ctx, "import os; os._exit(3)")
        await kernels.release(key)  # the turn ends; the next one takes the kernel again
        ctx = ToolContext(workspace=tmp_path, kernel=kernels.take(key, earlier))
        after = await run(ctx, "print('again')")
        await kernels.release(key)
    finally:
        await kernels.close()
    saved = sorted(p.name for p in (tmp_path / "outputs").iterdir())
    assert len(saved) == 2 and saved[0].endswith("-1.png") and saved[1].endswith("-2.svg"), saved
    assert (tmp_path / "outputs" / saved[0]).read_bytes() == PNG
    assert f"an image (PNG, 1x1, {len(PNG)} bytes) saved to outputs/{saved[0]}" in shown
    assert "text/html (11 characters): not shown" in shown and "HTML object" not in shown
    assert NO_INPUT in shown and "Stdin" not in shown, shown
    assert "KernelDied: the Python kernel process crashed: exit code 3" in died
    new = "This cell ran in a new kernel (the kernel of the earlier cells crashed: exit code 3)"
    assert new in after
    assert EARLIER_PROCESS not in after
