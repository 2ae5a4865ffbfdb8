"""One home for SQL, and one way to call the store from async code.

- No SQL statement in a string literal outside heron/store/ and a package's own `records`
  module. Modules that still hold some (written before this rule) are listed in `KNOWN` with
  their count: the count may only go down, and heron/agent/ and heron/channels/ hold none.
- No `asyncio.to_thread` on a store function: async code calls `Store.call(fn, ...,
  off_loop=...)`, which decides inline or on a thread in one place.
"""

from __future__ import annotations

import ast
from pathlib import Path

import heron
from heron.testing.sql_scan import sql_literals

ROOT = Path(heron.__file__).parent
# Statements left outside store/ (and records modules) before the rule; to move, not to add to.
# memory/'s moved into memory/records.py (issue 17): none are left.
KNOWN: dict[str, int] = {}
NEVER = ("agent/", "channels/")


def _exempt(rel: str) -> bool:
    return rel.startswith("store/") or Path(rel).name == "records.py"


def _modules() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(ROOT.rglob("*.py"))}


def test_the_detector_finds_statements_and_passes_prose():
    code = """
q = "SELECT id FROM turns WHERE conversation_id = ?"
w = f"UPDATE turns SET status = {s!r} WHERE id = ?"
prose = "Select the files from the list, then update the notes; delete from memory."
"""
    assert sql_literals(code) == [2, 3]


def test_no_sql_outside_the_store_and_records_modules():
    grown = {}
    for rel, source in _modules().items():
        if _exempt(rel):
            continue
        n = len(sql_literals(source))
        if n and not rel.startswith(NEVER) and n <= KNOWN.get(rel, 0):
            continue
        if n:
            grown[rel] = n
    assert not grown, (
        f"SQL statements outside heron/store/: {grown}. Move them into a store function (or "
        "the package's own records module) named for what it does."
    )


def test_only_memory_imports_memory_records():
    """memory/records.py is memory's SQL: the other layers ask memory, never its tables."""
    outside = []
    for rel, source in _modules().items():
        if rel.startswith("memory/"):
            continue
        for node in ast.walk(ast.parse(source)):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                names = [f"{module}.{a.name}" for a in node.names] + [module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(n == "heron.memory.records" for n in names):
                outside.append(rel)
    assert not outside, f"heron.memory.records imported outside heron/memory/: {outside}"


def test_known_debt_never_names_agent_or_channels():
    assert not [rel for rel in KNOWN if rel.startswith(NEVER)]


def store_thread_hops(source: str) -> list[int]:
    """Lines of `asyncio.to_thread(...)` / `to_thread(...)` calls whose function or arguments
    reach a store: a name or attribute called `store` (or ending in `_store`), or a name bound
    by an import from heron.store."""
    tree = ast.parse(source)
    from_store = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("heron.store")
        for alias in node.names
    }

    def reaches_store(expr: ast.AST) -> bool:
        for sub in ast.walk(expr):
            name = sub.id if isinstance(sub, ast.Name) else getattr(sub, "attr", None)
            if name and (name == "store" or name.endswith("_store") or name in from_store):
                return True
        return False

    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
        if name == "to_thread" and any(reaches_store(a) for a in [*node.args, *node.keywords]):
            lines.append(node.lineno)
    return lines


def test_the_hop_detector_finds_store_calls_only():
    code = """
import asyncio
from heron.store import engine_state as es
async def f(ctx, store, memory):
    await asyncio.to_thread(ctx.store.branch, 1)
    await asyncio.to_thread(es.bump_epoch, None, 1)
    await asyncio.to_thread(_usage, store, 1)
    await asyncio.to_thread(memory.count_waiting)
    await asyncio.to_thread(sys.stdin.readline)
"""
    assert store_thread_hops(code) == [5, 6, 7]


def test_no_raw_thread_hop_on_a_store_function():
    hops = {
        rel: lines
        for rel, source in _modules().items()
        if rel != "store/db.py" and (lines := store_thread_hops(source))
    }
    assert not hops, (
        f"asyncio.to_thread on store functions: {hops}. Call `await store.call(fn, ..., "
        "off_loop=True)` instead (heron/store/db.py)."
    )


def test_no_numbered_placeholders_which_postgresql_cannot_read():
    """`?1` is SQLite's own: heron/store/pg.py translates plain `?` only, so a statement with a
    numbered one fails on PostgreSQL (the heartbeat's count did, unseen until a test ran it)."""
    import re

    numbered = re.compile(r"\?\d")
    statement = re.compile(r"\b(SELECT|WHERE|SET|VALUES|AND)\b")
    found = {
        rel: lines
        for rel, source in _modules().items()
        if (lines := [s for s in source.splitlines() if numbered.search(s) and statement.search(s)])
    }
    assert not found, f"numbered placeholders: {found}; write plain `?` and repeat the value"
