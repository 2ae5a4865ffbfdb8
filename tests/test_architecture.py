"""The layering of docs/architecture.md ("## Layers"), checked by reading the source.

Every `heron` import of every module counts: at the top, inside a function, under
`if TYPE_CHECKING:`. An import must go to a lower level, or along a same-level arrow the page
lists; and no two modules may import each other, directly or through others.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "heron"
DOC = REPO / "docs" / "architecture.md"


@dataclass(frozen=True)
class Layers:
    level: dict[str, int]  # unit -> level, 0 at the top
    names: list[str]  # level names, from the top
    arrows: frozenset[tuple[str, str]]  # allowed same-level imports


@dataclass(frozen=True)
class Edge:
    source: str  # importing module, dotted
    target: str  # imported module, dotted
    where: str  # path:line of the import


def _rows(section: str) -> Iterator[list[str]]:
    for line in section.splitlines():
        if line.startswith("|") and not line.startswith("| ---"):
            yield [cell.strip() for cell in line.strip().strip("|").split("|")]


def _units(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def parse_layers(text: str) -> Layers:
    """The two tables under "## Layers": levels (level | units) and arrows (arrow | why)."""
    match = re.search(r"^## Layers\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"{DOC}: no '## Layers' section"
    level: dict[str, int] = {}
    names: list[str] = []
    arrows: set[tuple[str, str]] = set()
    for cells in _rows(match.group(1)):
        if cells[0] in ("level", "arrow"):
            continue
        if "->" in cells[0]:
            source, target = _units(cells[0])
            assert cells[1], f"{DOC}: the arrow {source} -> {target} says no why"
            arrows.add((source, target))
        else:
            names.append(cells[0])
            for unit in _units(cells[1]):
                assert unit not in level, f"{DOC}: {unit} is in two levels"
                level[unit] = len(names) - 1
    return Layers(level, names, frozenset(arrows))


def module_name(path: Path, repo: Path = REPO) -> str:
    parts = list(path.relative_to(repo).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _resolve(name: str, modules: set[str]) -> str:
    """The module a dotted name lives in (`heron.store.Store` -> `heron.store`)."""
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name


def _targets(node: ast.AST, source: str, package: bool, modules: set[str]) -> Iterable[str]:
    if isinstance(node, ast.Import):
        return [_resolve(a.name, modules) for a in node.names if a.name.split(".")[0] == "heron"]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: `.` is the importing module's package
        parts = source.split(".")
        keep = len(parts) - node.level + (1 if package else 0)
        base = ".".join([*parts[:keep], base] if base else parts[:keep])
    if base.split(".")[0] != "heron":
        return []
    # `from heron.tools import files` imports the module heron.tools.files.
    return [_resolve(f"{base}.{a.name}", modules) for a in node.names]


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement, nested ones included (in functions, classes, ifs, trys, withs, loops):
    an import is a statement, so expressions need not be walked."""
    for node in body:
        yield node
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, name, None)
            if inner:
                yield from _statements(inner)


def edges(root: Path = PACKAGE) -> list[Edge]:
    """Every `heron` import under `root` (a `heron` package folder), as module -> module."""
    repo = root.parent
    names = {module_name(p, repo): p for p in sorted(root.rglob("*.py"))}
    known = set(names)
    found: list[Edge] = []
    for module, path in names.items():
        tree = ast.parse(path.read_text(), str(path))
        package = path.name == "__init__.py"
        for node in _statements(tree.body):
            for target in _targets(node, module, package, known):
                where = f"{path.relative_to(repo)}:{node.lineno}"
                found.append(Edge(module, target, where))
    return found


def forbidden(layers: Layers, found: list[Edge]) -> list[str]:
    problems = []
    for edge in found:
        a, b = unit_of(edge.source), unit_of(edge.target)
        if a == b or (a, b) in layers.arrows:
            continue
        for unit in (a, b):
            if unit not in layers.level:
                problems.append(f"{edge.where} imports {edge.target}: {unit} is in no layer")
        if a not in layers.level or b not in layers.level:
            continue
        la, lb = layers.level[a], layers.level[b]
        if lb <= la:
            name_a, name_b = layers.names[la], layers.names[lb]
            problems.append(
                f"{edge.where} imports {edge.target}: layer {name_a} ({a}) may not import "
                f"layer {name_b} ({b})" + (" without an arrow in the table" if la == lb else "")
            )
    return sorted(set(problems))


