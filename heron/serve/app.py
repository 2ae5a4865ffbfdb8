"""The web face of `heron serve`: the FastAPI app with /ws, /login, the REST routes
(heron/serve/api.py) and the web UI's static files (heron/web/static/ at /).

Auth (heron/serve/auth.py), on every bind, loopback included: every HTTP route but /login,
and every /ws upgrade, needs the session cookie `/login?code=ONE-TIME-CODE` sets (`heron
serve` prints such an address, `heron web` gets a fresh one). Loopback is no boundary: a
sandboxed command on `network = "loopback"` and a page of any site in the person's browser
both reach 127.0.0.1. Before routing, a loopback bind refuses a Host header that is not one of
its own names (DNS rebinding); a state-changing request whose Origin is another site's is
refused (cross-site request forgery, beside the cookie's SameSite=Strict); a /ws upgrade must
come from a page of this server. Every response carries a Content-Security-Policy that allows
no inline script.
"""

from __future__ import annotations

import contextlib
import html
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from fastapi.staticfiles import StaticFiles
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.types import ASGIApp, Receive, Scope, Send

from heron.serve.api import install_errors
from heron.serve.api import router as api_router
from heron.serve.auth import (
    CODE_SECONDS,
    COOKIE,
    SESSION_SECONDS,
    Auth,
    host_allowed,
    same_origin,
)
from heron.serve.hub import Event
from heron.serve.runtime import Runtime
from heron.serve.session import Session

STATIC = Path(__file__).resolve().parent.parent / "web" / "static"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data: blob:; connect-src 'self'; frame-ancestors 'none'; form-action 'none'"
)  # form-action: the UI's own forms never navigate (they send by script); none other may
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Refusals of a /ws upgrade, as close codes before accept (the client sees HTTP 403).
POLICY_VIOLATION = 1008
GOING_AWAY = 1001  # the serve shuts down
MISDIRECTED = 421  # a Host this server does not answer to
LOGIN_HINT = (
    "Run `heron web` on this machine: it prints a one-time login address "
    "(`heron web --open` opens it in your browser)."
)


def _page(title: str, text: str, status: int) -> HTMLResponse:
    """A plain page for a browser (no script, no style: the CSP holds for it too)."""
    body = (
        f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"</head><body><h1>{html.escape(title)}</h1><p>{html.escape(text)}</p></body></html>"
    )
    return HTMLResponse(body, status)


def _not_logged_in(request: Request) -> Response:
    """401 in the shape the asker reads: the API's error for /api, a page for a browser."""
    message = "not logged in to this heron serve"
    if request.url.path.startswith("/api/"):
        return JSONResponse({"detail": {"message": message, "hint": LOGIN_HINT}}, 401)
    if request.url.path == "/" or "text/html" in request.headers.get("accept", ""):
        return _page("Log in to Heron", f"This browser is not logged in. {LOGIN_HINT}", 401)
    return PlainTextResponse(f"{message}. {LOGIN_HINT}", 401)


