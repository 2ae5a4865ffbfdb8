"""Traces as text (ls, show, --stats, usage) and as JSON (export)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from heron import timefmt
from heron.messages import Part, Reply, Text, Thinking, Usage, plural, reply_to_dict
from heron.providers.wire import streamed_to_dict
from heron.store import Store, Turn
from heron.store.db import turn_from_row
from heron.trace import records
from heron.trace.prices import PriceTable, conversation_cost, format_cost, turn_cost
from heron.trace.read import (
    CallTrace,
    RunSummary,
    RunTrace,
    load_run,
    overflowed,
    request_payload,
)
from heron.trace.scrub import Scrubber


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _secs(turn: Turn) -> float:
    return (turn.ended or turn.started) - turn.started


def _hit(usage: Usage) -> str:
    return f"{100 * usage.cache_read / usage.input:.0f}%" if usage.input else "-"


LS_HEADER = ("RUN", "STARTED", "CONVERSATION", "STATUS", "CALLS", "TOOLS", "IN", "OUT", "COST")


def _status(turn: Turn) -> str:
    """A run's status, a maintenance run's marked with its kind: `done (compact)`."""
    return f"{turn.status} ({turn.kind})" if turn.maintenance else turn.status


def ls_rows(runs: list[RunSummary], prices: PriceTable, zone: str) -> list[tuple[str, ...]]:
    """`heron trace ls`: one row per run, in LS_HEADER's columns (a maintenance run's
    status names its kind), started in the agent's `zone`."""
    return [
        (
            r.run_id,
            timefmt.when(r.turn.started, zone, timefmt.SECOND),
            r.conversation_key,
            _status(r.turn),
            str(r.turn.model_calls),
            str(r.turn.tool_calls),
            f"{r.turn.usage.input:,}",
            f"{r.turn.usage.output:,}",
            format_cost(turn_cost(r.turn, prices)),
        )
        for r in runs
    ]


# ---- show -----------------------------------------------------------------------------------


def render_show(store: Store, run: RunTrace, prices: PriceTable, zone: str) -> Iterator[str]:
    t = run.turn
    started = timefmt.when(t.started, zone, timefmt.SECOND, named=True)
    yield (
        f"{t.run_id} · conversation {run.conversation_key} · {t.status} ({t.stop_reason}) · "
        f"{t.provider}/{t.model} · {started} · {_secs(t):.1f}s"
    )
    if t.maintenance:
        yield f"{t.kind}: a maintenance run, made outside any turn (no message of its own)"
    elif run.fingerprints:
        yield "fingerprints: " + ", ".join(f"{k} {v}" for k, v in run.fingerprints.items())
    for problem in run.problems:
        yield f"damaged: {problem}"
    if not t.maintenance:
        yield f"{run.user_by}: {_short(run.user_text, 400)}"
    yield from _recalled_lines(run)
    events = list(run.events)
    for event in _due(events, 0):
        yield from _event(event)
    for call in run.calls:
        yield from _call_lines(store, call, t, prices, _run_label(run, call))
        mine = (x for x in run.tools if x.attempt == call.attempt)
        for tool in (x for x in mine if x.after_call == call.seq):
            mark = "■" if tool.interrupted else "✗" if tool.is_error else "←"
            what = f"{tool.name}({_short(tool.args, 200)}) [{tool.call_id}]"
            until = " until the stop" if tool.interrupted else ""
            yield f"    tool {what} {tool.duration:.2f}s{until}"
            yield f"      {mark} {_short(tool.result or '', 300)}"
            for effect in tool.effects:
                yield f"      effect: {_short(json.dumps(effect, ensure_ascii=False), 200)}"
        for event in _due(events, call.seq, call.attempt):
            yield from _event(event)
    if not t.maintenance:
        yield f"agent: {_short(run.reply_text, 400)}" if run.reply_text else "agent: (no reply)"
    if t.error:
        yield f"error: {t.error}"


def _recalled_lines(run: RunTrace) -> Iterator[str]:
    """What auto-recall injected before the message (it is in call #1's request): the call,
    then each line of its result, as the model read it."""
    for call in run.recalled:
        args = json.dumps(call.args, ensure_ascii=False)
        yield f"  auto-recall (before the message, no model call): {call.name}({_short(args, 200)})"
        lines = call.result.splitlines() or [""]
        yield f"      ← {_short(lines[0], 320)}"
        yield from (f"        {_short(line, 320)}" for line in lines[1:])


def _request_doc(payload: str, seq: int) -> dict[str, Any]:
    """A request as JSON; one that is not (a damaged old row) as a note that says so."""
    try:
        doc = json.loads(payload)
    except ValueError as error:
        doc = error
    if not isinstance(doc, dict):
        return {"damaged": f"the request of call #{seq} is not a JSON object: {doc}"}
    return doc


