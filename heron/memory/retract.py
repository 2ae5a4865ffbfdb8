"""Words by which the person takes back what they said: recall shows such a later message under
a hit (`Recall.corrections`), and the quote guard refuses to save a statement taken back right
after it was made (`guard.find_quote`, `QuoteMatch.taken_back`).

Narrow on purpose: a message counts only when it says that it corrects something. Two kinds:
words that retract what was just said ("scratch that", "I was wrong", "forget that", not
"don't forget that", "that was a mistake", "correction:", "that is no longer true"; and, only
where a sentence or message starts with them, "actually no, ...", "wait, no", "no wait",
"sorry, I meant ...", "I meant ..."), and words
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
# Words that retract only where they open a sentence or a message: "Actually no, Braga." takes
# back what came before it, "it was actually no trouble" and "Actually no one came" do not, and
# neither does "I meant to call you" or "I meant it". "actually no", "no wait" must end their
# phrase (a comma, a full stop, the end: not "No, wait for me"); "I meant" must not go on
# "to <do something>" other than "to say".
_PHRASE_END = r"(?=\s*(?:[,.!;:\u2014\u2013-]|$))"
_MEANT = r"i meant\b(?!\s+(?:to\b(?!\s+(?:say|write|type)\b)|it\b|what\b|that\b|well\b))"
_OPENERS = (
    rf"(?:actually|wait)\s*,?\s*no{_PHRASE_END}|no\s*,?\s*(?:wait|actually){_PHRASE_END}"
    rf"|(?:sorry|oops|no)\s*,?\s*{_MEANT}|{_MEANT}"
)
# the start of the text, or of a sentence, a line or a dash-led aside within it
_SENTENCE_START = r"(?:^|(?<=[.!?\n\u00b6;\u2014\u2013])\s*|(?<=\s-)\s*)"
RETRACTS = re.compile(
    rf"\b(?:{_RETRACTS})|{_SENTENCE_START}\b(?:{_OPENERS})", re.IGNORECASE | re.MULTILINE
)
_TAKES_BACK = re.compile(
    rf"\b(?:{_RETRACTS}|{_ENDED})|{_SENTENCE_START}\b(?:{_OPENERS})",
    re.IGNORECASE | re.MULTILINE,
)


def takes_back(text: str) -> bool:
    """Whether a message says it takes back or corrects something said before, or that what
    the person did or was has ended."""
    return bool(_TAKES_BACK.search(text))


def retraction(text: str) -> str | None:
    """The words of `text` that retract what was said just before it ("scratch that"), if
    any."""
    found = RETRACTS.search(text)
    return found.group(0).strip() if found else None
