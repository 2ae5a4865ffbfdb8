"""The memory service: saving with proof, forgetting with revocation, and the review queue.

One object per process, built from the memory folder and the store; the engine hands it to the
memory tools through `ToolContext.extra["memory"]` and to the chat commands. Every method is
synchronous and short (a few files, a few rows): async callers use `asyncio.to_thread`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from heron.memory import queue
from heron.memory.entries import (
    BadMemoryPath,
    Entry,
    EntryPath,
    MemoryFiles,
    MemoryRefused,
    Source,
)
from heron.memory.guard import QuoteMatch, find_quote, find_secret, quote_key, strip_request
from heron.memory.queue import Suggestion
from heron.store import Store

AGENT_ENV = "HERON_AGENT_COMMAND"
REVIEW_BATCH = 10

# Shows one checklist; returns the ids to keep, or None when the user pressed Esc.
ChooseFn = Callable[[list[Suggestion]], "set[int] | None"]


class AgentCommandRefused(MemoryRefused):
    pass


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
    status: str  # accepted | rejected | waiting (refused: left waiting)
    message: str


class MemoryService:
    def __init__(self, root: Path, store: Store) -> None:
        self.files = MemoryFiles(root)
        self.store = store
        # The memory section's budget in the prompt, in tokens (the engine sets it from the
        # window: [context] memory); None: unbounded.
        self.section_tokens: int | None = None

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

    def verify_quote(self, conversation_id: int, quote: str) -> QuoteMatch:
        """The user message of this conversation that holds `quote`, not revoked since."""
        rows = self.store.all_messages(conversation_id)
        matches = find_quote(quote, rows)
        if not matches:
            raise MemoryRefused(
                f"refused: the quote {quote!r} is not in anything the user wrote in this "
                "conversation",
                hint="Quote the user's own words exactly (at least a few words); tool results, "
                "web pages and your own text cannot be quoted.",
            )
        live = [m for m in matches if not self._revoked(quote, m)]
        if not live:
            raise MemoryRefused(
                "refused: the user asked to forget this statement",
                hint="Only a new statement by the user can bring it back.",
            )
        return live[0]

    def _revoked(self, quote: str, match: QuoteMatch) -> bool:
        key = quote_key(quote)
        rows = self.store.query("SELECT quote_key, created FROM memory_revocations")
        return any(
            (key in r["quote_key"] or r["quote_key"] in key) and match.created <= r["created"]
            for r in rows
        )

    @staticmethod
    def check_secret(*texts: str | None) -> None:
        for text in texts:
            what = find_secret(text or "")
            if what:
                raise MemoryRefused(
                    f"refused: this looks like {what}; secrets and credentials are never saved "
                    "to memory",
                    hint="Keep secrets in environment variables or a password manager.",
                )

    # ---- saving and forgetting ------------------------------------------------------------

    def save(
        self,
        conversation_id: int,
        path: EntryPath,
        text: str,
        quote: str,
        *,
        origin: str = "user",
        conversation_key: str | None = None,
    ) -> Entry:
        """Create or replace an entry that quotes the user's words in this conversation."""
        text = strip_request(text)
        if not text:
            raise MemoryRefused("refused: the entry is empty", hint="Say the rule in a sentence.")
        self.check_secret(text, quote)
        match = self.verify_quote(conversation_id, quote)
        source = Source(conversation_key, match.message_id, quote.strip())
        return self._write(path, text, origin, source)

    def _write(
        self, path: EntryPath, text: str, origin: str, source: Source, mistake: str | None = None
    ) -> Entry:
        now = time.time()
        existing = self.files.read(path)
        created = existing.created if existing else now
        entry = Entry(path, text.strip(), origin, created, now, source, mistake)
        self.files.write(entry)
        return entry

    def forget(self, path: EntryPath | str, conversation_id: int | None = None) -> Entry:
        """Delete an entry and revoke its quoted source, so no pass saves it again."""
        entry = self.get(path)
        if entry.source.quote:
            with self.store.transaction() as c:
                c.execute(
                    "INSERT INTO memory_revocations (quote_key, path, conversation_id,"
                    " message_id, created) VALUES (?, ?, ?, ?, ?)",
                    (
                        quote_key(entry.source.quote),
                        entry.path.rel,
                        conversation_id,
                        entry.source.message,
                        time.time(),
                    ),
                )
        self.files.delete(entry.path)
        return entry

    # ---- the review queue -----------------------------------------------------------------

    def suggest_fact(
        self, conversation_id: int, path: EntryPath, text: str, quote: str, *, origin: str = "auto"
    ) -> int | None:
        """Queue a fact a pass picked; None when it is already in memory. Refused (raises) when
        the quote is not the user's, was revoked, or holds a secret."""
        text = strip_request(text)
        self.check_secret(text, quote)
        match = self.verify_quote(conversation_id, quote)
        existing = self.files.read(path)
        if existing is not None and existing.text.strip() == text.strip():
            return None
        kind = "amendment" if existing is not None else "fact"
        return queue.add(
            self.store,
            kind,
            origin=origin,
            path=path.rel,
            text=text,
            quote=quote.strip(),
            conversation_id=conversation_id,
            message_id=match.message_id,
            base_digest=existing.digest if existing else None,
        )

    def suggest_lesson(
        self, path: EntryPath, rule: str, mistake: str, conversation_id: int | None = None
    ) -> int:
        """A lesson is the agent's words, so it only ever waits for review."""
        rule, mistake = rule.strip(), mistake.strip()
        if not rule:
            raise MemoryRefused("refused: the lesson is empty", hint="State the general rule.")
        self.check_secret(rule, mistake)
        return queue.add(
            self.store,
            "lesson",
            origin="lesson",
            path=path.rel,
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

    def accept(self, suggestion_id: int, env: Mapping[str, str] | None = None) -> Decision:
        ensure_not_agent(env)
        found = self._waiting(suggestion_id)
        try:
            message = self._apply(found)
        except MemoryRefused as refused:
            return Decision(found, "waiting", f"#{found.id} stays waiting: {refused}")
        queue.decide(self.store, found.id, "accepted")
        return Decision(found, "accepted", f"#{found.id} kept: {message}")

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
        self.check_secret(s.text, s.quote)
        if s.kind == "lesson":
            self._write(path, s.text or "", "lesson", Source(), s.mistake)
            return f"saved lesson {s.path}"
        if s.kind == "amendment" and current is not None and current.origin == "lesson":
            self._write(path, s.text or "", "lesson", current.source, current.mistake)
            return f"rewrote lesson {s.path}"
        self._write(path, s.text or "", "auto", self._source(s))
        return f"saved {s.path}"

    def _source(self, s: Suggestion) -> Source:
        if s.conversation_id is not None and s.quote:
            match = self.verify_quote(s.conversation_id, s.quote)  # revoked meanwhile: refused
            key = self.store.conversation_by_id(s.conversation_id).key
            return Source(key, match.message_id, s.quote)
        return Source(None, s.message_id, s.quote)

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
                else:
                    decisions.append(self.reject(s.id, "dropped"))
        return decisions

    def mark_thawed(self, conversation_id: int) -> None:
        """Forget the frozen memory section (at compaction and /new): the next build takes a
        fresh one."""
        with self.store.transaction() as c:
            c.execute("DELETE FROM memory_snapshots WHERE conversation_id = ?", (conversation_id,))
