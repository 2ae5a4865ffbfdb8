"""The provider/tool loop of one run.

    1. shape the messages for the model (repair, then any governor the engine installs);
    2. call the provider (retrying rate limits and transient errors);
    3. if the model asked for tools, run them concurrently and feed the results back;
    4. drain the mailbox (messages the user typed meanwhile) and go again, until the model stops.

Ceilings (model calls, tokens) end in a wrap-up call that says what is done and what is
pending: it keeps the run's tools (for the provider's cache) and is told not to call them.
A reply cut by the output cap is continued at most `max_continuations` times a run, never for
a model whose profile says not to, and never when the cut text loops; a reply that loops
while it streams is stopped by the repetition guard when the profile turns it on.
The runner owns no storage: every new message and every model and tool call is handed to the
hooks as it happens, so the engine can persist it before anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Literal

from heron.agent.control import with_mail
from heron.bus import MAIL_BREAK
from heron.context.repair import repair_tool_pairs
from heron.errors import FatalProviderError, ProviderError
from heron.messages import (
    JSONObject,
    Message,
    Part,
    Reply,
    Text,
    Thinking,
    ToolCall,
    ToolResult,
    Usage,
)
from heron.providers.base import Provider, RetryPolicy, call_with_retries
from heron.providers.profiles import ModelProfile
from heron.providers.repetition import guarded_chat, repeats_itself
from heron.providers.wire import STOPPED, FailedAttempt, ModelCallRecord, Streamed, body_of
from heron.redact import Redactor, scrub_error
from heron.request import ChatRequest, OnEvent, StreamEvent
from heron.store.engine_state import interrupted_text
from heron.tools.context import ToolContext
from heron.tools.registry import ToolRegistry, bounded_gather

log = logging.getLogger(__name__)

RunStop = Literal["done", "wrapup", "length", "repetition", "interrupted", "error"]

CONTINUE = "Your reply was cut off by the output limit. Continue exactly where it stopped."
WRAP_UP = (
    "This run has reached its limit of {what}. Do not call tools. Reply to the user with a short "
    "summary of what is done and what is still pending, so the work can resume later."
)
CUT = "The reply reached the output cap ({cap:,} tokens){how} and is incomplete. {then}"
EMPTY = "the model sent an empty reply twice (no text and no tool call)"
EMPTY_HINT = "The model or its server may be misbehaving: try again, or try another model."
BREAK = (
    "The user asked you to stop. Do not call tools. Reply with a short summary of what is done "
    "and what is still pending, so the work can resume later."
)


class HeronPrompt(Message):
    """A user-role message Heron writes itself (the continue, wrap-up and stop prompts): the
    model reads it as the user's turn, but the store records its author as 'heron', so it is
    never quoted as the person's words nor shown as theirs. Once stored and read back it is
    a plain message row whose `author` says so."""

    author = "heron"

    def __init__(self, text: str) -> None:
        super().__init__("user", [Text(text)])


@dataclass(frozen=True)
class RunLimits:
    max_model_calls: int = 200  # per run, before a wrap-up
    max_tokens_total: int = 1_000_000
    max_continuations: int = 2  # "continue where you stopped" requests per run

    @classmethod
    def recorded(cls, fields: dict[str, int]) -> RunLimits:
        """The limits a trace recorded; traces written before the rename say `max_turns`."""
        fields = dict(fields)
        if "max_turns" in fields:
            fields["max_model_calls"] = fields.pop("max_turns")
        return cls(**fields)


@dataclass
class ToolCallRecord:
    call: ToolCall
    result: ToolResult
    effects: list[JSONObject]
    started: float
    ended: float
    # The turn was stopped while the call ran: `result` is its interrupted result, with what
    # it had printed (the same text the conversation gets, heron/store/engine_state.py).
    stopped: bool = False


async def _nothing(_: object) -> None:
    return None


async def _no_mail() -> list[Message]:
    return []


@dataclass
class RunHooks:
    """How the engine watches and steers a run. Every hook is optional."""

    on_event: OnEvent | None = None  # streamed text and reasoning
    on_progress: Callable[[str], None] | None = None  # interim text before a tool call
    on_message: Callable[[Message], Awaitable[None]] = _nothing  # persist each new message
    on_model_call: Callable[[ModelCallRecord], Awaitable[None]] = _nothing
    on_tool_call: Callable[[ToolCallRecord], Awaitable[None]] = _nothing
    # A call running when the run was cancelled (/stop, Ctrl-C), as it is cancelled: kept in
    # the trace whatever the epoch says, as the conversation keeps its interrupted result.
    on_tool_stopped: Callable[[ToolCallRecord], Awaitable[None]] = _nothing
    on_tool_start: Callable[[ToolCall], None] | None = None
    drain: Callable[[], Awaitable[list[Message]]] = _no_mail  # the mailbox
    # Shapes what the model sees (micro-compaction, in-flight compaction, snipping); it may call
    # the model itself, so it is async. It never changes the run's own record.
    govern: Callable[[list[Message]], Awaitable[list[Message]]] | None = None
    on_retry: Callable[[ProviderError, float], None] | None = None
    # A soft break (/stop with a wrap-up): asked at each drain point; True ends the run with a
    # wrap-up call (told not to call tools).
    should_break: Callable[[], bool] | None = None
    # Model calls made for the run outside it (in-flight checkpoints, from `govern`): they
    # count toward max_model_calls, so a turn that compacts at every step still ends.
    outside_calls: Callable[[], int] | None = None
    # Around each batch of tool calls: records the workspace files (USER.md, ...) they changed,
    # so the prompt labels them as the agent's notes (heron/context/written.py).
    watch_tools: Callable[[], AbstractContextManager[None]] | None = None


@dataclass
class RunResult:
    messages: list[Message]  # everything the run added, in order
    stop: RunStop
    usage: Usage = Usage()
    model_calls: int = 0  # requests sent: every attempt of a retried call counts
    tool_calls: int = 0
    error: ProviderError | None = None
    # For the person, when the reply ends cut by the output cap (stop "length"): that it is
    # incomplete and what setting raises the cap (`Runner.cut_note`).
    note: str | None = None
    # A call was billed and never counted (cut after it began, no usage sent): `usage` is a
    # floor and the cost unknown.
    usage_unknown: bool = False

    @property
    def text(self) -> str:
        """The final answer: the text of the last assistant message."""
        for message in reversed(self.messages):
            if message.role == "assistant":
                return message.text
        return ""


@dataclass
class _State:
    history: list[Message]
    new: list[Message] = field(default_factory=list)
    usage: Usage = Usage()
    calls: int = 0
    retried: int = 0  # failed attempts tried again: requests sent beyond `calls`
    uncounted: bool = False  # a call billed and never counted (see RunResult.usage_unknown)
    tools: int = 0
    continuations: int = 0
    cut: list[str] = field(default_factory=list)  # the text of the cut replies continued so far

    @property
    def all(self) -> list[Message]:
        return self.history + self.new


class Runner:
    def __init__(
        self,
        provider: Provider,
        registry: ToolRegistry,
        profile: ModelProfile,
        limits: RunLimits = RunLimits(),
        retry: RetryPolicy = RetryPolicy(),
        redactor: Redactor | None = None,
    ) -> None:
        self.provider = provider
        self.registry = registry
        self.profile = profile
        self.limits = limits
        self.retry = retry
        # A provider error can echo the request's key: scrubbed before it is stored or shown.
        self.redactor = redactor or Redactor()

    async def run(
        self, system: str, messages: list[Message], ctx: ToolContext, hooks: RunHooks
    ) -> RunResult:
        """`messages` ends with the user's message, already persisted by the caller."""
        state = _State(list(messages))
        try:
            stop = await self._loop(system, state, ctx, hooks)
        except ProviderError as error:
            return self._result(state, "error", error)
        return self._result(state, stop)

    def _result(self, s: _State, stop: RunStop, error: ProviderError | None = None) -> RunResult:
        note = self.cut_note(s) if stop == "length" else None
        calls = s.calls + s.retried
        return RunResult(s.new, stop, s.usage, calls, s.tools, error, note, s.uncounted)

    def cut_note(self, s: _State) -> str:
        """Why a reply the output cap cut was left so (continued as far as allowed, or not at
        all) and what raises the cap, naming the settings in config.toml."""
        cap = f'max_output under [models."{self.provider.model}"]'
        most = self.limits.max_continuations
        if not self.profile.continue_cut:
            how, then = "", f"This model's cut replies are not continued: raise {cap}."
        elif most == 0:
            how = " (continuation is off: [agent] max_continuations = 0)"
            then = f"Raise {cap} or [agent] max_continuations in config.toml."
        elif s.continuations >= most:
            how = f" after {s.continuations} continuation{'s' if s.continuations > 1 else ''}"
            then = f"Raise {cap} or [agent] max_continuations in config.toml."
        else:  # `_may_continue` refused a loop: more room would only repeat it
            how, then = " repeating itself, so it was not continued", "Ask again differently."
        return CUT.format(cap=self.profile.max_output, how=how, then=then)

    async def _loop(self, system: str, s: _State, ctx: ToolContext, hooks: RunHooks) -> RunStop:
        empty_retried = False
        while True:
            limit = self._limit_reached(s, hooks)
            if limit:
                await self._wrap_up(system, s, hooks, limit)
                return "wrapup"
            reply = await self._call(system, s, hooks, tools=True, purpose="turn")
            if _is_empty(reply) and reply.stop != "length":  # a cut one is continued below
                if empty_retried:
                    raise FatalProviderError(EMPTY, hint=EMPTY_HINT)
                empty_retried = True
                continue
            await self._add(s, reply.message, hooks)
            if reply.tool_calls:
                if reply.text.strip() and hooks.on_progress:
                    hooks.on_progress(reply.text)
                await self._run_tools(reply.tool_calls, s, ctx, hooks)
                if hooks.should_break and hooks.should_break():
                    await self._wrap_up(system, s, hooks, "", prompt=BREAK)
                    return "wrapup"
                continue
            if reply.stop == "length" and self._may_continue(s, reply):
                s.continuations += 1
                s.cut.append(reply.text)
                await self._add(s, HeronPrompt(CONTINUE), hooks)
                continue
            if hooks.should_break and hooks.should_break():
                return "done"  # already a final answer: nothing to wrap up
            mail = await hooks.drain()
            if mail:
                if reply.text.strip() and hooks.on_event:  # what follows answers the mail:
                    hooks.on_event(StreamEvent("text", MAIL_BREAK))  # a paragraph of its own
                for message in mail:
                    await self._add(s, message, hooks)
                continue
            return reply.stop if reply.stop in ("length", "repetition") else "done"

    def _may_continue(self, s: _State, reply: Reply) -> bool:
        """A cut reply is continued within the run's bound, when the profile allows it and the
        text cut so far (this reply and the ones it continues) is not a loop."""
        if not self.profile.continue_cut or s.continuations >= self.limits.max_continuations:
            return False
        return not repeats_itself("".join([*s.cut, reply.text]))

    def _limit_reached(self, s: _State, hooks: RunHooks) -> str | None:
        outside = hooks.outside_calls() if hooks.outside_calls else 0
        if s.calls + outside >= self.limits.max_model_calls:
            return f"{self.limits.max_model_calls} model calls"
        if s.usage.total >= self.limits.max_tokens_total:
            return f"{self.limits.max_tokens_total} tokens"
        return None

    async def _call(
        self, system: str, s: _State, hooks: RunHooks, *, tools: bool, purpose: str
    ) -> Reply:
        view = repair_tool_pairs(s.all)
        if hooks.govern:
            view = await hooks.govern(view)
        request = ChatRequest(
            model=self.provider.model,
            system=system,
            messages=view,
            tools=self.registry.specs() if tools else [],
            max_tokens=self.profile.max_output,
            stall_timeout=self.retry.stall_timeout,
        )
        body = body_of(self.provider, request)  # the adapter posts this same body
        payload = body.text
        started = time.time()
        s.calls += 1
        seq = s.calls
        shown = RetryFilter(hooks.on_event) if hooks.on_event else None
        kept = StreamKept(shown)  # what this attempt streamed, should the call be stopped
        told = self._on_retry(hooks)
        guard = self.profile.loop_guard

        failed: list[FailedAttempt] = []  # attempts tried again, each with its error
        cut = False  # one of them broke after it began

        def on_retry(error: ProviderError, wait: float) -> None:
            nonlocal cut
            scrub_error(error, self.redactor)  # kept in the trace: no key it echoed
            failed.append(FailedAttempt(repr(error), wait, time.time()))
            cut |= kept.began  # it streamed, then broke: billed, never counted
            kept.restart()
            if shown is not None:
                shown.retrying()
            if told is not None:
                told(error, wait)

        def chat() -> Awaitable[Reply]:
            if guard:  # stops a looping reply as it streams
                return guarded_chat(self.provider, request, kept)
            return self.provider.chat(request, kept)

        try:
            reply = await call_with_retries(chat, self.retry, on_retry=on_retry)
        except asyncio.CancelledError:
            # Stopped (Ctrl-C, /stop) mid-call: the request was sent and billed, so its row
            # is kept with what streamed; the turn's interruption writes it (heron/agent/turn.py).
            stopped = kept.streamed()
            record = ModelCallRecord(
                seq,
                purpose,
                payload,
                None,
                STOPPED,
                started,
                time.time(),
                body,
                stopped,
                tuple(failed),
            )
            try:
                await asyncio.shield(hooks.on_model_call(record))
            except Exception:  # the stop goes on, whatever keeping the row ran into
                log.warning("the model call a stop cut could not be recorded", exc_info=True)
            raise
        except ProviderError as error:
            scrub_error(error, self.redactor)
            s.retried += len(failed)
            # What streamed before it broke was billed: kept, its usage unknown.
            streamed = kept.streamed() if kept.began or cut else None
            s.uncounted |= streamed is not None
            ended = time.time()
            record = ModelCallRecord(
                seq,
                purpose,
                payload,
                None,
                repr(error),
                started,
                ended,
                body,
                streamed,
                tuple(failed),
            )
            await hooks.on_model_call(record)
            raise
        s.retried += len(failed)
        if cut and not reply.usage_unknown:  # an earlier attempt's tokens were never counted
            reply = Reply(reply.parts, reply.stop, reply.usage, usage_unknown=True)
        s.uncounted |= reply.usage_unknown
        s.usage = s.usage + reply.usage
        await hooks.on_model_call(
            ModelCallRecord(
                seq, purpose, payload, reply, None, started, time.time(), body, failed=tuple(failed)
            )
        )
        return reply

    def _on_retry(self, hooks: RunHooks) -> Callable[[ProviderError, float], None] | None:
        shown = hooks.on_retry
        if shown is None:
            return None
        return lambda error, delay: shown(scrub_error(error, self.redactor), delay)

    async def _add(self, s: _State, message: Message, hooks: RunHooks) -> None:
        s.new.append(message)
        await hooks.on_message(message)

    async def _run_tools(
        self, calls: list[ToolCall], s: _State, ctx: ToolContext, hooks: RunHooks
    ) -> None:
        ctx.reply_seq = s.calls  # which reply asked (memory counts changes per reply)
        # At most MAX_PARALLEL_TOOLS at once (heron/tools/registry.py), results in call order.
        with hooks.watch_tools() if hooks.watch_tools else contextlib.nullcontext():
            results = await bounded_gather(
                [functools.partial(self._run_tool, c, ctx, hooks) for c in calls]
            )
        s.tools += len(calls)
        mail = await hooks.drain()
        # Mail typed during the tools rides in the same user message as the results, so the
        # history keeps alternating user and assistant. A message of Heron's own (a subagent's
        # result) follows as its own row: it keeps its author and the meta naming its run, and
        # is never read as the person's words.
        own = [m for m in mail if m.author == "heron"]
        typed = [m for m in mail if not any(m is o for o in own)]
        merged = Message("user", [*results, *(p for m in typed for p in m.parts)])
        await self._add(s, with_mail(merged, typed), hooks)  # with the mail's refs, if any
        for message in own:
            await self._add(s, message, hooks)

    async def _run_tool(self, call: ToolCall, ctx: ToolContext, hooks: RunHooks) -> ToolResult:
        if hooks.on_tool_start:
            hooks.on_tool_start(call)
        started = time.time()

        def running() -> None:
            nonlocal started  # its own time: not its wait for a writing call before it
            started = time.time()

        try:
            result, effects = await self.registry.call_recording(call, ctx, running)
        except asyncio.CancelledError:
            await _stopped_call(call, ctx, hooks, started)
            raise
        await hooks.on_tool_call(ToolCallRecord(call, result, effects, started, time.time()))
        return result

    async def _wrap_up(
        self, system: str, s: _State, hooks: RunHooks, what: str, prompt: str | None = None
    ) -> None:
        """The wrap-up call keeps the tools the run's calls had, so the request is the previous
        one plus two messages and the provider's cache serves all of it (without them the
        tools, the first thing cached, would differ and nothing would be read; Anthropic's
        `tool_choice: none` keeps only tools and system, its docs say, since a changed
        tool_choice invalidates the cached messages). The prompt says not to call tools; a
        reply that calls one anyway is set aside, and the wrap-up is asked once more without
        tools."""
        text = prompt or WRAP_UP.format(what=what)
        await self._add(s, HeronPrompt(text), hooks)
        reply = await self._call(system, s, hooks, tools=True, purpose="wrapup")
        if reply.tool_calls:
            if hooks.on_event:  # what streamed is replaced by the next reply: taken back
                hooks.on_event(StreamEvent("retry", reply.text))
            reply = await self._call(system, s, hooks, tools=False, purpose="wrapup")
        await self._add(s, reply.message, hooks)


