"""What a command the agent runs can reach, asked for by a scripted model through the engine:
`bash` and `run_cell`, in the sandbox (bubblewrap) and unconfined (HERON_BWRAP=off)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import (
    CONFIG_KEY,
    ENV_KEY,
    MEMORY_SECRET,
    call_tool,
    connect_command,
    listener,
    seed_home,
)

from heron.tools.approval import DECLINED, NO_TERMINAL

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is needed")

BASH_ATTACK = """\
echo escaped > {outside}/escape.txt; echo escaped > /tmp/{tmpname}
cat {home}/config.toml {home}/memory/personal/always/x.md; head -c 15 {home}/heron.db; echo
echo "HOME-LISTING: $(ls -A {home} | tr '\\n' ' ')"
echo "ENV: $(env | cut -d= -f1 | tr '\\n' ' ')"
env
(exec 3<>/dev/tcp/127.0.0.1/{port} && echo NET-CONNECTED) 2>&1
"""

CELL_ATTACK = """\
import os, socket
for target in ({outside!r} + '/escape.txt', '/tmp/{tmpname}'):
    try:
        open(target, 'w').write('escaped')
    except OSError as e:
        print('write refused:', e)
for name in ('config.toml', 'memory/personal/always/x.md', 'heron.db'):
    try:
        print(open(os.path.join({home!r}, name), 'rb').read()[:200])
    except OSError as e:
        print('read refused:', e)
print('HOME-LISTING:', ' '.join(sorted(os.listdir({home!r}))))
print('ENV:', ' '.join(sorted(os.environ)), dict(os.environ))
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=3).close()
    print('NET-CONNECTED')
except OSError as e:
    print('connect refused:', e)
"""


def attack(tool: str, home: Path, outside: Path, port: int) -> tuple[dict[str, str], str]:
    tmpname = f"heron-escape-{uuid.uuid4().hex}"
    template = BASH_ATTACK if tool == "bash" else CELL_ATTACK
    code = template.format(outside=str(outside), tmpname=tmpname, home=str(home), port=port)
    return ({"command": code} if tool == "bash" else {"code": code}), tmpname


def env_names(output: str) -> set[str]:
    line = next(line for line in output.splitlines() if "ENV:" in line)
    words = line.split("ENV:", 1)[1].split(" {", 1)[0].split()
    return set(words) - {"PWD", "SHLVL", "_", "OLDPWD"}


@pytest.mark.parametrize("tool", ["bash", "run_cell"])
async def test_sandboxed_command_reaches_only_the_workspace(
    tool: str, heron_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_home(heron_home)
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)  # in Heron's own environment too
    monkeypatch.setenv("HERON_SECRET_SETTING", "heron-variable-value")
    outside = tmp_path / "outside"
    outside.mkdir()
    with listener() as (port, accepted):
        args, tmpname = attack(tool, heron_home, outside, port)
        result = await call_tool(tool, args)
    out = result.content
    # Nothing written outside the workspace: neither a folder of the host nor the host's /tmp.
    assert not (outside / "escape.txt").exists()
    assert not (Path("/tmp") / tmpname).exists()
    # HERON_HOME is an empty folder but for the workspace: no config, no memory, no database.
    assert CONFIG_KEY not in out and MEMORY_SECRET not in out and "SQLite format" not in out
    assert "HOME-LISTING: workspace" in out
    # The environment is the allowlist (run_cell's kernel adds a few display settings).
    assert ENV_KEY not in out and "heron-variable-value" not in out
    assert {"PATH", "HOME", "LANG", "TERM"} <= env_names(out)
    assert not any(name.startswith("HERON_") or "KEY" in name for name in env_names(out))
    # No network: the host's loopback server never saw a connection.
    assert "NET-CONNECTED" not in out and accepted == []


@pytest.mark.parametrize("tool", ["bash", "run_cell"])
async def test_unconfined_command_gets_the_clean_environment_too(
    tool: str, heron_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_home(heron_home, 'approval = "allow"')
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    monkeypatch.setenv("HERON_SECRET_SETTING", "heron-variable-value")
    with listener() as (port, _accepted):
        args, _ = attack(tool, heron_home, tmp_path, port)
        result = await call_tool(tool, args, confined=False)
    out = result.content
    assert ENV_KEY not in out and "heron-variable-value" not in out
    assert not any(name.startswith("HERON_") or "KEY" in name for name in env_names(out))
    assert "HOME-LISTING: " in out  # it did run: unconfined means approved and unconfined


@pytest.mark.parametrize("network", ["all", "loopback"])
async def test_the_network_setting_is_what_the_sandbox_allows(
    network: str, heron_home: Path, tmp_path: Path
) -> None:
    """ "all" shares the host's network (so the test above could fail); "loopback" forwards
    the host's 127.0.0.1 into the command's own namespace (through pasta), and nothing else."""
    if network == "loopback" and shutil.which("pasta") is None:
        pytest.skip("pasta (Debian passt) is not installed")
    seed_home(heron_home, f'network = "{network}"')
    with listener() as (port, accepted):
        result = await call_tool("bash", {"command": connect_command("127.0.0.1", port)})
    assert "NET-CONNECTED HELLO" in result.content and accepted


def outside_address() -> str | None:
    """One of this machine's addresses that is not loopback, if it has one."""
    try:
        found = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    addresses = [a for a in found.stdout.split() if "." in a and not a.startswith("127.")]
    return addresses[0] if addresses else None