def _due(events: list[Any], after: int, attempt: int = 1) -> list[Any]:
    """The events of the turn's run `attempt` due after its call `after`, taken out of
    `events` so that each is shown once."""
    due = [e for e in events if e.attempt == attempt and e.after_call <= after]
    for e in due:
        events.remove(e)
    return due


def _run_label(run: RunTrace, call: CallTrace) -> str:
    """What tells a call of the turn's second run from the first's (both are numbered from
    1): the retry after a context overflow, the only reason a turn runs again."""
    if call.attempt == 1:
        return ""
    ended = [c for c in run.calls if c.attempt == call.attempt - 1][-1:]
    if ended and ended[0].error and overflowed(ended[0].error):
        return ", retry after overflow"
    return f", run {call.attempt} of the turn"


def _event(event: Any) -> Iterator[str]:
    if event.kind == "injection":
        texts = [
            p.get("text", "") for m in event.body or [] for p in m.get("parts", []) if "text" in p
        ]
        yield f"  ✉ mailbox: {_short(' / '.join(texts), 300)}"
    elif event.kind == "notice" and isinstance(event.body, dict):
        again = "" if event.body.get("shown", True) else " (told before, not shown again)"
        yield f"  ■ notice{again}: {_short(str(event.body.get('text', '')), 600)}"
    else:
        yield f"  ■ {event.kind}: {json.dumps(event.body, ensure_ascii=False)}"


def _call_lines(
    store: Store, call: CallTrace, turn: Turn, prices: PriceTable, label: str = ""
) -> Iterator[str]:
    u = call.usage
    payload = request_payload(store, call)
    request = _request_doc(payload, call.seq)
    count = len(request.get("messages") or [])
    cut = call.reply is not None and call.reply.usage_unknown
    cost = prices.cost(turn.model, u, turn.provider, known=call.streamed is None and not cut)
    tries = len(call.failed_attempts)
    attempts = f" · {tries + 1} attempts" if tries else ""
    yield (
        f"  #{call.seq} {call.purpose}{label}{attempts} · {call.duration:.2f}s · in {u.input:,} "
        f"(cache read {u.cache_read:,}, write {u.cache_write:,}) out {u.output:,} · "
        f"{format_cost(cost)} · request {len(payload):,} bytes, "
        f"{count} message{'' if count == 1 else 's'}"
    )
    yield from _failed_lines(call)
    if "damaged" in request:
        yield f"    ✗ {request['damaged']}"
    if call.streamed is not None:
        yield from _reply_lines(call.streamed.parts, "streamed")
        sent = "usage as the provider sent it" if call.streamed.usage else "no usage sent"
        yield f"    ■ {call.error} ({sent})"
        return
    if call.reply is None:
        yield f"    ✗ {call.error}"
        return
    yield from _reply_lines(call.reply.parts, "reply")
    yield f"    stop: {call.reply.stop}"
    if cut:
        yield f"    ■ usage unknown: {_why_unknown(call.reply)}"


def _failed_lines(call: CallTrace) -> Iterator[str]:
    """Each failed attempt of the call, with its error and the wait before the next: why
    the turn counts more calls than it shows replies."""
    for failed in call.failed_attempts:
        wait = failed.get("wait")
        after = f" (tried again after {wait:.1f}s)" if isinstance(wait, int | float) else ""
        error = _short(str(failed.get("error")), 300)
        yield f"    attempt {failed.get('attempt')} ✗ {error}{after}"


def _why_unknown(reply: Reply) -> str:
    if reply.stop == "length":
        return "cut at its output cap before the server counted it"
    return "no usage came from the server, or an attempt before it broke after it began"


def _reply_lines(parts: Sequence[Part], label: str) -> Iterator[str]:
    for part in parts:
        if isinstance(part, Text) and part.text.strip():
            yield f"    {label}: {_short(part.text, 300)}"
        elif isinstance(part, Thinking) and part.text:
            yield f"    (thinking) {_short(part.text, 160)}"


# ---- stats ----------------------------------------------------------------------------------

_STATS_HEAD = (
    f"{'turn':>4}  {'run':20} {'calls':>5} {'tools':>5} {'in':>9} {'out':>7} "
    f"{'cache rd':>9} {'cache wr':>9} {'hit':>4} {'cost':>9} {'time':>7}"
)


