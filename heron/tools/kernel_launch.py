"""Starts run_cell's IPython kernel on listening sockets Heron made for it.

    python kernel_launch.py -f CONNECTION_FILE [ipykernel options...]

The kernel talks to Heron over ZeroMQ's ipc transport, and ipykernel binds its five sockets
itself; but a sandboxed kernel cannot make a Unix socket (the seccomp filter,
heron/tools/seccomp.py, is in force from its first instruction, so nothing the kernel runs, a
startup file in the workspace's IPython profile included, ever can). So Heron binds the five
sockets before the start (python_kernel.bind_sockets) and the kernel inherits them listening;
here each `bind("ipc://PATH")` is handed the inherited socket bound at PATH (ZeroMQ's
`ZMQ_USE_FD`), and ipykernel runs as `ipykernel_launcher` would run it. A bind for any other
path, and any socket the kernel's code makes later, meets the filter.

Run by path with the kernel's interpreter, outside Heron's package (the kernel's environment
is the sandbox's, without PYTHONPATH): it imports nothing of Heron.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any


def inherited(paths: set[str]) -> dict[str, int]:
    """The fds this process inherited that are listening Unix sockets bound at one of `paths`."""
    found: dict[str, int] = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            continue  # not a socket (or the listing's own fd, closed by now)
        try:
            if sock.family == socket.AF_UNIX and sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_ACCEPTCONN
            ):
                where = sock.getsockname()
                if isinstance(where, str) and where in paths:
                    found[where] = fd
        except OSError:
            pass
        finally:
            sock.detach()  # the fd stays open, owned by no Python object
    return found


def endpoints(connection_file: str) -> set[str]:
    """The socket paths the connection file names (`<ip>-<port>` for the ipc transport)."""
    with open(connection_file, encoding="utf-8") as f:
        info = json.load(f)
    if info.get("transport") != "ipc":
        return set()
    ports = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
    return {f"{info['ip']}-{info[key]}" for key in ports if key in info}


def use_inherited(sockets: dict[str, int]) -> None:
    """Make every ZeroMQ bind to one of `sockets`' paths adopt the listening fd bound there.
    A connect from inside the kernel to one of them (ipykernel's debugger socket, which
    connects to the kernel's own shell socket for debug requests Heron never sends) is
    skipped: it would need a new Unix socket, and ZeroMQ would retry it every 100 ms for the
    kernel's life."""
    import zmq

    bind, connect = zmq.Socket.bind, zmq.Socket.connect
    own = set(sockets)

    def path(addr: str | bytes) -> str | None:
        if isinstance(addr, bytes):  # ipykernel passes a LAST_ENDPOINT as it came
            addr = addr.decode(errors="replace")
        return addr.removeprefix("ipc://") if addr.startswith("ipc://") else None

    def adopt(self: zmq.Socket[Any], addr: str) -> object:
        fd = sockets.pop(path(addr) or "", None)
        if fd is not None:
            self.set(zmq.USE_FD, fd)
        return bind(self, addr)

    def connect_elsewhere(self: zmq.Socket[Any], addr: str | bytes) -> object:
        return None if path(addr) in own else connect(self, addr)  # type: ignore[arg-type]

    zmq.Socket.bind = adopt  # type: ignore[method-assign,assignment]
    zmq.Socket.connect = connect_elsewhere  # type: ignore[method-assign,assignment]


def main(argv: list[str]) -> None:
    # This file's folder is Heron's tools package: its modules must not shadow the stdlib's.
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    connection_file = argv[argv.index("-f") + 1]
    use_inherited(inherited(endpoints(connection_file)))
    from ipykernel import kernelapp

    kernelapp.launch_new_instance(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
