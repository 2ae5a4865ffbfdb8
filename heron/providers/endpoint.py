"""Where an adapter sends its requests, as the person reads it, and the failures that are about
that place rather than the model.

A server that is not there, a URL without a scheme, https:// to a plain-HTTP server, a path
with no API under it (a base URL missing its /v1): each adapter maps these here, so that both
wires say the same thing. The error names the URL (credentials, query and fragment dropped: a
key never shows) and the setting that named it (HERON_BASE_URL, config.toml), says what to do,
and is retried only when waiting can help: a refused connection can (a server restarting), a
wrong URL cannot.
"""

from __future__ import annotations

import json
import re
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from heron.errors import FatalProviderError, ProviderError, TransientProviderError


def shown_url(url: str) -> str:
    """The URL without user:password, query or fragment (where a key could ride)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return url.split("?", 1)[0].split("#", 1)[0]
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address
    netloc = f"{host}:{port}" if port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


@dataclass(frozen=True)
class Endpoint:
    """A base URL and the setting that named it (None: the provider's own public API)."""

    url: str
    source: str | None = None

    @staticmethod
    def of(url: object, source: str | None) -> Endpoint:
        return Endpoint(shown_url(str(url)).rstrip("/"), source)

    @property
    def named(self) -> str:
        return f"{self.url} ({self.source})" if self.source else self.url

    def fix(self) -> str:
        """The next step about the setting, as the end of a sentence."""
        return f"check {self.source}" if self.source else "check the network connection"


def connection_error(error: BaseException, endpoint: Endpoint) -> ProviderError:
    """A request that never got an HTTP answer, as a Heron error: fatal when the URL itself is
    wrong, transient (retried) when the server may yet answer."""
    causes = list(_causes(error))
    tls = next((c for c in causes if isinstance(c, ssl.SSLError)), None)
    if tls is not None:
        return _tls_error(tls, endpoint)
    bad_url = next((c for c in causes if type(c).__name__ in _URL_ERRORS), None)
    if bad_url is not None:
        return FatalProviderError(
            f"cannot send a request to {endpoint.named}: {bad_url}",
            hint=f"The URL is not one a request can go to: {endpoint.fix()}.",
        )
    if any(isinstance(c, ConnectionRefusedError) for c in causes):
        return TransientProviderError(
            f"cannot connect to {endpoint.named}: connection refused",
            hint=f"Is the model server running? Start it, or {endpoint.fix()}.",
        )
    unknown = next((c for c in causes if isinstance(c, socket.gaierror)), None)
    if unknown is not None:
        return TransientProviderError(
            f"cannot find the host of {endpoint.named}: {unknown.strerror or unknown}",
            hint=_lookup_hint(endpoint),
        )
    if any(isinstance(c, TimeoutError) or "Timeout" in type(c).__name__ for c in causes):
        return TransientProviderError(
            f"connecting to {endpoint.named} timed out",
            hint=f"The server may be busy or unreachable: try again, or {endpoint.fix()}.",
        )
    detail = next((str(c) for c in reversed(causes) if str(c)), type(error).__name__)
    return TransientProviderError(
        f"cannot connect to {endpoint.named}: {detail}",
        hint=f"Is the model server running and reachable? Start it, or {endpoint.fix()}.",
    )


def _lookup_hint(endpoint: Endpoint) -> str:
    """A host name that could not be looked up: the setting that named it may be mistyped;
    a provider's own API (no setting) is a name that exists, so the network is to check."""
    if endpoint.source:
        return f"Check the host name in {endpoint.source} and the network connection."
    return "Check the network connection: the host's name could not be looked up."


def cut_mid_reply(error: BaseException, endpoint: Endpoint) -> TransientProviderError:
    """A connection that answered, then broke while the reply streamed (a proxy dropping a
    long stream, a server restarting): retried; not a server that cannot be reached."""
    detail = next((str(c) for c in reversed(list(_causes(error))) if str(c)), "")
    return TransientProviderError(
        f"the connection to {endpoint.named} was cut mid-reply" + (f": {detail}" if detail else ""),
        hint="The server or a proxy on the way dropped the stream: try again; if it keeps "
        "happening, check the proxy's or the server's timeouts for long streams.",
    )


def server_failed_hint(status: int, endpoint: Endpoint) -> str:
    """What to do about an HTTP 5xx that outlived its retries (the error names the URL)."""
    where = f", or check {endpoint.source}" if endpoint.source else ""
    return (
        f"The model server failed (HTTP {status}); it may be overloaded or restarting: try "
        f"again in a while{where}."
    )


def rate_limited_hint(endpoint: Endpoint) -> str:
    """What to do about a rate limit (HTTP 429) that outlived its retries (the error names the
    URL; Anthropic's says its own API)."""
    where = f" ({endpoint.source})" if endpoint.source else ""
    return (
        f"The server{where} is rate limiting these requests: wait a minute and try again; if "
        "it keeps happening, check the account's limits or send fewer requests at once."
    )


# httpx's (and the SDKs' vendored httpx2's) errors for a URL no request can be sent to.
_URL_ERRORS = frozenset({"UnsupportedProtocol", "InvalidURL"})


def _tls_error(error: ssl.SSLError, endpoint: Endpoint) -> ProviderError:
    text = str(error)
    if "WRONG_VERSION_NUMBER" in text or "record layer failure" in text:
        how = "the server answers in plain HTTP: write http:// instead of https://"
    elif isinstance(error, ssl.SSLCertVerificationError):
        how = "its certificate is not trusted here: check the host name and the certificate"
    else:
        how = "the TLS handshake failed"
    return FatalProviderError(
        f"cannot talk TLS with {endpoint.named}: {getattr(error, 'reason', None) or text}",
        hint=f"Retrying would not help: {how} ({endpoint.fix()}).",
    )


def _causes(error: BaseException) -> Iterator[BaseException]:
    """The error, what caused it, and every member of an exception group on the way (anyio
    reports a failed connection as a group of the attempts' errors)."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        for nxt in (current.__cause__, current.__context__):
            if nxt is not None:
                todo.append(nxt)


def no_api_there(
    status: int,
    method: str,
    url: object,
    said: object,
    body: str | None,
    endpoint: Endpoint,
    advice: str,
) -> FatalProviderError:
    """An HTTP answer that says the URL has no such API (a 404 that is not about the model, a
    405 or 501): the base URL is wrong, and retrying cannot mend it. `said` is the server's
    message, `advice` the wire's word on what its base URL looks like."""
    said = " ".join(_TAG.sub(" ", str(said or "")).split())[:160]  # an HTML page's text
    what = f"HTTP {status} from {method} {shown_url(str(url))}" + (f": {said}" if said else "")
    return FatalProviderError(
        what,
        status=status,
        body=body,
        hint=f"The URL looks wrong: no model API answers at {endpoint.named}. {advice}",
    )


_TAG = re.compile(r"<[^>]*>")


def not_the_api(
    endpoint: Endpoint, what: str, content_type: str, expected: str, advice: str
) -> ProviderError:
    """A 200 whose body is not what the API sends (an HTML page, JSON of another shape): the
    base URL names a web page, a proxy or another service. Retrying cannot mend it, so it
    fails at once, saying which setting to check (`what` names the request, and the address
    when its caller's words do not; `advice` is the wire's word on its base URL)."""
    kind = content_type.split(";")[0].strip() or "no content type"
    return FatalProviderError(
        f"{what} answered with {kind}, not {expected}",
        hint=f"It does not look like the model API: {advice}",
    )


def model_ids(text: str, content_type: str, endpoint: Endpoint, advice: str) -> list[str]:
    """The ids of a GET /models answer (`{"data": [{"id": ...}, ...]}`, both wires), read here
    rather than by the SDKs, which raised a bare AttributeError or TypeError (a traceback) on
    an HTML page or JSON of another shape."""
    try:
        data = json.loads(text).get("data")
        ids = [m["id"] for m in data]
    except (ValueError, AttributeError, TypeError, KeyError):
        ids = None
    if ids is None or not all(isinstance(i, str) for i in ids):
        # `heron models` names the address before this (heron/channels/info.py).
        raise not_the_api(endpoint, "its GET /models", content_type, "a list of models", advice)
    return sorted(ids)


def is_a_stream(content_type: str, endpoint: Endpoint, path: str, advice: str) -> None:
    """A 200 to a streamed POST that is no event stream (an HTML page, a JSON object) fails at
    once: the SDK finds no events in it, and the run retried five times and then said the
    stream ended early, naming neither the address nor the setting. No content type at all
    is let through (a server may omit it)."""
    if content_type and "event-stream" not in content_type:
        what = f"POST {path} at {endpoint.named}"
        raise not_the_api(endpoint, what, content_type, "an event stream", advice)


def with_v1(endpoint: Endpoint) -> str:
    """The OpenAI wire's advice: its base URL ends in /v1 (ollama, vLLM, llama.cpp, OpenAI)."""
    setting = endpoint.source or "the base URL"
    if urlsplit(endpoint.url).path.endswith("/v1"):
        return f"Check {setting}: it is the address the server's /chat/completions is under."
    return (
        "An OpenAI-compatible server's base URL usually ends in /v1: "
        f"try {endpoint.url}/v1 in {setting}."
    )
