"""`heron serve` on a port that is taken: one line naming the port, who holds it (this machine's
/proc) and what to do next; exit 2, no traceback, and nothing of the home is left locked."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from heron.cli import app
from heron.config import Settings
from heron.serve.lock import INFO_NAME, ServeLock
from heron.serve.ports import holder


@contextmanager
def taken_port() -> Iterator[int]:
    """A port this test process listens on, on 127.0.0.1."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]
    finally:
        sock.close()


def test_a_taken_port_is_one_line_naming_it_and_its_holder_exit_2():
    with taken_port() as port:
        result = CliRunner().invoke(app, ["serve", "--port", str(port)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith(f"heron: port {port} on 127.0.0.1 is in use by pid {os.getpid()} (")
    assert f"--port {port + 1}" in line and "--port 0" in line
    assert "Traceback" not in result.output + result.stderr
    home = Settings.load().paths.home
    assert not (home / INFO_NAME).exists()
    with ServeLock(home):  # the refused serve let go of its lock
        pass


def test_the_holder_of_a_port_is_found_and_a_free_port_has_none():
    with taken_port() as port:
        found = holder(port)
        assert found is not None and found.pid == os.getpid() and not found.is_heron_serve
    assert holder(port) is None


@pytest.mark.slow  # a real heron serve process
def test_a_port_held_by_another_heron_serve_names_it_and_its_home(tmp_path: Path):
    other = tmp_path / "other-home"
    other.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERON_")}
    env.update(
        HERON_HOME=str(other),
        HERON_BASE_URL="http://127.0.0.1:9",  # never called: no turn runs
        HERON_API_KEY="dummy",
        HERON_MODEL="fake-model",
    )
    first = subprocess.Popen(
        [sys.executable, "-m", "heron", "serve", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout is not None
        line = first.stdout.readline()  # "heron serve: http://127.0.0.1:PORT  (...)"
        assert line.startswith("heron serve: http://127.0.0.1:"), first.stderr
        port = int(line.split()[2].rsplit(":", 1)[1])
        second = subprocess.run(
            [sys.executable, "-m", "heron", "serve", "--port", str(port)],
            env={**env, "HERON_HOME": os.environ["HERON_HOME"]},
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        first.terminate()
        first.wait(30)
    assert second.returncode == 2
    assert second.stderr.strip() == second.stderr.strip().splitlines()[0]
    assert f"in use by another heron serve (pid {first.pid}, on {other})" in second.stderr
    assert f"kill {first.pid}" in second.stderr and "Traceback" not in second.stderr


def test_a_wildcard_bind_prints_an_address_a_browser_can_open():
    from heron.serve.main import shown_url

    assert shown_url("127.0.0.1", 8765) == ("http://127.0.0.1:8765", None)
    assert shown_url("192.168.1.5", 80) == ("http://192.168.1.5:80", None)
    url, note = shown_url("0.0.0.0", 8765, find=lambda host: "192.168.1.5")
    assert url == "http://192.168.1.5:8765" and note and "every interface" in note
    url, note = shown_url("0.0.0.0", 8765, find=lambda host: None)
    assert url == "http://0.0.0.0:8765" and note and "replace 0.0.0.0" in note
    url, _ = shown_url("::", 8765, find=lambda host: "2001:db8::5")
    assert url == "http://[2001:db8::5]:8765"


def test_a_bind_off_loopback_warns_that_the_login_travels_in_plain_http():
    from heron.serve.main import PLAIN_HTTP, plain_http_notice

    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1"):
        assert plain_http_notice(host) is None
    for host in ("0.0.0.0", "::", "192.168.1.5"):
        assert plain_http_notice(host) == PLAIN_HTTP
    for said in ("login code", "cookie", "TLS reverse proxy", "SSH tunnel"):
        assert said in PLAIN_HTTP


def test_serve_on_every_interface_prints_its_login_at_a_usable_address(monkeypatch):
    import asyncio

    from serve_helpers import TerminalOut

    from heron.providers.scripted import ScriptedProvider
    from heron.serve.main import PLAIN_HTTP, serve

    monkeypatch.setattr("heron.serve.main.outward_address", lambda host: "192.168.1.5")
    out, stop = TerminalOut(), asyncio.Event()  # a terminal: the address is printed

    async def run() -> None:
        ready = asyncio.Event()
        task = asyncio.create_task(
            serve(
                Settings.load(), host="0.0.0.0", port=0, provider=ScriptedProvider([]), out=out,
                on_ready=lambda info, login: ready.set(), until=stop, signals=False,
            )
        )  # fmt: skip
        await asyncio.wait_for(ready.wait(), 60)
        stop.set()
        await task

    asyncio.run(run())
    printed = out.getvalue()
    assert "/login?code=" in printed and "http://0.0.0.0" not in printed
    assert "Log in: http://192.168.1.5:" in printed
    assert PLAIN_HTTP + "\n" in printed  # one line, said once
    assert printed.count("plain HTTP") == 1
