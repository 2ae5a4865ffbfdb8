"""network = "none" and "loopback" reach no service of the host over a Unix socket (the seccomp
filter of heron/tools/seccomp.py), through `bash` and `run_cell`; what commands ordinarily do
with sockets (socketpair, asyncio, subprocesses, git, the kernel itself) still works."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import struct
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sandbox_helpers import call_tool, seed_home, settings

from heron.agent.engine import Engine
from heron.messages import Reply, Text, ToolCall, ToolResult
from heron.providers.scripted import ScriptedProvider
from heron.tools import seccomp

bwrap_needed = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is needed")

# Tried from inside the sandbox, by bash (through python -c) and by run_cell alike: a stream
# connection (a D-Bus, docker.sock, PostgreSQL), a datagram (journald, syslog), and a datagram
# through a socketpair, which can sendto() any path without socket().
ATTEMPTS = """\
import os, socket
print("VISIBLE" if os.path.exists({stream!r}) else "HIDDEN")
def stream():
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect({stream!r})
    s.sendall(b"stream-hello")
    s.recv(100)
def dgram():
    socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"dgram-hello", {dgram!r})
def paired():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b"pair-hello", {dgram!r})
for label, attempt in (("stream", stream), ("dgram", dgram), ("pair", paired)):
    try:
        attempt()
        print(label, "REACHED")
    except OSError as e:
        print(label, "refused:", e.strerror)
