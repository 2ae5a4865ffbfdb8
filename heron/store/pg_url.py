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
# user:password@ right after the scheme, the user possibly empty (`postgresql://:pw@host`). A
# password cannot hold a raw `@` or `/` (libpq's parser would end the user info there).
_USERINFO_PASSWORD = re.compile(r"(://[^:@/]*):[^@/]*@")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)
DEFAULT_PORT = 5432


def redact(url: str) -> str:
    """The URL without its password, wherever the URL carries one (the user info, or a
    `password=` parameter), fit for an error message or a log."""
    return _QUERY_PASSWORD.sub(rf"\1{MASK}", _USERINFO_PASSWORD.sub(rf"\1:{MASK}@", url))


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
    """Whether `host` is this machine's loopback: a 127.x or ::1 address, or a name every
    address of which is one (`localhost`, Debian's 127.0.1.1 host name). A Unix socket folder
    (`/run/postgresql`) is no TCP host; a name that does not resolve is not loopback."""
    if not host or host.startswith("/") or host.startswith("@"):
        return False
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    return bool(found) and all(ipaddress.ip_address(a[4][0]).is_loopback for a in found)


def loopback_ports(url: str, env: Mapping[str, str]) -> tuple[int, ...]:
    """The TCP ports the URL's server listens on at this machine's loopback (several hosts
    may be named, each with its port); none when it names another machine or a Unix socket."""
    params = _params(url, env)
    hosts = (params.get("hostaddr") or params.get("host") or "").split(",")
    ports = (params.get("port") or "").split(",")
    found = set()
    for index, host in enumerate(hosts):
        port = ports[index] if index < len(ports) else ports[-1]
        if is_loopback_host(host.strip()):
            found.add(int(port) if port.strip().isdigit() else DEFAULT_PORT)
    return tuple(sorted(found))


def has_password(url: str, env: Mapping[str, str]) -> bool:
    """Whether a password goes with the URL (in it, or in PGPASSWORD); a ~/.pgpass is not
    counted: the agent's commands can read the home folder it sits in."""
    return bool(_params(url, env).get("password"))
