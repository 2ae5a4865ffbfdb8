"""docs/architecture.md's "One turn, end to end" is the true map: every `module:function` it
names exists, and one ordinary turn with one tool call enters every one of them."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from types import CodeType, ModuleType

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
NAMED = re.compile(r"`(heron(?:\.\w+)*):([\w.]+)`")


def _bench() -> ModuleType:
    """bench/turn_profile.py, which runs and profiles the turn (its figures are the bench's)."""
    path = REPO / "bench" / "turn_profile.py"
    spec = importlib.util.spec_from_file_location("bench_turn_profile", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_turn_profile"] = module
    spec.loader.exec_module(module)
    return module


def map_section(text: str) -> str:
    start = text.index("## One turn, end to end")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def named_functions(text: str) -> list[tuple[str, str]]:
    """The (module, qualified name) pairs the section names, in order, each once."""
    found: list[tuple[str, str]] = []
    for module, name in NAMED.findall(map_section(text)):
        if (module, name) not in found:
            found.append((module, name))
    return found


def code_of(module: str, qualname: str) -> CodeType:
    """The code object a profiler sees entered for `module:qualname`: through classmethods,
    properties, decorators (`functools.wraps`) and tools (`@tool`, whose function is `fn`) to
    the function that was written."""
    from heron.tools.registry import Tool

    obj: object = importlib.import_module(module)
    for part in qualname.split("."):
        owner = obj
        obj = inspect.getattr_static(owner, part)
    if isinstance(obj, property):
        obj = obj.fget
    if isinstance(obj, Tool):
        obj = obj.fn
    if isinstance(obj, (classmethod, staticmethod)):
        obj = obj.__func__
    obj = inspect.unwrap(obj)  # type: ignore[arg-type]
    code = getattr(obj, "__code__", None)
    assert isinstance(code, CodeType), f"{module}:{qualname} is not a function"
    return code


def test_the_map_names_functions_that_exist():
    named = named_functions(DOC.read_text())
    assert len(named) >= 40, "the map should follow one turn through its functions"
    missing = []
    for module, qualname in named:
        try:
            code_of(module, qualname)
        except (ImportError, AttributeError, AssertionError) as error:
            missing.append(f"{module}:{qualname} ({error})")
    assert not missing, "docs/architecture.md names what is not there:\n" + "\n".join(missing)


def test_the_parser_reads_only_the_section_and_every_name_in_it():
    text = (
        "# t\n## One turn, end to end\n1. `heron.bus:Dispatcher.deliver` then "
        "`heron.agent.turn:run_turn` and `heron.bus:Dispatcher.deliver` again\n"
        "## Modules\n`heron.cli:app`\n"
    )
    assert named_functions(text) == [
        ("heron.bus", "Dispatcher.deliver"),
        ("heron.agent.turn", "run_turn"),
    ]


def test_one_turn_with_a_tool_call_enters_every_function_the_map_names(tmp_path):
    bench = _bench()
    entered, printed = bench.profile_run(tmp_path)
    assert printed.strip() == bench.ANSWER  # the turn really ran: tool call, then the answer
    read_file = code_of("heron.tools.files", "read_file")
    assert read_file in entered.codes  # the profile sees the tool the model called
    named = named_functions(DOC.read_text())
    not_entered = [f"{m}:{q}" for m, q in named if code_of(m, q) not in entered.codes]
    assert not not_entered, (
        "docs/architecture.md names functions one turn no longer enters (update the map):\n"
        + "\n".join(not_entered)
    )


def test_the_check_fails_for_a_function_the_turn_does_not_enter(tmp_path):
    bench = _bench()
    entered, _ = bench.profile_run(tmp_path)
    assert code_of("heron.agent.engine", "Engine.compact_now") not in entered.codes
