"""Starts a sandboxed command with the host's loopback, and nothing more, reachable from it.

    python -I -S netjoin.py PASTA UID:GID -- BWRAP ARGS...

`[tools] network = "loopback"`: bwrap gives the command a network namespace of its own (only its
own `lo`); before the command runs, pasta (Debian `passt`) joins that namespace and forwards each
connection the command makes to 127.0.0.1:PORT to the same port on the host's loopback (`-T
auto`: the ports bound on the host). pasta configures no interface in the namespace, so there is
no route anywhere else: the internet and the LAN stay unreachable. bwrap waits on `--block-fd`
until pasta is in place, so the command never races it; pasta ends with this process.

If pasta cannot start, the command still runs, with no network at all, and says so on stderr:
refusing would be less safe than nothing and no clearer.

Few imports, no Heron ones: it starts with -S, as heron/tools/runner.py does, for start-up time.
"""

import json
import os
import signal
import sys

# -t/-u none: nothing from the host into the namespace; -U none: no UDP out; no DHCP, NDP or
# router advertisements (there is no interface for them to configure anyway).
PASTA_ARGS = ("-q", "--no-udp", "--no-icmp", "--no-dhcp", "--no-ndp", "--no-dhcpv6", "--no-ra")
PASTA_PORTS = ("-t", "none", "-u", "none", "-T", "auto", "-U", "none")
RESET_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)
PR_SET_PDEATHSIG = 1


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


def main(argv: list[str]) -> int:
    split = argv.index("--")
    pasta, runas = argv[1], argv[2]
    bwrap, *rest = argv[split + 1 :]
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
    helper, problem = attach_pasta(pasta, runas, target) if target else (None, "no pid")
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
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code  # killed by a signal: the shell's convention


if __name__ == "__main__":
    sys.exit(main(sys.argv))