def stopped_record(call: ToolCall, partials: dict[str, str], started: float) -> ToolCallRecord:
    """A call its turn stopped, with the interrupted result the conversation keeps for it (what
    the tool left of its output, by call id in `partials`)."""
    text = interrupted_text(call.id, partials)
    return ToolCallRecord(call, ToolResult(call.id, text, True), [], started, time.time(), True)


async def _stopped_call(call: ToolCall, ctx: ToolContext, hooks: RunHooks, started: float) -> None:
    """A call cancelled with its run: handed on as stopped, so the trace lists it as the
    conversation does."""
    record = stopped_record(call, ctx.partials, started)
    try:
        await asyncio.shield(hooks.on_tool_stopped(record))
    except Exception:  # the stop goes on, whatever keeping the row ran into
        log.warning("the tool call a stop cut could not be recorded", exc_info=True)


class StreamKept:
    """One model call's stream events, passed on to `inner` and kept: the text, reasoning and
    latest usage of the attempt under way, which a call stopped mid-stream records."""

    def __init__(self, inner: OnEvent | None) -> None:
        self.inner = inner
        self.restart()

    def restart(self) -> None:
        """A retried attempt streams again from the start."""
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.usage: Usage | None = None

    def __call__(self, event: StreamEvent) -> None:
        if event.kind == "text":
            self.text.append(event.text)
        elif event.kind == "thinking":
            self.thinking.append(event.text)
        elif event.kind == "usage":
            self.usage = event.usage
        if self.inner is not None:
            self.inner(event)

    @property
    def began(self) -> bool:
        """Whether this attempt's reply had begun (text, reasoning or usage arrived): a call
        that breaks after that was billed."""
        return bool(self.text or self.thinking) or self.usage is not None

    def streamed(self) -> Streamed:
        parts: list[Part] = []
        if self.thinking:
            parts.append(Thinking(text="".join(self.thinking)))
        if self.text:
            parts.append(Text("".join(self.text)))
        return Streamed(parts, self.usage)


