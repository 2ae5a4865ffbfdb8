"""Starts a sandboxed command with the host's loopback, and nothing more, reachable from it.

    python -I -S netjoin.py PASTA UID:GID [PORT,PORT...] -- BWRAP ARGS...

`[tools] network = "loopback"`: bwrap gives the command a network namespace of its own (only its
own `lo`); before the command runs, pasta (Debian `passt`) joins that namespace and forwards each
connection the command makes to 127.0.0.1:PORT to the same port on the host's loopback (`-T
auto`: the ports bound on the host). pasta configures no interface in the namespace, so there is
no route anywhere else: the internet and the LAN stay unreachable. bwrap waits on `--block-fd`
until pasta is in place, so the command never races it; pasta ends with this process.

The ports listed after UID:GID (the PostgreSQL store's, when its URL names the loopback) are
left out: pasta's own exclusions (`-T ~PORT`) forward every other port statically, 65,535
listening sockets, so instead, before pasta starts, a child joins the namespace and binds each
of them (no listen) on 0.0.0.0 and [::], and hands the sockets to this process, which holds
them until the command ends. pasta then cannot bind them there (`auto` skips a port it cannot
bind), and a connection to them is refused inside the namespace. The command cannot release
them: they belong to a process outside its pid namespace.

If pasta cannot start, the command still runs, with no network at all, and says so on stderr:
refusing would be less safe than nothing and no clearer.

Few imports, no Heron ones: it starts with -S, as heron/tools/runner.py does, for start-up time.
"""

import json
import os
import signal
import socket
import sys
from typing import Any

# -t/-u none: nothing from the host into the namespace; -U none: no UDP out; no DHCP, NDP or
# router advertisements (there is no interface for them to configure anyway).
PASTA_ARGS = ("-q", "--no-udp", "--no-icmp", "--no-dhcp", "--no-ndp", "--no-dhcpv6", "--no-ra")
PASTA_PORTS = ("-t", "none", "-u", "none", "-T", "auto", "-U", "none")
RESET_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)
PR_SET_PDEATHSIG = 1
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
HELD_FAMILIES = ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::"))


def start(argv: list[str], keep: tuple[int, ...] = (), *, tied: bool = False) -> int:
    """Fork and exec `argv` with the fds in `keep` inherited; its pid. `tied`: it gets SIGKILL
    when this process ends, however it ends (PR_SET_PDEATHSIG survives the exec)."""
    pid = os.fork()
    if pid == 0:
        if tied:
            import ctypes

            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # Python ignores SIGPIPE and SIGXFSZ; a program must start with them at their
        # defaults (pasta refuses to start otherwise, and `yes | head` relies on SIGPIPE).
        for number in RESET_SIGNALS:
            signal.signal(number, signal.SIG_DFL)
        for fd in keep:
            os.set_inheritable(fd, True)
        try:
            os.execv(argv[0], argv)
        except OSError as error:
            print(f"{argv[0]}: {error.strerror}", file=sys.stderr)
        os._exit(127)
    return pid


def read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def attach_pasta(pasta: str, runas: str, target: int) -> tuple[int | None, str | None]:
    """Start pasta on the namespaces of `target`, in the foreground as a child tied to this
    process (in the background, attached to a pid, it would outlive the namespace). It writes
    its pid file once the namespace is set up: here a pipe, so reading it waits for that.
    (pasta's pid, None) when in place, else (None, why not)."""
    ready_r, ready_w = os.pipe()
    argv = [pasta, "-f", *PASTA_ARGS, "-P", f"/dev/fd/{ready_w}", "--runas", runas]
    pid = start([*argv, *PASTA_PORTS, str(target)], keep=(ready_w,), tied=True)
    os.close(ready_w)
    written = b""
    while not written.endswith(b"\n") and (chunk := os.read(ready_r, 64)):  # pasta may keep it open
        written += chunk
    os.close(ready_r)
    if written.strip():
        return pid, None
    _, status = os.waitpid(pid, 0)
    return None, f"pasta exited with {os.waitstatus_to_exitcode(status)}"


