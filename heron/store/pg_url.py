"""What a PostgreSQL store URL says about its own safety: its password masked for a message
(`redact`), and whether the agent's commands could reach the server it names
(`loopback_ports`, `has_password`: docs/security.md, "The store").

Few imports: the sandbox reads these at every engine start.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Mapping

MASK = "***"
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)
# A URL's query: `?` then key=value pairs to the end. A password may hold a raw `?` (and `/`
# and `@`: generated ones often do, and libpq then misreads the URL), so the query starts at
# the first `?` that such a tail follows, and the user info ends at the last `@` before it.
_QUERY_TAIL = re.compile(r"\?(?:[A-Za-z_]\w*=[^&]*(?:&[A-Za-z_]\w*=[^&]*)*)?")
_PIECE_ENDS = re.compile(r"[/@?:#&=]")
DEFAULT_PORT = 5432


def split_query(url: str) -> tuple[str, str]:
    """The URL before its query, and the query (without its `?`; empty when it has none)."""
    start = url.find("?")
    while start != -1:
        if _QUERY_TAIL.fullmatch(url, start):
            return url[:start], url[start + 1 :]
        start = url.find("?", start + 1)
    return url, ""


def _password_span(url: str) -> tuple[int, int] | None:
    """Where the password of the user info lies in `url` (`://user:PASSWORD@`), if it has one."""
    head = split_query(url)[0]
    begin = head.find("://")
    if begin < 0:
        return None
    at = head.rfind("@", begin + 3)
    colon = head.find(":", begin + 3, at) if at >= 0 else -1
    return None if colon < 0 else (colon + 1, at)


def redact(url: str) -> str:
    """The URL without its password, wherever the URL carries one (the user info, or a
    `password=` parameter), fit for an error message or a log."""
    span = _password_span(url)
    if span is not None:
        url = url[: span[0]] + MASK + url[span[1] :]
    return _QUERY_PASSWORD.sub(rf"\1{MASK}", url)


UNENCODED_HINT = (
    " Its password holds a raw `/`, `@` or `?`, which ends it early: percent-encode them "
    "(%2F, %40, %3F), or give the password in PGPASSWORD."
)


def needs_encoding(url: str) -> bool:
    """Whether the URL's password holds a character libpq reads as the end of the user info."""
    span = _password_span(url)
    return span is not None and any(c in url[span[0] : span[1]] for c in "/@?")


def redact_message(message: str, url: str) -> str:
    """A driver's message about `url` without its password or any piece of it: libpq reads a
    password with a raw `/`, `@` or `?` as a host or a port, and names that in its message."""
    span = _password_span(url)
    secrets = [url[span[0] : span[1]]] if span else []
    secrets += [m[0].split("=", 1)[1] for m in _QUERY_PASSWORD.finditer(url)]
    pieces = {p for s in secrets for p in (s, *_PIECE_ENDS.split(s)) if len(p) >= 4}
    for piece in sorted(pieces, key=len, reverse=True):
        message = message.replace(piece, MASK)
    return message


def _params(url: str, env: Mapping[str, str]) -> dict[str, str]:
    """The connection parameters libpq would use (the URL's, else its PG* variables); empty
    for a URL psycopg cannot read (its connect says why)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        found = {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}
    except Exception:  # psycopg.ProgrammingError, and whatever a malformed URL raises
        return {}
    for key, variable in (("host", "PGHOST"), ("port", "PGPORT"), ("password", "PGPASSWORD")):
        if key not in found and env.get(variable):
            found[key] = env[variable]
    return found


def is_loopback_host(host: str) -> bool:
    """Whether `host` is this machine: a 127.x, ::1, unspecified (0.0.0.0, ::) or IPv4-mapped
    such address, or a name every address of which is one (`localhost`, Debian's 127.0.1.1
    host name). A Unix socket folder is not a TCP host (`is_socket_host`); a name that does
    not resolve is not loopback."""
    if not host or is_socket_host(host):
        return False
    try:
        return _is_this_machine(host.strip("[]"))
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    return bool(found) and all(_is_this_machine(str(a[4][0])) for a in found)


def _is_this_machine(address: str) -> bool:
    """ValueError when `address` is no IP address."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return _is_this_machine(str(ip.ipv4_mapped))
    return ip.is_loopback or ip.is_unspecified


def is_socket_host(host: str) -> bool:
    """A Unix socket: a folder, an abstract name (`@...`), or no host at all (libpq's default,
    its socket folder)."""
    return not host or host.startswith(("/", "@"))


def loopback_ports(url: str, env: Mapping[str, str], *, sockets: bool = True) -> tuple[int, ...]:
    """The TCP ports the URL's server listens on at this machine's loopback (several hosts
    may be named, each with its port); none when it names another machine. With `sockets`,
    the port of a Unix socket the URL names too: a server reached over its socket usually
    listens on loopback TCP at the same port (Debian's default does)."""
    params = _params(url, env)
    hosts = (params.get("hostaddr") or params.get("host") or "").split(",")
    ports = (params.get("port") or "").split(",")
    found = set()
    for index, host in enumerate(hosts):
        port = ports[index] if index < len(ports) else ports[-1]
        if (sockets and is_socket_host(host.strip())) or is_loopback_host(host.strip()):
            found.add(int(port) if port.strip().isdigit() else DEFAULT_PORT)
    return tuple(sorted(found))


def has_password(url: str, env: Mapping[str, str]) -> bool:
    """Whether a password goes with the URL (in it, or in PGPASSWORD); a ~/.pgpass is not
    counted: the agent's commands can read the home folder it sits in."""
    return bool(_params(url, env).get("password"))
