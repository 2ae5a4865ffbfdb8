"""What compaction did and what the model would receive next, for `heron conversations show`."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from heron.compaction import records as rec
from heron.compaction.core import deps_for, load_branch, system_for, view_of
from heron.messages import Message
from heron.store import Store


def compaction_lines(store: Store, conversation_id: int) -> list[str]:
    out = []
    for c in rec.compactions(store, conversation_id):
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.created))
        rows = f"rows #{c.first_row_id}-#{c.last_row_id}"
        if c.kind == "inflight":
            rows += f" (checkpoint on #{c.anchor_row_id})"
        out.append(
            f"── compaction {c.id} · {when} · {c.kind} · why: {c.reason} · folded {c.rows_folded}"
            f" messages, {rows} · tokens {c.tokens_before} → {c.tokens_after}"
        )
        if c.meta.get("error"):
            out.append(f"   (summarizer failed: {c.meta['error']}; written without the model)")
        out.extend("   " + line for line in c.summary.splitlines())
    return out or ["No compactions yet."]


def model_view(settings: Any, store: Store, conversation: Any) -> tuple[str, list[Message]]:
    """The system prompt and messages the next request would start from (before the next user
    message), derived from the record exactly as a turn derives them."""
    from heron.config import ModelChoice
    from heron.errors import HeronError
    from heron.tools.registry import default_registry

    try:
        choice = settings.model()
    except HeronError:
        choice = ModelChoice("scripted", "unknown")
    engine = SimpleNamespace(
        settings=settings, store=store, choice=choice, provider=None, registry=default_registry()
    )
    deps = deps_for(engine)
    state = load_branch(store, conversation.id)
    return system_for(deps, conversation.agent, state), view_of(deps, state)
