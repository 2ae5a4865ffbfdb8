"""A forgotten secret's words, found again where they were stored as sent, and replaced.

A forget of an entry that holds a secret (heron/memory/service.py) takes it out of the memory
folder's history; the requests already made carried it too: in the Memory section of the
system prompt, in a runtime block's note ("- saved: ..."), and in the trace's copies of them.
`SecretScrub` is what finds those words there: each secret's run of words (refuse.secret_runs:
"password is hunter2zz", the word that names it included), matched across any spacing, as
plain text or as it reads inside a JSON string (a trace blob is JSON, a piece of a system
prompt blob is JSON cut mid-string), and replaced by MARKER.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from heron.context.runtime import HEADER
from heron.memory.refuse import MASK, secret_runs
from heron.memory.section import hide_secret_items
from heron.messages import dumps

MARKER = "[a forgotten secret]"
# Between two words of a run: spaces, or a line break or tab as a JSON string escapes it.
_GAP = r"(?:\s|\\[nrt])+"


@dataclass(frozen=True)
class SecretScrub:
    """The runs of secret words of some texts, as one pattern, and `probes`: one word of each
    run as it is stored in JSON, for a database to pick the rows worth reading (instr)."""

    pattern: re.Pattern[str]
    probes: tuple[str, ...]

    @classmethod
    def of(cls, texts: Iterable[str]) -> SecretScrub | None:
        """The scrub for the secrets `texts` hold; None when they hold none."""
        runs: dict[str, str] = {}
        for text in texts:
            runs.update(_runs(text))
        if not runs:
            return None
        # Longest first, so a run that holds another is replaced whole.
        ordered = sorted(runs, key=len, reverse=True)
        return cls(re.compile("|".join(ordered)), tuple(sorted(set(runs.values()))))

    def clean(self, text: str) -> str:
        """`text` with each secret's run replaced by MARKER."""
        return self.pattern.sub(MARKER, text)

    def found_in(self, text: str) -> bool:
        return self.pattern.search(text) is not None


def _runs(text: str) -> dict[str, str]:
    """Each secret run of `text` as a pattern, with its probe (its longest word, as JSON
    writes it). A run may hold an earlier one (masked first): its pattern holds that one's."""
    words = text.split()
    pieces: list[tuple[str, str, bool]] = [(_word(w), _escaped(w), False) for w in words]
    for start, end in secret_runs(words):
        run = pieces[start:end]
        probe = max((p for _, p, _ in run), key=len)
        pieces[start:end] = [(f"(?:{_GAP.join(p for p, _, _ in run)})", probe, True)]
        words[start:end] = [MASK]
    return {pattern: probe for pattern, probe, is_run in pieces if is_run}


def _escaped(word: str) -> str:
    """`word` as heron.messages.dumps writes it inside a JSON string (non-ASCII kept)."""
    return json.dumps(word, ensure_ascii=False)[1:-1]


def _word(word: str) -> str:
    """A pattern for `word`, plain or JSON-escaped."""
    plain, escaped = re.escape(word), re.escape(_escaped(word))
    return plain if plain == escaped else f"(?:{plain}|{escaped})"


def scrubbed_sent(raw: str, rel: str, scrub: SecretScrub) -> str:
    """A message's parts as sent (`raw`, canonical JSON) with the runtime block's notes of the
    entry `rel` written as a secret's (`section.hide_secret_items`) and any other run of its
    secret replaced by MARKER; the person's own words are left as they were (they said them
    in the conversation: a forget of memory does not rewrite them). A row that does not
    decode is left alone."""
    try:
        parts = json.loads(raw)
    except ValueError:
        return raw
    if type(parts) is not list:
        return raw
    out = [_scrubbed_part(p, rel, scrub) for p in parts]
    return raw if out == parts else dumps(out)


def _scrubbed_part(part: object, rel: str, scrub: SecretScrub) -> object:
    if not isinstance(part, dict) or part.get("kind") != "text":
        return part
    text = part.get("text")
    if not isinstance(text, str) or not text.lstrip().startswith(HEADER):
        return part
    return {**part, "text": scrub.clean(hide_secret_items(text, rel))}
