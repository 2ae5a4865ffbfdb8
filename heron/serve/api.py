"""The REST routes of `heron serve` (under /api), for the browser UI.

Every handler calls the same store, memory and compaction functions the CLI calls (listing,
`conversations delete` with its refusals, `memory accept/reject/forget`, the compaction
inspector), so the browser and the terminal cannot disagree. Actions that run through the turn
engine (/retry, /edit, /tree N, /new, /status) go over the WebSocket as slash commands instead.

The routes find what they need in `app.state.web` (a `WebState`, set by `install`); they open
their own `Store` connection, so a slow read never waits behind the engine's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from heron import timefmt
from heron.attachments import too_big
from heron.config import AttachmentCaps, Settings
from heron.errors import HeronError, StoreRefused
from heron.messages import new_key
from heron.store import Conversation, Store
from heron.store.engine_state import close_dead_runs, close_dead_turns
from heron.web.uploads import Upload, folder, save

router = APIRouter(prefix="/api")
T = TypeVar("T")


@dataclass
class WebState:
    """What the routes use: the home's settings, a store connection of their own, and the
    running serve (for whether a conversation is busy), when there is one."""

    settings: Settings
    store: Store
    busy: Callable[[str], bool] = field(default=lambda key: False)
    choice: Any = None  # the serve's ModelChoice; None: the configured one
    # Ends a deleted conversation's Python kernel in the serve (`Engine.end_kernel`): what it
    # held in memory goes with the conversation. None: no engine here.
    end_kernel: Callable[[Conversation], Awaitable[None]] | None = None
    # The serve's engine: the model view is built with its tools. None: the engine a chat here
    # would open.
    engine: Any = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def uploads(self) -> Path:
        return folder(self.settings.paths.home)


def install(app: FastAPI, settings: Settings, busy: Callable[[str], bool] | None = None) -> None:
    """Give `app` the state the routes need and include them (idempotent on the router)."""
    store = Store(settings.database, files=settings.paths.files)
    app.state.web = WebState(settings, store, busy or (lambda key: False))
    mounted = [getattr(r, "router", None) for r in app.router.routes]  # probe: Starlette
    if router not in mounted:
        app.include_router(router)
        install_errors(app)


def _state(request: Request) -> WebState:
    """The routes' state: set by `install`, or made once from the serve's runtime
    (`app.state.runtime`, heron/serve/app.py)."""
    state = getattr(request.app.state, "web", None)  # probe: Starlette app.state
    if state is None:
        runtime = getattr(request.app.state, "runtime", None)  # probe: Starlette app.state
        if runtime is None:
            raise HTTPException(503, "the web API is not installed on this app")
        settings = runtime.engine.settings
        store = Store(settings.database, files=settings.paths.files)
        engine = runtime.engine
        state = WebState(
            settings, store, runtime.loop.running, engine.choice, engine.end_kernel, engine
        )
        request.app.state.web = state
    return state


async def _run(state: WebState, fn: Callable[..., T], *args: Any) -> T:
    """A store call off the event loop; one at a time on this connection. A HeronError
    becomes a 4xx answer carrying its message and hint."""
    async with state.lock:
        try:
            return await asyncio.to_thread(fn, *args)
        except HeronError as e:
            raise HTTPException(_status_of(e), _detail(e)) from e


def _detail(error: HeronError) -> dict[str, str]:
    """An error as the API's `detail`: the message alone (str() of a HeronError ends with its
    hint, which has a field of its own), and the hint."""
    return {"message": str(error.args[0]), "hint": error.hint or ""}


def invalid_request(_: Request, error: Exception) -> JSONResponse:
    """A request FastAPI could not validate (`limit=abc`, a message id that is no number) in
    the API's documented shape, `{"detail": {"message", "hint"}}`, not FastAPI's list."""
    found = error.errors() if isinstance(error, RequestValidationError) else []
    said = []
    for problem in found:
        loc = problem.get("loc", ())
        where = ".".join(str(p) for p in loc if p not in ("query", "path", "body"))
        said.append(f"{where}: {problem.get('msg', '')}" if where else str(problem.get("msg")))
    return JSONResponse(
        {
            "detail": {
                "message": "; ".join(said) or "the request is not valid",
                "hint": "Send the request again with that value corrected; docs/web.md lists "
                "each route and what it takes.",
            }
        },
        status_code=422,
    )


def install_errors(app: FastAPI) -> None:
    """The API's error shape for requests that fail validation (heron/serve/app.py too)."""
    app.add_exception_handler(RequestValidationError, invalid_request)