async def test_loopback_reaches_nothing_beyond_the_hosts_loopback(
    heron_home: Path, tmp_path: Path
) -> None:
    """A server on the machine's own LAN address stands for the network beyond loopback: the
    same command reaches it with "all" (so this can fail) and not with "loopback"."""
    address = outside_address()
    if shutil.which("pasta") is None or address is None:
        pytest.skip("needs pasta and a non-loopback address")
    for network, reached in (("all", True), ("loopback", False)):
        seed_home(heron_home, f'network = "{network}"')
        with listener(address) as (port, accepted):
            result = await call_tool("bash", {"command": connect_command(address, port)})
        assert ("NET-CONNECTED" in result.content) == reached, (network, result.content)
        assert bool(accepted) == reached


async def test_the_kernel_runs_with_the_loopback_network(heron_home: Path) -> None:
    """run_cell's kernel starts through the same launcher and reaches the host's loopback;
    pasta ends with the command's namespace."""
    if shutil.which("pasta") is None:
        pytest.skip("pasta (Debian passt) is not installed")
    seed_home(heron_home, 'network = "loopback"')
    before = pasta_pids()
    with listener() as (port, accepted):
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), 5); print('OK')"
        result = await call_tool("run_cell", {"code": code})
    assert "OK" in result.content and accepted
    for _ in range(200):  # pasta ends with the launcher; give it a moment to be reaped
        if not pasta_pids() - before:
            break
        await asyncio.sleep(0.05)
    assert not pasta_pids() - before


def pasta_pids() -> set[int]:
    """The pasta processes running now that netjoin.py started (their argv has --runas)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if argv and argv[0].endswith(b"pasta") and b"--runas" in argv:
            found.add(int(entry.name))
    return found


@pytest.mark.parametrize(
    ("confined", "network"), [(True, "none"), (True, "loopback"), (False, "none")]
)
async def test_a_command_starts_with_default_signals(
    confined: bool, network: str, heron_home: Path
) -> None:
    """Python ignores SIGPIPE, and what a launcher ignores its exec'd command inherits: a
    pipeline's writer must end by SIGPIPE (141) as in a terminal, not print "Broken pipe"."""
    seed_home(heron_home, f'network = "{network}"\napproval = "allow"')
    command = 'yes | head -1; echo "writer ended ${PIPESTATUS[0]}"'
    result = await call_tool("bash", {"command": command}, confined=confined)
    assert "writer ended 141" in result.content and "Broken pipe" not in result.content


async def test_unconfined_commands_wait_for_approval(heron_home: Path, tmp_path: Path) -> None:
    seed_home(heron_home)  # approval unset: "ask", since bwrap "cannot run"
    marker = tmp_path / "ran"
    command = f"touch {marker}"
    refused = await call_tool("bash", {"command": command}, confined=False)
    assert refused.is_error and NO_TERMINAL in refused.content and not marker.exists()

    asked: list[tuple[str, str, bool]] = []

    async def no(tool: str, text: str, confined: bool) -> str | None:
        asked.append((tool, text, confined))
        return DECLINED

    declined = await call_tool("bash", {"command": command}, confined=False, approve=no)
    assert declined.is_error and DECLINED in declined.content and not marker.exists()
    assert asked == [("bash", command, False)]  # the exact command, said to be unconfined

    async def yes(tool: str, text: str, confined: bool) -> str | None:
        return None

    ran = await call_tool("bash", {"command": command}, confined=False, approve=yes)
    assert not ran.is_error and marker.exists()


async def test_never_refuses_every_command_and_allow_needs_no_one(heron_home: Path) -> None:
    seed_home(heron_home, 'approval = "never"')
    refused = await call_tool("run_cell", {"code": "print('ran')"})
    assert refused.is_error and 'approval = "never"' in refused.content
    assert "ran" not in refused.content.replace("refused", "")


