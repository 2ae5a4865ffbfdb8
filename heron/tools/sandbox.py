"""Where the agent's programs run: the one place that builds their command line and environment.

Every program a tool starts (`bash`, the `run_cell` kernel, any later one) goes through
`Sandbox.wrap`. Confined, that is bubblewrap (`bwrap`): the whole file system read-only, the
workspace read-write, a private /tmp, HERON_HOME covered by an empty tmpfs (the workspace bound
back inside it), and so the default home ~/.heron when HERON_HOME names another, new user,
pid, ipc, uts and cgroup namespaces, a new network namespace unless `[tools] network = "all"`,
every capability dropped, and `--die-with-parent`: when Heron dies,
bwrap and everything in its pid namespace die with it. Unless the network is "all", a seccomp
filter (heron/tools/seccomp.py, given to bwrap on a pipe: `seccomp()`, then `wrap(...,
seccomp=fd)`) keeps the command from making a Unix socket, so no socket file of the host (a
D-Bus, docker.sock, PostgreSQL's) is reachable either.

Unconfined (bwrap missing or unable to create namespaces: `probe` tries it once), the program
runs as it is, under a small runner (heron/tools/runner.py) whose argv carries `MARKER`, so the
person-only commands can find it among their ancestors (heron/tools/person.py), and which ends
whatever the command leaves behind; approval (heron/tools/approval.py) decides whether it runs
at all.

Either way the environment is built here from an allowlist (PATH, HOME pointing into the
workspace, LANG, TERM): no provider key and no HERON_ variable reaches a tool.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from heron import workspace_io
from heron.config import NetworkMode, default_home
from heron.request import WHERE_IT_RUNS
from heron.tools import seccomp as filters

# An argv element of the process that starts every tool command (bwrap's own argv when
# confined, the wrapper's when not); heron/tools/person.py looks for it up the process chain.
MARKER = "heron-tool-runner"
HOSTNAME = "heron-sandbox"
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
TOOL_HOME = Path(".heron") / "home"  # HOME of every tool command, inside the workspace
PROBE_TIMEOUT = 10.0
PROBE_CACHE = Path("run") / "sandbox-probe.json"  # under HERON_HOME

NAMESPACES = ("--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts")
# The unconfined runner (heron/tools/runner.py): it forks the command and waits, so it stays in
# the chain however the command execs, and it takes what the command leaves with it.
RUNNER = Path(__file__).with_name("runner.py")
# network = "loopback": starts bwrap and joins pasta to its network namespace (netjoin.py).
NETJOIN = Path(__file__).with_name("netjoin.py")


@dataclass(frozen=True)
class Probe:
    """Whether bwrap ran a trivial command in the namespaces Heron asks for; why not if not."""

    ok: bool
    problem: str | None = None


def find_bwrap(env: Mapping[str, str]) -> str | None:
    """HERON_BWRAP (a path; empty or "off" means none, which tests use for the unconfined
    path), else bwrap on PATH."""
    chosen = env.get("HERON_BWRAP")
    if chosen is not None:
        return None if turned_off(env) else chosen
    return shutil.which("bwrap", path=env.get("PATH") or DEFAULT_PATH)


def turned_off(env: Mapping[str, str]) -> bool:
    """Whether HERON_BWRAP turns bubblewrap off ("off" or empty), installed or not."""
    return env.get("HERON_BWRAP") in ("", "off")


def probe(bwrap: str | None) -> Probe:
    """Run /bin/true under bwrap with the same namespaces and seccomp filter as every tool
    command (a kernel without seccomp filters would fail every command otherwise)."""
    if bwrap is None:
        return Probe(False, "bubblewrap (bwrap) is not installed")
    argv = [bwrap, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", *NAMESPACES]
    argv += ["--unshare-net", "--die-with-parent"]
    code = filters.program()
    fd = None if code is None else filters.pipe_with(code)
    if fd is not None:
        argv += ["--seccomp", str(fd)]
    try:
        done = subprocess.run(
            [*argv, "--", "/bin/true"],
            capture_output=True,
            timeout=PROBE_TIMEOUT,
            check=False,
            pass_fds=() if fd is None else (fd,),
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return Probe(False, f"{bwrap} could not run: {error}")
    finally:
        if fd is not None:
            os.close(fd)
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}"
        return Probe(False, f"{bwrap} cannot create namespaces here: {said}")
    return Probe(True)


def cached_probe(bwrap: str | None, home: Path) -> Probe:
    """`probe`, remembered under HERON_HOME for this boot and this bwrap binary: trying costs
    tens of milliseconds at every start, and the answer only changes with the machine."""
    key = _probe_key(bwrap)
    path = home / PROBE_CACHE
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved.get("key") == key:
            return Probe(bool(saved["ok"]), saved.get("problem"))
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    found = probe(bwrap)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": key, "ok": found.ok, "problem": found.problem}))
    except OSError:
        pass  # a read-only home: probe again next time
    return found


def _probe_key(bwrap: str | None) -> str:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "?"
    try:
        st = os.stat(bwrap) if bwrap else None
    except OSError:
        st = None
    stamp = f"{bwrap}|{st.st_ino}|{st.st_mtime_ns}|{st.st_size}" if st else str(bwrap)
    # "seccomp": answers remembered before the probe tried the filter are tried again.
    key = f"seccomp|{boot}|{stamp}|{os.geteuid()}"
    return hashlib.sha256(key.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Sandbox:
    """How one home's tool commands run. `bwrap` None means unconfined (`problem` says why).
    Built without a probe (a bare ToolContext), it assumes bwrap works: a command then fails
    loudly rather than running unconfined."""

    workspace: Path
    home: Path | None = None  # HERON_HOME, hidden from every command
    network: NetworkMode = "none"
    bwrap: str | None = "bwrap"
    problem: str | None = None
    env_source: Mapping[str, str] = field(default_factory=dict, repr=False)
    pasta: str | None = None  # network = "loopback" forwards the host's loopback through it
    off: bool = False  # HERON_BWRAP turned bubblewrap off: nothing was tried
    # Other Heron homes hidden too when they exist (`other_homes`): the default ~/.heron when
    # HERON_HOME names another, which holds the person's main record and keys.
    also_hidden: tuple[Path, ...] = ()
    # The PostgreSQL store's ports on this machine's loopback: never forwarded into a command's
    # namespace with network = "loopback" (netjoin.py holds them there).
    closed_ports: tuple[int, ...] = ()
    open_store: bool = False  # the store is on loopback with no password (`notice` warns)

    @classmethod
    def detect(
        cls,
        workspace: Path,
        home: Path,
        network: NetworkMode,
        env: Mapping[str, str],
        store_url: str | None = None,
    ) -> Sandbox:
        """`store_url`: the PostgreSQL store's URL, if there is one (its loopback ports are
        kept from the commands)."""
        bwrap, off = find_bwrap(env), turned_off(env)
        if off:  # not a fact of the machine: never cached, and not "not installed"
            setting = env.get("HERON_BWRAP") or ""
            found = Probe(False, f"bubblewrap is turned off (HERON_BWRAP={setting})")
        else:
            found = cached_probe(bwrap, home)
        return cls(
            workspace,
            home,
            network,
            bwrap if found.ok else None,
            found.problem,
            {k: env[k] for k in ("PATH", "LANG", "TERM") if k in env},
            find_pasta(env) if network == "loopback" else None,
            off,
            other_homes(home),
            *store_reach(store_url, env),
        )

    @property
    def confined(self) -> bool:
        return self.bwrap is not None

    @property
    def filtered(self) -> bool:
        """Whether commands get the seccomp filter that refuses Unix sockets: confined, with
        a network short of "all" (which shares the host's, abstract sockets included), on a
        machine Heron has the filter for."""
        return self.confined and self.network != "all" and filters.supported()

    @property
    def sockets_open(self) -> bool:
        """Confined, with a network short of "all", yet no filter for this machine: commands
        can connect to the host's Unix sockets, and Heron says so."""
        return self.confined and self.network != "all" and not filters.supported()

    @property
    def tool_home(self) -> Path:
        return self.workspace / TOOL_HOME

    def describe(self) -> str:
        """What a command tool's description adds: the truth about where it runs."""
        if not self.confined:
            return (
                f"{WHERE_IT_RUNS}unconfined, on the user's machine with the user's rights (no "
                "sandbox is available); it may need the user's approval first, and what it "
                "starts ends with it."
            )
        net = {
            "none": "no network",
            "loopback": "no network but servers on the machine's loopback (127.0.0.1)",
            "all": "the network",
        }[self.network]
        if self.network == "loopback" and self.pasta is None:
            net = "no network"
        if self.filtered:
            net += " and cannot open Unix sockets (socketpair works)"
        elif self.sockets_open:
            net += " (yet it can connect to the machine's Unix sockets)"
        return (
            f"{WHERE_IT_RUNS}in a sandbox; only the workspace is writable, /tmp is private, "
            f"Heron's own files are hidden, it has {net}, and what it starts ends with it."
        )

    def notice(self, policy: str) -> str | None:
        """What a channel says once at start when commands cannot be confined, cannot have
        the network the configuration asks for, or could reach a store that asks no password;
        None if all is as configured."""
        said = [n for n in (self._confinement_notice(policy), self._store_notice()) if n]
        return " ".join(said) or None

    def _store_notice(self) -> str | None:
        if not self.open_store:
            return None
        return (
            "The PostgreSQL store is on this machine's loopback with no password in its URL: "
            "if the server trusts such connections (trust auth), any program that reaches the "
            "port reads and changes the whole store, and as a superuser runs programs on the "
            'server (with network = "all" or unconfined, the agent\'s commands too). Trust '
            "auth is for tests: give the role a password (in the URL or PGPASSWORD; "
            "a ~/.pgpass is readable by the agent's commands) or use peer auth over the "
            "server's Unix socket (docs/security.md#the-store)."
        )

    def _confinement_notice(self, policy: str) -> str | None:
        if self.confined:
            if self.sockets_open:
                return (
                    f"Heron has no seccomp filter for this machine ({filters.machine()}; it has "
                    "one for x86_64 and aarch64), so commands can connect to the machine's Unix "
                    "sockets (your D-Bus session, docker.sock, a database's socket) despite "
                    f'network = "{self.network}". To keep them from it, run Heron on x86_64 or '
                    "aarch64."
                )
            if self.network == "loopback" and self.pasta is None:
                return (
                    'network = "loopback" needs pasta, which is not installed, so commands have '
                    "no network at all. To let them reach servers on 127.0.0.1: sudo apt-get "
                    "install passt."
                )
            return None
        then = {
            "ask": "each command the agent runs waits for your approval",
            "allow": 'commands run without asking ([tools] approval = "allow")',
            "never": 'the agent cannot run commands ([tools] approval = "never")',
        }[policy]
        remedy = (
            "unset HERON_BWRAP (or set it to the path of bwrap)"
            if self.off
            else "install bubblewrap (Debian/Ubuntu: sudo apt-get install bubblewrap)"
        )
        return (
            f"No sandbox: {self.problem or 'bubblewrap is not available'}. Commands would run "
            f"unconfined, with your rights, so {then}. To confine them, {remedy}."
        )

    def environment(self) -> dict[str, str]:
        """The whole environment of a tool command: an allowlist, nothing inherited."""
        source = self.env_source
        return {
            "PATH": source.get("PATH") or DEFAULT_PATH,
            "HOME": str(self.tool_home),
            "LANG": source.get("LANG") or "C.UTF-8",
            "TERM": source.get("TERM") or "dumb",
        }

    def prepare(self) -> None:
        """Create the tool HOME (cheap; called before each start). Its folders are made
        without following a link the agent left there (workspace_io); a link that stands in
        their place is left alone: the command meets it inside the sandbox."""
        with (
            contextlib.suppress(workspace_io.Refused),
            workspace_io.folder(self.workspace, list(TOOL_HOME.parts), create=True),
        ):
            pass

    @contextlib.contextmanager
    def seccomp(self) -> Iterator[int | None]:
        """For one start: the fd bwrap reads the filter from (`wrap(..., seccomp=fd)`, and
        inherited by the child: `pass_fds`), closed afterwards; None when no filter applies."""
        code = filters.program() if self.filtered else None
        if code is None:
            yield None
            return
        fd = filters.pipe_with(code)
        try:
            yield fd
        finally:
            os.close(fd)

    def wrap(
        self, argv: Sequence[str], *, shown: Sequence[Path] = (), seccomp: int | None = None
    ) -> list[str]:
        """The command line that runs `argv` as a tool command; `shown` are extra folders made
        visible, read-only, at the same path (the kernel's socket folder: Heron's client
        reconnects to those paths, so the command must not be able to put a link there),
        `seccomp` the fd from
        `seccomp()`: a filtered sandbox refuses to build a command line without it, so no
        caller can start a command that reaches the host's Unix sockets by forgetting it."""
        if self.filtered and seccomp is None:
            raise ValueError("this sandbox filters Unix sockets: pass wrap() the seccomp() fd")
        env = self.environment()
        if self.bwrap is None:
            runner = [sys.executable, "-I", "-S", str(RUNNER), MARKER, str(os.getpid()), "--"]
            return [*runner, "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]
        out = [self.bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        out += ["--tmpfs", "/tmp"]
        for path in runtime_under_tmp():
            out += ["--ro-bind", str(path), str(path)]
        for kind, path in self._mounts(shown):
            out += ["--tmpfs", str(path)] if kind == "hide" else [kind, str(path), str(path)]
        out += [*NAMESPACES, "--unshare-cgroup-try", "--hostname", HOSTNAME]
        if self.network != "all":
            out.append("--unshare-net")
        # MARKER in bwrap's argv (and so in the sandbox's pid 1): a folder in the private /tmp.
        out += ["--dir", f"/tmp/{MARKER}", "--die-with-parent", "--cap-drop", "ALL"]
        if self.filtered:
            out += ["--seccomp", str(seccomp)]
        out.append("--clearenv")
        for key, value in env.items():
            out += ["--setenv", key, value]
        out += ["--chdir", str(self.workspace), "--", *argv]
        if self.network == "loopback" and self.pasta is not None:
            runas = f"{os.getuid()}:{os.getgid()}"  # pasta would drop root to nobody
            closed = ",".join(str(p) for p in self.closed_ports)
            launcher = [sys.executable, "-I", "-S", str(NETJOIN), self.pasta, runas, closed]
            return [*launcher, "--", *out]
        return out

    def _mounts(self, shown: Sequence[Path]) -> list[tuple[str, Path]]:
        """Mounts in the order bwrap must make them: a folder before anything inside it (the
        workspace usually lies inside the hidden home; in tests the home may lie inside it).
        Each is "hide" or the bwrap option that binds it."""
        workspace = self.workspace.resolve()
        mounts: list[tuple[str, Path]] = [("--bind", workspace)]
        if self.home is not None:
            mounts.append(("hide", self.home.resolve()))
        for other in self.also_hidden:
            found = other.resolve()
            # Only a folder that exists can be covered (/ is read-only: no mount point can be
            # made), and never one inside the workspace, whose files the command must keep.
            if found.is_dir() and not found.is_relative_to(workspace):
                mounts.append(("hide", found))
        mounts += [("--ro-bind", Path(b).resolve()) for b in shown]
        return sorted(mounts, key=lambda m: len(m[1].parts))


def other_homes(home: Path) -> tuple[Path, ...]:
    """The Heron homes to hide besides `home`: the default one (~/.heron) when `home` is
    another (a project's `HERON_HOME=./.heron`), so a project's commands cannot read the main
    record. Homes elsewhere are not known here (docs/security.md, "Not confined")."""
    try:
        default = default_home()
    except RuntimeError:  # no home folder for this user: nothing to hide
        return ()
    return () if default.resolve() == home.resolve() else (default,)


def store_reach(url: str | None, env: Mapping[str, str]) -> tuple[tuple[int, ...], bool]:
    """The PostgreSQL store's ports on this machine's loopback, its Unix socket's included
    (kept from the commands), and whether it is on loopback TCP with no password (a trust-auth
    server: `notice` warns)."""
    if not url:
        return (), False
    from heron.store.pg_url import has_password, loopback_ports

    # Warned about over TCP only: over the socket, peer auth is what the notice recommends.
    tcp = loopback_ports(url, env, sockets=False)
    return loopback_ports(url, env), bool(tcp) and not has_password(url, env)


def find_pasta(env: Mapping[str, str]) -> str | None:
    """pasta (Debian `passt`), which `network = "loopback"` needs; None without it: the
    command then has no network at all, and its description says so."""
    return shutil.which("pasta", path=env.get("PATH") or DEFAULT_PATH)


def runtime_under_tmp() -> list[Path]:
    """The interpreter's and Heron's own folders that the private /tmp would hide (a checkout or
    a virtual environment under /tmp, as a CI clone may be): bound back read-only, so the
    kernel and a `heron` run from a tool can start."""
    import heron

    tmp = Path("/tmp").resolve()
    found = {Path(sys.prefix), Path(sys.base_prefix), Path(heron.__file__).parent}
    return sorted({p.resolve() for p in found if p.resolve().is_relative_to(tmp)})


def is_marker(arg: str) -> bool:
    """Whether one argv element is the mark `wrap` leaves on the process it starts."""
    return arg == MARKER or arg.endswith("/" + MARKER)


def command_line(argv: Sequence[str]) -> str:
    """The argv as one line a person can read (for approval prompts and logs)."""
    return " ".join(shlex.quote(a) for a in argv)
