"""What the model reads of a long tool result, through the real path (the tool, the registry's
budget, the view's budget), on small and large windows: the head, the end (the error, the exit
code, read_file's paging footer) and one count of what was left out."""

from __future__ import annotations

import re

import pytest

from heron.agent.engine import Engine
from heron.config import Settings
from heron.messages import JSONObject, Reply, Text, ToolCall, Usage
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest

WINDOWS = [8_000, 32_000, 128_000]
COMPILE = (
    'for i in $(seq 3000); do echo "compiling unit $i of the project"; done; '
    'echo "FATAL: error in foo.c line 3: undefined symbol bar"; exit 2'
)


class OneCall:
    """A model that makes one tool call, then answers, keeping the result it was sent."""

    def __init__(self, name: str, args: JSONObject) -> None:
        self.call = ToolCall("call_0", name, args)
        self.sent: list[str] = []

    def __call__(self, request: ChatRequest) -> Reply:
        results = [r.content for m in request.messages for r in m.tool_results]
        if not results:
            return Reply([self.call], "tool_use", Usage(100, 5))
        self.sent.append(results[-1])
        return Reply([Text("done")], "done", Usage(100, 5))


async def _result_sent(name: str, args: JSONObject, setup: str = "") -> str:
    model = OneCall(name, args)
    settings = Settings.load()
    if setup:
        (settings.paths.workspace / "big.txt").parent.mkdir(parents=True, exist_ok=True)
        (settings.paths.workspace / "big.txt").write_text(setup)
    async with Engine.open(settings, provider=ScriptedProvider(model)) as engine:
        await engine.turn("k", "go")
        await engine.turn("k", "and again")  # the view derived once more, from the record
    assert len(model.sent) == 2 and model.sent[0] == model.sent[1]  # the same bytes: cacheable
    return model.sent[0]


CUT_LINE = r"\n\[\.\.\. ([\d,]+) (?:of ([\d,]+) )?characters (?:omitted|left out)[^\n]*\]\n"


def _counts(sent: str) -> list[tuple[int, int | None]]:
    """(left out, of how many when said) of every cut's line in `sent`: the tool's own
    ("omitted") or the registry's or view's ("left out")."""
    found = re.findall(CUT_LINE, sent)
    return [(int(a.replace(",", "")), int(b.replace(",", "")) if b else None) for a, b in found]


@pytest.mark.parametrize("window", WINDOWS)
async def test_the_model_sees_the_end_of_a_long_command(monkeypatch, window):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", str(window))
    sent = await _result_sent("bash", {"command": COMPILE})
    assert sent.startswith("compiling unit 1 of the project\n")
    assert sent.endswith("FATAL: error in foo.c line 3: undefined symbol bar\n[exit code 2]")
    assert len(sent) <= max(1_000, window // 10) + 400  # within the view's budget and a note
    assert sent.count("[...") == 1  # one count, not one nested in another
    ((omitted, total),) = _counts(sent)
    printed = sum(len(f"compiling unit {i} of the project\n") for i in range(1, 3001))
    printed += len("FATAL: error in foo.c line 3: undefined symbol bar\n")
    shown = len(sent) - len(re.search(CUT_LINE, sent).group(0))
    assert omitted == printed - (shown - len("[exit code 2]"))  # of all it printed
    assert total is None or total == omitted + shown


@pytest.mark.parametrize("window", WINDOWS)
async def test_the_model_sees_read_files_paging_footer(monkeypatch, window):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", str(window))
    text = "".join(f"line {i} of a file that is long enough to page\n" for i in range(5000))
    sent = await _result_sent("read_file", {"path": "big.txt"}, setup=text)
    footer = re.search(r"\[lines 1-(\d+) of 5000; read on with offset=(\d+)\]$", sent)
    assert footer is not None, sent[-300:]
    assert int(footer.group(2)) == int(footer.group(1)) + 1
    assert "[..." not in sent  # a page read whole: no line between 1 and its end left out
    assert sent.startswith("   1\tline 0 of") or sent.startswith("1\tline 0 of")
    assert len(sent) <= max(1_000, window // 10) + 400
