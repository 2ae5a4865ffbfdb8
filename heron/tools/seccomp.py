"""The seccomp filter that keeps a sandboxed command away from the machine's Unix sockets.

bwrap's `--ro-bind / /` leaves every socket file of the host in view, and connecting to a
socket needs no write access to its file system: with only a network namespace, a command with
`network = "none"` could still talk to the person's D-Bus and systemd (`systemd-run --user`
runs anything unconfined), to docker.sock, to PostgreSQL over its socket with peer auth, each
of which sees the person's uid. Sockets live anywhere (a home folder, /run, /var/tmp), so no
list of paths to hide closes that; the filter closes it at the only door: a command cannot make
a Unix socket that could be connected anywhere.

What it refuses, with EACCES ("Permission denied", so a program says why):
- `socket(AF_UNIX, ...)`: the only way to get a socket that can `connect()` to a path;
- `socketpair(AF_UNIX, SOCK_DGRAM, ...)`: a datagram socket can `sendto()` any path even when
  paired; stream and seqpacket pairs (asyncio's and multiprocessing's self-pipes, a child's
  stdio) stay, since a connected stream socket cannot connect again (EISCONN);
- `io_uring_setup`: io_uring makes sockets without the `socket` system call (EPERM; programs
  fall back to ordinary system calls, as under Docker's default profile).

The program is classic BPF, assembled here with struct (no libseccomp binding), for the two
architectures Heron knows: x86_64 (with its 32-bit i386 and x32 calls: a 32-bit program's
`socketcall` cannot show its family, so creating any socket through it is refused) and aarch64
(with its 32-bit arm calls). On another machine `program()` is None, and the sandbox says at
start and in the tools' descriptions that commands can reach the machine's Unix sockets
(heron/tools/sandbox.py). bwrap installs it (`--seccomp FD`) just before it executes the
command; the kernel installs nothing itself (heron/tools/kernel_launch.py).
"""

from __future__ import annotations

import errno
import os
import platform
import struct
from dataclasses import dataclass

# linux/filter.h, linux/seccomp.h, linux/audit.h
LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K
RET_K = 0x06  # BPF_RET | BPF_K
RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
NR, ARCH, ARG0, ARG1 = 0, 4, 16, 24  # offsets in struct seccomp_data (little endian)
AF_UNIX = 1
SOCK_DGRAM = 2
SOCK_TYPE_MASK = 0xF  # the type without SOCK_NONBLOCK / SOCK_CLOEXEC
SYS_SOCKET, SYS_SOCKETPAIR = 1, 8  # socketcall's call numbers (i386)
X32_BIT = 0x40000000


@dataclass(frozen=True)
class Abi:
    """One system call table the filter checks: its audit arch and its call numbers."""

    arch: int
    socket: int
    socketpair: int
    io_uring_setup: int = 425  # the same number in every table since Linux 5.1
    socketcall: int | None = None  # a multiplexer that hides the family (i386)
    x32: bool = False  # x86_64: the x32 calls are the same numbers with X32_BIT set


# Per machine: the native table first, then the 32-bit one the same kernel also runs.
ABIS: dict[str, tuple[Abi, ...]] = {
    "x86_64": (
        Abi(0xC000003E, socket=41, socketpair=53, x32=True),
        Abi(0x40000003, socket=359, socketpair=360, socketcall=102),
    ),
    "aarch64": (
        Abi(0xC00000B7, socket=198, socketpair=199),
        Abi(0x40000028, socket=281, socketpair=288),
    ),
}
ABIS["amd64"] = ABIS["x86_64"]
ABIS["arm64"] = ABIS["aarch64"]


def machine() -> str:
    return platform.machine().lower()


def supported() -> bool:
    """Whether Heron can build the filter for this machine."""
    return machine() in ABIS


def program(arch: str | None = None) -> bytes | None:
    """The filter for `arch` (default: this machine) as bwrap's `--seccomp` reads it (struct
    sock_filter records, native byte order), or None for a machine Heron has no table for."""
    abis = ABIS.get((arch or machine()).lower())
    return None if abis is None else _assemble(abis)


def _assemble(abis: tuple[Abi, ...]) -> bytes:
    """Each table's checks behind a jump on the audit arch; an arch not listed is killed (it
    cannot occur on this machine, and allowing it would let its calls through unchecked)."""
    blocks = [_block(abi) for abi in abis]
    code: list[tuple[int, int, int, int]] = [(LD_W_ABS, 0, 0, ARCH)]
    # The arch dispatch: one jeq per table, each jumping over the remaining dispatch and the
    # blocks before its own.
    dispatch = len(blocks) + 1  # the jeqs, then the final kill
    for i, abi in enumerate(abis):
        skip = (dispatch - i - 1) + sum(len(b) for b in blocks[:i])
        code.append((JEQ_K, skip, 0, abi.arch))
    code.append((RET_K, 0, 0, RET_KILL_PROCESS))
    for block in blocks:
        code += block
    return b"".join(struct.pack("=HBBI", *insn) for insn in code)


def _block(abi: Abi) -> list[tuple[int, int, int, int]]:
    """The checks of one table; every jump in it is relative and lands inside it."""
    deny = RET_ERRNO | errno.EACCES
    eperm = RET_ERRNO | errno.EPERM
    allow = (RET_K, 0, 0, RET_ALLOW)
    # Each rule: (call number, the checks run when it matches, ending in a return).
    family = [(LD_W_ABS, 0, 0, ARG0), (JEQ_K, 0, 1, AF_UNIX), (RET_K, 0, 0, deny), allow]
    pair = [
        (LD_W_ABS, 0, 0, ARG0),
        (JEQ_K, 0, 4, AF_UNIX),
        (LD_W_ABS, 0, 0, ARG1),
        (AND_K, 0, 0, SOCK_TYPE_MASK),
        (JEQ_K, 0, 1, SOCK_DGRAM),
        (RET_K, 0, 0, deny),
        allow,
    ]
    rules: list[tuple[int, list[tuple[int, int, int, int]]]] = [
        (abi.socket, family),
        (abi.socketpair, pair),
        (abi.io_uring_setup, [(RET_K, 0, 0, eperm)]),
    ]
    if abi.socketcall is not None:
        call = [
            (LD_W_ABS, 0, 0, ARG0),
            (JEQ_K, 1, 0, SYS_SOCKET),
            (JEQ_K, 0, 1, SYS_SOCKETPAIR),
            (RET_K, 0, 0, deny),
            allow,
        ]
        rules.append((abi.socketcall, call))
    if abi.x32:
        rules += [(nr | X32_BIT, body) for nr, body in rules]
    code: list[tuple[int, int, int, int]] = [(LD_W_ABS, 0, 0, NR)]
    bodies_before = 0
    for i, (nr, body) in enumerate(rules):
        # From this jeq: the other jeqs after it, the final allow, then earlier bodies.
        code.append((JEQ_K, (len(rules) - i - 1) + 1 + bodies_before, 0, nr))
        bodies_before += len(body)
    code.append(allow)
    for _, body in rules:
        code += body
    return code


def pipe_with(data: bytes) -> int:
    """A pipe's read end holding `data` and then EOF, for bwrap's `--seccomp FD` (a few
    hundred bytes: far below a pipe's buffer, so the write cannot block)."""
    read, write = os.pipe()
    try:
        os.write(write, data)
    finally:
        os.close(write)
    return read
