"""Secrets kept out of the record: text scrubbed before it is stored, sent or printed.

Pure functions, no I/O. A `Redactor` knows the credentials Heron itself holds (every key in
config.toml and in the provider variables) and replaces them exactly, always; with `patterns`
on (`[tools] redact = true`, the default) it also replaces what looks like a secret of any
kind: API key prefixes (sk-, sk-ant-, ghp_, xox*, AKIA), PEM private keys, `KEY=`/`TOKEN=`/
`PASSWORD=`/`SECRET=` assignments in .env or TOML style, bearer tokens, JSON web tokens,
passwords in connection strings and long high-entropy tokens. Each is replaced by
`[redacted: kind]`, so the model and the user can tell that something was there and what.

The tool result path (heron/tools/registry.py) scrubs every result before it is stored or
sent, and the runner scrubs provider errors before they are stored or shown. Memory uses the
same patterns (heron/memory/guard.py) to refuse secrets outright.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

# The variables a provider key comes from (heron/config.py); their values are always redacted.
KEY_VARIABLES = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "HERON_API_KEY")
# Any other variable named like a credential is redacted as well.
_SECRET_SUFFIXES = ("API_KEY", "_TOKEN", "_SECRET", "_PASSWORD")
# Values that stand for "no key" (a local server) and may appear in any text.
_DUMMIES = {"not-needed", "local", "replay", "none", "dummy", "scripted"}
MIN_KEY = 8  # shorter values would redact ordinary words


def mark(kind: str) -> str:
    return f"[redacted: {kind}]"


# (kind, pattern): the whole match is replaced. Memory refuses the same (heron/memory/refuse.py).
PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    (
        "private key",
        re.compile(
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?:.*?-----END [A-Z0-9 ]*PRIVATE KEY-----"
            r"|.*\Z)",
            re.DOTALL,
        ),
    ),
    ("api key", re.compile(r"\b(?:sk|pk|rk)-(?:ant-|proj-|live-|test-)?[A-Za-z0-9_-]{16,}")),
    ("github token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,})")),
    ("aws key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("google api key", re.compile(r"\bAIza[0-9A-Za-z_-]{30,}")),
    ("slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("json web token", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[\w-]+")),
    ("bearer token", re.compile(r"\b(?P<keep>bearer )[A-Za-z0-9._~+/=-]{16,}", re.IGNORECASE)),
    # The user may be empty (`postgresql://:pw@host`).
    ("password in a url", re.compile(r"(?<=://)[^/\s:@]*:[^/\s@]+(?=@)")),
]
# A pattern runs only when its marker is in the text (a substring test costs microseconds where
# a regex scan of a long output costs milliseconds); most outputs hold none of them.
MARKERS = {
    "private key": ("PRIVATE KEY",),
    "api key": ("sk-", "pk-", "rk-"),
    "github token": ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    "aws key": ("AKIA", "ASIA"),
    "google api key": ("AIza",),
    "slack token": ("xox",),
    "json web token": ("eyJ",),
    "bearer token": ("bearer ",),  # looked for in the lowered text
    "password in a url": ("://",),
}

# NAME=value, NAME: value, name = "value" where the name's last part is a credential word; the
# value (quoted or bare, to the end of the token) is replaced and the name kept. The match starts
# at the credential word, which must begin the name or follow _ . - (so not "monkey = x"). Only
# lines holding one of the words are searched (`_CREDENTIAL_WORDS`).
ASSIGNMENT = re.compile(
    r"""(?ix)
    (?:(?<![A-Za-z0-9])|(?<=[_.-]))
    (?P<name>api[_-]?key|apikey|key|token|secret|password|passwd|passphrase|pwd|credentials?)
    (?P<sep>["']?[ \t]*+[=:][ \t]*+)
    (?P<value>"[^"\n]{4,}"|'[^'\n]{4,}'|[^\s"',;]{4,})
    """
)

_CREDENTIAL_WORDS = ("key", "token", "secret", "pass", "pwd", "credential")

# A value that is only a file path ("PWD=/home/me", "ssh_key: ~/.ssh/id_ed25519") names where
# something is, not a secret: the shell's PWD is in every `env` and os.environ.
_PATH_VALUE = re.compile(r"[~.]?/[A-Za-z0-9_./-]*")

# Only from the start of a run of token characters: a shorter run then fails once, not once per
# character of it.
_TOKEN = re.compile(r"(?<![A-Za-z0-9+/=_\-.])[A-Za-z0-9+/=_\-.]{24,}")
_CLASSES = [re.compile(p) for p in (r"[a-z]", r"[A-Z]", r"[0-9]", r"[+/=_\-]")]


def entropy(token: str) -> float:
    """Shannon entropy in bits per character."""
    size = len(token)
    return -sum(n / size * math.log2(n / size) for n in Counter(token).values())


def random_looking(token: str) -> bool:
    """Long, high-entropy and mixing character classes: a key or token, not a word, a path, a
    hex digest (git ids stay readable) or a dotted name."""
    if token.count("/") > 1 or token.count(".") > 1:
        return False  # a path, a URL or a module name
    classes = sum(1 for p in _CLASSES if p.search(token))
    return classes >= 3 and entropy(token) >= 4.0


def _assignment(match: re.Match[str]) -> str:
    value = match.group("value").strip("\"'")
    if value.startswith("[redacted") or _PATH_VALUE.fullmatch(value):
        return match.group()
    quote = match.group("value")[0] if match.group("value")[0] in "\"'" else ""
    # A quoted value keeps its quotes: a dict or a TOML line printed stays one.
    return match.group("name") + match.group("sep") + quote + mark("assignment") + quote


def _replace(kind: str) -> Callable[[re.Match[str]], str]:
    def replace(match: re.Match[str]) -> str:
        kept = match.groupdict().get("keep") or ""
        return kept + mark(kind)

    return replace


def _lines_with(text: str, lowered: str, words: tuple[str, ...]) -> list[tuple[int, int]]:
    """(start, end) of every line of `text` that holds one of `words` (searched in `lowered`,
    found with str.find: far faster than a regex scan of a long output)."""
    spans: set[tuple[int, int]] = set()
    for word in words:
        at = lowered.find(word)
        while at != -1:
            start = text.rfind("\n", 0, at) + 1
            end = text.find("\n", at)
            end = len(text) if end == -1 else end
            spans.add((start, end))
            at = lowered.find(word, end)
    return sorted(spans)


def _assignments(text: str, lowered: str) -> str:
    """`ASSIGNMENT` applied to the lines that hold a credential word."""
    if len(lowered) != len(text):  # a letter whose lower case is longer ("İ"): no offsets
        return ASSIGNMENT.sub(_assignment, text)
    pieces, last = [], 0
    for start, end in _lines_with(text, lowered, _CREDENTIAL_WORDS):
        pieces += [text[last:start], ASSIGNMENT.sub(_assignment, text[start:end])]
        last = end
    return "".join([*pieces, text[last:]]) if pieces else text


def _tokens(text: str) -> str:
    """Long random-looking tokens replaced; only words of 24 characters or more are searched
    (splitting on white space is far faster than a regex scan of a long output)."""
    found = {m.group() for w in set(text.split()) if len(w) >= 24 for m in _TOKEN.finditer(w)}
    for token in sorted(found, key=len, reverse=True):
        if random_looking(token):
            text = text.replace(token, mark("token"))
    return text


def scrub_patterns(text: str) -> str:
    """Every pattern-shaped secret in `text` replaced by its mark."""
    lowered = text.lower()
    for kind, pattern in PATTERNS:
        hay = lowered if kind == "bearer token" else text
        if any(marker in hay for marker in MARKERS[kind]):
            text = pattern.sub(_replace(kind), text)
    text = _assignments(text, text.lower())
    return _tokens(text)


@dataclass(frozen=True)
class Redactor:
    """Scrubs text: the configured `keys` exactly (always), and the patterns when `patterns`."""

    keys: tuple[str, ...] = ()
    patterns: bool = True

    @classmethod
    def of(cls, values: Iterable[str | None], patterns: bool = True) -> Redactor:
        found = {v for v in values if v and len(v) >= MIN_KEY and v.lower() not in _DUMMIES}
        # Longest first, so a key that contains another is replaced whole.
        return cls(tuple(sorted(found, key=len, reverse=True)), patterns)

    def clean(self, text: str) -> str:
        for key in self.keys:
            if key in text:
                text = text.replace(key, mark("configured key"))
        return scrub_patterns(text) if self.patterns else text

    def clean_opt(self, text: str | None) -> str | None:
        return None if text is None else self.clean(text)


def configured_keys(
    api_keys: Mapping[str, str], env: Mapping[str, str], *extra: str | None
) -> list[str | None]:
    """Every credential Heron holds: config.toml's keys, the provider variables, any variable
    named like a credential, and `extra` (the key of the model in use)."""
    named = [v for k, v in env.items() if k.upper().endswith(_SECRET_SUFFIXES)]
    return [*api_keys.values(), *(env.get(k) for k in KEY_VARIABLES), *named, *extra]


E = TypeVar("E", bound=BaseException)


def scrub_error(error: E, redactor: Redactor) -> E:
    """The same error with its message, hint and body scrubbed (in place, so the class, the
    status and the retry hint stay what the caller catches on)."""
    error.args = tuple(redactor.clean(a) if isinstance(a, str) else a for a in error.args)
    for name in ("hint", "body"):
        value = getattr(error, name, None)  # probe: any exception's hint/body
        if isinstance(value, str):
            setattr(error, name, redactor.clean(value))
    return error
