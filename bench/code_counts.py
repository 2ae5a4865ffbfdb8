"""Counts of how Heron's parts are wired, for issue 12's before/after figures.

Read from the source of heron/ (parsed, not imported):

- `engine: Any` parameters: function parameters annotated `Any` whose name is `engine`.
- getattr/hasattr probes: every call of either builtin, and those not marked with a
  `# probe:` comment saying which third-party or user object they read (the target is 0
  unmarked: Heron's own classes are typed, so probing them hides coupling).
- `Any` per 1,000 lines: `Any` names in code (not comments or strings) per 1,000 lines.
- SQL statements outside heron/store/ and `records` modules (heron/testing/sql_scan.py, the
  detector tests/test_architecture_sql.py checks with).
- The largest class by field count (annotated class-level fields plus `self.x =` targets).
- Lines of Python in heron/.

    python bench/code_counts.py [--json] [--root heron] [--top N]

`--top N` lists the N files with the most `Any` names, the place to start narrowing them.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import tokenize
from dataclasses import asdict, dataclass
from pathlib import Path

from heron.testing.sql_scan import sql_literals


@dataclass
class Counts:
    engine_any_params: int
    probes: int
    unmarked_probes: int
    any_names: int
    any_per_1000_lines: float
    sql_outside_store: int
    largest_class: str
    largest_class_fields: int
    lines: int


def engine_any_params(tree: ast.AST) -> int:
    """Parameters named `engine` annotated `Any`."""
    found = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.arg == "engine" and node.annotation is not None:
            found += ast.unparse(node.annotation) in ("Any", "typing.Any")
    return found


def probes(tree: ast.AST, lines: list[str]) -> tuple[int, int]:
    """(all getattr/hasattr calls, those whose line has no `# probe:` note)."""
    total = unmarked = 0
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
        ):
            total += 1
            span = lines[node.lineno - 1 : (node.end_lineno or node.lineno)]
            if not any("# probe:" in line for line in span):
                unmarked += 1
    return total, unmarked


def any_names(source: str) -> int:
    """`Any` as a name token: annotations and casts, not prose in comments or strings."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return sum(1 for t in tokens if t.type == tokenize.NAME and t.string == "Any")


def class_fields(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    """(field count, name) of each class: annotated class fields and `self.x` assignments."""
    out = []
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        names = {
            s.target.id
            for s in cls.body
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
        }
        for node in ast.walk(cls):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            for t in targets:
                if isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self":
                    names.add(t.attr)
        out.append((len(names), f"{module}:{cls.name}"))
    return out


def any_by_file(root: Path) -> list[tuple[int, str]]:
    """(`Any` names, path under root) of every file that has any, most first."""
    found = [(any_names(p.read_text()), str(p.relative_to(root))) for p in root.rglob("*.py")]
    return sorted(((n, rel) for n, rel in found if n), key=lambda f: (-f[0], f[1]))


def count(root: Path) -> Counts:
    engine = total = unmarked = anys = sql = lines = 0
    classes: list[tuple[int, str]] = []
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root))
        source = path.read_text()
        tree = ast.parse(source)
        text_lines = source.splitlines()
        lines += len(text_lines)
        engine += engine_any_params(tree)
        t, u = probes(tree, text_lines)
        total, unmarked = total + t, unmarked + u
        anys += any_names(source)
        if not (rel.startswith("store/") or path.name == "records.py"):
            sql += len(sql_literals(source))
        classes += class_fields(tree, rel)
    fields, name = max(classes) if classes else (0, "")
    return Counts(
        engine_any_params=engine,
        probes=total,
        unmarked_probes=unmarked,
        any_names=anys,
        any_per_1000_lines=round(1000 * anys / max(lines, 1), 1),
        sql_outside_store=sql,
        largest_class=name,
        largest_class_fields=fields,
        lines=lines,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON line as well")
    parser.add_argument("--root", default=str(Path(__file__).parent.parent / "heron"))
    parser.add_argument("--top", type=int, default=0, help="list the N files with most Any")
    args = parser.parse_args()
    c = count(Path(args.root))
    for n, rel in any_by_file(Path(args.root))[: args.top]:
        print(f"{n:5d}  {rel}")
    print(f"engine: Any parameters        {c.engine_any_params}")
    print(f"getattr/hasattr calls         {c.probes} ({c.unmarked_probes} without '# probe:')")
    print(f"Any per 1,000 lines           {c.any_per_1000_lines} ({c.any_names} in {c.lines})")
    print(f"SQL outside store/, records   {c.sql_outside_store}")
    print(f"largest class                 {c.largest_class} ({c.largest_class_fields} fields)")
    if args.json:
        print(json.dumps(asdict(c)))


if __name__ == "__main__":
    main()
