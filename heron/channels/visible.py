"""Text the model, a tool or a web page wrote, as a terminal may show it.

A terminal obeys what it is sent: ESC and the C1 controls move the cursor, erase lines, set the
window title or write the clipboard (OSC 52), and a lone carriage return draws over the line.
So every string that reaches a terminal and did not come from Heron itself (a reply, a
command waiting for approval, a job's prompt, a stored message) goes through `visible`, which
writes those characters as their Python escapes (ESC as `\\x1b`, U+202E as `\\u202e`). What is
stored is never changed: only the terminal's copy is; a pipe or a file gets the exact text
(`for_stream`). Pure: the standard library only.
"""

from __future__ import annotations

import re
import shutil
import unicodedata
from typing import TextIO

# Bidi embeddings, overrides and isolates reorder all that follows them on a line ("Trojan
# Source"); a reply has no need of them. The marks (LRM, RLM, ALM) reorder nothing after
# them and belong to right-to-left text, so only a command shows those.
REORDERING = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
KEPT = frozenset("\n\t")  # the controls text is laid out with
# Categories a command waiting for approval shows escaped on top of the controls: format
# characters (bidi marks, zero-width spaces and joiners, soft hyphen, BOM), the line and
# paragraph separators, and the spaces but the plain one (NBSP, U+2000-U+200A, U+3000). Each
# is invisible, moves text or draws as blank: the person must see every byte.
COMMAND_CATEGORIES = frozenset({"Cf", "Zl", "Zp", "Zs"})
# Characters a terminal draws as blank that are letters or symbols, not spaces: the braille
# blank and the Hangul fillers (qa21v H1). A command shows them escaped too.
BLANK_DRAWN = frozenset("\u2800\u115f\u1160\u3164\uffa0")
# A run of blank lines, of spaces or of one escaped character longer than these is shown by
# its length, so that padding cannot push what a command does out of sight.
BLANK_LINES = 2
SPACES = 40  # deeper than any indentation a script has
TALL = 20  # screen lines: a command this tall may not fit the screen
HEAD = 200  # characters of a tall command said again after it
_BLANKS = re.compile(rf"(?:\n[ \t]*){{{BLANK_LINES + 1},}}\n")
_SPACES = re.compile(rf"[ \t]{{{SPACES},}}")
_REPEATS = re.compile(rf"(.)\1{{{SPACES - 1},}}", re.DOTALL)


def visible(text: str, *, command: bool = False) -> str:
    """`text` with every character a terminal would obey written as its escape: C0 and C1
    controls but newline and tab (a carriage return only before a newline is kept), DEL,
    lone surrogates and the bidi controls that reorder a line. `command`: also every format
    character (bidi marks, zero-width characters). Text without them comes back unchanged."""
    if _plain(text, command):
        return text
    out = []
    for i, c in enumerate(text):
        if c == "\r" and text.startswith("\n", i + 1):
            out.append(c)
        elif _hidden(c, command):
            out.append(_escape(c))
        else:
            out.append(c)
    return "".join(out)


def _plain(text: str, command: bool) -> bool:
    # The common case (a reply of printable text) is decided without a loop in Python.
    if text.isprintable() and not (command and not BLANK_DRAWN.isdisjoint(text)):
        return True
    return not any(_hidden(c, command) for c in text)


def _hidden(c: str, command: bool) -> bool:
    if c in KEPT or c == " ":
        return False
    if c in REORDERING:
        return True
    category = unicodedata.category(c)
    if category in ("Cc", "Cs"):
        return True
    return command and (category in COMMAND_CATEGORIES or c in BLANK_DRAWN)


def _escape(c: str) -> str:
    if c == "\r":
        return "\\r"
    n = ord(c)
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError, AttributeError):  # closed, or not a file at all
        return False


def for_stream(text: str, stream: TextIO) -> str:
    """`text` as `stream` gets it: escaped (`visible`) for a terminal, exact for a pipe or a
    file, where a script reads the bytes as they were stored."""
    return visible(text) if is_terminal(stream) else text


def command_shown(label: str, command: str, width: int | None = None) -> tuple[str, str]:
    """A command waiting for approval as a terminal `width` columns wide (the terminal's, by
    default) shows it: the command, every character visible and long runs of blank lines,
    spaces or one escaped character shortened to their length; and the lines printed after
    it, which name what is asked (`label`) and the command's size again, so that the question
    is the last thing on the screen, and a command taller than the screen (counted in the
    screen lines its long lines wrap to) says so and shows its start again."""
    shown, repeats = _REPEATS.subn(_repeated, command)
    shown = visible(shown, command=True)
    shown, blanks = _BLANKS.subn(_blank_lines, shown)
    shown, runs = _SPACES.subn(lambda m: f"[{len(m.group())} spaces]", shown)
    lines = command.count("\n") + 1
    size = f"{lines} line{'s' if lines != 1 else ''}, {len(command)} characters"
    after = f"↑ the whole command ({label}): {size}"
    if blanks or runs or repeats:
        after += "; runs of blank lines or spaces are shown as [N blank lines], [N spaces]"
    width = width or shutil.get_terminal_size().columns
    if screen_lines(shown, width) >= TALL:
        head = shown[:HEAD].replace("\n", "⏎") + ("…" if len(shown) > HEAD else "")
        after += f"; scroll up to read all of it\n  it begins: {head}"
    return shown, after


def _repeated(m: re.Match[str]) -> str:
    """A run of one character the command shows escaped (6,000 U+2800) as its length."""
    c = m.group(1)
    return f"[{len(m.group())} × {_escape(c)}]" if _hidden(c, True) else m.group()


def screen_lines(text: str, width: int) -> int:
    """The lines `text` takes on a screen `width` columns wide, its long lines wrapped."""
    width = max(width, 1)
    return sum(max(1, -(-_cells(line) // width)) for line in text.split("\n"))


def _cells(line: str) -> int:
    # As a terminal draws them: East Asian wide characters take two columns, combining marks
    # none, a tab up to 8 (counted as 8: too many lines warns, too few would not).
    cells = 0
    for c in line:
        if c == "\t":
            cells += 8
        elif not unicodedata.combining(c):
            cells += 2 if unicodedata.east_asian_width(c) in "WF" else 1
    return cells


def _blank_lines(m: re.Match[str]) -> str:
    return f"\n[{m.group().count(chr(10)) - 1} blank lines]\n"
