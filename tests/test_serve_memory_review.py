"""`/memory review` in `heron chat`: through a running serve (real uvicorn and control socket)
it shows the same checklists and leaves memory and the output exactly as the in-process review
does (accept, reject, Esc)."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console
from serve_helpers import running_serve

from heron.agent.engine import Engine
from heron.channels import terminal
from heron.channels.remote import connect_remote
from heron.config import Settings
from heron.memory.entries import EntryPath
from heron.memory.service import MemoryService
from heron.messages import Reply, Text, user
from heron.providers.scripted import ScriptedProvider
from heron.serve.lock import SOCKET_NAME
from heron.store import Store


def _seed() -> tuple[int, int]:
    """The person said two things; the agent proposes both (one to keep, one to drop)."""
    settings = Settings.load()
    store = Store(settings.paths.ensure().db)
    try:
        conv = store.open_conversation("personal")
        store.append(conv.id, user("I prefer tea, and I live in Lyon"))
        service = MemoryService(settings.paths.memory, store)
        tea = service.suggest_fact(conv.id, EntryPath.parse("user/always/tea.md"), "I prefer tea")
        home = service.suggest_fact(
            conv.id, EntryPath.parse("user/always/home.md"), "I live in Lyon"
        )
        assert tea is not None and home is not None
        return tea, home
    finally:
        store.close()


def _memory() -> tuple[list[str], list[int]]:
    settings = Settings.load()
    store = Store(settings.paths.db)
    try:
        service = MemoryService(settings.paths.memory, store)
        return [e.path.rel for e in service.entries()], [s.id for s in service.waiting()]
    finally:
        store.close()


def _provider() -> ScriptedProvider:
    return ScriptedProvider(lambda request: Reply([Text("ok")], "done"))


async def _review(mode: str, keep: str | None, monkeypatch) -> tuple[str, list[list[str]]]:
    """Run `/memory review` in mode "serve" or "inprocess"; `keep` names the line to check in
    the checklist (None: Esc). Returns what the chat printed and the checklists it showed."""
    shown: list[list[str]] = []

    async def checklist(batch: list[tuple[int, str]]) -> set[int] | None:
        shown.append([line for _, line in batch])
        return None if keep is None else {i for i, line in batch if keep in line}

    monkeypatch.setattr(terminal, "_checklist", checklist)
    out = StringIO()
    console = Console(file=out, width=200)
    state = terminal.ChatState(terminal.PERSONAL, "default")
    view = terminal.TerminalView(console, state)
    if mode == "serve":
        async with running_serve(_provider()) as serve:
            path = Path(serve.info.socket)
            assert path.name == SOCKET_NAME
            async with connect_remote(path, "terminal", view.deliver, terminal.PERSONAL) as conn:
                handled = await terminal._command("/memory review", None, conn, state, view, None)  # type: ignore[arg-type]
    else:
        async with Engine.open(Settings.load(), provider=_provider()) as engine:
            handled = await terminal._command("/memory review", engine, None, state, view, None)  # type: ignore[arg-type]
    assert handled
    return out.getvalue(), shown


@pytest.mark.parametrize("keep", ["tea", None], ids=["keep-one-drop-one", "esc"])
async def test_memory_review_through_serve_does_what_it_does_in_process(
    keep, heron_home, tmp_path, monkeypatch
):
    seen = {}
    for mode, home in (("inprocess", heron_home), ("serve", tmp_path / "served-home")):
        home.mkdir(exist_ok=True)
        monkeypatch.setenv("HERON_HOME", str(home))
        _seed()
        printed, lists = await _review(mode, keep, monkeypatch)
        seen[mode] = (printed, lists, _memory())
    assert seen["serve"] == seen["inprocess"]
    printed, lists, (entries, waiting) = seen["serve"]
    assert len(lists) == 1 and len(lists[0]) == 2  # one checklist of both suggestions
    if keep is None:
        assert entries == [] and len(waiting) == 2 and "2 still waiting." in printed
    else:
        assert entries == ["user/always/tea.md"] and waiting == []
        assert "Kept 1, dropped 1." in printed


async def test_nothing_waiting_says_so_through_serve(monkeypatch):
    printed, lists = await _review("serve", "tea", monkeypatch)
    assert printed == "Nothing waits for review.\n" and lists == []


async def test_after_learn_through_serve_the_review_opens_only_when_something_waits(monkeypatch):
    shown: list[list[int]] = []

    async def checklist(batch: list[tuple[int, str]]) -> set[int] | None:
        shown.append([i for i, _ in batch])
        return set()  # drop them all

    monkeypatch.setattr(terminal, "_checklist", checklist)
    out = StringIO()
    console = Console(file=out, width=200)
    async with running_serve(_provider()) as serve:
        path = Path(serve.info.socket)
        async with connect_remote(path, "terminal", _ignore, terminal.PERSONAL) as conn:
            await terminal._review_either(None, conn, console, only_if_waiting=True)
            assert out.getvalue() == "" and shown == []  # nothing waits: nothing said
            tea, home = _seed()
            await terminal._review_either(None, conn, console, only_if_waiting=True)
    assert shown == [[tea, home]]
    assert "Kept 0, dropped 2." in out.getvalue()
    assert _memory() == ([], [])


async def _ignore(item) -> None:
    pass