class _HostGate:
    """Before any routing, HTTP and WebSocket alike: a Host header this server does not answer
    to is refused (a loopback bind knows its names; `allowed` None lets any through)."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str] | None) -> None:
        self.app, self.allowed = app, allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and self.allowed is not None:
            hosts = [v.decode("latin-1") for k, v in scope["headers"] if k == b"host"]
            host = hosts[0] if len(hosts) == 1 else ""  # two Host headers: neither is trusted
            if not host_allowed(host, self.allowed):
                if scope["type"] == "websocket":  # before accept: the client sees 403
                    await send({"type": "websocket.close", "code": POLICY_VIOLATION})
                    return
                refusal = PlainTextResponse(
                    f"This server does not answer to the host {host!r}. Open the address "
                    "`heron web` prints.",
                    MISDIRECTED,
                )
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _foreign(request: Request, allowed: frozenset[str] | None) -> str | None:
    """Who sent a request from another origin, as the browser says it: a foreign `Origin`
    (browsers send one with every POST, PUT, PATCH and DELETE), or a `Sec-Fetch-Site` that is
    not this origin (for a browser that left the Origin out). None for this origin's own
    pages, and for a client that says neither (curl with the cookie)."""
    origin = request.headers.get("origin")
    if origin is not None and not same_origin(origin, request.headers.get("host"), allowed):
        return origin
    site = request.headers.get("sec-fetch-site")
    if site in ("same-site", "cross-site"):
        return f"Sec-Fetch-Site: {site}"
    return None


class _Guard(BaseHTTPMiddleware):
    """Security headers on every response; another site's state-changing request refused;
    the session cookie on every route but /login."""

    def __init__(self, app: Any, auth: Auth, allowed: frozenset[str] | None) -> None:
        super().__init__(app)
        self.auth, self.allowed = auth, allowed

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response: Response
        if request.method in STATE_CHANGING and (foreign := _foreign(request, self.allowed)):
            response = JSONResponse(
                {
                    "detail": {
                        "message": f"refused: a {request.method} from another site ({foreign})",
                        "hint": "Use the web UI this serve serves, from its own address.",
                    }
                },
                403,
            )
        elif request.url.path != "/login" and not self.auth.allows(request.cookies):
            response = _not_logged_in(request)
        else:
            response = await call_next(request)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["X-Frame-Options"] = "DENY"  # no page of another site frames the UI
        return response


class _WebSocketTransport:
    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket

    async def recv(self) -> dict[str, Any] | None:
        try:
            text = await self.websocket.receive_text()
        except (WebSocketDisconnect, RuntimeError):  # RuntimeError: we closed it (shutdown)
            return None
        return _decode(text)

    async def send(self, event: Event) -> None:
        await self.websocket.send_text(json.dumps(event, ensure_ascii=False))

    async def close(self) -> None:
        await self.websocket.close(GOING_AWAY, "heron serve stopped")


def _decode(text: str) -> dict[str, Any]:
    data = json.loads(text)  # a JSONDecodeError is a ValueError: the session answers it
    if not isinstance(data, dict):
        raise ValueError("expected an object")
    return data


def create_app(
    runtime: Runtime, auth: Auth | None = None, allowed: frozenset[str] | None = None
) -> FastAPI:
    """The app for one runtime, its sessions in `auth` (memory-only when not given), answering
    the Host headers in `allowed` (None: any). Its lifespan starts the runtime (if the caller
    has not) and closes it on shutdown: running turns stopped as by /stop, their partial work
    kept."""
    auth = auth or Auth()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.close()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.runtime, app.state.auth = runtime, auth
    app.add_middleware(_Guard, auth=auth, allowed=allowed)
    app.add_middleware(_HostGate, allowed=allowed)  # added last: runs first
    app.include_router(api_router)
    install_errors(app)

    @app.get("/login", include_in_schema=False)
    async def login(request: Request, code: str = "") -> Response:
        home = RedirectResponse("/", status_code=303)
        if auth.allows(request.cookies):  # logged in already: the code is left unspent
            return home
        token = auth.login(code)
        if token is None:
            minutes = CODE_SECONDS // 60
            return _page(
                "This login code does not work",
                "The code is wrong, has expired, or was already used: a code works once, "
                f"for {minutes} minutes, and only as printed (copy the whole address). "
                f"{LOGIN_HINT}",
                403,
            )
        home.set_cookie(
            COOKIE, token, max_age=SESSION_SECONDS, httponly=True, samesite="strict", path="/"
        )
        return home

    @app.get("/api/session", include_in_schema=False)
    async def session() -> dict[str, bool]:
        """The page's probe after its socket closed: this answer means logged in (the guard
        answers 401 before this runs), so a refused /ws upgrade is told from a stopped serve."""
        return {"logged_in": True}

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        origin, host = websocket.headers.get("origin"), websocket.headers.get("host")
        if not same_origin(origin, host, allowed):
            await websocket.close(POLICY_VIOLATION)  # before accept: HTTP 403
            return
        if not auth.allows(websocket.cookies):
            await websocket.close(POLICY_VIOLATION)
            return
        await websocket.accept()
        session = Session(runtime, _WebSocketTransport(websocket), "web")
        with contextlib.suppress(WebSocketDisconnect):
            await session.run()

    if STATIC.is_dir():
        app.mount("/", StaticFiles(directory=STATIC, html=True), name="static")
    else:  # a checkout without the web UI's files: the sockets still work

        @app.get("/", include_in_schema=False)
        async def no_ui() -> Response:
            return PlainTextResponse(f"The web UI's files are missing ({STATIC}).", 404)

    return app
