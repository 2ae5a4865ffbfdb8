"""The memory service: saving with proof, forgetting with revocation, and the review queue.

One object per process, built from the memory folder and the store; the engine hands it to the
memory tools through `ToolContext.services.memory` and to the chat commands. Every method is
synchronous and short (a few files, a few rows): async callers use `asyncio.to_thread`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from heron.memory import queue, records
from heron.memory.entries import (
    BadMemoryPath,
    Entry,
    EntryPath,
    MemoryFiles,
    MemoryRefused,
    Source,
    parse,
)
from heron.memory.guard import (
    BOUNDARY_HINT,
    MAX_ENTRY_CHARS,
    QUOTED_HINT,
    QuoteMatch,
    appears_in,
    asks_to_forget,
    clauses_of,
    find_quote,
    find_secret,
    find_sensitive,
    names_entry,
    normalise,
    overlaps,
    quote_key,
    quote_text,
    quoted_in,
    revocation_key,
    says_again,
    shown_in,
    within,
)
from heron.memory.history import MemoryHistory, MemoryHistoryError
from heron.memory.queue import Suggestion
from heron.memory.scrub import MARKER, SecretScrub, scrubbed_sent
from heron.store import Store
from heron.store.schedule import user_timezone

log = logging.getLogger(__name__)
AGENT_ENV = "HERON_AGENT_COMMAND"
REVIEW_BATCH = 10

# Shows one checklist; returns the ids to keep, or None when the user pressed Esc.
ChooseFn = Callable[[list[Suggestion]], "set[int] | None"]


class AgentCommandRefused(MemoryRefused):
    pass


class Unchanged(MemoryRefused):
    """An update whose text is the entry's own: nothing to write."""


