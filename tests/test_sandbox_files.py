"""Every file tool refuses a symlink or a hard link whose file lies outside the workspace, asked
for by a scripted model through the engine (the attack: a link to HERON_HOME/config.toml)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sandbox_helpers import CONFIG_KEY, call_tool, seed_home

from heron.tools.files import MAX_LINK_SCAN, resolve_in


@pytest.fixture
def links(heron_home: Path) -> Path:
    """The workspace with a hard link and a symlink to config.toml, and a harmless hard link
    whose two names are both inside."""
    seed_home(heron_home)
    workspace = heron_home / "workspace"
    workspace.mkdir(exist_ok=True)
    os.link(heron_home / "config.toml", workspace / "hard.toml")
    (workspace / "soft.toml").symlink_to(heron_home / "config.toml")
    (workspace / "mine.txt").write_text("my own words\n")
    os.link(workspace / "mine.txt", workspace / "mine-too.txt")
    return workspace


CALLS = [
    ("read_file", {"path": "{name}"}),
    ("write_file", {"path": "{name}", "content": "overwritten"}),
    ("edit_file", {"path": "{name}", "old": "api_key", "new": "stolen"}),
    ("grep", {"pattern": "api_key", "path": "{name}"}),
    ("list_files", {"path": "{name}"}),
]


@pytest.mark.parametrize("name", ["hard.toml", "soft.toml"])
@pytest.mark.parametrize(("tool", "args"), CALLS, ids=[c[0] for c in CALLS])
async def test_every_file_tool_refuses_a_link_out(
    links: Path, heron_home: Path, tool: str, args: dict[str, str], name: str
) -> None:
    filled = {k: v.format(name=name) for k, v in args.items()}
    result = await call_tool(tool, filled)
    assert result.is_error
    assert CONFIG_KEY not in result.content
    said = "hard link to a file outside the workspace" if name == "hard.toml" else "outside"
    assert said in result.content
    assert CONFIG_KEY in (heron_home / "config.toml").read_text()  # nothing written through


async def test_a_search_of_the_workspace_passes_over_links_out(links: Path) -> None:
    result = await call_tool("grep", {"pattern": "api_key|my own"})
    assert not result.is_error
    assert CONFIG_KEY not in result.content and "hard.toml" not in result.content
    assert "mine.txt:1:my own words" in result.content  # both names inside: a plain file


async def test_a_hard_link_with_every_name_inside_is_a_plain_file(links: Path) -> None:
    result = await call_tool("read_file", {"path": "mine-too.txt"})
    assert not result.is_error and "my own words" in result.content


def test_a_workspace_too_big_to_search_refuses_rather_than_guesses(
    links: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from heron.errors import PathEscape
    from heron.tools import files

    monkeypatch.setattr(files, "MAX_LINK_SCAN", 1)
    with pytest.raises(PathEscape):
        resolve_in(links, "mine.txt")
    assert MAX_LINK_SCAN > 1
