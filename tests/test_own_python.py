"""Heron's own Python children never import from the folder they were started in (qa24d
Critical 1: a `heron/` package the agent's sandboxed `bash` wrote into the workspace ran,
unconfined and with Heron's keys, when a chat started from the workspace closed)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import heron
from heron.memory.commands import review_argv
from heron.own_python import python_module


def _plant(folder: Path) -> Path:
    """A `heron` package and a `json` module in `folder` that leave a mark when imported."""
    mark = folder / "PLANTED-CODE-RAN"
    code = f"open({str(mark)!r}, 'w').write('ran')\n"
    (folder / "heron").mkdir()
    (folder / "heron" / "__init__.py").write_text(code)
    (folder / "json.py").write_text(code)
    return mark


def test_the_review_at_a_chats_close_started_in_the_workspace_runs_heron_not_what_is_there(
    tmp_path,
):
    mark = _plant(tmp_path)
    argv = [*review_argv(["personal"], None), "--help"]  # imports what a review imports
    env = {**os.environ, "HERON_HOME": str(tmp_path / "home")}
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "review" in done.stdout.lower()
    assert not mark.exists()


def test_every_python_child_of_heron_is_started_through_python_module():
    """The offline model's server, the review pass, auto-recall's searcher and the workers:
    none builds `sys.executable -m` itself (scripts run by path, inside the sandbox, put
    their own folder first, not the current one)."""
    assert python_module("heron", "worker")[1:3] == ["-P", "-m"]
    root = Path(heron.__file__).parent
    found = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if re.search(r'sys\.executable,\s*"-m"', path.read_text())
    ]
    assert found == []
