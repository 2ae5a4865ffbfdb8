"""Tool schemas written without pydantic (registry._plain_schema) must be exactly what pydantic
generates and `_lean` trims, key order included: the schema is sent on every request."""

from __future__ import annotations

import json
from typing import Annotated, Literal, Optional

import pytest
from pydantic import Field

from heron.tools import memory_tools, message
from heron.tools.builtin import default_registry
from heron.tools.context import ToolContext
from heron.tools.registry import Tool, _args_model, _lean, _plain_schema


def _pydantic_schema(t: Tool) -> dict:
    schema = _lean(_args_model(t.fn, t.name, t.docs).model_json_schema())
    schema.pop("additionalProperties", None)
    return schema


def shapes(
    ctx: ToolContext,
    name: str,
    ratio: float = 0.5,
    flag: bool = True,
    ids: list[int] | None = None,
    level: Optional[Literal["a", "b"]] = None,  # noqa: UP045 - the typing spelling, on purpose
    kind: Literal["x", "y", "z"] = "x",
    count: int | None = None,
    *,
    note: str = "",
) -> str:
    """Every plain shape.

    Args:
        name: The name.
        ratio: A share.
        level: A level.
        note: A note.
    """
    return name


def annotated(ctx: ToolContext, n: Annotated[int, Field(ge=1)] = 2) -> str:
    """Not plain: pydantic says it."""
    return str(n)


def _tools() -> list[Tool]:
    registry = default_registry()
    extra = [memory_tools.manage_memory, memory_tools.view_memory, memory_tools.propose_lesson]
    extra += [memory_tools.recall_history, message.message]
    return [registry.get(n) for n in registry.names()] + extra + [Tool.from_function(shapes)]


@pytest.mark.parametrize("t", _tools(), ids=lambda t: t.name)
def test_plain_schema_is_pydantics_byte_for_byte(t: Tool) -> None:
    assert _plain_schema(t.fn, t.docs) is not None  # written without pydantic
    assert json.dumps(t.parameters) == json.dumps(_pydantic_schema(t))


def test_a_hint_outside_the_plain_set_is_left_to_pydantic() -> None:
    assert _plain_schema(annotated, {}) is None
    t = Tool.from_function(annotated)
    assert t.parameters["properties"]["n"]["minimum"] == 1
    assert json.dumps(t.parameters) == json.dumps(_pydantic_schema(t))


def test_the_run_path_does_not_import_pydantic() -> None:
    import subprocess
    import sys

    code = (
        "import sys, heron.cli, heron.channels.script;"
        "from heron.tools.builtin import default_registry;"
        "[t.spec for t in default_registry()._tools.values()];"
        "print('pydantic' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
