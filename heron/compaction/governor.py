"""The runner's `govern` hook: before every model call, the view is derived again from the
record, overflow is predicted, and a turn that outgrows the window is compacted in flight.

In-flight compaction folds the turn's older steps into a checkpoint. The checkpoint is asked for
with the very request that was about to go out plus one instruction, so the provider's cache
serves it; a model that calls a tool instead gets one retry on a transcript without tools, and
after two failures the checkpoint is written without the model. The folded rows are marked and
the turn's request row carries the checkpoint, so the next turn derives the same view.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable

from heron.compaction import records as rec
from heron.compaction.core import ContextDeps, tokens_of
from heron.compaction.summary import (
    CHECKPOINT_INSTRUCTION,
    checkpoint_body,
    checkpoint_text,
    clip,
    fallback_facts,
    quotes_of,
    state_block,
    transcript,
)
from heron.context.budget import RequestTooLarge, section_name, split_sections, too_large
from heron.context.history import BranchState, load_branch_async, view_of
from heron.context.tokens import estimate_message, estimate_messages, estimate_text
from heron.context.view import Said, not_shown_whole, said_in, shape_messages, snip
from heron.messages import Message, Text, plural
from heron.providers.wire import ModelCallRecord
from heron.request import ChatRequest
from heron.store import compactions as folds
from heron.store import work
from heron.store.records import StoredMessage

log = logging.getLogger(__name__)
INFLIGHT_AT = 0.8  # of the input budget
CHAIN_AT = 0.2  # the turn's own chain must be at least this share of the budget
RECENT_SHARE = 0.3  # the recent steps kept verbatim
SETTLE_AT = 0.6  # where an in-flight compaction aims the whole request, checkpoint aside
# When a checkpoint cannot land at SETTLE_AT (the system prompt, tools and earlier history take
# most of the budget), the turn is "tight": checkpoints are written without the model and only
# when the request nears the whole budget, or every step would cost one more model call.
TIGHT_AT = 0.95
MODEL_FAILURES_MAX = 2
SAVE_EVERY = 10  # calibration samples between writes to the store


class Governor:
    """One run's view keeper."""

    def __init__(
        self,
        deps: ContextDeps,
        conversation_id: int,
        system: str,
        anchor_id: int | None,
        turn_id: int | None = None,
        state: BranchState | None = None,
        base_len: int = 0,
        view: list[Message] | None = None,
    ) -> None:
        self.deps = deps
        self.conversation_id = conversation_id
        self.system = system
        self.anchor_id = anchor_id  # the turn's request row
        self.turn_id = turn_id
        self.state = state  # the record as last read; the runner's messages after base_len
        self.base_len = base_len  # are the run's own, not read back from the store
        self.model_failures = 0
        self.inflight = 0
        self.model_calls = 0  # checkpoint calls: they count toward the run's max_model_calls
        self.tight = False  # this turn's work does not fit the window well (TIGHT_AT)
        self.last_raw = 0  # uncalibrated estimate of the last request governed
        # The view of `state` alone (no messages of the run), derived once per state read:
        # BUILD hands over the one it derived, so the first call does not derive it again.
        self._state_view = (state, view) if state is not None and view is not None else None
        # The record and the view of the latest call governed (`not_whole`).
        self._sent: tuple[BranchState, list[Message]] | None = None

    async def govern(self, given: list[Message]) -> list[Message]:
        """The view for the next call. The record is read back only when an in-flight
        compaction is due; otherwise the run's new messages extend the view derived at BUILD."""
        if self.state is None and not await self._reload(given):
            return self._shape_only(given)
        assert self.state is not None
        view = self._view(given[self.base_len :])
        raws: list[int] | None = [estimate_message(m) for m in view]  # for _over and _fit
        trigger = TIGHT_AT if self.tight else INFLIGHT_AT
        if self._over(view, trigger, raws) and await self._reload(given):
            view, raws = self._view([]), None
            if await self._inflight(self.state, view) and await self._reload(given):
                view = self._view([])
                after = tokens_of(self.deps, self.system, view)
                await self.deps.store.call(self._set_after, after)
                # Hysteresis: a checkpoint that did not land well below the trigger would be
                # followed by another at the next step.
                self.tight = self.tight or after > self.deps.budget.input * SETTLE_AT
        fitted = self._fit(view, raws)
        self._sent = (self.state, fitted)
        return fitted

    def not_whole(self) -> set[int]:
        """The rows of the branch (after the fold) that the latest call's view did not show
        whole: snipped to pointers, cut to head and tail, folded in flight. recall_history
        keeps them searchable though the conversation's view holds them (docs/memory.md)."""
        sent = self._sent
        return set() if sent is None else not_shown_whole(sent[0].rows, sent[0].plan, sent[1])

    def _view(self, extra: list[Message]) -> list[Message]:
        """`view_of` the current state and `extra`; the state's own view is derived once."""
        assert self.state is not None
        if extra:
            return view_of(self.deps, self.state, extra)
        if self._state_view is None or self._state_view[0] is not self.state:
            self._state_view = (self.state, view_of(self.deps, self.state))
        return list(self._state_view[1])

    async def _reload(self, given: list[Message]) -> bool:
        """Read the record again; False when it does not hold what the runner holds."""
        state = await load_branch_async(self.deps.store, self.conversation_id)
        if not _matches(state.rows, given):
            return False
        self.state, self.base_len = state, len(given)
        return True

    def _over(self, view: list[Message], share: float, raws: list[int] | None = None) -> bool:
        if raws is None:
            tokens = tokens_of(self.deps, self.system, view)
        else:  # the same sum as tokens_of, from estimates already made
            tokens = tokens_of(self.deps, self.system, []) + self.deps.calibration.tokens(sum(raws))
        return tokens > self.deps.budget.input * share

    def _fit(self, view: list[Message], raws: list[int] | None = None) -> list[Message]:
        """The view snipped to the room the system prompt and tools leave; raises
        RequestTooLarge when even that does not fit (the hard invariant: nothing over the
        window is sent). `raws`: the raw estimate of each message of `view`, if made."""
        fixed = tokens_of(self.deps, self.system, [])
        budget = self.deps.budget
        words = budget.share(budget.shares.user_words)
        fitted = snip(view, budget.input - fixed, self.deps.calibration, raws, self._said(), words)
        body = sum(raws) if raws is not None and fitted is view else estimate_messages(fitted)
        self.last_raw = estimate_text(self.system) + body + _tools_raw(self.deps)
        if fixed + self.deps.calibration.tokens(body) > budget.input:
            raise self._too_large(self.deps.calibration.tokens(body))
        return fitted

    def _said(self) -> list[Said]:
        """The user side of the view's rows as the record holds it (row ids, authors), for the
        pointers snip writes and the texts it leaves to Heron."""
        return said_in(self.state.rows, self.state.plan) if self.state is not None else []

    def _too_large(self, messages: int) -> RequestTooLarge:
        cal = self.deps.calibration
        parts = {"tool schemas": cal.tokens(_tools_raw(self.deps)), "messages": messages}
        for section in split_sections(self.system):
            name = section_name(section)
            parts[name] = parts.get(name, 0) + cal.tokens(estimate_text(section))
        budget = self.deps.budget
        return too_large(parts, budget.window, budget.output, self.deps.model)

    def _shape_only(self, given: list[Message]) -> list[Message]:
        return self._fit(shape_messages(given, self.deps.view_options()))

    # ---- in-flight compaction -----------------------------------------------------------------

    def _rounds(self, state: BranchState) -> list[list[StoredMessage]]:
        ids = [r.id for r in state.rows]
        if self.anchor_id not in ids:
            return []
        steps = [
            r
            for r in state.rows[ids.index(self.anchor_id) + 1 :]
            if r.id not in state.plan.compacted
        ]
        rounds: list[list[StoredMessage]] = []
        for row in steps:
            if row.role == "assistant" or not rounds:
                rounds.append([row])
            else:
                rounds[-1].append(row)
        return rounds

    def _split(
        self, rounds: list[list[StoredMessage]], before_turn: int
    ) -> tuple[list[StoredMessage], list[StoredMessage]]:
        """(folded rows, kept rows): the most recent rounds within RECENT_SHARE, at least one,
        and fewer when the history before the turn leaves less room: the view must land well
        under the trigger, or the next call would compact again."""
        budget = self.deps.budget.input
        room = min(budget * RECENT_SHARE, budget * SETTLE_AT - before_turn)
        kept: list[list[StoredMessage]] = []
        for rnd in reversed(rounds):
            size = self.deps.calibration.tokens(estimate_messages(r.wire for r in rnd))
            if kept and size + sum(_size(self.deps, k) for k in kept) > room:
                break
            kept.insert(0, rnd)
        folded = [r for rnd in rounds[: len(rounds) - len(kept)] for r in rnd]
        return folded, [r for rnd in kept for r in rnd]

    def tight_notice(self) -> str:
        """What the person is told once when the turn becomes tight: why, in figures, and
        what gives the model more room."""
        budget = self.deps.budget
        fixed = tokens_of(self.deps, self.system, [])
        return TIGHT_NOTICE.format(window=budget.window, fixed=fixed, input=budget.input)

    async def _inflight(self, state: BranchState, view: list[Message]) -> bool:
        rounds = self._rounds(state)
        chain = sum(_size(self.deps, rnd) for rnd in rounds)
        before = tokens_of(self.deps, self.system, view)
        settle = self.deps.budget.input * SETTLE_AT
        # The part no checkpoint shrinks (the chain is measured on the rows, the view may show
        # them shorter, hence the system prompt and tools as a floor) plus the round it keeps:
        # above SETTLE_AT, even an empty checkpoint would land too close to the trigger.
        floor = max(before - chain, tokens_of(self.deps, self.system, []))
        if rounds and floor + _size(self.deps, rounds[-1]) > settle:
            self.tight = True
        if not self.tight and chain < self.deps.budget.input * CHAIN_AT:
            return False
        folded, _ = self._split(rounds, before - chain)
        if not folded or folded[0].role != "assistant":
            return False
        if self.tight:
            body = _mechanical([r.message for r in folded], self._previous(state), self._words())
        else:
            body = await self._checkpoint_body(state, view, folded)
        await self.deps.store.call(self._record, state, folded, body, before)
        self.inflight += 1
        return True

    async def _checkpoint_body(
        self, state: BranchState, view: list[Message], folded: list[StoredMessage]
    ) -> str:
        previous = self._previous(state)
        attempts: list[Callable[[], Awaitable[str | None]]] = [
            lambda: self._ask_same_request(view),
            lambda: self._ask_transcript(previous, folded),
        ]
        for attempt in attempts:
            if self.model_failures >= MODEL_FAILURES_MAX:
                break
            body = await attempt()
            if body:
                return body
            self.model_failures += 1
        return _mechanical([r.message for r in folded], previous, self._words())

    def _words(self) -> int:
        """The share of the budget a checkpoint's body and quotes each get."""
        budget = self.deps.budget
        return budget.share(budget.shares.user_words)

    def _previous(self, state: BranchState) -> str:
        """The turn's checkpoint so far ("" before the first)."""
        return state.plan.checkpoints.get(self.anchor_id or -1, "")

    async def _ask(self, request: ChatRequest) -> str | None:
        self.model_calls += 1
        try:
            reply = await self.deps.chat(request, "checkpoint")
        except Exception as e:  # a failed checkpoint falls back; it never fails the turn
            # At INFO, the error's first line only: a chat in its own process shows WARNING on
            # its screen, and a provider's hint ("try again in a while") read as the turn's.
            log.info("in-flight checkpoint failed, fell back: %s", (str(e).splitlines() or [""])[0])
            return None
        if reply.tool_calls or not reply.text.strip():
            return None
        return reply.text

    async def _ask_same_request(self, view: list[Message]) -> str | None:
        last = view[-1]
        asked = [
            *view[:-1],
            Message(last.role, [*last.parts, Text("\n\n" + CHECKPOINT_INSTRUCTION)]),
        ]
        if last.role != "user":
            asked = [*view, Message("user", [Text(CHECKPOINT_INSTRUCTION)])]
        return await self._ask(
            ChatRequest(
                model=self.deps.provider.model,
                system=self.system,
                messages=asked,
                tools=self.deps.tools,
                max_tokens=min(self.deps.budget.output, 2_000),
            )
        )

    async def _ask_transcript(self, previous: str, folded: list[StoredMessage]) -> str | None:
        text = (previous + "\n\n" if previous else "") + transcript([r.wire for r in folded])
        room = self.deps.budget.input * 3
        prompt = text[-room:] + "\n\n" + CHECKPOINT_INSTRUCTION
        return await self._ask(
            ChatRequest(
                model=self.deps.provider.model,
                system="You write checkpoints of an assistant's work so it can continue.",
                messages=[Message("user", [Text(prompt)])],
                tools=[],
                max_tokens=min(self.deps.budget.output, 2_000),
            )
        )

    def _record(
        self, state: BranchState, folded: list[StoredMessage], body: str, before: int
    ) -> None:
        earlier = [r for r in state.rows if r.id in state.plan.compacted]
        ids = {r.id for r in folded} | {r.id for r in earlier}
        turn_rows = [r for r in state.rows if r.id in ids]
        extra = state_block(
            work.work_state(self.deps.store, self.conversation_id),
            work.todos(self.deps.store, self.conversation_id),
        )
        words = self._words()
        text = checkpoint_text(body, quotes_of(turn_rows), clip(extra, words), words)
        folds.add_compaction(
            self.deps.store,
            self.conversation_id,
            kind="inflight",
            reason="the turn filled the window",
            summary=text,
            first_row_id=folded[0].id,
            last_row_id=folded[-1].id,
            anchor_row_id=self.anchor_id,
            rows_folded=len(folded),
            tokens_before=before,
            compacted_rows=[r.id for r in folded],
        )

    def _set_after(self, tokens: int) -> None:
        folds.set_last_inflight_tokens_after(self.deps.store, self.conversation_id, tokens)

    # ---- calibration --------------------------------------------------------------------------

    def observing(
        self, on_model_call: Callable[[ModelCallRecord], Awaitable[None]]
    ) -> Callable[[ModelCallRecord], Awaitable[None]]:
        """Wrap the runner's on_model_call so each reply's usage calibrates the estimate."""

        async def observe(record: ModelCallRecord) -> None:
            await on_model_call(record)
            usage = record.reply.usage if record.reply is not None else None
            if usage is None or not usage.input or not self.last_raw:
                return
            cal = self.deps.calibration.observe(self.last_raw, usage.input)
            self.deps.calibration = cal
            if cal.samples % SAVE_EVERY == 1:  # the store is written now and then, not per call
                await self.deps.store.call(
                    rec.save_calibration, self.deps.store, self.deps.model, cal, 0
                )

        return observe


