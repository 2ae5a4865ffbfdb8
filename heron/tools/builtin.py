"""The built-in tools, listed once: the registry every turn starts from.

Here rather than in registry.py, so that the tools import their registry and never the other way
round."""

from __future__ import annotations

from heron.tools import files, python_kernel, scratchpad, shell, todos, work_state
from heron.tools.registry import BeforeCall, ToolRegistry


def default_registry(before_call: BeforeCall | None = None) -> ToolRegistry:
    """The built-in tools: files, bash and a Python kernel."""
    return ToolRegistry(
        [
            files.read_file,
            files.write_file,
            files.edit_file,
            files.list_files,
            files.grep,
            shell.bash,
            python_kernel.run_cell,
            work_state.work_state,
            todos.todos,
            scratchpad.scratchpad,
        ],
        before_call,
    )