class AlreadySaid(MemoryRefused):
    """Another entry already says this statement: keeping it would send it twice. `entry`:
    the entry that says it."""

    def __init__(self, message: str, entry: Entry | None = None, *, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.entry = entry


def ensure_not_agent(env: Mapping[str, str] | None = None) -> None:
    """Refuse when the caller is a command the agent started: the bash tool and the Python
    kernel set HERON_AGENT_COMMAND, so an agent cannot approve its own proposals."""
    env = os.environ if env is None else env
    if env.get(AGENT_ENV):
        raise AgentCommandRefused(
            "refused: this command was started by the agent (HERON_AGENT_COMMAND is set), "
            "and only you can accept memory suggestions",
            hint="Run `heron memory review` or `heron memory accept ID` yourself, in your own "
            "terminal, or use /memory review in a chat.",
        )


@dataclass(frozen=True)
class Decision:
    suggestion: Suggestion
    status: str  # accepted | rejected | waiting (refused: left waiting) | dropped (a no-op)
    message: str


@dataclass(frozen=True)
class Scrubbed:
    """What the forget of a secret rewrote: messages as sent (their runtime notes), pieces of
    recorded requests, and the conversations (keys) whose recorded requests held it."""

    messages: int
    pieces: int
    conversations: tuple[str, ...]


def _said_by(statement: str, said: Iterable[str]) -> bool:
    """Whether one of `said` says `statement` again, or it says one of them: the revocation's
    own test (`overlaps` reads both ways; `statement` is a revocation key, whose MASK a text
    of `said` fills only with a secret of its own)."""
    return any(overlaps(t, statement) for t in said)


def _said_source(conversation_key: str | None, match: QuoteMatch, quote: str) -> Source:
    """Where an entry stands: the person's message that holds `quote`, and when they said it
    (in whole seconds, as the file keeps it: the entry returned is the entry read back)."""
    return Source(conversation_key, match.message_id, quote, float(int(match.created)))


class MemoryService:
    def __init__(self, root: Path, store: Store, timezone: str | None = None) -> None:
        self.files = MemoryFiles(root)
        self.store = store
        # The agent's zone (`Settings.timezone`), the dates of Recent History are read in;
        # None: the system's, as `[agent] timezone` unset gives.
        self.timezone = timezone or user_timezone(None)
        # The folder is a git repository: each change below is a commit (heron/memory/history.py).
        self.history = MemoryHistory(root)
        # The memory section's budget in the prompt, in tokens (the engine sets it from the
        # window: [context] memory); None: unbounded.
        self.section_tokens: int | None = None
        # What the forget of a secret took out of what was sent, by path, until told
        # (`scrub_line`).
        self.scrubbed: dict[str, Scrubbed] = {}
        # The calls of one reply run at once, each on a thread: two saves of one statement
        # must not both find memory without it and both write it.
        self._writing = threading.Lock()
        self._check_revocations()

    # ---- reading --------------------------------------------------------------------------

    def entries(self, scope: str | None = None) -> list[Entry]:
        return self.files.entries(scope)

    def get(self, path: EntryPath | str) -> Entry:
        path = EntryPath.parse(path) if isinstance(path, str) else path
        entry = self.files.read(path)
        if entry is None:
            raise MemoryRefused(
                f"no memory entry {path.rel}", hint="List entries with `heron memory list`."
            )
        return entry

    # ---- proof ----------------------------------------------------------------------------

    def find_quote(self, conversation_id: int, quote: str) -> QuoteMatch:
        """The user message of this conversation's current branch that holds `quote` as a
        whole clause: what /retry, /edit or /tree left on another branch the person turned
        away from, and it proves nothing."""
        rows = self.store.branch(conversation_id)
        matches = find_quote(quote, rows)
        if matches:
            return matches[0]
        if quoted_in(quote, rows):
            raise MemoryRefused(
                f"refused: the quote {quote!r} is words the user put in quotation marks, "
                "reported from someone else, not their own statement",
                hint=QUOTED_HINT,
            )
        if appears_in(quote, rows):
            raise MemoryRefused(
                f"refused: the quote {quote!r} is only a piece of a sentence the user wrote",
                hint=BOUNDARY_HINT,
            )
        block = shown_in(quote, rows)
        if block is not None:
            where = (
                "a block the user piped in or pasted between fences"
                if block == "a block"
                else f"{block}, a file the user attached"
            )
            raise MemoryRefused(
                f"refused: the quote {quote!r} is in {where}, not in words they typed",
                hint="What a file or a pasted text says is not the user's own statement. Quote "
                "what the user typed, or ask them whether it holds for them and quote their "
                "answer.",
            )
        if find_quote(quote, self.store.all_messages(conversation_id)):
            raise MemoryRefused(
                f"refused: the quote {quote!r} is from a message the user replaced or left on "
                "another branch (/edit, /retry, /tree): they no longer stand by it",
                hint="Quote what the user says on the conversation's current branch.",
            )
        raise MemoryRefused(
            f"refused: the quote {quote!r} is not in anything the user wrote in this conversation",
            hint="Quote the user's own words exactly (at least a few words); tool results, "
            "web pages, Heron's own prompts and your own text cannot be quoted.",
        )

    def verify_quote(self, conversation_id: int, quote: str) -> QuoteMatch:
        """The user message of this conversation that holds `quote`, refused when the quote says
        again (by meaning, not by substring) something the user asked to forget since."""
        rows = self.store.branch(conversation_id)
        matches = find_quote(quote, rows)
        if not matches:
            return self.find_quote(conversation_id, quote)  # raises, saying why
        standing = [m for m in matches if m.taken_back is None]
        if not standing:
            raise MemoryRefused(
                f"refused: the user took this back right after saying it "
                f"({matches[0].taken_back!r})",
                hint="Save what the user said instead, in their words, or ask them which holds "
                "and quote their answer.",
            )
        live = [m for m in standing if not self._revoked(quote, m)]
        if not live:
            raise MemoryRefused(
                "refused: the user asked to forget this statement (the quote overlaps what "
                "was forgotten)",
                hint="Only a new statement by the user can bring it back.",
            )
        return live[0]

    def _revoked(self, quote: str, match: QuoteMatch) -> bool:
        self.sync_revocations()
        revoked = records.revoked_since(self.store, match.created)
        return any(overlaps(quote, k) for k in revoked)

    def sync_revocations(self) -> None:
        """Mark void each revocation whose statement an entry in force says, and in force
        again each that no entry says any more (`memory_revocations.held`), so the save guard
        and recall read the same revocations (they disagreed: qa22x M1). A forgotten entry
        brought back (`heron memory undo`) is in force again, and what it says is no longer
        forgotten; undoing that undo removes it, and it is forgotten again. So is a statement
        another entry still says: memory holds it."""
        rows = records.revoked_statements(self.store)
        if not rows:
            return
        entries = self.entries()
        said = {t for e in entries for t in self._said(e)}  # as written: a secret's case counts
        # Said again, as the guard reads it (`overlaps`, both ways): a slice of it, or it with
        # more around it, in an entry in force keeps it in memory (qa22v M2).
        now = {i: _said_by(key, said) for i, key, _ in rows}
        held = [i for i, _, was in rows if now[i] and not was]
        free = [i for i, _, was in rows if not now[i] and was]
        if held or free:
            records.set_held(self.store, held, free)

    def _check_revocations(self) -> None:
        """Leave the secret's words out of the statements revoked before a forget kept none
        (migration m031 marks them unchecked; qa22x H2). One small query when there are none."""
        unchecked = records.unchecked_revocations(self.store)
        if unchecked:
            records.set_checked(self.store, {i: revocation_key(k) for i, k in unchecked})

    @staticmethod
    def check_secret(*texts: str | None) -> None:
        for text in texts:
            what = find_secret(text or "")
            if what:
                raise MemoryRefused(
                    f"refused: this looks like {what}; secrets and credentials are never saved "
                    "to memory",
                    hint="Keep secrets in a password manager. A false alarm? The person can "
                    "write it themselves: a Markdown file they put in the memory folder (e.g. "
                    "personal/always/<name>.md, docs/memory.md) is theirs (origin hand), and "
                    "Heron does not check it.",
                )

    @staticmethod
    def check_size(*texts: str | None) -> None:
        size = sum(len(t or "") for t in texts)
        if size > MAX_ENTRY_CHARS:
            raise MemoryRefused(
                f"refused: the entry would be {size:,} characters; an entry holds at most "
                f"{MAX_ENTRY_CHARS:,}",
                hint="Quote the one sentence that states the fact; a long text belongs in a "
                "file in the workspace, not in memory.",
            )

    def check_entry(self, text: str, asked: bool) -> None:
        """What no entry may be, whoever proposed it: too long, a secret, or a sensitive claim
        the user did not explicitly ask to remember (`asked`: "remember that <quote>")."""
        if not text:
            raise MemoryRefused("refused: the entry is empty", hint="Quote the user's words.")
        self.check_size(text)
        self.check_secret(text)
        what = find_sensitive(text)
        if what and not asked:
            raise MemoryRefused(
                f"refused: this is a sensitive claim ({what}); it is saved only when the user "
                "explicitly asks to remember that exact thing",
                hint='Leave it out of memory. If the user says "remember that ...", quote '
                "those words.",
            )

    def _proved(self, conversation_id: int, quote: str) -> tuple[str, QuoteMatch]:
        """The entry's text for `quote` and the user message proving it, every check passed."""
        self.check_size(quote)
        self.check_secret(quote)
        text = quote_text(quote)
        match = self.verify_quote(conversation_id, quote)
        self.check_entry(text, match.asked)
        return text, match

    def free_path(self, path: EntryPath, taken: Iterable[str] = ()) -> EntryPath:
        """`path`, or the first of path-2, path-3, ... that names no entry (nor one of `taken`):
        a new entry never overwrites another."""
        busy = set(taken)
        candidate, n = path, 1
        while self.files.read(candidate) is not None or candidate.rel in busy:
            n += 1
            slug = f"{path.slug[: 60 - len(str(n))]}-{n}"
            candidate = EntryPath(path.scope, path.kind, path.topic, slug)
        return candidate

    # ---- saving and forgetting ------------------------------------------------------------

    def save(
        self,
        conversation_id: int,
        path: EntryPath,
        quote: str,
        *,
        conversation_key: str | None = None,
    ) -> Entry:
        """A new entry whose text is the user's `quote` (a leading "remember that" left out),
        at `path` or, when that is taken, at a free path next to it."""
        text, match = self._proved(conversation_id, quote)
        source = _said_source(conversation_key, match, quote.strip())
        with self._writing:
            same = self.files.read(path)
            if same is not None and (same.text, same.source.message) == (text, match.message_id):
                # The save already happened: a call run again (a --retry, a turn whose process
                # was killed after the file was written) must not leave a copy beside it.
                return same
            said = self.saying(text)
            if said is not None:  # in another scope or path, or said before: one is enough
                raise AlreadySaid(f"already in memory as {said.path.rel}: {said.text}", said)
            return self._write(self._target(text, path), text, "user", source)

    def update(
        self,
        conversation_id: int,
        path: EntryPath,
        quote: str,
        *,
        conversation_key: str | None = None,
    ) -> Entry | int:
        """Replace an entry's text with something new the user said (`quote`, from a message
        after the entry was last written). An entry the user wrote by hand is not replaced: the
        change waits for review, showing both texts; its id is returned."""
        current = self.files.read(path)
        if current is None:
            raise MemoryRefused(f"{path.rel} does not exist", hint="Use action=create.")
        text, match = self._proved(conversation_id, quote)
        if quote_key(text) == quote_key(current.text):
            raise Unchanged(
                f"{path.rel} already says this, so no update was written",
                hint="Leave it: the entry is as the user said.",
            )
        said = self.saying(text, besides=path)
        if said is not None:
            raise AlreadySaid(
                f"{said.path.rel} already says this, so {path.rel} was left as it is", said
            )
        # The file's stamp has whole seconds: a message of the second the entry was written
        # in, and older, is told by its number (ids grow with time), not by the stamp.
        if match.created <= current.updated or match.message_id <= (current.source.message or 0):
            raise MemoryRefused(
                "refused: an update needs something new the user said; this quote is older "
                f"than {path.rel}",
                hint="Quote what the user said since the entry was written, or leave it.",
            )
        if current.origin == "hand":
            return self._queue_change(conversation_id, current, text, quote, match, "user")
        source = _said_source(conversation_key, match, quote.strip())
        return self._write(path, text, "user", source)

    def delete(self, conversation_id: int, path: EntryPath, quote: str) -> Entry:
        """Forget an entry because the user asked to: `quote` is their request, it must ask to
        forget and name the entry (share a word with its text or path)."""
        entry = self.get(path)
        if not appears_in(quote, self.store.branch(conversation_id)):
            self.find_quote(conversation_id, quote)  # raises: not the user's words
        if not asks_to_forget(quote):
            raise MemoryRefused(
                "refused: delete needs the user's request to forget; this quote asks for none",
                hint='Quote the words that ask to forget it (e.g. "forget that I ..."). If the '
                "user said what holds now instead, update the entry with that quote "
                f"(action=update, path={entry.path.rel}).",
            )
        if not names_entry(quote, entry.text, entry.path.rel):
            raise MemoryRefused(
                f"refused: the user's request to forget does not name {entry.path.rel}",
                hint="Ask the user which entry to forget, or let them run "
                f"`heron memory forget {entry.path.rel}`.",
            )
        return self.forget(entry.path, conversation_id)

    def _write(
        self, path: EntryPath, text: str, origin: str, source: Source, mistake: str | None = None
    ) -> Entry:
        now = time.time()
        existing = self.files.read(path)
        created = existing.created if existing else now
        entry = Entry(path, text.strip(), origin, created, now, source, mistake)
        verb = "updated" if existing else "saved"
        self.history.record(f"{verb} {path.rel} ({origin})", lambda: self.files.write(entry))
        return entry

    def forget(
        self, path: EntryPath | str, conversation_id: int | None = None, *, purge: bool = False
    ) -> Entry:
        """Delete an entry and revoke what it said (its quote and its text, normalised, in every
        version its history holds: an update's older statement too), so no pass saves it again
        from anything the user said before, and recall does not show it as current. An entry
        that holds a secret (saved before the check knew its shape, or written by hand), or any
        with `purge`, is also taken out of the history (`purge_history`)."""
        entry = self.get(path)
        said = [t for e in self._versions(entry) for t in self._said(e)]
        # Kept without a secret's words: the revocation must not keep what the history loses.
        statements = {revocation_key(t) for t in said}
        records.revoke(
            self.store,
            sorted(statements),
            entry.path.rel,
            conversation_id,
            entry.source.message,
            time.time(),
        )
        self.history.record(f"removed {entry.path.rel}", lambda: self.files.delete(entry.path))
        # No request carries it from the next turn on: a conversation's frozen section that
        # holds it is written again then (one cache miss), its text blanked now (qa22x H1).
        records.thaw_holding(self.store, entry.path.rel)
        self.sync_revocations()  # another entry that says the same keeps it in force
        if purge or self.holds_secret(entry):
            self.purge_history(entry.path.rel)
        scrub = SecretScrub.of(t for t in said if find_secret(t))
        if scrub is not None:
            self.scrubbed[entry.path.rel] = self._scrub(entry.path.rel, scrub)
        return entry

    def _scrub(self, rel: str, scrub: SecretScrub) -> Scrubbed:
        """Take a forgotten secret out of what was sent: the runtime notes stored with the
        person's messages, which every later request of their conversation replays (qa22v
        H1: one cache miss for each), and the trace's copies of the requests (qa22v M1)."""
        sent: dict[int, str] = {}
        for message_id, raw in self.store.sent_holding(scrub.probes):
            cleaned = scrubbed_sent(raw, rel, scrub)
            if cleaned != raw:
                sent[message_id] = cleaned
        self.store.rewrite_sent(sent)
        from heron.trace.forget import rewrite_secret  # lazy: only a secret's forget needs it

        traced = rewrite_secret(self.store, scrub.probes, scrub.clean)
        return Scrubbed(len(sent), traced.pieces, traced.conversations)

    def scrub_line(self, rel: str) -> str | None:
        """What the forget of `rel` took out of what was sent, in a sentence; None when it
        held no secret (the CLI, the browser and the tool say it)."""
        done = self.scrubbed.pop(rel, None)
        if done is None:
            return None
        if not (done.messages or done.pieces):
            return "No message stored as sent and no recorded request held its secret."
        named = ", ".join(done.conversations[:5]) + (
            f" and {len(done.conversations) - 5} more" if len(done.conversations) > 5 else ""
        )
        where = f" of {named}" if named else ""
        return (
            f"Its secret was taken out of what was sent{where}: {done.messages} stored "
            "message(s) will not send it again (their conversation's next request is not "
            f"cached), and {done.pieces} recorded request piece(s) hold {MARKER} in its place "
            "(a replay of those runs differs there)."
        )

    def still_said(self, gone: Entry) -> str | None:
        """After a forget of `gone`: the other entries that still say what it said, and what
        to do, in a sentence (for the CLI and the tool); None when none does (qa22x M1)."""
        others = self.also_saying(gone)
        if not others:
            return None
        keys = {quote_key(t) for t in self._said(gone)}
        also = [e.path.rel for e in others]
        same = all(keys & {quote_key(t) for t in self._said(e)} for e in others)
        those, say = ("those", "say") if len(also) > 1 else ("that", "says")
        what = "the same" if same else "it, or part of it"
        return (
            f"{', '.join(also)} still {say} {what}, so it stays in force and may be learned "
            f"again: forget {those} too to have it out of memory (heron memory forget "
            f"{also[0]})."
        )

    def also_saying(self, entry: Entry) -> list[Entry]:
        """The entries in force, other than `entry`, that say what it says (text or quote), as
        the revocation reads it (`overlaps`, both ways: a slice of it, or it with more around
        it; qa22v M2): after a forget of `entry`, what still holds the statement in memory."""
        keys = {quote_key(t) for t in self._said(entry)}
        return [
            e
            for e in self.entries()
            if e.path != entry.path and any(_said_by(k, self._said(e)) for k in keys)
        ]

    def _versions(self, entry: Entry) -> list[Entry]:
        """`entry` and each earlier version of its file in the history (a git failure leaves
        the entry alone: the forget goes on with what is on disk)."""
        try:
            texts = self.history.versions(entry.path.rel)
        except MemoryHistoryError as error:
            log.warning("heron: memory history: %s", error)
            texts = []
        return [entry, *(parse(entry.path, text, quiet=True) for text in texts)]

    @staticmethod
    def holds_secret(entry: Entry) -> str | None:
        """What secret an entry's text or quote holds, if any."""
        return find_secret(entry.text) or find_secret(entry.source.quote or "")

    def purge_history(self, rel: str) -> bool:
        """Take every version of the file `rel` out of the memory folder's history; whether the
        history no longer holds it. A git failure is logged, never raised, as for a commit:
        the forget itself is done either way."""
        try:
            self.history.purge(rel)
        except MemoryHistoryError as error:
            log.warning("heron: memory history: %s", error)
        return not self.history.holds(rel)

    # ---- the review queue -----------------------------------------------------------------

    def suggest_fact(
        self, conversation_id: int, path: EntryPath, quote: str, *, origin: str = "auto"
    ) -> int | None:
        """Queue a fact a pass picked, in the user's words (`quote`); None when memory already
        says it. Refused (raises) when the quote is not the user's, was revoked, is too long,
        holds a secret or a sensitive claim they did not ask to remember."""
        text, match = self._proved(conversation_id, quote)
        if self.saying(text) is not None:
            return None
        queued = self._queued_saying(text)
        if queued is not None:  # a sentence and its own clause are one statement
            return queued.id
        clauses = self._queued_clauses(text)
        existing = self.holding(text) or self.files.read(path)
        if existing is not None:
            number = self._queue_change(conversation_id, existing, text, quote, match, origin)
        else:
            number = queue.add(
                self.store,
                "fact",
                origin=origin,
                path=path.rel,
                text=text,
                quote=quote.strip(),
                conversation_id=conversation_id,
                message_id=match.message_id,
                said=match.created,
            )
        # Once it waits (a sentence turned down before is not queued: its clauses stay), the
        # facts that say only its clauses are one statement with it: it says them whole.
        for clause in clauses:
            queue.decide(self.store, clause.id, "dropped")
        return number

    def _target(self, text: str, path: EntryPath) -> EntryPath:
        """Where a new statement goes: over the entry that says only a clause of it ("I always
        cycle to work", then "I always cycle to work, even in winter."), so one entry says it
        whole, else `path` or a free path beside it. An entry the person wrote by hand is theirs
        to change: refused, naming it."""
        held = self.holding(text)
        if held is None:
            return self.free_path(path)
        if held.origin == "hand":
            raise MemoryRefused(
                f"refused: {held.path.rel}, a file the user wrote, already says part of this "
                f"({held.text!r}); nothing was saved beside it",
                hint=f"Update that entry with these words instead (manage_memory action=update, "
                f"path={held.path.rel}: the user reviews the change), or edit the file.",
            )
        return held.path

    def holding(self, text: str, besides: EntryPath | None = None) -> Entry | None:
        """The entry (other than `besides`) that says only a whole clause of `text`: `text`
        says all it says and more, so it supersedes that entry rather than stand beside it."""
        for entry in self.entries():
            if entry.path != besides and any(says_again(t, text) for t in self._said(entry)):
                return entry
        return None

    def saying(self, text: str, besides: EntryPath | None = None) -> Entry | None:
        """The entry (other than `besides`) whose text or quote says `text`, case, spacing,
        quotation marks and the punctuation around them folded (`quote_key`), or holds it as
        one of its whole clauses (`says_again`), wherever it is filed: a pass may pick a
        statement memory holds under another path, the tool save it in a second scope."""
        for entry in self.entries():
            if entry.path != besides and any(says_again(text, t) for t in self._said(entry)):
                return entry
        return None

    def _queued_saying(self, text: str) -> Suggestion | None:
        """The fact or amendment waiting in the queue that says `text` (the same statement,
        or a sentence that holds it as a clause)."""
        for s in self.waiting():
            said = [t for t in (s.text, s.quote) if t]
            if s.kind in ("fact", "amendment") and any(says_again(text, t) for t in said):
                return s
        return None

    def _queued_clauses(self, text: str) -> list[Suggestion]:
        """The facts waiting in the queue that say only a whole clause of `text`."""
        return [
            s
            for s in self.waiting()
            if s.kind == "fact" and any(says_again(t, text) for t in (s.text, s.quote) if t)
        ]

    @staticmethod
    def _said(entry: Entry) -> list[str]:
        return [t for t in (entry.text, entry.source.quote) if t]

    def _queue_change(
        self,
        conversation_id: int,
        current: Entry,
        text: str,
        quote: str,
        match: QuoteMatch,
        origin: str,
    ) -> int:
        """An amendment for review: it shows the entry's text now (`reason`) and the new one."""
        return queue.add(
            self.store,
            "amendment",
            origin=origin,
            path=current.path.rel,
            text=text,
            quote=quote.strip(),
            reason=current.text,
            conversation_id=conversation_id,
            message_id=match.message_id,
            base_digest=current.digest,
            said=match.created,
        )

    def suggest_lesson(
        self, path: EntryPath, rule: str, mistake: str, conversation_id: int | None = None
    ) -> int:
        """A lesson is the agent's words, so it only ever waits for review; it is named so it
        collides neither with an entry nor with a lesson already waiting. The same rule already
        waiting (a nightly pass over eight conversations may pick it eight times) is not queued
        again: its number is returned."""
        rule, mistake = rule.strip(), mistake.strip()
        if not rule:
            raise MemoryRefused("refused: the lesson is empty", hint="State the general rule.")
        self.check_size(rule, mistake)
        self.check_secret(rule, mistake)
        pending = self.waiting()
        key = quote_key(rule)  # case, spacing, quotes and the punctuation around them folded
        same = [s.id for s in pending if s.kind == "lesson" and quote_key(s.text or "") == key]
        if same:
            return same[0]
        waiting = (s.path for s in pending if s.path)
        return queue.add(
            self.store,
            "lesson",
            origin="lesson",
            path=self.free_path(path, waiting).rel,
            text=rule,
            mistake=mistake or None,
            conversation_id=conversation_id,
        )

    def suggest_removal(
        self, path: EntryPath | str, reason: str, conversation_id: int | None = None
    ) -> int:
        entry = self.get(path)
        return queue.add(
            self.store,
            "removal",
            origin="auto",
            path=entry.path.rel,
            reason=reason,
            conversation_id=conversation_id,
            base_digest=entry.digest,
        )

    def waiting(self) -> list[Suggestion]:
        return queue.waiting(self.store)

    def count_waiting(self) -> int:
        return queue.count_waiting(self.store)

    def accept(
        self,
        suggestion_id: int,
        env: Mapping[str, str] | None = None,
        *,
        path: str | None = None,
        quote: str | None = None,
    ) -> Decision:
        """Keep a suggestion; the person may file it elsewhere (`path`: a fact or a lesson) or
        keep only a whole clause of the words it quotes (`quote`: a fact or an amendment)."""
        ensure_not_agent(env)
        found = self._waiting(suggestion_id)
        try:
            message = self._apply(self._edited(found, path, quote))
        except AlreadySaid as said:  # nothing to keep: memory says it already
            queue.decide(self.store, found.id, "dropped")
            return Decision(found, "dropped", f"#{found.id} dropped: {said}")
        except MemoryRefused as refused:
            return Decision(found, "waiting", f"#{found.id} stays waiting: {refused}")
        queue.decide(self.store, found.id, "accepted")
        return Decision(found, "accepted", f"#{found.id} kept: {message}")

    @staticmethod
    def _edited(s: Suggestion, path: str | None, quote: str | None) -> Suggestion:
        """`s` as the person edits it on accepting: filed under `path`, or narrowed to `quote`,
        a whole clause of its own quote (the entry's text stays the person's words)."""
        if path is not None:
            if s.kind not in ("fact", "lesson"):
                raise MemoryRefused(
                    f"suggestion #{s.id} is {'an' if s.kind == 'amendment' else 'a'} {s.kind} "
                    f"of {s.path}; it cannot be filed elsewhere",
                    hint="Accept it as it is, or reject it.",
                )
            s = replace(s, path=EntryPath.parse(path).rel)
        if quote is not None:
            if s.kind not in ("fact", "amendment") or not s.quote:
                raise MemoryRefused(
                    f"suggestion #{s.id} quotes nothing of yours to narrow",
                    hint="Accept it as it is, or reject it.",
                )
            if not says_again(quote, s.quote):
                raise MemoryService._not_a_clause(s, quote)
            s = replace(s, quote=quote.strip(), text=quote_text(quote))
        return s

    @staticmethod
    def _not_a_clause(s: Suggestion, quote: str) -> MemoryRefused:
        """Why `quote` cannot be kept of `s`, naming the clauses of its quote that can."""
        said = s.quote or ""
        offer = [c for c in clauses_of(said) if quote_key(c) != quote_key(said)]
        instead = "keep the whole quote" + (
            f", or one of its clauses: {', '.join(repr(c) for c in offer)}" if offer else ""
        )
        if within(quote, said):  # the tools' test: a piece that says nothing alone
            return MemoryRefused(
                f"{quote!r} is only a piece of the sentence suggestion #{s.id} quotes "
                f"({said!r}), and says nothing alone",
                hint=f"An entry is your own words and must make sense alone: {instead}.",
            )
        return MemoryRefused(
            f"{quote!r} is not a whole clause of what suggestion #{s.id} quotes ({said!r})",
            hint=f"An entry is your own words, copied as you wrote them: {instead}.",
        )

    def reject(self, suggestion_id: int, status: str = "rejected") -> Decision:
        found = self._waiting(suggestion_id)
        queue.decide(self.store, found.id, status)  # type: ignore[arg-type]
        return Decision(found, status, f"#{found.id} dropped")

    def _waiting(self, suggestion_id: int) -> Suggestion:
        found = queue.get(self.store, suggestion_id)
        if found is None:
            raise MemoryRefused(
                f"no suggestion #{suggestion_id}", hint="See what waits: heron memory review."
            )
        if found.status != "waiting":
            raise MemoryRefused(f"suggestion #{suggestion_id} was already {found.status}")
        return found

    def _apply(self, s: Suggestion) -> str:
        """Carry out a kept suggestion; a removal or amendment of an entry that changed since it
        was suggested is refused (raises MemoryRefused) and stays waiting."""
        if s.path is None:
            raise BadMemoryPath(f"suggestion #{s.id} names no entry")
        path = EntryPath.parse(s.path)
        current = self.files.read(path)
        if s.kind in ("removal", "amendment") and (
            current is None or current.digest != s.base_digest
        ):
            raise MemoryRefused(
                f"{s.path} changed since this was suggested",
                hint="Look at the entry again (heron memory show); reject this suggestion if it "
                "no longer applies.",
            )
        if s.kind == "removal":
            self.forget(path, s.conversation_id)
            return f"removed {s.path}"
        self.check_size(s.text, s.mistake)
        self.check_secret(s.text, s.quote)
        if s.kind == "lesson":
            target = self.free_path(path)  # never over another entry
            self._write(target, s.text or "", "lesson", Source(), s.mistake)
            return f"saved lesson {target.rel}"
        if s.kind == "amendment" and current is not None and current.origin == "lesson":
            self._write(path, s.text or "", "lesson", current.source, current.mistake)
            return f"rewrote lesson {s.path}"
        if not s.quote or normalise(s.text or "") != normalise(quote_text(s.quote)):
            raise MemoryRefused(  # queued before entries had to be the user's own words
                f"suggestion #{s.id} is worded by the model, not in the user's own words",
                hint=f"Reject it (heron memory reject {s.id}); say the fact in a chat instead.",
            )
        same = self.saying(s.text or "", path if s.kind == "amendment" else None)
        if same is not None:  # said under another path since it was queued (or before: a bug)
            raise AlreadySaid(f"{same.path.rel} already says this")
        source, asked = self._source(s)
        self.check_entry(s.text or "", asked)
        # A fact goes beside an entry that appeared since it was suggested, never over it, but
        # over one that says only a clause of it (`_target`); an amendment replaces the entry
        # it was shown against (its digest was checked above).
        target = path if s.kind == "amendment" else self._target(s.text or "", path)
        verb = "updated" if s.kind == "fact" and self.files.read(target) else "saved"
        self._write(target, s.text or "", "auto", source)
        return f"{verb} {target.rel}" + (
            " (it said only part of this)" if verb == "updated" else ""
        )

    def _source(self, s: Suggestion) -> tuple[Source, bool]:
        """Where a kept fact stands, and whether the user asked to remember exactly it. The
        quote is proved again now, and its message tells when the person said it, which the
        entry keeps (`said`): kept days after, its "last month" is read from that day."""
        if s.conversation_id is not None and s.quote:
            match = self.verify_quote(s.conversation_id, s.quote)  # revoked meanwhile: refused
            key = self.store.conversation_by_id(s.conversation_id).key
            return _said_source(key, match, s.quote), match.asked
        return Source(None, s.message_id, s.quote), False

    def review(self, choose: ChooseFn, env: Mapping[str, str] | None = None) -> list[Decision]:
        """Checklists of up to 10 waiting suggestions in turn. `choose` returns the ids to keep
        (the rest of that checklist is dropped) or None (Esc): this checklist and every later
        one stay waiting."""
        ensure_not_agent(env)
        decisions: list[Decision] = []
        pending = self.waiting()
        for start in range(0, len(pending), REVIEW_BATCH):
            batch = pending[start : start + REVIEW_BATCH]
            kept = choose(batch)
            if kept is None:
                break
            for s in batch:
                if s.id in kept:
                    decisions.append(self.accept(s.id, env))
                else:  # the person saw it and said no: it is not proposed again
                    decisions.append(self.reject(s.id))
        return decisions

    def mark_thawed(self, conversation_id: int) -> None:
        """Forget the frozen memory section (at compaction and /new): the next build takes a
        fresh one."""
        records.drop_snapshot(self.store, conversation_id)
