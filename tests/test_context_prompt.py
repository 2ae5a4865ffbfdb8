from __future__ import annotations

from pathlib import Path

import pytest

from heron.context.prompt import (
    TEMPLATES,
    PromptInputs,
    build_system_prompt,
    install_templates,
    is_shipped_template,
)
from heron.request import ToolSpec

TOOLS = [ToolSpec("read_file", "Read a file.", {"type": "object"})]


def shipped_versions() -> list[Path]:
    return sorted((TEMPLATES / "shipped").glob("*.v*.md"))


def test_every_bootstrap_template_has_a_shipped_version_equal_to_it():
    # Editing a template without recording the new version would turn old copies in users'
    # workspaces into "user-written" files; the current text must be one of the shipped ones.
    for name in ("AGENTS.md", "SOUL.md", "USER.md"):
        current = (TEMPLATES / name).read_text()
        stem = name.removesuffix(".md")
        versions = [p.read_text() for p in shipped_versions() if p.name.startswith(stem + ".v")]
        assert current in versions


@pytest.mark.parametrize("version", shipped_versions(), ids=lambda p: p.name)
def test_every_shipped_version_is_recognised_by_digest(tmp_path, version):
    name = version.name.split(".v")[0] + ".md"
    text = version.read_text()
    assert is_shipped_template(name, text)
    assert is_shipped_template(name, text.replace("\n", "\r\n") + "\n\n")  # line endings only
    (tmp_path / name).write_text(text)
    prompt = build_system_prompt(PromptInputs("heron", tmp_path, TOOLS))
    if name == "SOUL.md":
        assert "SOUL.md (unmodified default, not written by the user)" in prompt
        assert text.strip() in prompt
    else:
        assert name not in prompt and text.strip() not in prompt


def test_edited_bootstrap_files_are_included_in_full(tmp_path):
    install_templates(tmp_path)
    (tmp_path / "USER.md").write_text("# USER.md\nI am Ana; answer in Portuguese.\n")
    prompt = build_system_prompt(PromptInputs("heron", tmp_path, TOOLS))
    assert "## USER.md\n# USER.md\nI am Ana; answer in Portuguese." in prompt
    assert "AGENTS.md" not in prompt  # still the template


def test_files_given_as_none_are_not_read_from_the_workspace(tmp_path):
    """A replayed run that had no workspace files records {}: a USER.md written since must
    not enter its rebuilt prompt (every request of the replay differed)."""
    (tmp_path / "USER.md").write_text("# USER.md\nWritten after the run.\n")
    read = build_system_prompt(PromptInputs("heron", tmp_path, TOOLS))
    assert "Written after the run." in read  # no files given: the workspace's are read
    given = build_system_prompt(PromptInputs("heron", tmp_path, TOOLS, bootstrap={}))
    assert "Written after the run." not in given


def test_sections_come_in_the_fixed_order(tmp_path):
    (tmp_path / "AGENTS.md").write_text("run make test before saying done")
    inputs = PromptInputs(
        "heron",
        tmp_path,
        [ToolSpec("schedule", "Schedule.", {"type": "object"})],  # recurring work is rendered
        memory="MEMORY-X",
        recent_history="HISTORY-X",
        skills="SKILLS-X",
        archived_summary="ARCHIVE-X",
    )
    prompt = build_system_prompt(inputs)
    marks = [
        "You are heron",
        "run make test",
        "# Tools\n",
        "# Recurring work",
        "MEMORY-X",
        "HISTORY-X",
        "SKILLS-X",
        "ARCHIVE-X",
        "# Tools available in this turn",
    ]
    positions = [prompt.index(m) for m in marks]
    assert positions == sorted(positions)


def test_recurring_work_only_with_a_scheduler_or_undeclared_tools(tmp_path):
    without = build_system_prompt(PromptInputs("h", tmp_path, TOOLS))
    scheduler = [*TOOLS, ToolSpec("schedule", "Schedule.", {"type": "object"})]
    with_it = build_system_prompt(PromptInputs("h", tmp_path, scheduler))
    assert "# Recurring work" not in without and "# Recurring work" in with_it


def test_prompt_bytes_are_stable(tmp_path):
    a = build_system_prompt(PromptInputs("h", tmp_path, TOOLS))
    b = build_system_prompt(PromptInputs("h", tmp_path, TOOLS))
    assert a == b and "Time:" not in a


def test_the_brief_prompt_names_an_agent_but_not_the_default_one(tmp_path: Path):
    """The offline model's whole prompt read "You are default, a helpful assistant."."""
    unnamed = build_system_prompt(PromptInputs("default", tmp_path, [], brief=True))
    named = build_system_prompt(PromptInputs("ada", tmp_path, [], brief=True))
    assert unnamed.startswith("You are a helpful assistant. Give short")
    assert named.startswith("You are ada, a helpful assistant.")