DONE_HEAD = "## Done (calls made and the start of each result)\n"


def _mechanical(messages: list[Message], previous: str, tokens: int) -> str:
    """A checkpoint body written without the model: the calls made and each result's start,
    after the turn's previous checkpoint (its body alone), the newest within `tokens`. What
    does not fit is counted in one line, with what earlier checkpoints left out: a count of
    the last re-split alone stayed at "3" for 200 calls, and a model judging its progress by
    what it sees could not tell how far the turn had got (qa24f M3)."""
    earlier = checkpoint_body(previous).removeprefix(DONE_HEAD.strip()).strip()
    calls, notes = _left_out(earlier)
    earlier = LEFT_OUT.sub("", earlier).strip()
    lines = fallback_facts(messages, earlier).splitlines()
    kept: list[str] = []
    for at in range(len(lines) - 1, -1, -1):  # the newest steps matter most to the step now
        if estimate_text("\n".join([lines[at], *kept])) > tokens:
            dropped = lines[: at + 1]
            made = sum(1 for line in dropped if CALL_LINE.match(line))
            kept.insert(0, _left_out_line(calls + made, notes + len(dropped) - made))
            break
        kept.insert(0, lines[at])
    else:
        if calls or notes:  # everything new fits, and what was left out before stays counted
            kept.insert(0, _left_out_line(calls, notes))
    return DONE_HEAD + "\n".join(kept)


