"""Every command's `--help` reads as prose: the one-line summaries in a group's command list
do not break mid-sentence, and a longer description is rewrapped to the terminal's width
rather than keeping the line breaks of the source."""

from __future__ import annotations

from functools import cache
from itertools import pairwise

import typer
from typer.testing import CliRunner

from heron.cli import app

WIDE = 200


def _paths(command: object, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [path]
    for name, sub in getattr(command, "commands", {}).items():  # a group's (typer's own click)
        out += _paths(sub, (*path, name))
    return out


@cache  # the same text for every test that reads it: each command's help rendered once
def _help(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDE)})
    assert result.exit_code == 0, result.output
    return result.output


def _description(text: str) -> list[str]:
    """The lines of `text` before its first boxed panel, after the usage line, right-stripped."""
    lines = text.splitlines()
    start = next(n for n, line in enumerate(lines) if "Usage:" in line) + 1
    end = next((n for n, line in enumerate(lines) if line.startswith("╭")), len(lines))
    return [line.rstrip() for line in lines[start:end]]


COMMANDS = _paths(typer.main.get_command(app))


def test_the_tree_is_walked():
    assert ("run",) in COMMANDS and ("memory", "undo") in COMMANDS and len(COMMANDS) > 25


def test_no_command_summary_wraps_in_a_wide_command_list():
    for path in COMMANDS:
        panel = False
        for line in _help(path).splitlines():
            if "─ Commands ─" in line:
                panel = True
            elif line.startswith("╰"):
                panel = False
            elif panel:
                # a continuation row has an empty name column: the summary broke
                assert not line.startswith("│" + " " * 4), (path, line)


def test_descriptions_are_rewrapped_not_broken_at_the_source_lines():
    for path in COMMANDS:
        lines = _description(_help(path))
        for line, after in pairwise(lines):
            # at 200 columns a paragraph fills its line before it wraps: a line followed by
            # more of its paragraph while far short of the width kept a source line break
            assert not (line and after) or len(line) > WIDE - 40, (path, line)


def test_a_flag_shows_no_value_placeholder():
    """typer's panel showed every flag as `--json <bool>`, `--help <bool>`, as if it took a
    value (QA22u L11); an option that takes one keeps its placeholder."""
    for path in COMMANDS:
        assert "<bool>" not in _help(path), path
    shown = _help(("run",))
    assert "<str>" in shown and "FILE" in shown  # --conversation, --attach take values


def test_heron_web_help_says_how_long_a_login_address_works_as_the_serve_has_it():
    """It said 10 minutes of a code that works 2 (qa24c L3): the figures are the serve's."""
    from heron.serve.auth import CODE_SECONDS, SESSION_SECONDS

    said = " ".join(_help(("web",)).replace("│", " ").split())
    assert f"it works once, for {CODE_SECONDS // 60} minutes" in said
    assert f"stays logged in for {SESSION_SECONDS // 86400} days" in said
