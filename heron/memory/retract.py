"""Words by which the person takes back what they said: recall shows such a later message under
a hit (`Recall.corrections`), and the quote guard refuses to save a statement taken back right
after it was made (`guard.find_quote`, `QuoteMatch.taken_back`).

Narrow on purpose: a message counts only when it says that it corrects something. Two kinds:
words that retract what was just said ("scratch that", "I was wrong", "forget that", not
"don't forget that", "that was a mistake", "correction:", "that is no longer true"), and words
that say a state has ended ("I no longer ...", "I don't ... any more"). Recall takes both; a
save is refused only for the first, since "I moved to Porto. I no longer live in Lisbon." takes
nothing of its first sentence back.
"""

from __future__ import annotations

import re

_RETRACTS = (
    r"no longer (?:true|the case|right|correct|valid)"
    r"|(?:isn'?t|wasn'?t|is not|was not|not) (?:true|the case)\b"
    r"|scratch that|i was wrong|i misspoke|i made a mistake"
    r"|(?:that|it|this) was (?:wrong|a mistake|an error)|correction\s*:"
    r"|(?<!n't )(?<!not )(?<!never )forget (?:that|what i said)|take (?:that|it) back"
)
_ENDED = (
    r"(?:i|we)(?:['’]m| am|['’]re| are)? no longer\b"
    r"|(?:not|no|\w+n't)\b[^.!?\n]{0,40}\bany ?more\b"
)
RETRACTS = re.compile(rf"\b(?:{_RETRACTS})", re.IGNORECASE)
_TAKES_BACK = re.compile(rf"\b(?:{_RETRACTS}|{_ENDED})", re.IGNORECASE)


def takes_back(text: str) -> bool:
    """Whether a message says it takes back or corrects something said before, or that what
    the person did or was has ended."""
    return bool(_TAKES_BACK.search(text))


def retraction(text: str) -> str | None:
    """The words of `text` that retract what was said just before it ("scratch that"), if
    any."""
    found = RETRACTS.search(text)
    return found.group(0) if found else None
