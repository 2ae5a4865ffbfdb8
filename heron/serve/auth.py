"""Who may use the web face of `heron serve`: holders of a session cookie, on every bind.

A browser gets its cookie by opening a login address, `/login?code=ONE-TIME-CODE`. `heron
serve` prints one as it starts when its output is a terminal (heron/serve/main.py: a file or a
pipe may be read by a sandboxed command), and `heron web` asks the running serve for a fresh
one over the control socket (mode 0600 in HERON_HOME, which a sandboxed command cannot see):
what authenticates a login is being able to reach HERON_HOME, so neither a sandboxed command on
`network = "loopback"` nor a page of another site can get in. A code works once and for
`CODE_SECONDS`, and the start-up code no longer works once `heron web` has asked for another
(`Auth.first`): a terminal's scrollback or log (tmux, `script`) keeps a usable code only
until it is spent or expires, 2 minutes at most. A session lasts `SESSION_SECONDS` and
survives restarts of the serve, because the hashes of the session tokens (never the tokens)
are kept in `HERON_HOME/web-sessions.json`, mode 0600.

Bound to loopback, the Host header must also name this server (`allowed_hosts`), so a page
that rebinds its own name to 127.0.0.1 gets nothing even before the cookie is asked for.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

COOKIE = "heron_session"
SESSIONS_NAME = "web-sessions.json"
SESSION_SECONDS = 30 * 24 * 3600  # the cookie's Max-Age: log in once a month per browser
# A printed code left unused this long no longer works. Short, because a terminal whose output
# is logged (`script`, tmux logging) keeps the code in a file a sandboxed command can read, and
# nothing tells such a terminal apart: a browser spends its code at once, and `heron web` gives
# a fresh one any time.
CODE_SECONDS = 2 * 60
MAX_SESSIONS = 100  # past this, the oldest browsers log in again
MAX_CODES = 20  # outstanding codes; the oldest is dropped past this
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass
class Auth:
    """The one-time codes (in memory) and the sessions (their hashes, kept in `path`), each
    with the wall-clock instant it expires at. `clock` is the time (tests move it)."""

    path: Path | None = None  # None: sessions kept in memory only
    clock: Callable[[], float] = time.time
    codes: dict[str, float] = field(default_factory=dict)
    sessions: dict[str, float] = field(default_factory=dict)
    first: str | None = None  # the digest of the code printed at start, while unspent

    @classmethod
    def load(cls, home: Path, clock: Callable[[], float] = time.time) -> Auth:
        """The sessions kept in `home`; an unreadable file logs every browser out rather than
        stopping the serve."""
        path = home / SESSIONS_NAME
        auth = cls(path, clock)
        try:
            found = json.loads(path.read_text())["sessions"]
            auth.sessions = {str(k): float(v) for k, v in found.items()}
            os.chmod(path, 0o600)  # a copy put back by hand keeps its secrets to its owner
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            auth.sessions = {}
        auth._prune()
        return auth

    def new_code(self, *, first: bool = False) -> str:
        """A fresh one-time login code, good for `CODE_SECONDS`. `first`: the code the serve
        prints at start; any other (`heron web`) revokes that one, as the person who asks for a
        new code no longer needs the old, and only a copy of it elsewhere could still use it."""
        if self.first is not None:
            self.codes.pop(self.first, None)
            self.first = None
        self._prune()
        while len(self.codes) >= MAX_CODES:
            del self.codes[min(self.codes, key=self.codes.__getitem__)]
        code = secrets.token_urlsafe(18)
        self.codes[_digest(code)] = self.clock() + CODE_SECONDS
        if first:
            self.first = _digest(code)
        return code

    def login(self, code: str) -> str | None:
        """A new session token for a good code (which is then spent), else None."""
        expires = self.codes.pop(_digest(code), None) if code else None
        if expires is None or expires <= self.clock():
            return None
        token = secrets.token_urlsafe(32)
        self.sessions[_digest(token)] = self.clock() + SESSION_SECONDS
        self._prune()
        self._save()
        return token

    def allows(self, cookies: Mapping[str, str]) -> bool:
        token = cookies.get(COOKIE, "")
        if not token:
            return False
        expires = self.sessions.get(_digest(token))
        return expires is not None and expires > self.clock()

    def _prune(self) -> None:
        now = self.clock()
        self.codes = {k: v for k, v in self.codes.items() if v > now}
        live = sorted(((v, k) for k, v in self.sessions.items() if v > now), reverse=True)
        self.sessions = {k: v for v, k in live[:MAX_SESSIONS]}

    def _save(self) -> None:
        """Written whole, then renamed over the old file: mode 0600 from its creation, and no
        reader sees half a file. A few kilobytes at most, on a login: fast enough for the loop."""
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"sessions": self.sessions}, f)
        os.replace(tmp, self.path)


def login_url(base: str, code: str) -> str:
    return f"{base}/login?code={code}"


def allowed_hosts(host: str, port: int) -> frozenset[str] | None:
    """The Host headers a loopback bind answers (the loopback names with its port; without
    one on port 80), or None for any other bind, where the name people use is not known and
    the cookie alone guards."""
    if not is_loopback(host):
        return None
    names = {*LOOPBACK_NAMES, f"[{host}]" if ":" in host else host}
    allowed = {f"{name}:{port}" for name in names}
    if port == 80:
        allowed |= names
    return frozenset(allowed)


def host_allowed(header: str | None, allowed: frozenset[str] | None) -> bool:
    return allowed is None or (header or "").lower() in allowed


def same_origin(origin: str | None, host: str | None, allowed: frozenset[str] | None) -> bool:
    """The Origin header is exactly the origin of the host this server was reached by (scheme
    http or https), as a browser serialises it: lower case, no path, not even a trailing `/`
    (no browser sends another form, so only a hand-made request would); and, on loopback,
    that host is one of this server's own names."""
    if not origin or not host:
        return False
    netloc = host.lower()
    return origin in (f"http://{netloc}", f"https://{netloc}") and host_allowed(netloc, allowed)
