"""Finds SQL statements in Python source: the rule "one home for SQL" is checked with it
(tests/test_architecture_sql.py) and bench/code_counts.py counts with it."""

from __future__ import annotations

import ast
import re

SQL = re.compile(
    r"\b(SELECT\s.+?\sFROM\b|SELECT\s+(COUNT|MAX|MIN|SUM|EXISTS|1)\b|INSERT\s+(OR\s+\w+\s+)?INTO\b"
    r"|UPDATE\s+\w+\s+SET\b|DELETE\s+FROM\b|CREATE\s+(TABLE|INDEX|VIRTUAL|TRIGGER|VIEW|UNIQUE)\b"
    r"|DROP\s+(TABLE|INDEX)\b|PRAGMA\s+\w+|WITH\s+RECURSIVE\b|REPLACE\s+INTO\b)",
    re.S,
)


def sql_literals(source: str) -> list[int]:
    """Line numbers of the string literals (f-strings too) that hold an SQL statement."""
    found: list[int] = []
    tree = ast.parse(source)
    parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        if id(node) in parts:  # a piece of an f-string, read with the whole
            continue
        if isinstance(node, ast.JoinedStr):
            text = "".join(str(v.value) for v in node.values if isinstance(v, ast.Constant))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            continue
        if SQL.search(text):
            found.append(node.lineno)
    return found
