"""What may enter memory: the user's own words, and no secrets.

A save names a quote; the quote must appear, after folding case, punctuation variants and white
space, in a message the user typed in this conversation. Only typed user text counts: tool
results travel in user-role messages on the wire, and synthetic rows (summaries, recall
injections, subagent prompts) are written by Heron, so neither is searched. The model's own text
never is.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from heron.messages import Text
from heron.redact import PATTERNS
from heron.store import StoredMessage

MIN_QUOTE_CHARS = 8

# Row kinds other than a typed message, and meta flags, that mark text Heron wrote itself.
_SYNTHETIC_FLAGS = ("synthetic", "injected", "injected_event", "recall", "summary", "subagent")

_FOLD = str.maketrans(
    {"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-"}
)


def normalise(text: str) -> str:
    """Case, Unicode form, typographic quotes and runs of white space folded away."""
    text = unicodedata.normalize("NFKC", text).translate(_FOLD).casefold()
    return " ".join(text.split())


def _trim(quote: str) -> str:
    """A quote may be wrapped in quotation marks or end with a full stop the user did not type."""
    return normalise(quote).strip(" \"'`.,;:!?")


def typed_text(row: StoredMessage) -> str | None:
    """The text the user typed in `row`, or None when the row is not the user's own words: its
    author is not the person (Heron's own prompts, summaries, injections: 'heron'), or its
    kind or flags say Heron wrote it. A tool row's text parts are what the person typed while
    the tools ran (its results are not text parts)."""
    if row.author not in (None, "user", "tool"):
        return None
    if row.role != "user" or row.kind != "message":
        return None
    if any(row.meta.get(flag) for flag in _SYNTHETIC_FLAGS):
        return None
    texts = [p.text for p in row.message.parts if isinstance(p, Text)]
    return "\n".join(texts) if texts else None


@dataclass(frozen=True)
class QuoteMatch:
    message_id: int
    created: float


def find_quote(quote: str, rows: Iterable[StoredMessage]) -> list[QuoteMatch]:
    """The user messages among `rows` that contain `quote` (normalised); newest first."""
    needle = _trim(quote)
    if len(needle) < MIN_QUOTE_CHARS:
        return []
    found = []
    for row in rows:
        text = typed_text(row)
        if text is not None and needle in normalise(text):
            found.append(QuoteMatch(row.id, row.created))
    return sorted(found, key=lambda m: -m.message_id)


def quote_key(quote: str) -> str:
    return _trim(quote)


# ---- "remember that ..." ---------------------------------------------------------------------

_ASK = re.compile(
    r"^\s*(?:(?:please|pls|also|and|oh|ok|okay)[,\s]+)*"
    r"(?:remember|keep\s+in\s+mind|don'?t\s+forget|do\s+not\s+forget|note|make\s+a\s+note)"
    r"(?:\s+that)?\s*[,:]?\s+",
    re.IGNORECASE,
)


def strip_request(text: str) -> str:
    """'Remember that I prefer tea' -> 'I prefer tea': the entry states the rule itself."""
    stripped = _ASK.sub("", text, count=1).strip()
    if not stripped:
        return text.strip()
    return stripped[0].upper() + stripped[1:]


# ---- secrets ---------------------------------------------------------------------------------

# Memory refuses what tool output scrubs (heron/redact.py), and a few phrasings of its own.
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    *((f"a secret ({kind})", pattern) for kind, pattern in PATTERNS),
    ("a bearer token", re.compile(r"\bbearer\s+[A-Za-z0-9._~+/=-]{16,}", re.IGNORECASE)),
    (
        "a password",
        re.compile(
            r"\b(?:password|passwd|passcode|pin|passphrase|mot de passe)\b\s*(?:is|=|:|was)\s*\S+",
            re.IGNORECASE,
        ),
    ),
    (
        "a credential",
        re.compile(r"\b(?:api[_ -]?key|secret|token|access[_ -]?key)\s*(?:is|=|:)\s*\S{6,}", re.I),
    ),
]

_CARD = re.compile(r"\b(?:\d[ -]?){13,19}\b")
_TOKEN = re.compile(r"[A-Za-z0-9+/=_\-.]{20,}")


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _entropy(token: str) -> float:
    counts = {c: token.count(c) for c in set(token)}
    return -sum(n / len(token) * math.log2(n / len(token)) for n in counts.values())


def _random_looking(token: str) -> bool:
    """Long, high-entropy and mixing character classes: a key or token, not a word or a path."""
    if "/" in token.strip("/") and token.count("/") > 2:
        return False  # a path or URL
    classes = sum(bool(re.search(p, token)) for p in (r"[a-z]", r"[A-Z]", r"[0-9]", r"[+/=_\-]"))
    return classes >= 3 and _entropy(token) >= 3.8


def find_secret(text: str) -> str | None:
    """What kind of secret `text` holds, or None. Patterns first, then card numbers (Luhn),
    then any long token random enough to be a key."""
    for what, pattern in _PATTERNS:
        if pattern.search(text):
            return what
    for match in _CARD.finditer(text):
        digits = re.sub(r"\D", "", match.group())
        if 13 <= len(digits) <= 19 and _luhn(digits):
            return "a card number"
    for match in _TOKEN.finditer(text):
        if _random_looking(match.group()):
            return "a token or key (a long random string)"
    return None