def _status_of(error: HeronError) -> int:
    text = str(error)
    if text.startswith("no "):
        return 404
    if "still in use" in text:
        return 409
    return 400


def _conversation(store: Store, key: str) -> Any:
    conv = store.conversation(key)
    if conv is None:
        raise HTTPException(404, {"message": f"no conversation {key!r}", "hint": "Pick one."})
    return conv


def _visible(key: str) -> bool:
    """Internal conversations (schedules, heartbeat, subagents) are never listed: the store's
    one rule for them (records.is_internal)."""
    from heron.store.records import is_internal

    return not is_internal(key)


# ---- conversations ----------------------------------------------------------------------------


def _row(store: Store, conv: Conversation, zone: str) -> dict[str, Any]:
    """A conversation as the sidebar lists it; `day`, the date of its last activity in the
    agent's `zone`, is what the sidebar shows of an old one (as `conversations list` does)."""
    turns, branches = store.branch_counts(conv.id)  # the current branch's turns
    day = timefmt.when(conv.updated, zone, timefmt.DAY)
    return {
        "key": conv.key,
        "title": conv.title,
        "updated": conv.updated,
        "day": day,
        "turns": turns,
        "branches": branches,
    }


def _listing(store: Store, limit: int, offset: int, zone: str) -> tuple[list[dict[str, Any]], bool]:
    """The page of the list from the `offset`-th, and whether more follow it."""
    found = store.conversations(limit + 1, offset=offset)
    return [_row(store, c, zone) for c in found[:limit] if _visible(c.key)], len(found) > limit


def _search(
    store: Store, query: str, limit: int, offset: int, zone: str
) -> tuple[list[dict[str, Any]], bool]:
    """Conversations whose title or key holds `query`, then those whose messages match it in
    the full-text index, best first, each with its best snippet (the recall index
    `heron memory recall` uses) where its messages match; the page from the `offset`-th, and
    whether more follow."""
    from heron.memory.recall import Recall

    wanted = offset + limit + 1
    named = store.conversations(wanted, named=query.strip())
    said: dict[str, dict[str, Any]] = {}  # per conversation, its best hit
    for hit in Recall(store, zone=zone).search(query, wanted * 5):
        key = hit.conversation_key
        if key not in said and _visible(key):
            snippet = " ".join(hit.snippet.split())[:200]
            said[key] = {"snippet": snippet, "message_id": hit.message_id, "on_branch": True}
            if hit.elsewhere:  # the page opens on the current branch: say which one holds it
                branch = _branch_holding(store, hit.conversation_id, hit.message_id)
                said[key].update(on_branch=False, branch=branch)
    rows = [{**_row(store, c, zone), **said.get(c.key, {})} for c in named]
    listed = {c.key for c in named}
    for key, best in said.items():
        if len(rows) >= wanted:
            break
        found = store.conversation(key)
        if found is not None and key not in listed:
            rows.append({**_row(store, found, zone), **best})
    return rows[offset : offset + limit], len(rows) > offset + limit