async def test_the_model_is_told_where_commands_run(heron_home: Path) -> None:
    from sandbox_helpers import settings

    from heron.agent.engine import Engine
    from heron.context.prompt import build_system_prompt
    from heron.providers.scripted import ScriptedProvider

    seed_home(heron_home)
    for confined, says in ((True, "run (bash, run_cell): in a sandbox"), (False, "unconfined")):
        async with Engine.open(settings(confined), provider=ScriptedProvider([])) as engine:
            specs = {s.name: s.description for s in engine.registry.specs()}
            prompt = build_system_prompt(engine.prompt_inputs("default"))
        assert specs["bash"].endswith(engine.sandbox.describe())
        assert specs["run_cell"].endswith(engine.sandbox.describe())
        assert says in prompt and "Files and commands act inside the workspace" not in prompt


def test_bad_tools_settings_say_what_is_wrong(heron_home: Path) -> None:
    from heron.config import Settings
    from heron.errors import ConfigError

    for body, said in (
        ('network = "internet"', "network must be one of 'none', 'loopback', 'all'"),
        ('approval = "maybe"', "approval must be one of 'ask', 'allow', 'never'"),
        ('redact = "yes"', "redact must be true or false"),
        ("sandbox = false", "[tools] has no key 'sandbox'"),
    ):
        (heron_home / "config.toml").write_text(f"[tools]\n{body}\n", encoding="utf-8")
        with pytest.raises(ConfigError) as error:
            Settings.load()
        assert said in str(error.value)
    (heron_home / "config.toml").write_text('[tools]\nnetwork = "all"\nredact = false\n')
    tools = Settings.load().config.tools
    assert (tools.network, tools.approval, tools.redact) == ("all", None, False)


def test_the_probe_is_tried_for_real_and_remembered(heron_home: Path, tmp_path: Path) -> None:
    from heron.tools.sandbox import PROBE_CACHE, Sandbox, cached_probe

    failing = tmp_path / "bwrap"
    failing.write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n"
    )
    failing.chmod(0o755)
    env = {"HERON_BWRAP": str(failing), "PATH": os.environ["PATH"]}
    sandbox = Sandbox.detect(tmp_path, heron_home, "none", env)
    assert not sandbox.confined and "No permissions to create new namespace" in sandbox.problem
    assert "No sandbox" in (sandbox.notice("ask") or "")
    saved = json.loads((heron_home / PROBE_CACHE).read_text())
    assert saved["ok"] is False
    real = shutil.which("bwrap")
    assert cached_probe(real, heron_home).ok  # another binary: tried again, not the cache


def test_the_notice_says_why_there_is_no_sandbox(heron_home: Path, tmp_path: Path) -> None:
    """HERON_BWRAP=off is a choice, not a missing package: the notice says it is turned off
    and how to turn it on again, whether or not bwrap is installed; a machine without bwrap
    is told to install it."""
    from heron.tools.sandbox import PROBE_CACHE, Sandbox

    off = Sandbox.detect(tmp_path, heron_home, "none", {"HERON_BWRAP": "off"})
    assert off.problem == "bubblewrap is turned off (HERON_BWRAP=off)"
    said = off.notice("ask") or ""
    assert said.startswith("No sandbox: bubblewrap is turned off (HERON_BWRAP=off).")
    assert "not installed" not in said and "apt-get" not in said
    assert said.endswith("To confine them, unset HERON_BWRAP (or set it to the path of bwrap).")
    assert not (heron_home / PROBE_CACHE).exists()  # a setting, not a fact to remember
    nowhere = tmp_path / "empty"
    nowhere.mkdir()
    missing = Sandbox.detect(tmp_path, heron_home, "none", {"PATH": str(nowhere)})
    assert missing.problem == "bubblewrap (bwrap) is not installed"
    assert "install bubblewrap (Debian/Ubuntu: sudo apt-get install bubblewrap)" in (
        missing.notice("ask") or ""
    )


async def test_heron_run_without_a_terminal_refuses_and_tells_the_person(
    heron_home: Path, tmp_path: Path
) -> None:
    import io

    from sandbox_helpers import settings

    from heron.channels.script import run_once
    from heron.messages import Reply, Text, ToolCall, Usage
    from heron.providers.scripted import ScriptedProvider

    seed_home(heron_home)
    marker = tmp_path / "ran"
    provider = ScriptedProvider(
        [
            Reply([ToolCall("c1", "bash", {"command": f"touch {marker}"})], "tool", Usage(1, 1)),
            Reply([Text("I could not run it.")], "done", Usage(1, 1)),
        ]
    )
    out, err = io.StringIO(), io.StringIO()
    ok = await run_once(settings(False), "go", "default", None, None, False, out, err, provider)
    said = err.getvalue()
    assert ok and not marker.exists()
    assert said.count("No sandbox: bubblewrap is turned off (HERON_BWRAP=off)") == 1  # at start
    assert (
        f"refused to run bash without your approval (no terminal to ask in):\n  touch {marker}"
        in said
    )
    result = provider.requests[1].messages[-1].parts[0]
    assert result.is_error and NO_TERMINAL in result.content


