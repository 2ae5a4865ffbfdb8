"""Approval of the agent's commands: the registry's `before_call` hook, wired in by the engine.

`[tools] approval` says what happens before `bash` or `run_cell` runs: "allow" (the default when
the sandbox works), "ask" (the default when it does not: the channel shows the exact command and
waits for y/n) or "never". A channel that can ask gives its `Approver` to the AgentLoop
(`connect(..., approve=...)`), which hands it to each of that channel's turns (`TurnHooks.approve`,
then the tools' `ToolContext.approve`); without one, "ask" refuses, and the model reads why.
`heron serve` asks every client of the turn's conversation instead (heron/agent/approvals.py).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass

from heron.config import ApprovalMode, Settings
from heron.messages import ToolCall
from heron.tools.context import ToolContext
from heron.tools.registry import BeforeCall, ToolRegistry
from heron.tools.sandbox import Sandbox

COMMAND_TOOLS = {"bash": "command", "run_cell": "code"}  # tool -> the argument that it runs

NO_TERMINAL = (
    "no sandbox is available on this machine, so each command needs the person's approval, and "
    "this run has no terminal to ask in. Tell the person what you wanted to run; they can run "
    'it in `heron chat`, install bubblewrap, or set approval = "allow" under [tools] in '
    "config.toml."
)
NEVER = (
    'commands are turned off on this machine ([tools] approval = "never" in config.toml). '
    "Use the file tools, or tell the person what to run."
)
DECLINED = "the person declined to run this. Ask them what to do instead."
UNANSWERED = (
    "nobody answered the request to run this within {minutes} minutes, so it did not run. "
    "Tell the person what you wanted to run; they can approve it when you ask again."
)


def approval_label(tool: str, confined: bool) -> str:
    """What an approval prompt says of the command besides itself: its tool and whether the
    sandbox confines it ("bash, sandboxed" when approval "ask" was chosen with bubblewrap
    working; "bash, unconfined" without it), so that "ask" never reads as "the sandbox is off"."""
    return f"{tool}, {'sandboxed' if confined else 'unconfined'}"


def policy_for(configured: ApprovalMode | None, sandbox: Sandbox) -> ApprovalMode:
    """The policy in force: as configured, else "allow" sandboxed and "ask" unconfined."""
    if configured is not None:
        return configured
    return "allow" if sandbox.confined else "ask"


@dataclass
class Approval:
    """The `before_call` gate; `then` is a hook that was already installed (it runs after)."""

    policy: ApprovalMode
    then: BeforeCall | None = None
    confined: bool = False  # the sandbox confines the commands: the person is told so

    async def __call__(self, call: ToolCall, ctx: ToolContext) -> str | None:
        reason = await self._check(call, ctx)
        if reason is not None or self.then is None:
            return reason
        found = self.then(call, ctx)
        return await found if inspect.isawaitable(found) else found

    async def _check(self, call: ToolCall, ctx: ToolContext) -> str | None:
        argument = COMMAND_TOOLS.get(call.name)
        if argument is None or self.policy == "allow":
            return None
        if self.policy == "never":
            return NEVER
        if ctx.approve is None:
            return NO_TERMINAL
        return await ctx.approve(call.name, str(call.args.get(argument, "")), self.confined)


def install(registry: ToolRegistry, sandbox: Sandbox, configured: ApprovalMode | None) -> None:
    """Gate the registry's command tools and tell the model where they run (their description:
    the tool list is part of every prompt, so the sentence reaches every request)."""
    then = registry.before_call
    if isinstance(then, Approval):  # a registry handed to a second engine
        then = then.then
    registry.before_call = Approval(policy_for(configured, sandbox), then, sandbox.confined)
    describe_commands(registry, sandbox)


def describe_commands(registry: ToolRegistry, sandbox: Sandbox) -> None:
    """End each command tool's description with where it runs (the system prompt's contract
    repeats it: heron/context/prompt.py)."""
    for name in COMMAND_TOOLS:
        found = registry.get(name)
        if found is not None and sandbox.describe() not in found.description:
            described = f"{found.description} {sandbox.describe()}"
            registry.replace(dataclasses.replace(found, description=described))


def start_notice(registry: ToolRegistry, sandbox: Sandbox) -> str | None:
    """What a channel says once at start when commands cannot be confined (None: they can)."""
    gate = registry.before_call
    return sandbox.notice(gate.policy if isinstance(gate, Approval) else "allow")


def set_up(registry: ToolRegistry, settings: Settings) -> Sandbox:
    """The engine's sandbox (bwrap tried once, heron/tools/sandbox.py) and the registry gated
    for it."""
    paths, tools = settings.paths, settings.config.tools
    sandbox = Sandbox.detect(
        paths.workspace, paths.home, tools.network, settings.env, settings.store_url
    )
    install(registry, sandbox, tools.approval)
    return sandbox