# A line of `fallback_facts`: one call made ("- name(args) -> start of its result").
CALL_LINE = re.compile(r"- .+ -> ")
LEFT_OUT = re.compile(
    r"^\[([\d,]+) earlier calls?(?: and ([\d,]+) lines? of notes)? left out; "
    r"the record keeps them\]$",
    re.M,
)


def _left_out(body: str) -> tuple[int, int]:
    """The calls and the lines of notes (a model-written checkpoint's) a checkpoint body says
    it left out, 0 and 0 when it says none."""
    found = LEFT_OUT.search(body)
    if found is None:
        return 0, 0
    return int(found[1].replace(",", "")), int((found[2] or "0").replace(",", ""))


def _left_out_line(calls: int, notes: int) -> str:
    said = plural(calls, "earlier call") + (
        f" and {plural(notes, 'line')} of notes" if notes else ""
    )
    return f"[{said} left out; the record keeps them]"


# Told once per turn when it becomes tight (Governor.tight_notice).
TIGHT_NOTICE = (
    "This turn's work does not fit the model's window well: the window is {window} tokens and "
    "the system prompt and tool schemas alone take {fixed} of its {input} input "
    "tokens. From now on this turn's older steps are folded without asking the model, only "
    "when they no longer fit (they stay in the record). A larger window "
    "(HERON_CONTEXT_WINDOW, or context_window in config.toml) gives the model more of the turn."
)


def _size(deps: ContextDeps, rows: list[StoredMessage]) -> int:
    return deps.calibration.tokens(estimate_messages(r.wire for r in rows))


def _tools_raw(deps: ContextDeps) -> int:
    return deps.tools_raw()


def _matches(rows: list[StoredMessage], given: list[Message]) -> bool:
    """The record holds what the runner is about to send (its last message is the last row)."""
    if not rows or not given:
        return False
    last = rows[-1].wire
    return last.role == given[-1].role and last.parts == given[-1].parts
