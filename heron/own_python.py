"""How Heron starts a Python child of its own: the offline model's server, the memory review at a
chat's close, auto-recall's searcher, a worker of `heron serve --workers`.

With `python -m`, Python puts the folder the process was started in first on the child's
`sys.path`, before Heron's own packages. A person who runs Heron from the workspace would then
have the child import a `heron/` package (or a `json.py`) the agent's tools wrote there, outside
the sandbox, with Heron's keys and files at hand (QA pass 10, qa24d: code planted with a
sandboxed `bash` call ran when a chat closed). `-P` (Python 3.11) leaves that folder out; the
children still see `PYTHONPATH`, which is the person's own setting, not a folder the agent can
write.
"""

from __future__ import annotations

import sys


def python_module(module: str, *args: str) -> list[str]:
    """The command that runs `module` of Heron (or of the standard library) with `args` in a
    child of this interpreter, the current folder kept off its import path."""
    return [sys.executable, "-P", "-m", module, *args]
