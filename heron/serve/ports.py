"""Why `heron serve` cannot listen: the one-line refusal when its port is taken, naming the
process that holds it when this machine says (Linux's /proc; elsewhere the port alone).

Only a listening TCP socket holds a port against our bind, so the holder is found from the
socket's inode in /proc/net/tcp{,6} and the process whose open files include that socket.
A process of another user cannot be read, and then the message names the port only.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass
from pathlib import Path

from heron.errors import ConfigError

_LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp


@dataclass(frozen=True)
class Holder:
    """A process that listens on a port: its pid and command line."""

    pid: int
    argv: tuple[str, ...]

    @property
    def is_heron_serve(self) -> bool:
        words = [Path(a).name for a in self.argv]
        return "serve" in words and any(w.startswith("heron") for w in words)

    @property
    def home(self) -> str | None:
        """The HERON_HOME of a heron serve holder, when its environment is readable."""
        with contextlib.suppress(OSError):
            env = Path(f"/proc/{self.pid}/environ").read_bytes().split(b"\0")
            for item in env:
                if item.startswith(b"HERON_HOME="):
                    return item.partition(b"=")[2].decode(errors="replace")
        return None


def _listening_inodes(port: int, proc: Path) -> set[str]:
    found: set[str] = set()
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in (proc / "net" / name).read_text().splitlines()[1:]:
                cols = line.split()
                if (
                    len(cols) > 9
                    and cols[3] == _LISTEN
                    and int(cols[1].rsplit(":", 1)[1], 16) == port
                ):
                    found.add(cols[9])
    return found - {"0"}


def holder(port: int, proc: Path = Path("/proc")) -> Holder | None:
    """The process listening on `port`, or None when it cannot be told."""
    inodes = {f"socket:[{i}]" for i in _listening_inodes(port, proc)}
    if not inodes:
        return None
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        argv = (entry / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
                        return Holder(
                            int(entry.name), tuple(a.decode(errors="replace") for a in argv)
                        )
    return None


def bind_error(host: str, port: int, error: OSError, home: Path) -> ConfigError:
    """The refusal for a failed bind, on one line: the port, who holds it, what to do next."""
    if error.errno != errno.EADDRINUSE:
        why = error.strerror or str(error)
        return ConfigError(
            f"heron serve cannot listen on {host}:{port} ({why}); choose another --host or --port"
        )
    held = holder(port)
    other = f"start this one with --port {port + 1 if port < 65535 else 0} (or --port 0: any free)"
    if held is None:
        return ConfigError(f"port {port} on {host} is in use; {other}, or stop what listens there")
    if held.is_heron_serve:
        where = held.home
        on = "this home" if where is not None and Path(where) == home else (where or "another home")
        return ConfigError(
            f"port {port} on {host} is in use by another heron serve (pid {held.pid}, on {on}); "
            f"use that one, stop it (kill {held.pid}), or {other}"
        )
    command = " ".join(" ".join(held.argv).split())[:60] or "?"  # on one line
    return ConfigError(
        f"port {port} on {host} is in use by pid {held.pid} ({command}); "
        f"{other}, or stop pid {held.pid}"
    )
