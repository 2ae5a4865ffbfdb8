"""The memory chat commands, as plain functions a command module can call.

    /memory                   what waits for review
    /memory review            checklists of up to 10 (needs a `choose` callback from the channel)
    /memory accept ID         keep one suggestion
    /memory reject ID         drop one suggestion
    /learn, /reflect          review now, show what memory gained/changed/lost, propose tidying

Each returns the text to show the user. Accepting refuses when HERON_AGENT_COMMAND is set, so
nothing the agent runs can approve its own proposals.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from heron.config import Settings
from heron.memory.entries import MemoryRefused
from heron.memory.service import ChooseFn, MemoryService
from heron.own_python import python_module
from heron.providers.profiles import ModelChoice
from heron.store import Store
from heron.store.review_state import has_unread

if TYPE_CHECKING:
    from heron.memory.extract import Asker

USAGE = "Usage: /memory [review | accept ID | reject ID]"


def opening_line(service: MemoryService) -> str | None:
    """The line a chat opens with when suggestions wait; None when none do."""
    n = service.count_waiting()
    if not n:
        return None
    noun = "suggestion waits" if n == 1 else "suggestions wait"
    return f"{n} memory {noun} for your review: /memory review"


def list_waiting(service: MemoryService) -> str:
    waiting = service.waiting()
    if not waiting:
        return "Nothing waits for review."
    return "\n".join(f"#{s.id} {s.kind}: {s.describe()}" for s in waiting)


def memory_command(
    service: MemoryService,
    args: str,
    *,
    choose: ChooseFn | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run `/memory ARGS`; refusals come back as text, never as an exception."""
    words = args.split()
    try:
        if not words:
            return list_waiting(service)
        if words[0] == "review" and len(words) == 1:
            if choose is None:
                return list_waiting(service) + "\nKeep one with /memory accept ID."
            return review_text(service, choose, env)
        if words[0] in ("accept", "reject") and len(words) == 2 and words[1].lstrip("#").isdigit():
            number = int(words[1].lstrip("#"))
            if words[0] == "accept":
                return service.accept(number, env).message
            return service.reject(number).message
    except MemoryRefused as refused:
        return str(refused)
    return USAGE


def review_text(service: MemoryService, choose: ChooseFn, env: Mapping[str, str] | None) -> str:
    if not service.count_waiting():
        return "Nothing waits for review."
    decisions = service.review(choose, env)
    kept = [d for d in decisions if d.status == "accepted"]
    refused = [d for d in decisions if d.status == "waiting"]
    said = [d for d in decisions if d.status == "dropped"]  # kept, but memory said it already
    left = service.count_waiting()
    lines = [d.message for d in kept + refused + said]
    lines.append(f"Kept {len(kept)}, dropped {len(decisions) - len(kept) - len(refused)}.")
    if left:
        lines.append(f"{left} still waiting.")
    return "\n".join(lines)


@dataclass(frozen=True)
class LearnReport:
    gained: list[str]
    changed: list[str]
    lost: list[str]
    suggested: list[int]

    def text(self) -> str:
        lines = ["Memory since this chat started:"]
        for label, items in (("gained", self.gained), ("changed", self.changed)):
            lines += [f"  + {label}: {p}" for p in items]
        lines += [f"  - lost: {p}" for p in self.lost]
        if len(lines) == 1:
            lines.append("  no change")
        lines.append(f"{len(self.suggested)} new suggestion(s) from this review.")
        return "\n".join(lines)


def memory_digests(service: MemoryService) -> dict[str, str]:
    """What memory holds now (path -> digest); a chat keeps this from its start for /learn."""
    return {e.path.rel: e.digest for e in service.entries()}


async def learn(
    service: MemoryService,
    providers: tuple[Asker, Asker],
    conversation_id: int,
    baseline: Mapping[str, str],
    window: int | None = None,
) -> LearnReport:
    """/learn: what changed since `baseline`, then the review and tidy passes (which only add
    suggestions), each asking its provider of `providers` (the same model, recorded under
    each pass's name). The channel then opens the review checklists."""
    from heron.memory.extract import review_pass, tidy_pass

    now = memory_digests(service)
    gained = sorted(set(now) - set(baseline))
    lost = sorted(set(baseline) - set(now))
    changed = sorted(p for p in set(now) & set(baseline) if now[p] != baseline[p])
    suggested = await review_pass(providers[0], service, conversation_id, window)
    suggested += await tidy_pass(providers[1], service, conversation_id, window)
    return LearnReport(gained, changed, lost, suggested)


# ---- when a chat closes ------------------------------------------------------------------------


def unreviewed_keys(store: Store, keys: list[str]) -> list[str]:
    """Of these conversations, the ones with messages past their review cursor, whatever
    wrote them (a turn, /retry, another client): what a review at a chat's close would read.
    /learn moves the cursor past what it read; a fold of compaction does not."""
    found = (store.conversation(key) for key in keys)
    return [c.key for c in found if c is not None and has_unread(store, c.id)]


def review_argv(keys: list[str], cli_model: str | None) -> list[str]:
    """The hidden `heron memory review-pass` for these conversations, with the chat's model."""
    argv = python_module("heron", "memory", "review-pass")
    if cli_model:
        argv += ["--model", cli_model]
    for key in keys:
        argv += ["--conversation", key]
    return argv


def _detached(argv: list[str]) -> None:
    subprocess.Popen(  # our own interpreter and module, fixed arguments
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def closing_notice(choice: ModelChoice) -> str:
    return (
        f"Reviewing this chat for memory in the background with {choice.provider}/"
        f"{choice.model}: model calls that only add suggestions for your review "
        "(/memory review). Turn it off with [memory] review_on_close = false in config.toml."
    )


def review_on_close(
    settings: Settings,
    cli_model: str | None,
    choice: ModelChoice,
    keys: list[str],
    *,
    say: Callable[[str], object],
    start: Callable[[list[str]], object] = _detached,
) -> bool:
    """When a chat closes: start the review pass over what was said since the last review in
    a detached process (leaving the chat does not wait for it), with the chat's model and
    settings, and say so, naming the model: its calls are ones the user would not otherwise
    know about. Nothing runs when no conversation was talked in or `[memory] review_on_close`
    is false. Returns whether it started."""
    if not keys or not settings.config.memory.review_on_close:
        return False
    start(review_argv(keys, cli_model))
    say(closing_notice(choice))
    return True