@router.get("/conversations")
async def conversations(
    request: Request,
    q: str = "",
    limit: Annotated[int, Query(ge=1)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> JSONResponse:
    """A page of the list, or of a search's conversations; `more`: a page follows it."""
    state = _state(request)
    zone = state.settings.timezone
    if q.strip():
        rows, more = await _run(state, _search, state.store, q, limit, offset, zone)
    else:
        rows, more = await _run(state, _listing, state.store, limit, offset, zone)
    return JSONResponse({"conversations": rows, "more": more})


_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$")


@router.post("/conversations")
async def new_conversation(request: Request) -> JSONResponse:
    state = _state(request)
    body = await _json(request)
    key = str(body.get("key") or new_key("web"))
    if not _KEY.match(key):
        raise HTTPException(
            400, {"message": f"{key!r} is not a usable key", "hint": "Letters, digits, -_.:@"}
        )
    if not _visible(key):  # cron:..., heartbeat, subagent:...: Heron's own, never listed
        raise HTTPException(
            400,
            {
                "message": f"{key!r} is reserved for Heron's own conversations",
                "hint": "Choose another key, or leave it out for a new web-... one.",
            },
        )
    # The row comes with the first message: a conversation opened and left unused stores
    # nothing. A title is kept (on a row of its own) only when one is given.
    if body.get("title"):
        conv = await _run(state, state.store.open_conversation, key)
        await _run(state, state.store.set_title, conv.id, str(body["title"]))
    return JSONResponse({"key": key}, status_code=201)


@router.patch("/conversations/{key}")
async def rename(request: Request, key: str) -> JSONResponse:
    state = _state(request)
    body = await _json(request)
    title = str(body.get("title") or "").strip()
    if not title:
        raise HTTPException(400, {"message": "the title is empty", "hint": "Type a title."})
    conv = await _run(state, _conversation, state.store, key)
    await _run(state, state.store.set_title, conv.id, title[:200])
    return JSONResponse({"key": key, "title": title[:200]})


@router.delete("/conversations/{key}")
async def delete(request: Request, key: str) -> JSONResponse:
    from heron.channels.info import remove_conversation

    state = _state(request)
    if state.busy(key):
        raise HTTPException(
            409,
            {
                "message": f"conversation {key!r} is still in use: a turn runs in it",
                "hint": "Stop that turn (/stop), then delete.",
            },
        )
    gone = await _run(state, remove_conversation, state.store, key)
    if state.end_kernel is not None:
        await state.end_kernel(gone)
    return JSONResponse({"deleted": key})


@router.get("/conversations/{key}/transcript")
async def transcript(
    request: Request,
    key: str,
    limit: Annotated[int | None, Query(ge=1)] = None,
    before: int | None = None,
    since: int | None = None,
) -> JSONResponse:
    """The whole branch, or a page of it (docs/web.md): the newest `limit` items above row
    `before`, or every item from row `since` on; `earlier` is the `before` of the page above."""
    from heron.web.transcript import FILE_URL, Page, build

    state = _state(request)
    asked = (limit, before, since) != (None, None, None)
    paged = Page(limit, before, since) if asked else None
    await _run(state, _close_left, state.store, key)
    built = await _run(state, build, state.store, key, FILE_URL, paged)
    if built is None:  # a conversation not started yet: empty, not an error
        empty: dict[str, Any] = {"conversation": key, "title": None, "head_id": None, "items": []}
        return JSONResponse({**empty, "start": None, "earlier": None})
    return JSONResponse(built.to_json())


def _close_left(store: Store, key: str) -> None:
    """A turn whose process died mid-turn here (a `heron run --model` killed beside the serve)
    is read as stopped, with its note and /retry, not as a message with nothing under it."""
    from heron.agent.turn import STOPPED

    conversation = store.conversation(key)
    if conversation is not None:
        with contextlib.suppress(StoreRefused):  # a full disk: the transcript is read all the same
            close_dead_turns(store, STOPPED, conversation.id)


@router.get("/conversations/{key}/files/{message_id}/{index}")
async def file(request: Request, key: str, message_id: int, index: int) -> Response:
    from heron.web.transcript import file_part

    state = _state(request)
    part = await _run(state, file_part, state.store, key, message_id, index)
    if part is None:
        raise HTTPException(404, {"message": "no such attachment", "hint": "Reload the page."})
    name = _NAME.sub("_", part.name or "file")
    # Only what a browser shows without running anything opens in the page; anything else (an
    # HTML or SVG file could carry script on this origin) is a download.
    shown = part.media_type in _SHOWN
    return Response(
        part.data,
        media_type=part.media_type if shown else "application/octet-stream",
        headers={
            "Content-Disposition": f'{"inline" if shown else "attachment"}; filename="{name}"',
            "X-Content-Type-Options": "nosniff",
        },
    )


_SHOWN = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp", "application/pdf"})


@router.get("/conversations/{key}/export")
async def export(
    request: Request, key: str, form: Annotated[str, Query(alias="format")] = "md"
) -> Response:
    """The conversation's current branch, whole, as `heron conversations export` writes it
    (the same function), as a download: `?format=md` (Markdown) or `json`."""
    from heron.channels.export import MEDIA_TYPE, export_format, exported, filename

    state = _state(request)
    try:
        form = export_format(form)
    except HeronError as e:
        raise HTTPException(400, _detail(e)) from e
    text, _ = await _run(state, exported, state.store, key, form, state.settings.timezone)
    return Response(
        text.encode("utf-8"),
        media_type=MEDIA_TYPE[form],
        headers={"Content-Disposition": f'attachment; filename="{filename(key, form)}"'},
    )


def _branch_holding(store: Store, conversation_id: int, message_id: int) -> int | None:
    """The number /tree gives the first branch that holds the message (None: none does)."""
    from heron.agent.commands import _leaves

    parent = {r.id: r.parent_id for r in store.all_messages(conversation_id)}
    for n, (leaf, _) in enumerate(_leaves(store, conversation_id), 1):
        at: int | None = leaf.id
        while at is not None and at >= message_id:  # ids fall along a branch
            if at == message_id:
                return n
            at = parent.get(at)
    return None


def _branches(store: Store, key: str, zone: str) -> dict[str, Any]:
    """The conversation's branches (leaves) and the user's messages on the current one, as
    /tree lists them: /tree N and /edit N TEXT take these numbers. Each branch says when its
    last message came (`when`, in the agent's zone): two that end alike (an /edit, then a
    /retry of it) are told apart by it and by their number."""
    from heron.agent.commands import _leaves, _user_messages

    conv = _conversation(store, key)
    if conv.head_id is None:
        return {"branches": [], "messages": []}
    rows = store.branch(conv.id)
    on_branch = {r.id for r in rows}
    leaves = [
        {"n": i, "id": leaf.id, "text": label, "current": leaf.id in on_branch}
        | {"when": timefmt.when(leaf.created, zone)}
        for i, (leaf, label) in enumerate(_leaves(store, conv.id), 1)
    ]
    typed = [
        {"n": i, "id": r.id, "text": r.message.text} for i, r in enumerate(_user_messages(rows), 1)
    ]
    return {"branches": leaves, "messages": typed}


@router.get("/conversations/{key}/branches")
async def branches(request: Request, key: str) -> JSONResponse:
    state = _state(request)
    zone = state.settings.timezone
    return JSONResponse(await _run(state, _branches, state.store, key, zone))


def _compactions(state: WebState, key: str) -> dict[str, Any]:
    """What each compaction folded, and the model view the next request starts from: the
    system prompt and tools of the serve's own engine, which sends it."""
    from heron.channels.info import next_request_deps
    from heron.compaction import inspect
    from heron.messages import File, Text, ToolCall, ToolResult
    from heron.providers.wire import file_label
    from heron.store import compactions as folds

    store = state.store
    conv = _conversation(store, key)
    folded = [
        {
            "id": c.id,
            "kind": c.kind,
            "reason": c.reason,
            "created": c.created,
            "rows": [c.first_row_id, c.last_row_id],
            "rows_folded": c.rows_folded,
            "tokens_before": c.tokens_before,
            "tokens_after": c.tokens_after,
            "summary": c.summary,
        }
        for c in folds.compactions(store, conv.id)
    ]
    deps = next_request_deps(state.settings, store, state.choice, state.engine)
    system, messages = inspect.model_view(deps, conv)
    tools = [
        {"name": t.name, "description": t.description, "parameters": t.parameters}
        for t in deps.tools
    ]
    view = []
    for m in messages:
        lines = []
        for p in m.parts:
            if isinstance(p, Text):
                lines.append(p.text)
            elif isinstance(p, ToolCall):
                lines.append(f"[call {p.id}] {p.name}({json.dumps(p.args, ensure_ascii=False)})")
            elif isinstance(p, ToolResult):
                lines.append(f"[result {p.call_id}{' error' if p.is_error else ''}] {p.content}")
            elif isinstance(p, File):
                lines.append(f"[file {file_label(p)}]")
        view.append({"role": m.role, "text": "\n".join(lines)})
    return {"compactions": folded, "system": system, "tools": tools, "view": view}


@router.get("/conversations/{key}/compactions")
async def compactions(request: Request, key: str) -> JSONResponse:
    state = _state(request)
    return JSONResponse(await _run(state, _compactions, state, key))


def _status(state: WebState, key: str) -> dict[str, Any]:
    """Model, context used, cache hit rate and cost of the conversation (as /status)."""
    from heron.agent.commands import _usage
    from heron.trace.prices import conversation_cost

    store = state.store
    try:
        choice = state.choice or state.settings.model()
        model, window = f"{choice.provider}/{choice.model}", choice.profile.context_window
    except HeronError as e:
        model, window = f"none ({str(e).splitlines()[0]})", 0
    conv = store.conversation(key)
    if conv is not None:  # a /compact its process died in counts what it did, interrupted
        with contextlib.suppress(StoreRefused):
            close_dead_runs(store)
    if conv is None:
        return {
            "model": model,
            "window": window,
            "context": 0,
            "turns": 0,
            "cache_hit": None,
            "cost_usd": 0.0,
        }
    used = _usage(store, conv.id)
    # What the conversation cost: its maintenance runs (/compact, memory reviews) included.
    cost = conversation_cost(store.turns(conv.id, maintenance=True))
    return {
        "model": model,
        "window": window,
        "context": used.tokens,
        "turns": used.turns,
        "cache_hit": used.rate,
        "cost_usd": cost,
    }


@router.get("/conversations/{key}/status")
async def status(request: Request, key: str) -> JSONResponse:
    state = _state(request)
    found = await _run(state, _status, state, key)
    found["busy"] = state.busy(key)
    return JSONResponse(found)


# ---- memory -----------------------------------------------------------------------------------


def _memory(state: WebState) -> Any:
    from heron.memory.service import MemoryService

    return MemoryService(state.settings.paths.memory, state.store, state.settings.timezone)


def _entries(state: WebState) -> dict[str, Any]:
    from heron.memory.section import day_shown

    scopes: dict[str, list[dict[str, Any]]] = {}
    service = _memory(state)
    zone = service.timezone
    for e in service.entries():
        scopes.setdefault(e.path.scope, []).append(
            {
                "path": e.path.rel,
                "text": e.text,
                "origin": e.origin,
                "quote": e.source.quote,
                "conversation": e.source.conversation,
                "message": e.source.message,
                # The day the person said the quote: the entry's "last month" is read from it.
                "said": timefmt.when(e.source.said, zone, timefmt.DAY) if e.source.said else None,
                # What the model is shown: "said <day>", else "saved <day>" (the panel shows it
                # for every entry, one without a conversation or without `said` too).
                "day": day_shown(e, zone),
                "mistake": e.mistake,
                "updated": e.updated,
            }
        )
    return {"scopes": [{"scope": s, "entries": v} for s, v in sorted(scopes.items())]}


@router.get("/memory")
async def memory(request: Request) -> JSONResponse:
    state = _state(request)
    return JSONResponse(await _run(state, _entries, state))


def _waiting(state: WebState) -> dict[str, Any]:
    return {"suggestions": [{**asdict(s), "line": s.describe()} for s in _memory(state).waiting()]}


@router.get("/memory/review")
async def review(request: Request) -> JSONResponse:
    state = _state(request)
    return JSONResponse(await _run(state, _waiting, state))


def _decide(state: WebState, suggestion_id: int, accept: bool) -> dict[str, Any]:
    service = _memory(state)
    decision = service.accept(suggestion_id) if accept else service.reject(suggestion_id)
    return {"id": suggestion_id, "status": decision.status, "message": decision.message}


@router.post("/memory/review/{suggestion_id}/{verdict}")
async def decide(request: Request, suggestion_id: int, verdict: str) -> JSONResponse:
    if verdict not in ("accept", "reject"):
        raise HTTPException(404, {"message": f"no verdict {verdict!r}", "hint": "accept|reject"})
    state = _state(request)
    found = await _run(state, _decide, state, suggestion_id, verdict == "accept")
    return JSONResponse(found, status_code=200 if found["status"] != "waiting" else 409)


def _forget(state: WebState, path: str) -> dict[str, Any]:
    service = _memory(state)
    gone = service.forget(path)
    # What a secret's forget took out of what was sent (None: it held none).
    return {"forgot": gone.path.rel, "scrubbed": service.scrub_line(gone.path.rel)}


@router.delete("/memory/entries/{path:path}")
async def forget(request: Request, path: str) -> JSONResponse:
    state = _state(request)
    return JSONResponse(await _run(state, _forget, state, path))


# ---- uploads ----------------------------------------------------------------------------------


_NAME = re.compile(r"[^A-Za-z0-9._ -]+")


@router.post("/uploads")
async def upload(request: Request, name: str = "file") -> JSONResponse:
    """One file as the raw request body (its type in Content-Type, its name in `?name=`),
    kept under HERON_HOME/uploads until a message takes it. Over `[attachments] max_file_mb`
    (20 MB by default) it is refused, with the error heron/attachments.py gives."""
    state = _state(request)
    caps = state.settings.config.attachments
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > caps.max_file:
        raise HTTPException(413, _too_big(name, int(declared), caps))
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > caps.max_file:
            raise HTTPException(413, _too_big(name, len(data), caps))
    mime = (request.headers.get("content-type") or "application/octet-stream").split(";")[0]
    found = Upload(secrets.token_hex(12), _NAME.sub("_", name)[:120] or "file", mime, len(data))
    await asyncio.to_thread(save, state.settings.paths.home, found, bytes(data))
    return JSONResponse(asdict(found), status_code=201)


def _too_big(name: str, size: int, caps: AttachmentCaps) -> dict[str, str]:
    return _detail(too_big(name, size, caps))


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        body = {}
    return body if isinstance(body, dict) else {}