"""


@contextmanager
def host_services() -> Iterator[tuple[dict[str, str], list[bytes]]]:
    """A stream and a datagram Unix socket server of the host, mode 0600 as a person's bus is,
    in a folder the sandbox sees: under /var/tmp, since the sandbox's /tmp (where pytest's
    tmp_path lies) is private. Yields their paths and what they received."""
    folder = Path(tempfile.mkdtemp(prefix="heron-sock-", dir="/var/tmp"))
    paths = {"stream": str(folder / "bus.sock"), "dgram": str(folder / "log.sock")}
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(paths["stream"])
    listening.listen()
    datagrams = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    datagrams.bind(paths["dgram"])
    for path in paths.values():
        os.chmod(path, 0o600)
    received: list[bytes] = []
    stop = threading.Event()

    def serve(server: socket.socket) -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                if server.type == socket.SOCK_DGRAM:
                    received.append(server.recv(100))
                    continue
                conn, _ = server.accept()
            except OSError:
                continue
            with conn, contextlib.suppress(OSError):
                conn.settimeout(5)
                received.append(conn.recv(100))
                conn.sendall(b"served\n")

    threads = [
        threading.Thread(target=serve, args=(s,), daemon=True) for s in (listening, datagrams)
    ]
    for thread in threads:
        thread.start()
    try:
        yield paths, received
    finally:
        stop.set()
        for thread in threads:
            thread.join(2)
        listening.close()
        datagrams.close()
        shutil.rmtree(folder, ignore_errors=True)


def attempts_call(tool: str, paths: dict[str, str]) -> dict[str, str]:
    code = ATTEMPTS.format(**paths)
    if tool == "run_cell":
        return {"code": code}
    return {"command": f"{sys.executable} - <<'EOF'\n{code}EOF"}


@bwrap_needed
@pytest.mark.parametrize(
    ("tool", "network"),
    [("bash", "none"), ("bash", "loopback"), ("run_cell", "none"), ("bash", "all")],
)
async def test_no_host_unix_socket_is_reachable_without_the_network(
    tool: str, network: str, heron_home: Path
) -> None:
    """The host's sockets are in view (the file system is bound read-only), yet with "none" or
    "loopback" neither a connection nor a datagram reaches them; "all" shares the host's
    network and does reach them (so this test can fail)."""
    if network == "loopback" and shutil.which("pasta") is None:
        pytest.skip("pasta (Debian passt) is not installed")
    seed_home(heron_home, f'network = "{network}"')
    with host_services() as (paths, received):
        result = await call_tool(tool, attempts_call(tool, paths))
    out = result.content
    assert "VISIBLE" in out, out  # in view: the filter, not the file system, is what stops it
    if network == "all":
        assert "stream REACHED" in out and b"stream-hello" in received
        return
    assert received == [], out
    for label in ("stream", "dgram", "pair"):
        assert f"{label} refused: Permission denied" in out, out


@bwrap_needed
async def test_ordinary_socket_work_still_runs_in_the_sandbox(heron_home: Path) -> None:
    """What the filter leaves: socketpair (asyncio's self-pipe, its subprocesses),
    multiprocessing's pool, TCP on the command's own loopback, git in the workspace; and the
    kernel, started on sockets Heron made for it, runs cells that do the same."""
    seed_home(heron_home)
    work = (
        "import asyncio, multiprocessing, socket\n"
        "a, b = socket.socketpair(); a.sendall(b'x'); assert b.recv(1) == b'x'\n"
        "async def echo():\n"
        "    p = await asyncio.create_subprocess_exec('echo', 'sub', stdout=-1)\n"
        "    return (await p.communicate())[0]\n"
        "assert asyncio.run(echo()) == b'sub\\n'\n"
        "with multiprocessing.Pool(2) as pool: assert pool.map(abs, [-1, -2]) == [1, 2]\n"
        "t = socket.socket(); t.bind(('127.0.0.1', 0)); t.listen()\n"
        "socket.create_connection(t.getsockname(), 5).close()\n"
        "print('PYTHON-OK')\n"
    )
    git = (
        "git init -q repo && cd repo && echo hi > f && git add f && "
        "git -c user.name=t -c user.email=t@example.com commit -qm first && "
        "echo GIT-COMMITS $(git rev-list --count HEAD)"
    )
    command = f"{git}\n{sys.executable} - <<'EOF'\n{work}EOF"
    result = await call_tool("bash", {"command": command})
    assert "GIT-COMMITS 1" in result.content and "PYTHON-OK" in result.content, result.content
    cell = work.replace("assert asyncio.run(echo())", "assert await echo()")
    result = await call_tool("run_cell", {"code": cell})
    assert "PYTHON-OK" in result.content, result.content


# A classic BPF interpreter for the filter's few instructions, so both architectures' programs
# are checked here whatever this machine is (the tests above run this machine's for real).
def run_filter(code: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    insns = [struct.unpack("=HBBI", code[i : i + 8]) for i in range(0, len(code), 8)]
    acc, pc = 0, 0
    while True:
        op, jt, jf, k = insns[pc]
        if op == seccomp.LD_W_ABS:
            acc = struct.unpack_from("<I", data, k)[0]
        elif op == seccomp.AND_K:
            acc &= k
        elif op == seccomp.JEQ_K:
            pc += jt if acc == k else jf
        elif op == seccomp.RET_K:
            return k
        else:
            raise AssertionError(f"unexpected instruction {op:#x}")
        pc += 1


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_filter_refuses_unix_sockets_on_every_table(machine: str) -> None:
    import errno

    code = seccomp.program(machine)
    assert code is not None
    eacces, eperm = seccomp.RET_ERRNO | errno.EACCES, seccomp.RET_ERRNO | errno.EPERM
    stream, dgram = socket.SOCK_STREAM, socket.SOCK_DGRAM
    for abi in seccomp.ABIS[machine]:
        numbers = [0] + ([seccomp.X32_BIT] if abi.x32 else [])
        for bit in numbers:

            def verdict(nr: int, *args: int, bit: int = bit, abi: seccomp.Abi = abi) -> int:
                return run_filter(code, nr | bit, abi.arch, args)

            cloexec = stream | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
            assert verdict(abi.socket, socket.AF_UNIX, stream) == eacces
            assert verdict(abi.socket, socket.AF_UNIX | 0x100000000, stream) == eacces
            assert verdict(abi.socket, socket.AF_INET, stream) == seccomp.RET_ALLOW
            assert verdict(abi.socket, socket.AF_INET6, dgram) == seccomp.RET_ALLOW
            assert verdict(abi.socketpair, socket.AF_UNIX, cloexec) == seccomp.RET_ALLOW
            assert verdict(abi.socketpair, socket.AF_UNIX, dgram | socket.SOCK_CLOEXEC) == eacces
            assert verdict(abi.io_uring_setup, 8, 0) == eperm
            assert verdict(abi.socket + 1000) == seccomp.RET_ALLOW  # anything else runs
            if abi.socketcall is not None:  # i386: the multiplexer hides the family
                assert verdict(abi.socketcall, seccomp.SYS_SOCKET) == eacces
                assert verdict(abi.socketcall, seccomp.SYS_SOCKETPAIR) == eacces
                assert verdict(abi.socketcall, 3) == seccomp.RET_ALLOW  # connect on what exists
    assert run_filter(code, 41, 0xDEADBEEF) == seccomp.RET_KILL_PROCESS  # no such table here


def test_another_machine_says_its_unix_sockets_are_reachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a machine Heron has no filter for, commands still run in bwrap, and the start notice
    and the tools' description say the host's Unix sockets stay reachable; a filtered sandbox
    builds no command line without the filter's fd."""
    from heron.tools.sandbox import Sandbox

    home = tmp_path / "home"
    sandbox = Sandbox(tmp_path, home, "none", "/usr/bin/bwrap")
    if seccomp.supported():
        with pytest.raises(ValueError, match="seccomp"):
            sandbox.wrap(["true"])
        with sandbox.seccomp() as fd:
            assert fd is not None and stat.S_ISFIFO(os.fstat(fd).st_mode)
            argv = sandbox.wrap(["true"], seccomp=fd)
        assert argv[argv.index("--seccomp") + 1] == str(fd)
        assert sandbox.notice("allow") is None and "cannot open Unix sockets" in sandbox.describe()
    monkeypatch.setattr(seccomp.platform, "machine", lambda: "riscv64")
    assert seccomp.program() is None and sandbox.confined and not sandbox.filtered
    notice = sandbox.notice("allow") or ""
    assert "riscv64" in notice and "Unix sockets" in notice
    assert "can connect to the machine's Unix sockets" in sandbox.describe()
    assert "--seccomp" not in sandbox.wrap(["true"])
    shared = Sandbox(tmp_path, home, "all", "/usr/bin/bwrap")
    assert shared.notice("allow") is None and "--seccomp" not in shared.wrap(["true"])


@bwrap_needed
def test_a_kernel_without_seccomp_filters_is_no_sandbox(tmp_path: Path) -> None:
    """The probe loads the filter as every command does: a bwrap that cannot (here a wrapper
    failing as bwrap does where the kernel has no seccomp filters) leaves commands unconfined,
    behind approval, rather than every command failing; the real bwrap loads it."""
    from heron.tools.sandbox import probe

    real = shutil.which("bwrap")
    wrapper = tmp_path / "bwrap"
    wrapper.write_text(
        '#!/bin/sh\ncase " $* " in *" --seccomp "*)\n'
        "  echo 'bwrap: prctl(PR_SET_SECCOMP): Invalid argument' >&2; exit 1;;\nesac\n"
        f'exec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    found = probe(str(wrapper))
    if seccomp.supported():
        assert not found.ok and "PR_SET_SECCOMP" in (found.problem or "")
    assert probe(real).ok


# A cell that swaps the kernel's socket paths for links to a host socket, then drops its ends
# of Heron's connections to them, so Heron's client (ZeroMQ reconnects by path) reconnects.
SWAP = """\
import glob, os, socket, time
folder = glob.glob("/tmp/heron-kernel-*")[0]
names = {{"k-3", "k-4", "k-5"}}
for name in sorted(names):
    try:
        os.unlink(f"{{folder}}/{{name}}")
        os.symlink({target!r}, f"{{folder}}/{{name}}")
        print(name, "SWAPPED")
    except OSError as e:
        print(name, "kept:", e.strerror)
for fd in os.listdir("/proc/self/fd"):
    try:
        s = socket.socket(fileno=int(fd))
    except OSError:
        continue
    try:
        accepted = s.family == socket.AF_UNIX and not s.getsockopt(
            socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        if accepted and os.path.basename(s.getsockname() or "") in names:
            s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        s.detach()
time.sleep(3)
"""


@bwrap_needed
async def test_the_kernel_cannot_steer_herons_own_connections(heron_home: Path) -> None:
    """The kernel's socket folder is Heron's: a cell can neither replace a socket path there
    with a link to a host socket nor make Heron's client, which reconnects by path, connect to
    one; the kernel goes on answering after the attempt."""
    seed_home(heron_home)
    with host_services() as (paths, received):
        provider = ScriptedProvider(
            [
                Reply(
                    [ToolCall("c1", "run_cell", {"code": SWAP.format(target=paths["stream"])})],
                    "tool",
                ),
                Reply([ToolCall("c2", "run_cell", {"code": "print('STILL', 6 * 7)"})], "tool"),
                Reply([Text("done")], "done"),
            ]
        )
        async with Engine.open(settings(True), provider=provider) as engine:
            await engine.turn("attack", "go")
    swap, after = (
        next(p for p in request.messages[-1].parts if isinstance(p, ToolResult))
        for request in provider.requests[1:]
    )
    assert received == [], swap.content
    assert "SWAPPED" not in swap.content, swap.content
    assert "STILL 42" in after.content, after.content
