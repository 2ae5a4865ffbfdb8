"""The import rules of docs/architecture.md, checked by reading the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "heron"


def heron_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("heron"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("heron"))
    return found


def files(sub: str) -> list[Path]:
    target = ROOT / sub
    return [target] if target.suffix == ".py" else sorted(target.rglob("*.py"))


RULES = [
    ("messages.py", ("heron.",), ()),
    (
        "providers",
        (
            "heron.store",
            "heron.agent",
            "heron.context",
            "heron.channels",
            "heron.cli",
            "heron.memory",
            "heron.compaction",
            "heron.trace",
            "heron.tools",
        ),
        (),
    ),
    ("store", ("heron.agent", "heron.providers", "heron.channels", "heron.cli", "heron.tools"), ()),
    (
        "context",
        (
            "heron.providers.anthropic",
            "heron.providers.openai_compat",
            "heron.agent",
            "heron.channels",
            "heron.cli",
        ),
        (),
    ),
    ("agent", ("heron.channels", "heron.cli"), ()),
    ("memory", ("heron.agent", "heron.channels", "heron.cli"), ()),
    ("trace", ("heron.agent", "heron.channels", "heron.cli"), ()),
]


@pytest.mark.parametrize(("where", "forbidden", "_"), RULES, ids=[r[0] for r in RULES])
def test_imports_point_down(where, forbidden, _):
    offenders = []
    for path in files(where):
        for module in heron_imports(path):
            if any(module == f.rstrip(".") or module.startswith(f) for f in forbidden):
                offenders.append(f"{path.relative_to(ROOT.parent)} imports {module}")
    assert offenders == []