def test_a_runtime_under_tmp_is_bound_back_into_the_private_tmp(tmp_path, monkeypatch):
    """A checkout or venv under /tmp (as a CI clone may be) would be hidden by the sandbox's
    private /tmp, and the kernel could not start: it is bound back read-only."""
    import sys

    from heron.tools.sandbox import Sandbox, runtime_under_tmp

    venv = (tmp_path / "venv").resolve()
    venv.mkdir()
    monkeypatch.setattr(sys, "prefix", str(venv))
    assert venv in runtime_under_tmp()
    argv = Sandbox(tmp_path, bwrap="bwrap").wrap(["true"], seccomp=3)
    tmpfs = argv.index("/tmp") - 1  # the private /tmp, then the runtime bound back inside it
    bound = argv.index(str(venv)) - 1
    assert argv[tmpfs] == "--tmpfs" and bound > tmpfs
    assert argv[bound : bound + 3] == ["--ro-bind", str(venv), str(venv)]


def test_loopback_without_pasta_says_there_is_no_network(tmp_path: Path) -> None:
    """Without pasta, "loopback" must not claim what it cannot give: the start notice and the
    tools' description both say the commands have no network, and how to get the setting."""
    from heron.tools.sandbox import Sandbox

    without = Sandbox(tmp_path, tmp_path / "home", "loopback", "/usr/bin/bwrap", pasta=None)
    with_pasta = Sandbox(tmp_path, tmp_path / "home", "loopback", "/usr/bin/bwrap", pasta="pasta")
    notice = without.notice("allow")
    assert notice and "no network" in notice and "apt-get install passt" in notice
    assert "has no network" in without.describe() and with_pasta.notice("allow") is None
    assert "127.0.0.1" in with_pasta.describe()
    assert "netjoin.py" in " ".join(with_pasta.wrap(["true"], seccomp=3))
    assert "netjoin.py" not in " ".join(without.wrap(["true"], seccomp=3))


MAIN_SECRET = "sk-test-mainhome-5a5a5a5a5a5a5a5a"


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A folder outside /tmp (the sandbox's /tmp is its own, so nothing of the host's /tmp
    shows there), removed afterwards."""
    try:
        made = Path(tempfile.mkdtemp(prefix="heron-test-", dir="/var/tmp"))
    except OSError:
        pytest.skip("needs a writable /var/tmp")
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


@pytest.mark.parametrize("where", ["beside", "inside"])
async def test_the_default_home_is_hidden_too_when_heron_home_names_another(
    where: str, tmp_path: Path, outside_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The QA's finding: a project run with its own HERON_HOME let its commands read the
    person's main ~/.heron (its config.toml, heron.db, web-sessions.json). Now hidden too,
    whether the project's home lies beside it or inside it (`HERON_HOME=~/.heron/work`); the
    rest of the person's home folder stays readable, as documented."""
    person = outside_tmp
    main = person / ".heron"
    main.mkdir(parents=True)
    (main / "config.toml").write_text(f'[providers.openai]\napi_key = "{MAIN_SECRET}"\n')
    (person / "notes.txt").write_text("readable notes\n")
    monkeypatch.setenv("HOME", str(person))
    project = tmp_path / "project-home" if where == "beside" else main / "work"
    project.mkdir(mode=0o700)
    monkeypatch.setenv("HERON_HOME", str(project))
    seed_home(project)
    command = f"cat {main}/config.toml; echo LISTED: $(ls -A {main}); cat {person}/notes.txt; pwd"
    result = await call_tool("bash", {"command": command})
    out = result.content
    assert MAIN_SECRET not in out and "api_key" not in out  # (the redactor would mask the key)
    expected = "LISTED:" if where == "beside" else "LISTED: work"  # the way to the workspace
    assert f"{expected}\n" in out, out
    assert "readable notes" in out and str(project / "workspace") in out


def test_a_default_home_inside_the_workspace_is_left_alone(tmp_path: Path) -> None:
    """Hiding it there would take the command's own files away."""
    from heron.tools.sandbox import Sandbox

    workspace = tmp_path / "ws"
    (workspace / ".heron").mkdir(parents=True)
    sandbox = Sandbox(
        workspace, tmp_path / "home", bwrap="bwrap", also_hidden=(workspace / ".heron",)
    )
    argv = sandbox.wrap(["true"], seccomp=3)
    assert str(workspace / ".heron") not in argv