# RETRY_MARKER (heron/bus.py) is what the RetryFilter marks a restarted stream with.


class RetryFilter:
    """One model call's stream events, passed on. A retried call streams again from the start:
    what repeats what was already shown is held back, and where the new attempt first differs
    a "retry" event marks the break (the channel shows it; its text is the text taken back),
    so no text is printed twice."""

    def __init__(self, on_event: OnEvent) -> None:
        self.on_event = on_event
        self.shown = {"text": "", "thinking": ""}
        self.replayed: dict[str, int] | None = None  # after a retry: how much came again

    def retrying(self) -> None:
        self.replayed = {"text": 0, "thinking": 0}

    def __call__(self, event: StreamEvent) -> None:
        kind = event.kind
        if self.replayed is not None and kind in self.replayed:
            shown, at = self.shown[kind], self.replayed[kind]
            rest = shown[at:]
            if rest.startswith(event.text):
                self.replayed[kind] = at + len(event.text)
                return  # already on screen
            if event.text.startswith(rest):  # caught up: pass on only what is new
                del self.replayed[kind]
                event = StreamEvent(kind, event.text[len(rest) :])
            else:
                self._start_again()
        if kind in self.shown:
            self.shown[kind] += event.text
        if event.text:
            self.on_event(event)

    def _start_again(self) -> None:
        """The new attempt differs from what was shown: the "retry" event carries the text it
        takes back (a channel that holds the reply drops it), then what the new attempt had
        repeated so far, held back until now, is passed on as its start."""
        replayed = self.replayed or {}
        again = {k: v[: replayed[k]] if k in replayed else v for k, v in self.shown.items()}
        self.on_event(StreamEvent("retry", self.shown["text"]))
        self.replayed = None
        self.shown = {"text": "", "thinking": ""}
        for kind in ("thinking", "text"):
            if again[kind]:
                self.shown[kind] = again[kind]
                self.on_event(StreamEvent(kind, again[kind]))


def _is_empty(reply: Reply) -> bool:
    return not reply.tool_calls and not reply.text.strip()
