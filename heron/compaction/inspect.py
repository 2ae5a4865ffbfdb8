"""What compaction did and what the model would receive next, for `heron conversations show`."""

from __future__ import annotations

from typing import Any

from heron import timefmt
from heron.compaction.core import Budget, ContextDeps, tokens_of
from heron.context.budget import section_name, split_sections
from heron.context.history import BranchState, load_branch, system_for, view_of
from heron.context.tokens import estimate_messages, estimate_text
from heron.messages import Message
from heron.store import Store
from heron.store import compactions as folds


def compaction_lines(store: Store, conversation_id: int, zone: str) -> list[str]:
    """Each compaction of the conversation, numbered from 1 within it (the store's id, shared
    by every conversation, runs into the hundreds: it follows in brackets), with when it ran
    in the agent's `zone`."""
    out = []
    for n, c in enumerate(folds.compactions(store, conversation_id), 1):
        when = timefmt.when(c.created, zone)
        rows = f"rows #{c.first_row_id}-#{c.last_row_id}"
        if c.kind == "inflight":
            rows += f" (checkpoint on #{c.anchor_row_id})"
        out.append(
            f"── compaction {n} (id {c.id}) · {when} · {c.kind} · why: {c.reason} · folded"
            f" {c.rows_folded}"
            f" messages, {rows} · tokens {c.tokens_before} → {c.tokens_after}"
        )
        if c.meta.get("error"):
            out.append(f"   (summarizer failed: {c.meta['error']}; written without the model)")
        out.extend("   " + line for line in c.summary.splitlines())
    return out or ["No compactions yet."]


def model_view(deps: ContextDeps, conversation: Any) -> tuple[str, list[Message]]:
    """The system prompt and messages the next request would start from (before the next user
    message), derived from the record exactly as a turn derives them with `deps`, the engine's
    that will send it (its tools are `deps.tools`)."""
    _, system, view = _next_request(deps, conversation)
    return system, view


def _next_request(deps: ContextDeps, conversation: Any) -> tuple[BranchState, str, list[Message]]:
    state = load_branch(deps.store, conversation.id)
    system = system_for(deps, conversation.agent, state, conversation.id)
    return state, system, view_of(deps, state)


def budget_lines(budget: Budget) -> list[str]:
    """Each budget in tokens and as its share of the window."""
    out = []
    for label, tokens in budget.lines():
        share = f"({100 * tokens / budget.window:.1f}%)" if label != "window" else ""
        out.append(f"  {label:34} {tokens:>9,} {share}".rstrip())
    return out


def budget_report(deps: ContextDeps, conversation: Any) -> list[str]:
    """`heron conversations show KEY --budget`: the budgets of the model of `deps` (the engine
    that will send the next request), and what the next request's parts take now."""
    state, system, view = _next_request(deps, conversation)
    cal, b = deps.calibration, deps.budget
    summary = state.consolidation.summary if state.consolidation else ""
    memory = next((s for s in split_sections(system) if section_name(s) == "memory"), "")
    results = [len(r.content) // 4 for m in view for r in m.tool_results]
    fixed = tokens_of(deps, system, []) - cal.tokens(estimate_text(summary))
    now = [
        ("system prompt with memory", cal.tokens(estimate_text(system))),
        ("  memory", cal.tokens(estimate_text(memory))),
        ("archived context", cal.tokens(estimate_text(summary))),
        ("recent turns (the view)", cal.tokens(estimate_messages(view))),
        ("largest tool result in the view", cal.tokens(max(results, default=0))),
        ("tool schemas", cal.tokens(deps.tools_raw())),
    ]
    return [
        f"Budgets of {conversation.key} (window {b.window:,} tokens; shares set in [context]"
        " of config.toml)",
        *budget_lines(b),
        f"  {'consolidates when history passes':34} {b.trigger(fixed):>9,}",
        "Now:",
        *(f"  {label:34} {tokens:>9,}" for label, tokens in now),
    ]