def start_holder(ports: list[int]) -> tuple[int, socket.socket] | None:
    """A child that will bind `ports` in the command's network namespace (`hold`); started
    first, so its `import ctypes` (about 20 ms) runs while bwrap sets the sandbox up."""
    if not ports:
        return None
    mine, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the child: whatever happens, it ends here and never runs the parent's code
        code = 1
        try:
            mine.close()
            import ctypes

            target = int(theirs.recv(32) or b"0")
            if target:
                _join(ctypes.CDLL(None, use_errno=True), target)
                held = [_bound(f, address, port) for port in ports for f, address in HELD_FAMILIES]
                socket.send_fds(theirs, [b"held"], [s.fileno() for s in held if s is not None])
                code = 0
        except BaseException as error:
            theirs.sendall(f"cannot hold ports {ports}: {error}".encode())
        finally:
            os._exit(code)
    theirs.close()
    return pid, mine


def hold(
    holder: tuple[int, socket.socket] | None, target: int | None
) -> tuple[list[socket.socket], str | None]:
    """The ports bound on every address of `target`'s network namespace, listening on none:
    (the sockets, None), or ([], why not). `target` None: the holder is let go."""
    if holder is None:
        return [], None if target else "no pid"
    pid, mine = holder
    try:
        mine.sendall(str(target or 0).encode())
        said, fds, _, _ = socket.recv_fds(mine, 4096, len(HELD_FAMILIES) * 64)
    except OSError as error:  # the holder is gone (it failed before it could say why)
        said, fds = str(error).encode(), []
    finally:
        mine.close()
        os.waitpid(pid, 0)
    if not target:
        return [], "no pid"
    if said != b"held":
        return [], said.decode(errors="replace") or "the child that holds them ended"
    return [socket.socket(fileno=fd) for fd in fds], None


def _join(libc: Any, target: int) -> None:
    """Enter `target`'s user namespace (where this uid holds every capability: bwrap made it),
    then its network namespace."""
    import ctypes

    for name, kind in (("user", CLONE_NEWUSER), ("net", CLONE_NEWNET)):
        fd = os.open(f"/proc/{target}/ns/{name}", os.O_RDONLY)
        try:
            if libc.setns(fd, kind) != 0:
                number = ctypes.get_errno()
                raise OSError(number, f"setns {name}: {os.strerror(number)}")
        finally:
            os.close(fd)


def _bound(family: socket.AddressFamily, address: str, port: int) -> socket.socket | None:
    """A socket bound to `address`:`port` without SO_REUSEADDR, so pasta's bind of that port
    fails; None where the namespace has no such family (IPv6 turned off)."""
    try:
        held = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        return None
    if family == socket.AF_INET6:
        held.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    held.bind((address, port))
    return held


def main(argv: list[str]) -> int:
    split = argv.index("--")
    pasta, runas = argv[1], argv[2]
    closed = [int(p) for p in argv[3].split(",") if p] if split > 3 else []
    bwrap, *rest = argv[split + 1 :]
    holder = start_holder(closed)  # before any pipe of bwrap's is made: it inherits none
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
    command = [bwrap, "--info-fd", str(info_w), "--block-fd", str(block_r), *rest]
    child = start(command, keep=(info_w, block_r))
    os.close(info_w)
    os.close(block_r)
    try:
        target = json.loads(read_all(info_r) or b"{}").get("child-pid")
    except ValueError:
        target = None
    held, problem = hold(holder, target)
    # A port that cannot be held would be forwarded: then no loopback at all, rather than one
    # that reaches the store.
    helper, problem = attach_pasta(pasta, runas, target) if not problem else (None, problem)
    if problem:
        print(f"heron: no loopback network for this command ({problem})", file=sys.stderr)
    # Set only now: pasta will not start with a signal ignored. Heron's SIGTERM (a timeout, a
    # stop) ends this process; bwrap's --die-with-parent and pasta's death signal follow.
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(128 + signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.write(block_w, b"go")
    os.close(block_w)
    _, status = os.waitpid(child, 0)
    if helper is not None:
        os.kill(helper, signal.SIGTERM)
        os.waitpid(helper, 0)
    for sock in held:
        sock.close()
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code  # killed by a signal: the shell's convention


if __name__ == "__main__":
    sys.exit(main(sys.argv))
