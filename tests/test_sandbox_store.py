"""The PostgreSQL store from a sandboxed command: with `network = "loopback"` the store's port
on 127.0.0.1 is never forwarded into the command's namespace (heron/tools/netjoin.py holds it
there), while every other loopback port still is; and a store on loopback with no password is
warned about at start (docs/security.md, "The store")."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from sandbox_helpers import connect_command, listener

from heron.tools.sandbox import Sandbox

needs_pasta = pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("pasta") is None,
    reason="needs bubblewrap and pasta (Debian passt)",
)


def run_in(sandbox: Sandbox, command: str) -> str:
    """What `bash -c command` prints in the sandbox (stdout and stderr)."""
    sandbox.prepare()
    with sandbox.seccomp() as fd:
        argv = sandbox.wrap(["bash", "-c", command], seccomp=fd)
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=120, pass_fds=() if fd is None else (fd,)
        )
    return done.stdout + done.stderr


@needs_pasta
@pytest.mark.parametrize(
    "url",
    [
        "postgresql://postgres@127.0.0.1:{port}/heron",
        # qa21v M1: a server reached over its socket listens on loopback TCP at that port too
        "postgresql://postgres@/heron?host=/run/postgresql&port={port}",
        "postgresql://postgres@[::ffff:127.0.0.1]:{port}/heron",
    ],
)
def test_a_loopback_command_cannot_reach_the_stores_port_but_reaches_the_others(
    tmp_path: Path, url: str
) -> None:
    """The QA's attack: with trust auth, a command on "loopback" connected to the store's port,
    read every message and, as superuser, ran programs outside the sandbox (COPY FROM
    PROGRAM). A plain listener stands for the server: what matters is that no connection to
    it is made, while a server on another loopback port is reached as before."""
    home, workspace = tmp_path / "home", tmp_path / "home" / "workspace"
    workspace.mkdir(parents=True)
    with listener() as (store, store_seen), listener() as (other, other_seen):
        sandbox = Sandbox.detect(workspace, home, "loopback", os.environ, url.format(port=store))
        if not sandbox.confined or sandbox.pasta is None:
            pytest.skip(f"bubblewrap cannot run here: {sandbox.problem}")
        assert sandbox.closed_ports == (store,)
        command = "; ".join(
            [
                connect_command("127.0.0.1", store).replace("NET-CONNECTED", "STORE-REACHED"),
                connect_command("::1", store).replace("NET-CONNECTED", "STORE6-REACHED"),
                connect_command("127.0.0.1", other),
            ]
        )
        out = run_in(sandbox, command)
    assert "NET-CONNECTED HELLO" in out and other_seen, out  # loopback still works
    assert "REACHED" not in out and not store_seen, out
    assert "no loopback network" not in out


@needs_pasta
def test_without_a_store_on_loopback_every_port_is_forwarded(tmp_path: Path) -> None:
    """A store on another machine keeps nothing from the commands: the same port on this
    machine's loopback (a server of the person's own) is reached."""
    home, workspace = tmp_path / "home", tmp_path / "home" / "workspace"
    workspace.mkdir(parents=True)
    with listener() as (port, seen):
        url = f"postgresql://heron:pw@192.0.2.1:{port}/heron"
        sandbox = Sandbox.detect(workspace, home, "loopback", os.environ, url)
        if not sandbox.confined:
            pytest.skip(f"bubblewrap cannot run here: {sandbox.problem}")
        assert sandbox.closed_ports == ()
        out = run_in(sandbox, connect_command("127.0.0.1", port))
    assert "NET-CONNECTED HELLO" in out and seen, out


@pytest.mark.parametrize(
    ("url", "env", "warned"),
    [
        ("postgresql://heron@127.0.0.1:5432/heron", {}, True),  # the docs' old example
        ("postgresql://heron@localhost/heron", {}, True),
        ("postgresql://heron:s3cret@127.0.0.1:5432/heron", {}, False),
        ("postgresql://heron@127.0.0.1:5432/heron", {"PGPASSWORD": "s3cret"}, False),
        ("postgresql://heron@192.0.2.1:5432/heron", {}, False),  # another machine
        ("postgresql:///heron?host=/run/postgresql", {}, False),  # peer auth over a socket
        ("postgresql:///heron", {}, False),  # the same, at libpq's default socket
        ("postgresql://heron@0.0.0.0:5432/heron", {}, True),  # qa21v M1: this machine too
        (None, {}, False),  # SQLite
    ],
)
def test_a_store_on_loopback_without_a_password_is_warned_about_at_start(
    tmp_path: Path, url: str | None, env: dict[str, str], warned: bool
) -> None:
    env = {**env, "HERON_BWRAP": "/usr/bin/bwrap"}  # any: the notice is not about bwrap here
    sandbox = Sandbox.detect(tmp_path, tmp_path / "home", "none", env, url)
    notice = Sandbox(tmp_path, bwrap="bwrap", open_store=sandbox.open_store).notice("allow")
    assert bool(notice) == warned, notice
    if warned:
        assert notice and "no password" in notice and "trust" in notice
        assert "peer auth" in notice and "docs/security.md" in notice


@needs_pasta
def test_a_port_that_cannot_be_held_leaves_the_command_no_network(tmp_path: Path) -> None:
    """Held or nothing: were the store's port not held, pasta would forward it, so a failure
    gives the command no loopback at all, and its output says why."""
    import dataclasses

    home, workspace = tmp_path / "home", tmp_path / "home" / "workspace"
    workspace.mkdir(parents=True)
    with listener() as (other, seen):
        sandbox = Sandbox.detect(workspace, home, "loopback", os.environ)
        if not sandbox.confined or sandbox.pasta is None:
            pytest.skip(f"bubblewrap cannot run here: {sandbox.problem}")
        no_such_port = dataclasses.replace(sandbox, closed_ports=(70000,))
        out = run_in(no_such_port, connect_command("127.0.0.1", other))
    assert "no loopback network for this command (cannot hold ports [70000]" in out, out
    assert "NET-CONNECTED" not in out and not seen
