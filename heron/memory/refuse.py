"""What memory refuses whatever the quote: secrets, and sensitive claims not asked for.

Secrets are the patterns tool output is scrubbed of (heron/redact.py), and what a person says
in passing: PIN-like numbers, card numbers (Luhn), social security numbers, passwords in any
phrasing ("pass hunter2", "my password for the bank is x"), long hex or random strings, and a
key spelled out a character at a time ("s-k-a-n-t-..."). Sensitive claims (health, sexuality,
religion, politics) are saved only when the person explicitly asked to remember that exact
thing. Every function is pure and returns what it found, in words the model is told.
"""

from __future__ import annotations

import re
from functools import cache

from heron.redact import PATTERNS, entropy

_STRONG = r"(?:password|passwd|passphrase|passcode|mot de passe|kennwort)s?"
# A word with a digit or a symbol in it (punctuation that ends a sentence does not count).
_VALUE = r"(?=\S*[\d_]|\S*[^\w\s.,;:!?])\S{4,}"


# The patterns are compiled on first use (`_secret_patterns`, `_sensitive_patterns`): most
# processes never save a memory, and compiling them cost a few milliseconds of every start.
@cache
def _secret_patterns() -> list[tuple[str, re.Pattern[str]]]:
    return [
        *((f"a secret ({kind})", pattern) for kind, pattern in PATTERNS),
        ("a bearer token", re.compile(r"\bbearer\s+[A-Za-z0-9._~+/=-]{16,}", re.IGNORECASE)),
        (
            "a password",
            re.compile(
                rf"\b{_STRONG}\b(?:[^.\n]{{0,40}}?(?:\bis\b|\bwas\b|=|:)\s*\S{{3,}}"
                rf"|\s*[:=]?\s*{_VALUE})"
                rf"|\b(?:pass|pw|pwd)(?:\s*[:=]\s*|\s+)(?=\S*\d)\S{{4,}}",
                re.IGNORECASE,
            ),
        ),
        (
            "a PIN or access code",
            re.compile(
                r"\b(?:pin|pin code|pin number|passcode|combination|door code|lock code"
                r"|access code|security code|alarm code)\b"
                r"[^\d\n]{0,16}\d(?:[ -]?\d){3,7}\b",
                re.IGNORECASE,
            ),
        ),
        (
            "a social security number",
            re.compile(
                r"\b\d{3}-\d{2}-\d{4}\b|\b(?:ssn|social security(?: number)?)\b\D{0,16}\d{3}", re.I
            ),
        ),
        (
            "a credential",
            re.compile(
                r"\b(?:api[_ -]?key|secret|token|access[_ -]?key)\s*(?:is|=|:)\s*\S{6,}", re.I
            ),
        ),
        ("a key (a long hex string)", re.compile(r"\b[0-9a-fA-F]{24,}\b")),
        # One character, one separator, at least ten times: a key or code spelled out to get past
        # the patterns above.
        ("a key or code spelled out", re.compile(r"(?<![\w-])(?:[A-Za-z0-9][-_.,\s]){9,}\w\b")),
    ]


_CARD = r"\b(?:\d[ -]?){13,19}\b"
_TOKEN = r"[A-Za-z0-9+/=_\-.]{20,}"


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _random_looking(token: str) -> bool:
    """Long, high-entropy and mixing character classes: a key or token, not a word or a path."""
    if token.count("/") > 2 or token.count(".") > 1:
        return False  # a path, a URL or a dotted name
    classes = sum(bool(re.search(p, token)) for p in (r"[a-z]", r"[A-Z]", r"[0-9]", r"[+/=_\-]"))
    return classes >= 3 and entropy(token) >= 3.8


def find_secret(text: str) -> str | None:
    """What kind of secret `text` holds, or None. Patterns first, then card numbers (Luhn),
    then any long token random enough to be a key."""
    for what, pattern in _secret_patterns():
        if pattern.search(text):
            return what
    for match in re.finditer(_CARD, text):
        digits = re.sub(r"\D", "", match.group())
        if 13 <= len(digits) <= 19 and _luhn(digits):
            return "a card number"
    for match in re.finditer(_TOKEN, text):
        if _random_looking(match.group()):
            return "a token or key (a long random string)"
    return None


# ---- sensitive claims ------------------------------------------------------------------------


@cache
def _sensitive_patterns() -> list[tuple[str, re.Pattern[str]]]:
    return [
        (
            "health",
            re.compile(
                r"\b(?:hiv|aids|cancer|tumou?r|diabet\w*|depress\w*|anxiety|bipolar|schizophreni\w*"
                r"|adhd|autis\w*|ocd|ptsd|epilep\w*|diagnos\w*|disorder|disease|illness|chronic"
                r"|medication|prescri\w*|antidepressant\w*|therapy|therapist|psychiatri\w*"
                r"|pregnan\w*|miscarriage|abortion|addict\w*|rehab|overdose|suicid\w*|self-harm"
                r"|mental health|hepatitis|disabilit\w*|chemo\w*|insulin|surgery)\b",
                re.IGNORECASE,
            ),
        ),
        (
            "sexuality",
            re.compile(
                r"\b(?:gay|lesbian|bisexual|homosexual|heterosexual|queer|asexual|pansexual"
                r"|transgender|non-binary|nonbinary|sexual orientation|sexuality|closeted"
                r"|coming out|came out|sex life|kink\w*)\b",
                re.IGNORECASE,
            ),
        ),
        (
            "religion",
            re.compile(
                r"\b(?:religio\w*|muslim|islam\w*|christian\w*|catholic\w*|protestant|jewish"
                r"|judaism|jew|hindu\w*|buddhis\w*|sikh\w*|atheis\w*|agnostic|mormon|evangelical"
                r"|church|mosque|synagogue|pray\w*|faith|allah|bible|quran|torah)\b",
                re.IGNORECASE,
            ),
        ),
        (
            "politics",
            re.compile(
                r"\b(?:politic\w*|democrat\w*|republican\w*|socialist"
                r"|communist|fascist|libertarian|tory|tories|green party|left-wing"
                r"|right-wing|vote[sd]?|voting|voter|election\w*|party member|union member"
                r"|trump|biden|harris|maga)\b",
                re.IGNORECASE,
            ),
        ),
    ]


def find_sensitive(text: str) -> str | None:
    """Which sensitive kind of claim `text` makes (health, sexuality, religion, politics)."""
    for what, pattern in _sensitive_patterns():
        if pattern.search(text):
            return what
    return None
