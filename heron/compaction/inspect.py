"""What compaction did and what the model would receive next, for `heron conversations show`."""

from __future__ import annotations

import time
from typing import Any, cast

from heron.compaction.core import Budget, CompactionSetup, ContextDeps, deps_for, tokens_of
from heron.context.budget import section_name, split_sections
from heron.context.history import load_branch, system_for, view_of
from heron.context.prompt import PromptInputs
from heron.context.tokens import estimate_messages, estimate_text
from heron.messages import Message
from heron.providers.base import Provider
from heron.providers.profiles import ModelChoice
from heron.request import ToolSpec
from heron.store import Store
from heron.store import compactions as folds


def compaction_lines(store: Store, conversation_id: int) -> list[str]:
    """Each compaction of the conversation, numbered from 1 within it (the store's id, shared
    by every conversation, runs into the hundreds: it follows in brackets)."""
    out = []
    for n, c in enumerate(folds.compactions(store, conversation_id), 1):
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.created))
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


def _offline_deps(
    settings: Any, store: Store, specs: list[ToolSpec], choice: ModelChoice | None = None
) -> ContextDeps:
    """The compaction dependencies of `choice` (else the configured model), without opening
    it; `specs` are the tools a turn would offer (the caller's registry: compaction does not
    know the tools)."""
    from heron.errors import HeronError

    if choice is None:
        try:
            choice = settings.model()
        except HeronError:
            choice = ModelChoice("scripted", "unknown")
    workspace = settings.paths.workspace

    def inputs(name: str, conversation_id: int | None = None) -> PromptInputs:
        return PromptInputs(name, workspace, list(specs))

    setup = CompactionSetup(
        store,
        cast(Provider, None),  # never called: the view is read, no model call is made
        choice.model,
        choice.profile,
        settings.config.agent,
        settings.config.context,
        workspace,
        lambda: list(specs),
        inputs,
        forced_window=str(settings.env.get("HERON_CONTEXT_WINDOW") or ""),
    )
    return deps_for(_Offline(setup))


class _Offline:
    def __init__(self, setup: CompactionSetup) -> None:
        self.setup = setup

    def compaction_setup(self) -> CompactionSetup:
        return self.setup


def model_view(
    settings: Any,
    store: Store,
    conversation: Any,
    specs: list[ToolSpec],
    choice: ModelChoice | None = None,
) -> tuple[str, list[Message]]:
    """The system prompt and messages the next request would start from (before the next user
    message), derived from the record exactly as a turn derives them, for `choice` (else the
    configured model)."""
    deps = _offline_deps(settings, store, specs, choice)
    state = load_branch(store, conversation.id)
    return system_for(deps, conversation.agent, state), view_of(deps, state)


def budget_lines(budget: Budget) -> list[str]:
    """Each budget in tokens and as its share of the window."""
    out = []
    for label, tokens in budget.lines():
        share = f"({100 * tokens / budget.window:.1f}%)" if label != "window" else ""
        out.append(f"  {label:34} {tokens:>9,} {share}".rstrip())
    return out


def budget_report(
    settings: Any,
    store: Store,
    conversation: Any,
    specs: list[ToolSpec],
    choice: ModelChoice | None = None,
) -> list[str]:
    """`heron conversations show KEY --budget`: the budgets of `choice` (else the configured
    model), and what the next request's parts take now."""
    deps = _offline_deps(settings, store, specs, choice)
    state = load_branch(store, conversation.id)
    system, view = system_for(deps, conversation.agent, state), view_of(deps, state)
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
