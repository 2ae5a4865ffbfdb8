"""The system prompt, assembled in a fixed order so its bytes stay the same from turn to turn.

Anything that changes every turn (the time, the channel) does not belong here: it goes in the
runtime block after the user's message, so the provider's prompt cache keeps hitting.
"""

from __future__ import annotations

import hashlib
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

from heron.providers.base import ToolSpec

TOOL_CONTRACT = """\
# Tools
Use tools when they help; answer directly when they do not. Independent calls may run in
parallel. A tool error comes back as a result: read it and correct the call. Files and commands
act inside the workspace."""


@dataclass(frozen=True)
class PromptInputs:
    agent: str
    workspace: Path
    tools: list[ToolSpec]


def identity(inputs: PromptInputs) -> str:
    runtime = f"{platform.system()}, Python {sys.version.split()[0]}"
    return (
        f"You are {inputs.agent}, a personal assistant running in Heron.\n"
        f"Workspace: {inputs.workspace}\nRuntime: {runtime}"
    )


def tool_inventory(tools: list[ToolSpec]) -> str:
    names = ", ".join(t.name for t in tools) if tools else "none"
    return f"# Tools available in this turn\n{names}"


def build_system_prompt(inputs: PromptInputs) -> str:
    sections = [
        identity(inputs),
        TOOL_CONTRACT if inputs.tools else "",
        tool_inventory(inputs.tools),
    ]
    return "\n\n".join(s for s in sections if s)


def fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