def _stats_row(label: str, run: str, t: Any, usage: Usage, cost: float | None, secs: float) -> str:
    return (
        f"{label:>4}  {run:20} {t[0]:>5} {t[1]:>5} {usage.input:>9,} {usage.output:>7,} "
        f"{usage.cache_read:>9,} {usage.cache_write:>9,} {_hit(usage):>4} "
        f"{format_cost(cost):>9} {secs:>6.1f}s"
    )


def render_stats(store: Store, turns: list[Turn], prices: PriceTable) -> Iterator[str]:
    """Per turn: model and tool calls, tokens in and out, cache read and write, cost, time; then
    the total of these turns and the cost of the whole conversation. A maintenance run (a
    /compact, a memory review) has a row of its own, numbered `-` and named at its end."""
    yield _STATS_HEAD
    total, secs = Usage(), 0.0
    numbers = _turn_numbers(store, turns)
    for turn in turns:
        total, secs = total + turn.usage, secs + _secs(turn)
        row = _stats_row(
            str(numbers.get(turn.id, "-")),
            turn.run_id,
            (turn.model_calls, turn.tool_calls),
            turn.usage,
            turn_cost(turn, prices),
            _secs(turn),
        )
        yield f"{row}  {turn.kind}" if turn.maintenance else row
    calls = (sum(t.model_calls for t in turns), sum(t.tool_calls for t in turns))
    yield _stats_row("all", "", calls, total, conversation_cost(turns, prices), secs)
    if turns:
        everything = store.turns(turns[0].conversation_id, maintenance=True)
        runs = sum(1 for t in everything if t.maintenance)
        extra = f" and {plural(runs, 'maintenance run')}" if runs else ""
        yield (
            f"conversation: {plural(len(everything) - runs, 'turn')}{extra}, "
            f"cost {format_cost(conversation_cost(everything, prices))}"
        )


def unknown_cost_notes(turns: Iterable[Turn], prices: PriceTable) -> list[str]:
    """For a listing with a `?` cost, said on stderr so that its stdout stays the table: why
    it is unknown, and for a model with no price how to give it one (the keys of
    `[prices."<glob>"]` are otherwise only in docs/traces.md)."""
    turns = list(turns)
    unpriced = _unpriced(turns, prices)
    notes = [
        f'? no price is known for {model}: add [prices."{model}"] with input and output '
        "(US dollars per million tokens; cache_read and cache_write optional) to config.toml "
        '(docs/traces.md, "Prices").'
        for model in unpriced
    ]
    stopped = [
        t
        for t in turns
        if t.usage_unknown and t.model not in unpriced and turn_cost(t, prices) is None
    ]
    if stopped:
        notes.append(
            f"? {plural(len(stopped), 'run')} stopped while a reply streamed: the output was "
            "billed but never counted, so the cost is unknown."
        )
    return notes


def _turn_numbers(store: Store, turns: list[Turn]) -> dict[int, int]:
    numbers: dict[int, int] = {}
    for conversation_id in {t.conversation_id for t in turns}:
        for n, t in enumerate(store.turns(conversation_id), 1):
            numbers[t.id] = n
    return numbers


# ---- usage ------------------------------------------------------------------------------------


def render_usage(
    store: Store, prices: PriceTable, zone: str, since: float | None = None
) -> Iterator[str]:
    """Tokens, cache hit rate and cost, by day (the days of the agent's `zone`) and by model:
    every run's, the maintenance runs made outside any turn included (`turns` counts the turns
    only); when there were any, a `maintenance` row under each total says how much of it they
    were."""
    turns = usage_turns(store, since)
    if not turns:
        yield "No turns recorded yet."
        return
    by_day: dict[str, list[Turn]] = defaultdict(list)
    by_model: dict[str, list[Turn]] = defaultdict(list)
    for t in turns:
        by_day[timefmt.when(t.started, zone, timefmt.DAY)].append(t)
        by_model[f"{t.provider}/{t.model}"].append(t)
    upkeep = [t for t in turns if t.maintenance]
    for title, groups in (("day", by_day), ("model", by_model)):
        yield (
            f"{title:32} {'turns':>6} {'in':>11} {'out':>9} {'cache rd':>11} {'cache wr':>10} "
            f"{'hit':>4} {'cost':>9}"
        )
        for name, group in sorted(groups.items()):
            yield _usage_row(name, group, prices)
        yield _usage_row("total", turns, prices)
        if upkeep:
            name = f"maintenance ({_share(upkeep, turns, prices)})"
            yield _usage_row(name, upkeep, prices, len(upkeep))
        yield ""