def cycles(found: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = {}
    for edge in found:
        if edge.source != edge.target:
            graph.setdefault(edge.source, set()).add(edge.target)
            graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    result.append(sorted(component))
    return sorted(result)


def shortest_loop(component: list[str], found: list[Edge]) -> list[Edge]:
    """One shortest way round a cycle: from the component's first module back to it (BFS)."""
    inside = set(component)
    first: dict[tuple[str, str], Edge] = {}
    for e in found:
        if e.source in inside and e.target in inside and e.source != e.target:
            first.setdefault((e.source, e.target), e)
    start = component[0]
    came: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for (source, target), edge in sorted(first.items()):
                if source != node:
                    continue
                if target == start:
                    path = [edge]
                    while path[0].source != start:
                        path.insert(0, came[path[0].source])
                    return path
                if target not in came:
                    came[target] = edge
                    following.append(target)
        frontier = following
    raise AssertionError(f"no loop through {start}")  # a component always has one


def describe(component: list[str], found: list[Edge]) -> str:
    loop = shortest_loop(component, found)
    hops = [f"{e.where} imports {e.target}" for e in loop]
    names = " -> ".join([loop[0].source, *(e.target for e in loop)])
    rest = f" ({len(component)} modules in the cycle)" if len(component) > len(loop) else ""
    return f"import cycle {names}{rest}:\n    " + "\n    ".join(hops)


@pytest.fixture(scope="module")
def layers() -> Layers:
    return parse_layers(DOC.read_text())


@pytest.fixture(scope="module")
def found() -> list[Edge]:
    return edges()


def test_every_import_is_on_an_allowed_arrow(layers: Layers, found: list[Edge]) -> None:
    problems = forbidden(layers, found)
    assert not problems, "imports against docs/architecture.md ## Layers:\n" + "\n".join(problems)


def test_no_import_cycles(found: list[Edge]) -> None:
    problems = [describe(c, found) for c in cycles(found)]
    assert not problems, "\n".join(problems)


def test_every_unit_has_a_layer(layers: Layers) -> None:
    units = {unit_of(module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert sorted(units - set(layers.level)) == []


def test_same_level_arrows_join_units_of_one_level(layers: Layers) -> None:
    for source, target in layers.arrows:
        assert layers.level[source] == layers.level[target], f"{source} -> {target}"


# The checker itself, on small made-up packages: it must see what it is meant to catch.

TABLE = """## Layers

| level | units |
| --- | --- |
| top | `cli`, `channels` |
| low | `store` |
| data | `heron`, `messages` |

| arrow | why |
| --- | --- |
| `cli` -> `channels` | mounts them |
"""


def _package(tmp_path: Path, files: dict[str, str]) -> list[Edge]:
    for name, text in files.items():
        path = tmp_path / "heron" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return edges(tmp_path / "heron")


def test_checker_catches_upward_same_level_and_hidden_imports(tmp_path: Path) -> None:
    found = _package(
        tmp_path,
        {
            "__init__.py": "",
            "messages.py": "",
            "cli.py": "from heron.channels import chat\n",
            "channels/__init__.py": "",
            "channels/chat.py": "def f():\n    from heron.cli import main\n",
            "store/__init__.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import heron.channels\n"
            ),
            "store/rows.py": "from . import cache\nfrom ..messages import x\n",
            "store/cache.py": "from heron.store import rows\n",
        },
    )
    problems = forbidden(parse_layers(TABLE), found)
    assert problems == [
        "heron/channels/chat.py:2 imports heron.cli: layer top (channels) may not import "
        "layer top (cli) without an arrow in the table",
        "heron/store/__init__.py:3 imports heron.channels: layer low (store) may not import "
        "layer top (channels)",
    ]
    loops = cycles(found)
    assert loops == [
        ["heron.channels.chat", "heron.cli"],
        ["heron.store.cache", "heron.store.rows"],
    ]
    assert describe(loops[0], found) == (
        "import cycle heron.channels.chat -> heron.cli -> heron.channels.chat:\n"
        "    heron/channels/chat.py:2 imports heron.cli\n"
        "    heron/cli.py:1 imports heron.channels.chat"
    )
    assert Edge("heron.store.rows", "heron.messages", "heron/store/rows.py:2") in found


def test_context_never_imports_a_provider(found: list[Edge]) -> None:
    """Prompt assembly is provider-neutral: the request types it builds are in heron/request.py
    (the levels alone would let services import adapters)."""
    wrong = [
        e.where
        for e in found
        if unit_of(e.source) == "context" and unit_of(e.target) == "providers"
    ]
    assert wrong == []
