"""The web face of `heron serve`: the FastAPI app with /ws, /login, the REST routes
(heron/serve/api.py) and the web UI's static files (heron/web/static/ at /).

Auth: bound to loopback, the app needs no token (only this machine's users reach it; the
control socket is mode 0600 for the same reason). Bound to anything else, every HTTP route and
every /ws upgrade needs the session cookie that `/login?code=ONE-TIME-CODE` sets; the code is
printed once by `heron serve` and works once. Every /ws upgrade must come from a page of this
server (its Origin names the host it was served from), so a page on another site cannot drive
the agent through the user's browser. Every response carries a Content-Security-Policy that
allows no inline script.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import PlainTextResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint

from heron.serve.api import install_errors
from heron.serve.api import router as api_router
from heron.serve.hub import Event
from heron.serve.runtime import Runtime
from heron.serve.session import Session

STATIC = Path(__file__).resolve().parent.parent / "web" / "static"
COOKIE = "heron_session"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data: blob:; connect-src 'self'"
)
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Refusals of a /ws upgrade, as close codes before accept (the client sees HTTP 403).
POLICY_VIOLATION = 1008
GOING_AWAY = 1001  # the serve shuts down


def is_loopback(host: str) -> bool:
    return host in LOOPBACK or host.startswith("127.")


@dataclass
class Auth:
    """Who may use the app: anyone on loopback; elsewhere, holders of a session cookie."""

    required: bool
    code: str | None = None  # the one-time login code; None once used
    sessions: set[str] = field(default_factory=set)

    @classmethod
    def for_host(cls, host: str, *, force: bool = False) -> Auth:
        required = force or not is_loopback(host)
        return cls(required, secrets.token_urlsafe(18) if required else None)

    def login(self, code: str) -> str | None:
        """A new session token for the right code (which then expires), else None."""
        if self.code is None or not hmac.compare_digest(code.encode(), self.code.encode()):
            return None
        self.code = None
        token = secrets.token_urlsafe(32)
        self.sessions.add(token)
        return token

    def allows(self, cookies: dict[str, str]) -> bool:
        if not self.required:
            return True
        token = cookies.get(COOKIE, "")
        return any(hmac.compare_digest(token, s) for s in self.sessions)

    def login_url(self, base: str) -> str | None:
        return f"{base}/login?code={self.code}" if self.code else None


def same_origin(origin: str | None, host: str | None) -> bool:
    """The Origin header names the host the page was served from (scheme http or https)."""
    if not origin or not host:
        return False
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


class _Guard(BaseHTTPMiddleware):
    """Security headers on every response; the session cookie on every route but /login."""

    def __init__(self, app: Any, auth: Auth) -> None:
        super().__init__(app)
        self.auth = auth

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if request.url.path != "/login" and not self.auth.allows(request.cookies):
            response: Response = PlainTextResponse(
                "Log in first: open the /login?code=... address `heron serve` printed.", 401
            )
        else:
            response = await call_next(request)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
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


def create_app(runtime: Runtime, auth: Auth | None = None) -> FastAPI:
    """The app for one runtime. Its lifespan starts the runtime (if the caller has not) and
    closes it on shutdown: running turns stopped as by /stop, their partial work kept."""
    auth = auth or Auth(required=False)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.close()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.runtime, app.state.auth = runtime, auth
    app.add_middleware(_Guard, auth=auth)
    app.include_router(api_router)
    install_errors(app)

    @app.get("/login", include_in_schema=False)
    async def login(code: str = "") -> Response:
        token = auth.login(code) if auth.required else None
        if auth.required and token is None:
            return PlainTextResponse(
                "This login code is wrong or already used. Restart `heron serve` for a new one.",
                403,
            )
        response = RedirectResponse("/", status_code=303)
        if token is not None:
            response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
        return response

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        if not same_origin(websocket.headers.get("origin"), websocket.headers.get("host")):
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
