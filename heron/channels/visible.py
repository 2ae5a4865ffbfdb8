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
import unicodedata
from typing import TextIO

# Bidi embeddings, overrides and isolates reorder all that follows them on a line ("Trojan
# Source"); a reply has no need of them. The marks (LRM, RLM, ALM) reorder nothing after
# them and belong to right-to-left text, so only a command shows those.
REORDERING = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
KEPT = frozenset("\n\t")  # the controls text is laid out with
# Categories a command waiting for approval shows escaped on top of the controls: format
# characters (bidi marks, zero-width spaces and joiners, soft hyphen, BOM) and the line and
# paragraph separators. Each is invisible or moves text: the person must see every byte.
COMMAND_CATEGORIES = frozenset({"Cf", "Zl", "Zp"})
# A run of blank lines or of spaces longer than these is shown by its length, so that padding
# cannot push what a command does out of sight.
BLANK_LINES = 2
SPACES = 40  # deeper than any indentation a script has
TALL = 20  # lines: a command this tall may not fit the screen
_BLANKS = re.compile(rf"(?:\n[ \t]*){{{BLANK_LINES + 1},}}\n")
_SPACES = re.compile(rf"[ \t]{{{SPACES},}}")


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
    return text.isprintable() or not any(_hidden(c, command) for c in text)


def _hidden(c: str, command: bool) -> bool:
    if c in KEPT:
        return False
    if c in REORDERING:
        return True
    category = unicodedata.category(c)
    return category in ("Cc", "Cs") or (command and category in COMMAND_CATEGORIES)


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


def command_shown(label: str, command: str) -> tuple[str, str]:
    """A command waiting for approval as a terminal shows it: the command, every character
    visible and long runs of blank lines or spaces shortened to their length; and the line
    printed after it, which names what is asked (`label`) and the command's size again, so
    that the question is the last thing on the screen and a command taller than the screen
    says so."""
    shown = visible(command, command=True)
    shown, blanks = _BLANKS.subn(_blank_lines, shown)
    shown, runs = _SPACES.subn(lambda m: f"[{len(m.group())} spaces]", shown)
    lines = command.count("\n") + 1
    size = f"{lines} line{'s' if lines != 1 else ''}, {len(command)} characters"
    after = f"↑ the whole command ({label}): {size}"
    if blanks or runs:
        after += "; runs of blank lines or spaces are shown as [N blank lines], [N spaces]"
    if shown.count("\n") >= TALL:
        after += "; scroll up to read all of it"
    return shown, after


def _blank_lines(m: re.Match[str]) -> str:
    return f"\n[{m.group().count(chr(10)) - 1} blank lines]\n"
