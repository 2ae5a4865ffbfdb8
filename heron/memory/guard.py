"""What may enter memory: the user's own words, and no secrets.

A save names a quote; the quote must appear, after folding case, punctuation variants and white
space, in a message the user typed in this conversation, as a whole clause (it starts and ends
where a sentence or clause does, or right after a request to remember), so no slice of a
sentence can say what the sentence did not ("like tea" out of "I do not like tea"). Words the
person put in quotation marks are not their statement either (`My sister said "I hate olives"
but I love olives.`): a clause inside a quotation is refused (`quoted_in` says why), unless the
person asked to remember what they quoted (`Remember "I take the 8:15 train".`) or says the
quotation is theirs (`I told her "I'm allergic to nuts"`, `"I love olives," I said.`); a
sentence of theirs that holds a quotation (`I always order the "house special".`) is theirs.
Only typed user text counts: rows whose author is Heron (continue and wrap-up prompts,
summaries, recall injections, subagent prompts) are never searched, nor are tool results, but
for the answer the person typed to an `ask_user` question (its result quotes it). The model's
own text never is, nor what stands in a fenced block of the person's message (`unfenced`): a
file attached as text, stdin piped after the message, a pasted log are what they show, not
what they say. The entry's text is then the quote itself (`quote_text`): the agent picks
where it goes, never its wording.

A forgotten statement is kept normalised (its secret words left out), and any later quote that
overlaps it by meaning (`overlaps`: a run of six words, or the content words of one nearly all
among the other's) is refused.

Secrets and sensitive claims are found in heron/memory/refuse.py.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from heron.memory.refuse import MASK, find_secret, find_sensitive, without_secret
from heron.memory.retract import retraction
from heron.messages import Text
from heron.store import StoredMessage
from heron.store.records import ANSWERED, ASK_TOOL, SYNTHETIC_FLAGS

__all__ = ["find_secret", "find_sensitive"]

MIN_QUOTE_CHARS = 8
MAX_ENTRY_CHARS = 1_000

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


def typed_text(row: StoredMessage, asked_by: StoredMessage | None = None) -> str | None:
    """The text the user typed in `row`, or None when the row is not the user's own words: its
    author is not the person (Heron's own prompts, summaries, injections: 'heron'), or its
    kind or flags say Heron wrote it. A tool row's text parts are what the person typed while
    the tools ran; of its results, only an answer the person typed to an `ask_user` call of
    `asked_by` (the reply just before the row) counts, without the tool's own words around it."""
    if row.author not in (None, "user", "tool"):
        return None
    if row.role != "user" or row.kind != "message":
        return None
    if any(row.meta.get(flag) for flag in SYNTHETIC_FLAGS):
        return None
    texts = [p.text for p in row.message.parts if isinstance(p, Text)]
    if asked_by is not None and asked_by.role == "assistant":
        asks = {c.id for c in asked_by.message.tool_calls if c.name == ASK_TOOL}
        texts += [
            r.content[len(ANSWERED) :]
            for r in row.message.tool_results
            if r.call_id in asks and not r.is_error and r.content.startswith(ANSWERED)
        ]
    return "\n".join(unfenced(t) for t in texts) if texts else None


# A fence (CommonMark): three or more backticks or tildes at the start of a line, up to three
# spaces in; the block ends at a line of at least as many of the same, or at the text's end.
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def _blocks(text: str) -> Iterator[tuple[int, int, str]]:
    """Each fenced block of `text` as (first line, line after it, label): the label is the
    line just before the fence when it ends with a colon (an attachment's name, "notes.txt:"),
    else ""."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        fence = opened.group(1)
        end = i + 1
        while end < len(lines) and not _closes(lines[end], fence):
            end += 1
        before = lines[i - 1].strip() if i else ""
        yield i, min(end + 1, len(lines)), before[:-1] if before.endswith(":") else ""
        i = end + 1


def _closes(line: str, fence: str) -> bool:
    closing = _FENCE.match(line)
    run = closing.group(1) if closing else ""
    return run[:1] == fence[0] and len(run) >= len(fence) and not line.strip()[len(run) :]


def unfenced(text: str) -> str:
    """`text` without its fenced blocks, each left as an empty line (a clause boundary). What
    stands in one is material the person shows, not words they say: a text file attached
    inline (heron/attachments.py), stdin piped after `heron run MESSAGE`, a log or a page
    pasted between fences."""
    if "```" not in text and "~~~" not in text:
        return text
    lines = text.split("\n")
    for start, end, _ in reversed(list(_blocks(text))):
        lines[start:end] = [""]
    return "\n".join(lines)


def shown_in(quote: str, rows: Iterable[StoredMessage]) -> str | None:
    """Where `quote` stands in a fenced block of the person's messages among `rows`, as the
    block's label ("notes.txt") or "a block"; None when it stands in none."""
    needle = _trim(quote)
    if len(needle) < MIN_QUOTE_CHARS:
        return None
    for row in rows:
        if typed_text(row) is None:
            continue
        for part in row.message.parts:
            if not isinstance(part, Text):
                continue
            lines = part.text.split("\n")
            for start, end, label in _blocks(part.text):
                if needle in normalise("\n".join(lines[start:end])):
                    return label or "a block"
    return None


def typed_texts(rows: Sequence[StoredMessage]) -> dict[int, str]:
    """`typed_text` of each row of `rows` (a conversation's, in order) that has one, the person's
    answers to ask_user included: each row is read with its parent, the reply that asked."""
    by_id = {r.id: r for r in rows}
    out = {}
    for row in rows:
        asked_by = by_id.get(row.parent_id) if row.parent_id is not None else None
        text = typed_text(row, asked_by)
        if text is not None:
            out[row.id] = text
    return out


@dataclass(frozen=True)
class QuoteMatch:
    message_id: int
    created: float
    asked: bool = False  # the person asked to remember exactly this ("remember that <quote>")
    # The person's words that took it back right after ("Scratch that, I moved to Braga."),
    # in the same message or at the start of their next one; None: it stands.
    taken_back: str | None = None


# Where a clause starts or ends: the text's edge, sentence or clause punctuation, a line break
# (kept as a pilcrow through normalising), brackets and quotation marks.
_EDGE = '.!?;:,()[]"\u00b6'
BOUNDARY_HINT = (
    "Quote a whole sentence or clause of the user's (from its start to its end or a comma), "
    'one that says something alone, with its own subject or verb ("I always cycle to work", '
    'not "even in winter"); a piece cut from a sentence can say what the sentence did not.'
)


def _hay(text: str) -> str:
    """A typed message normalised for searching, its line breaks kept as boundaries."""
    return normalise("\n".join(line.strip() + " \u00b6" for line in text.splitlines()))


def _starts_clause(before: str) -> tuple[bool, bool]:
    """(whether a quote may start after `before`, whether `before` ends in a request to
    remember)."""
    head = before.rstrip()
    if not head:
        return True, False
    asked = bool(_ASK_TAIL.search(head + " "))
    return asked or head[-1] in _EDGE or bool(_JOINER.search(head)), asked


# A clause also starts after a word that joins clauses or opens a request ("..., but I like
# coffee", "please forget that ..."); it never ends before one (that could drop a "but not").
_JOINER = re.compile(r"(?:^|[\s,])(?:and|but|so|because|also|please|actually|well|ok|okay|oh)$")


def _ends_clause(after: str) -> bool:
    tail = after.lstrip()
    return not tail or tail[0] in _EDGE


# Where a sentence starts or ends (a quotation is a whole utterance too): a clause between
# two of them, or the text's edges, is a whole sentence.
_SENTENCE_EDGE = '.!?"\u00b6'
# The words that show a subject or a verb without a parser: a piece cut after a comma needs one
# to say something alone ("..., I read a lot", "..., tea is better", "..., never ask me").
_SUBJECT_OR_VERB_TEXT = """i we you he she it they there this that these those me us him her
them am is are was were be been being have has had do does did can could will would shall
should may might must cannot"""
_SUBJECT_OR_VERB = frozenset(_SUBJECT_OR_VERB_TEXT.split())
_CONTRACTED = ("'m", "'re", "'s", "'ve", "'d", "'ll", "n't")
# A piece that opens with one of these leans on the rest of its sentence ("even in winter",
# "only on Sundays", "when it rains", "not coffee", "in the morning"): it only qualifies
# what the sentence says.
_LEANS_TEXT = """even only especially except not unless if when whenever while although though
until since before after as in on at for with without by from during into to of than"""
_LEANS = frozenset(_LEANS_TEXT.split())


def _stands_alone(hay: str, at: int, needle: str) -> bool:
    """Whether `needle`, standing at `at` in `hay` between clause boundaries, says something
    alone: it is a whole sentence, or a piece of one that neither opens with a word that leans
    on the rest nor, cut after a comma, lacks a subject or verb of its own. "even in winter" of
    "I always cycle to work, even in winter." is only a piece: an entry of it means nothing."""
    head, tail = hay[:at].rstrip(), hay[at + len(needle) :].lstrip()
    if (not head or head[-1] in _SENTENCE_EDGE) and (not tail or tail[0] in _SENTENCE_EDGE):
        return True
    words = re.findall(r"[\w']+", needle)
    if not words or words[0] in _LEANS:
        return False
    if head.endswith(","):  # "..., coffee in the morning" says nothing of its own
        return any(w in _SUBJECT_OR_VERB or w.endswith(_CONTRACTED) for w in words)
    return True


def _clauses(hay: str, needle: str) -> Iterator[tuple[bool, bool]]:
    """Each place `needle` stands as a whole clause in `hay`, as (asked: after a request to
    remember, quoted: inside a quotation the person did not ask to have remembered). A piece
    of a sentence that says nothing alone (`_stands_alone`) is no clause, unless the person
    asked to remember exactly it."""
    at = hay.find(needle)
    while at != -1:
        start, asked = _starts_clause(hay[:at])
        alone = asked or _stands_alone(hay, at, needle)
        if start and alone and _ends_clause(hay[at + len(needle) :]):
            quoted = _in_quotation(hay, at)
            if quoted and _remember_quoted(hay, at):
                asked, quoted = True, False
            elif quoted and _said_by_self(hay, at):
                quoted = False
            yield asked or bool(_ASK.match(needle)), quoted
        at = hay.find(needle, at + 1)


def _in_quotation(hay: str, at: int) -> bool:
    """Whether `at` falls between a pair of quotation marks: an odd number of them before it
    and one after (a lone mark, an inch sign, opens no quotation). Typographic marks are folded
    to `"` by `normalise`; a single quote is no boundary at all (it is also an apostrophe)."""
    return hay.count('"', 0, at) % 2 == 1 and '"' in hay[at:]


def _remember_quoted(hay: str, at: int) -> bool:
    """Whether the quotation `at` is in opens with it and follows a request to remember
    (`remember "..."`): the person's own words, quoted to be kept as they are."""
    opened = hay.rfind('"', 0, at)
    return not hay[opened + 1 : at].strip() and bool(_ASK_TAIL.search(hay[:opened].rstrip() + " "))


# The person as the speaker of a quotation: "I said", "I told her", "I keep saying", "I always
# say," just before its opening mark, or "I said", "I told him" just after its closing one. Not
# "I never said" (a denial), nor anyone else ("she said", "My sister said").
_SELF_SPEAKS = (
    r"i\s+(?:(?:always|often|just|once|also|then|even|usually|keep|kept|like\s+to)\s+)*"
    r"(?:said|say|saying|told|tell|telling|wrote|write|writing|replied|answered|texted|typed)"
)
_SELF_BEFORE = re.compile(
    rf"(?:^|[^\w'])(?:as\s+)?{_SELF_SPEAKS}"
    r"(?:\s+(?:(?:my|our|the)\s+)?[\w']+)?\s*[,:]?$"  # whom: "her", "my doctor"
)
_SELF_AFTER = re.compile(rf"^[,.!?]?\s*(?:{_SELF_SPEAKS}|said\s+i)\b")


def _said_by_self(hay: str, at: int) -> bool:
    """Whether the quotation `at` is in is the person's own words, quoted: introduced by them
    as its speaker (`I told her "..."`) or followed by it (`"...," I said.`)."""
    opened = hay.rfind('"', 0, at)
    closed = hay.find('"', at)
    return bool(_SELF_BEFORE.search(hay[:opened].rstrip())) or bool(
        _SELF_AFTER.match(hay[closed + 1 :])
    )


def _clause_at(hay: str, needle: str) -> QuoteMatch | None:
    """Where `needle` stands as a whole clause of the person's own in `hay` (asked: after a
    request to remember); None when it stands nowhere so, or only inside a quotation."""
    for asked, quoted in _clauses(hay, needle):
        if not quoted:
            return QuoteMatch(0, 0.0, asked)
    return None


QUOTED_HINT = (
    "Words the user put in quotation marks are what they report someone (or something) else "
    "saying, not their own statement. Quote what the user says in their own words, or ask them "
    "whether it holds for them."
)


def quoted_in(quote: str, rows: Iterable[StoredMessage], only: set[int] | None = None) -> bool:
    """Whether `quote` stands in what the user typed (of `only` among `rows`, if given) as a
    whole clause only inside quotation marks: the words of someone the person quotes."""
    needle = _trim(quote)
    if len(needle) < MIN_QUOTE_CHARS:
        return False
    typed = typed_texts(list(rows))
    return any(
        quoted
        for row_id, text in typed.items()
        if (only is None or row_id in only) and needle in normalise(text)
        for _, quoted in _clauses(_hay(text), needle)
    )


def find_quote(
    quote: str, rows: Iterable[StoredMessage], only: set[int] | None = None
) -> list[QuoteMatch]:
    """The user messages among `rows` (of `only` among them, if given) that hold `quote`
    (normalised) as a whole clause; newest first."""
    needle = _trim(quote)
    if len(needle) < MIN_QUOTE_CHARS:
        return []
    found = []
    rows = list(rows)
    typed = typed_texts(rows)
    following = dict(itertools.pairwise(typed))  # each typed message -> the person's next
    for row in rows:
        text = typed.get(row.id) if only is None or row.id in only else None
        if text is None or needle not in normalise(text):
            continue
        hay = _hay(text)
        clause = _clause_at(hay, needle)
        if clause is not None:
            after = typed.get(following.get(row.id, -1), "")
            back = _taken_back(needle, hay[hay.rfind(needle) + len(needle) :], after)
            found.append(QuoteMatch(row.id, row.created, clause.asked, back))
    return sorted(found, key=lambda m: -m.message_id)


# The rest of a sentence and the one after it: where "scratch that" speaks of what came before.
_NEXT_SENTENCE = re.compile(r"[^.!?\u00b6]*[.!?\u00b6\s]*[^.!?\u00b6]*")
# The first sentence of the next message: only its start speaks of what the last one ended on.
_FIRST_SENTENCE = re.compile(r"[^.!?\u00b6]*")


def _taken_back(statement: str, rest: str, next_message: str) -> str | None:
    """The words that take back `statement`, where `rest` is what follows it in its message
    (normalised) and `next_message` the person's next message: a retraction in the sentence
    after it ("I moved to Porto. Scratch that, I moved to Braga."), or, when the statement
    ends its message, in the first sentence of the next one ("Scratch that, ..."; not its
    second: "Thanks for the tips. Correction: ..." took back what the message before said,
    qa24b H2). A retraction that says a statement of its own on another subject is about that
    ("Correction: the dentist is on Friday, not Thursday."; `retract.is_about`)."""
    last = not rest.strip(" .!?;:,\u00b6")
    near = (_FIRST_SENTENCE if last else _NEXT_SENTENCE).match(_hay(next_message) if last else rest)
    window = " ".join((near.group(0) if near else "").replace("\u00b6", " ").split())
    return window.strip(" .,;:") if retraction(window, statement) else None


def appears_in(quote: str, rows: Iterable[StoredMessage]) -> bool:
    """Whether `quote` is anywhere in what the user typed, whole clause or not."""
    needle = _trim(quote)
    return len(needle) >= MIN_QUOTE_CHARS and any(
        needle in normalise(t) for t in typed_texts(list(rows)).values()
    )


def quote_key(quote: str) -> str:
    return _trim(quote)


def says_again(statement: str, said: str) -> bool:
    """Whether `statement` is what `said` says: the same words (`quote_key`), or one of its
    whole clauses ("I always cycle to work" of "I always cycle to work, even in winter."), which
    an entry holding `said` already sends with every request."""
    needle = _trim(statement)
    if not needle or needle == _trim(said):
        return bool(needle)
    if len(needle) < MIN_QUOTE_CHARS or needle not in normalise(said):
        return False
    return next(_clauses(_hay(said), needle), None) is not None


def clauses_of(said: str) -> list[str]:
    """The clauses of `said` (its words between punctuation marks, as written) that an entry
    may keep alone (`says_again`): what to offer when a piece of it was asked for."""
    parts = (p.strip(" \"'") for p in re.split(r"[,;:.!?()\n]", said))
    return [p for p in parts if p and says_again(p, said)]


def within(statement: str, said: str) -> bool:
    """Whether `statement` stands in `said` at all (folded as quotes are), clause or not."""
    needle = _trim(statement)
    return bool(needle) and needle in normalise(said)


def quote_text(quote: str) -> str:
    """An entry's text for `quote`: the quote with its typography and white space folded (its
    case kept), wrapping quotation marks dropped, and a leading request to remember left out."""
    text = " ".join(unicodedata.normalize("NFKC", quote).translate(_FOLD).split())
    return strip_request(text.strip(" \"'`"))


# ---- revocation by meaning -------------------------------------------------------------------

RUN_WORDS = 6  # a run this long, shared with a forgotten statement, is that statement
_STOP = frozenset(
    """a an the and or but so of to in on at for from by with about as is are was were be been
    am i i'm im me my mine we our you your he she it its they them their this that these those
    there here do does did not no don't dont have has had will would can could should just
    very really also too then than if when what which who how please remember keep mind note
    that's it's said say says saying told tell tells telling""".split()  # noqa: SIM905
)  # a paragraph reads better than a list; "said", "told": they frame a statement, not make one


def words(text: str) -> list[str]:
    return re.findall(r"[\w']+", normalise(text))


def revocation_key(statement: str) -> str:
    """What a forget keeps of `statement`: its words normalised (`quote_key`), with each
    secret's words left out and a MASK in their place (`without_secret`). The mask is kept (it
    once fell away with the punctuation, qa24b H1: "The wifi password is tulips" was kept as
    "the wifi", which revoked every message mentioning wifi), since `overlaps` reads it."""
    pieces = without_secret(statement.replace(MASK, "...")).split(MASK)
    return f" {MASK} ".join(normalise(p) for p in pieces).strip(" \"'`.,;:!?")


def _key_words(key: str) -> list[str]:
    """The words of a revocation key, each MASK one word of its own (`revocation_key`)."""
    pieces = key.split(MASK)
    return [w for i, p in enumerate(pieces) for w in ([MASK] if i else []) + words(p)]


def _masked_words(quote: str, about: set[str]) -> list[str] | None:
    """The words of `quote` with its secrets masked as a revocation key's are, when it gives a
    secret and shares a word of `about` (a masked key's other content words); else None: it
    cannot say again a statement whose secret's place it leaves empty. The secret is looked for
    only then (a sentence of recall's, a quote of the guard's: most share no word)."""
    if not about & set(words(quote)) or not find_secret(quote):
        return None
    return _key_words(revocation_key(quote))


def _content(ws: list[str]) -> set[str]:
    return {w for w in ws if w not in _STOP}


def _shares_run(a: list[str], b: list[str], n: int) -> bool:
    runs = {tuple(b[i : i + n]) for i in range(len(b) - n + 1)}
    return any(tuple(a[i : i + n]) in runs for i in range(len(a) - n + 1))


def overlaps(quote: str, forgotten: str) -> bool:
    """Whether `quote` says again what `forgotten` said: they share a run of six words, or the
    content words of one are (nearly) all among the other's. So a slice, a shortening or a
    re-ordering of the forgotten sentence is caught (its words are all the forgotten one's), and
    so is the forgotten sentence with more said around it (its words are all in the quote).

    Sharing most words is not enough: "I take my coffee with oat milk at my parents'" shares
    two of the three content words of "I take my coffee black", yet it is another statement,
    and once it was revoked with it (qa22x H3): recall hid it and it could not be saved. What
    makes the forgotten statement itself ("black") must be there, unless the quote adds nothing
    of its own. "Nearly": one word in five may differ (`_nearly_within`).

    `forgotten` is a revocation key (`revocation_key`): where it kept a MASK for a secret's
    words, the statement was that secret, and the MASK is one of its content words. A quote
    matches it only where it gives a secret too, masked the same way: "The wifi password is
    roses." says again "the wifi …", "Our office wifi drops every afternoon." does not (qa24b
    H1: a mask lost left "the wifi", a topic). A key of only masks and small words revokes
    nothing: what it said is not known."""
    f = _key_words(forgotten)
    q: list[str] | None = words(quote)
    if MASK in f:  # a secret stood there: only a sentence giving one there says it again
        q = _masked_words(quote, _content(f) - {MASK})
    if not q or not f:
        return False
    if _shares_run(q, f, RUN_WORDS):
        return True
    qc, fc = _content(q), _content(f)
    if not qc or not fc:  # one is all small words ("I, we"): compare every word
        qc, fc = set(q), set(f)
    return _nearly_within(qc, fc) or _nearly_within(fc, qc)


def _nearly_within(part: set[str], whole: set[str]) -> bool:
    """Whether all of `part` is in `whole` but for one word in five (none below five words:
    in a short statement each word is what it says)."""
    return len(part - whole) <= len(part) // 5


def names_entry(request: str, *about: str) -> bool:
    """Whether a request to forget names an entry: it shares a content word (or its first five
    letters) with the entry's text or path."""
    asked = {w[:5] for w in _content(words(request)) if w not in _FORGET_WORDS}
    named = {w[:5] for text in about for w in _content(words(text.replace("-", " ")))}
    return bool(asked & named)


_FORGET = re.compile(
    r"\b(?:forget|delete|remove|erase|drop|unlearn|scrap|no longer|not true|isn'?t true"
    r"|stop remembering|don'?t remember|do not remember)\b",
    re.IGNORECASE,
)
_FORGET_WORDS = frozenset(
    {"forget", "delete", "remove", "erase", "drop", "unlearn", "scrap", "longer", "true"}
    | {"isn't", "stop", "remembering"}
)


def asks_to_forget(text: str) -> bool:
    return bool(_FORGET.search(text))


# ---- "remember that ..." ---------------------------------------------------------------------

_ASK = re.compile(
    r"^\s*(?:(?:please|pls|also|and|oh|ok|okay)[,\s]+)*"
    r"(?:remember|keep\s+in\s+mind|don'?t\s+forget|do\s+not\s+forget|note|make\s+a\s+note)"
    r"(?:\s+that)?\s*[,:]?\s+",
    re.IGNORECASE,
)


# The same request at the end of the text before a quote ("..., so remember that ").
_ASK_TAIL = re.compile(
    r"(?:remember|keep\s+in\s+mind|don'?t\s+forget|do\s+not\s+forget|note|make\s+a\s+note)"
    r"(?:\s+that)?\s*[,:]?\s+$",
    re.IGNORECASE,
)


def strip_request(text: str) -> str:
    """'Remember that I prefer tea' -> 'I prefer tea': the entry states the rule itself."""
    stripped = _ASK.sub("", text, count=1).strip()
    if not stripped:
        return text.strip()
    return stripped[0].upper() + stripped[1:]