@dataclass(frozen=True)
class UsageTotal:
    """What `heron usage` counts since an instant, summed: `turns` the turns among its `runs`
    (maintenance runs are not turns), their tokens and their cost (None: a price not known)."""

    turns: int
    runs: int
    usage: Usage
    cost: float | None
    unpriced: tuple[str, ...] = ()  # the models run that have no price (`unknown_cost_notes`)

    @property
    def hit_rate(self) -> float | None:
        """The share of input tokens read from the prompt cache (None: no input counted)."""
        return self.usage.cache_read / self.usage.input if self.usage.input else None


def usage_total(store: Store, prices: PriceTable, since: float | None = None) -> UsageTotal:
    """The runs `heron usage` counts since `since`, as one total (`heron status`: today's)."""
    runs = usage_turns(store, since)
    turns = sum(1 for t in runs if not t.maintenance)
    cost = conversation_cost(runs, prices)
    return UsageTotal(turns, len(runs), _summed(runs), cost, _unpriced(runs, prices))


def _unpriced(turns: Iterable[Turn], prices: PriceTable) -> tuple[str, ...]:
    """The models of `turns` no price is known for, by name."""
    return tuple(
        sorted({t.model for t in turns if t.model and prices.price(t.model, t.provider) is None})
    )


def usage_turns(store: Store, since: float | None = None) -> list[Turn]:
    """Every run `heron usage` counts, maintenance runs included, since `since`."""
    return [turn_from_row(r) for r in records.turn_rows_since(store, since or 0.0)]


def _usage_row(name: str, turns: list[Turn], prices: PriceTable, count: int | None = None) -> str:
    """One row of `heron usage`: `count` (by default the turns among `turns`; the
    maintenance row's, its runs), then the tokens and cost of them all."""
    u = _summed(turns)
    if count is None:
        count = sum(1 for t in turns if not t.maintenance)
    return (
        f"{name:32} {count:>6} {u.input:>11,} {u.output:>9,} {u.cache_read:>11,} "
        f"{u.cache_write:>10,} {_hit(u):>4} {format_cost(conversation_cost(turns, prices)):>9}"
    )


def _summed(turns: list[Turn]) -> Usage:
    u = Usage()
    for t in turns:
        u = u + t.usage
    return u


def _share(part: list[Turn], whole: list[Turn], prices: PriceTable) -> str:
    """What share of `whole` `part` was: of the cost when both are known and not zero, else
    of the tokens (input and output)."""
    cost, total = conversation_cost(part, prices), conversation_cost(whole, prices)
    if cost is not None and total:
        return f"{100 * cost / total:.0f}% of cost"
    tokens, all_tokens = _summed(part), _summed(whole)
    shown = tokens.input + tokens.output
    every = all_tokens.input + all_tokens.output
    return f"{100 * shown / every:.0f}% of tokens" if every else "no tokens"


# ---- export -----------------------------------------------------------------------------------


def export_run(store: Store, run_id: str, scrubber: Scrubber) -> str:
    """The whole run as one JSON document: every request rebuilt as sent, every reply, tool call
    and event. Any credential in reach is replaced before it is returned."""
    run = load_run(store, run_id)
    t = run.turn
    doc: dict[str, Any] = {
        "run_id": t.run_id,
        "conversation": run.conversation_key,
        "turn": {
            "kind": t.kind,
            "status": t.status,
            "stop_reason": t.stop_reason,
            "provider": t.provider,
            "model": t.model,
            "usage": t.usage.__dict__,
            "usage_unknown": t.usage_unknown,
            "model_calls": t.model_calls,
            "tool_calls": t.tool_calls,
            "system_fingerprint": t.system_fingerprint,
            "error": t.error,
            "started": t.started,
            "ended": t.ended,
            "user_text": run.user_text,
            "reply_text": run.reply_text,
        },
        "start": run.start,
        "fingerprints": run.fingerprints,
        "model_calls": [_export_call(store, c) for c in run.calls],
        "tool_calls": [tool.__dict__ for tool in run.tools],
        "events": [e.__dict__ for e in run.events],
        "problems": run.problems,
        "auto_recall": [call.__dict__ for call in run.recalled],
    }
    return scrubber.clean(json.dumps(doc, ensure_ascii=False, indent=2))


def _export_call(store: Store, call: CallTrace) -> dict[str, Any]:
    return {
        "seq": call.seq,
        "attempt": call.attempt,  # the turn's run: 2 for the retry after a context overflow
        # Attempts of this call that failed and were tried again (each one a call counted).
        "failed_attempts": call.failed_attempts,
        "purpose": call.purpose,
        "request": _request_doc(request_payload(store, call), call.seq),
        "reply": reply_to_dict(call.reply) if call.reply else None,
        "streamed": streamed_to_dict(call.streamed) if call.streamed else None,
        "error": call.error,
        "usage": call.usage.__dict__,
        "started": call.started,
        "ended": call.ended,
    }
