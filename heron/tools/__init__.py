"""The tools an agent calls: files, bash and a Python kernel, all confined to a workspace."""

from heron.tools.context import ToolContext
from heron.tools.registry import Tool, ToolOutput, ToolRegistry, tool

__all__ = ["Tool", "ToolContext", "ToolOutput", "ToolRegistry", "tool"]
