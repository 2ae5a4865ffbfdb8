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
nothing of its first sentence back. Either counts only about the statement it would correct
(`is_about`): "Correction: the dentist is on Friday." corrects the dentist, not what was said
before it.
"""

from __future__ import annotations

import re

from heron.memory.stopwords import STOPWORDS

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


def takes_back(text: str, statement: str | None = None) -> bool:
    """Whether a message says it takes back or corrects something said before, or that what
    the person did or was has ended; with `statement`, a sentence of it that does so is about
    `statement` (`is_about`)."""
    return any(
        statement is None or is_about(statement, sentence.strip(), found.group(0))
        for sentence in _SENTENCE.findall(text)
        for found in _TAKES_BACK.finditer(sentence.strip())
    )


def retraction(text: str, statement: str | None = None) -> str | None:
    """The words of `text` that retract what was said just before it ("scratch that"), if
    any; with `statement`, only words about it (`is_about`)."""
    for found in RETRACTS.finditer(text):
        if statement is None or is_about(statement, text, found.group(0)):
            return found.group(0).strip()
    return None


# A sentence of a message: what a correction in it speaks of (a colon does not end it).
_SENTENCE = re.compile(r"[^.!?\n\u00b6]+[.!?\n\u00b6]*")
# A correction that says this many words of its own, none the statement's, says something else.
OWN_WORDS = 3
# The words retractions are made of: none is what a correction says of its own.
_RETRACTION_WORDS = """scratch correction update meant sorry oops actually wait wrong misspoke
mistake made error forget take back longer true case right correct valid anymore any more
said ok okay yes well"""
# Retractions that point back at what was said ("scratch that", "that is no longer true", "I
# was wrong"): they speak of it, whatever follows them.
_POINTS_BACK = re.compile(
    r"\b(?:scratch|forget|take)\s+(?:that|it|this|what i said)\b"
    r"|\b(?:that|it|this)(?:'s|\s+is|\s+was)?\s+(?:not|no longer|wrong|a mistake|an error)\b"
    r"|\bi (?:was wrong|misspoke|made a mistake)\b",
    re.IGNORECASE,
)


def is_about(statement: str, correction: str, words: str) -> bool:
    """Whether `correction` (a sentence holding the retraction `words`) speaks of `statement`:
    its retraction points back at what was said ("scratch that", "that is no longer true"),
    or it shares a content word with the statement (their first five letters: "moved",
    "move"), or says too little of its own to be about anything else ("Sorry, I meant
    Braga."). "Correction: the dentist is on Friday, not Thursday." corrects the dentist, not
    "I started learning Portuguese" said before it (qa24b H2)."""
    if _POINTS_BACK.search(words) or _POINTS_BACK.search(correction):
        return True
    own = _stems(correction) - _RETRACTION_STEMS
    return bool(own & _stems(statement)) or len(own) < OWN_WORDS


def _stems(text: str) -> set[str]:
    return {w[:5] for w in re.findall(r"[\w']+", text.casefold()) if w not in STOPWORDS}


_RETRACTION_STEMS = frozenset(_stems(_RETRACTION_WORDS))  # once, not at every sentence judged
