"""`[agent] max_model_calls` bounds the model calls of one run; `max_turns`, its older name,
still reads as the same setting. `[agent] timezone` is checked when the file loads, and
`heron config show` says where the model in use was named."""

from __future__ import annotations

import asyncio
from io import StringIO
from pathlib import Path

import pytest

from heron.agent.engine import Engine
from heron.agent.runner import RunLimits
from heron.config import Settings, load_config
from heron.errors import ConfigError
from heron.messages import Reply, Text, ToolCall, Usage
from heron.providers.scripted import ScriptedProvider


def _config(tmp_path: Path, agent: str):
    path = tmp_path / "config.toml"
    path.write_text(f"[agent]\n{agent}\n")
    return load_config(path)


def test_the_older_key_sets_the_model_call_limit(tmp_path):
    assert _config(tmp_path, "max_turns = 7").agent.max_model_calls == 7
    assert _config(tmp_path, "max_model_calls = 9").agent.max_model_calls == 9
    assert _config(tmp_path, "").agent.max_model_calls == 200


def test_a_bad_value_is_reported_under_the_key_as_written(tmp_path):
    with pytest.raises(ConfigError, match=r"\[agent\] max_turns must be above 0, got -5"):
        _config(tmp_path, "max_turns = -5")
    with pytest.raises(ConfigError, match=r"\[agent\] max_model_calls must be a whole number"):
        _config(tmp_path, 'max_model_calls = "many"')


def test_both_names_at_once_is_an_error_that_says_which_to_keep(tmp_path):
    with pytest.raises(ConfigError, match="sets max_model_calls twice") as raised:
        _config(tmp_path, "max_turns = 3\nmax_model_calls = 4")
    assert "Keep one line" in (raised.value.hint or "")


def test_limits_recorded_under_the_older_name_still_load():
    assert RunLimits.recorded({"max_turns": 5, "max_tokens_total": 10}) == RunLimits(5, 10)
    assert RunLimits.recorded({"max_model_calls": 6}).max_model_calls == 6


async def test_the_alias_bounds_a_real_run(heron_home):
    (heron_home / "config.toml").write_text("[agent]\nmax_turns = 2\n")
    call = ToolCall("c1", "read_file", {"path": "missing.txt"})
    looping = [Reply([call], "tool_use", Usage(10, 2)) for _ in range(2)]
    provider = ScriptedProvider([*looping, Reply([Text("Done so far: nothing.")], "done")])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        result = await engine.turn("k", "loop please")
    provider.assert_complete()
    assert result.run.stop == "wrapup" and result.run.model_calls == 3


@pytest.mark.parametrize("zone", ['"Mars/Olympus"', '"../etc/passwd"', "5", '""'])
def test_an_unknown_timezone_is_a_config_error_at_load(tmp_path, zone):
    with pytest.raises(ConfigError) as caught:
        _config(tmp_path, f"timezone = {zone}")
    assert "[agent] timezone" in str(caught.value) and "Europe/Berlin" in str(caught.value)
    assert _config(tmp_path, 'timezone = "Europe/Berlin"').agent.timezone == "Europe/Berlin"


def test_every_command_refuses_an_unknown_timezone(monkeypatch):
    from typer.testing import CliRunner

    from heron.cli import app

    home = Settings.load().paths.ensure().home
    (home / "config.toml").write_text('[agent]\ntimezone = "Mars/Olympus"\n')
    for args in (["run", "hi"], ["jobs", "list"], ["config", "show"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, args
        assert "timezone 'Mars/Olympus' is no known timezone" in result.stderr, args


def test_config_show_names_where_the_model_was_set(monkeypatch):
    from typer.testing import CliRunner

    from heron.cli import app

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-real")
    home = Settings.load().paths.ensure().home
    (home / "config.toml").write_text('model = "gpt-4o"\n')
    shown = CliRunner().invoke(app, ["config", "show"]).stdout
    assert "model:       openai / gpt-4o (from config.toml)" in shown
    monkeypatch.setenv("HERON_MODEL", "gpt-4.1")
    shown = CliRunner().invoke(app, ["config", "show"]).stdout
    assert "openai / gpt-4.1 (from HERON_MODEL)" in shown
    (home / "config.toml").unlink()
    monkeypatch.delenv("HERON_MODEL")
    shown = CliRunner().invoke(app, ["config", "show"]).stdout
    assert "(from the provider's default)" in shown and "default)" not in shown.replace(
        "provider's default)", ""
    )


def test_config_show_says_plainly_that_no_model_was_named(monkeypatch):
    """It said "model: openai / default (from no model named: ...)"."""
    from typer.testing import CliRunner

    from heron.cli import app

    monkeypatch.setenv("HERON_BASE_URL", "http://127.0.0.1:9/v1")
    shown = CliRunner().invoke(app, ["config", "show"]).stdout
    assert "(from no model named" not in shown
    assert (
        "model:       openai / default (no model named, so `default` is sent; "
        "`heron models` lists the server's)"
    ) in shown


def test_the_kernels_idle_time_is_read_and_checked(tmp_path):
    path = tmp_path / "config.toml"
    assert load_config(path).tools.kernel_idle_minutes == 30
    path.write_text("[tools]\nkernel_idle_minutes = 5\n")
    assert load_config(path).tools.kernel_idle_minutes == 5
    for bad in ("-1", '"ten"', "true"):
        path.write_text(f"[tools]\nkernel_idle_minutes = {bad}\n")
        with pytest.raises(ConfigError, match="kernel_idle_minutes must be a number of minutes"):
            load_config(path)


def test_a_heron_home_is_its_owners_only(tmp_path):
    """The home was made 0755 (and heron.db 0644) under the usual umask: another local user
    read every transcript out of the database. A new home is 0700; an older Heron home that
    others can read is made 0700; a shared folder that is no Heron home is left alone."""
    import stat

    from heron.config import Paths

    def mode(path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    new = Paths(tmp_path / "fresh" / ".heron").ensure()
    assert mode(new.home) == 0o700

    old = tmp_path / "old-home"
    old.mkdir(mode=0o755)
    old.chmod(0o755)
    (old / "heron.db").write_bytes(b"")
    Paths(old).ensure()
    assert mode(old) == 0o700

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    Paths(shared).ensure()  # no heron.db: a folder the person pointed HERON_HOME at
    assert mode(shared) == 0o755


async def test_a_home_made_beforehand_is_private_from_its_first_run(heron_home):
    """A HERON_HOME the person made (0755, holding config.toml) stayed 0755 through the whole
    first run with heron.db in it, and became 0700 only at the second (QA21r #16)."""
    import stat

    from heron.channels.script import run_once

    heron_home.chmod(0o755)
    (heron_home / "config.toml").write_text("[agent]\nmax_model_calls = 5\n")
    provider = ScriptedProvider(lambda request: Reply([Text("hi")], "done", Usage(3, 1)))
    out, err = StringIO(), StringIO()
    assert await run_once(Settings.load(), "hi", "default", "k", None, False, out, err, provider)
    assert (heron_home / "heron.db").exists()
    assert stat.S_IMODE(heron_home.stat().st_mode) == 0o700


def test_every_model_and_price_override_is_checked_when_the_file_loads(tmp_path):
    """`[models."other*"] contxt_window` was accepted while no model in use matched the glob,
    and a matching one's error named neither the file nor the line; `[prices]` likewise."""
    path = tmp_path / "config.toml"
    path.write_text(
        'model = "fake-model"\n\n[models."other*"]\ncontext_window = 8000\ncontxt_window = 1000\n'
    )
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value).startswith(
        f"{path}:5: [models.\"other*\"]: unknown key 'contxt_window'"
    )
    assert "context_window" in (raised.value.hint or "")
    path.write_text('[models."x*"]\ntool_mode = "both"\n')
    with pytest.raises(
        ConfigError, match=r"config\.toml:2: \[models\.\"x\*\"\]: tool_mode must be"
    ):
        load_config(path)
    path.write_text("[models]\nx = 3\n")
    with pytest.raises(ConfigError, match=r"config\.toml: \[models\.\"x\"\] must be a table"):
        load_config(path)
    path.write_text('[prices."nobody*"]\ninput = 1.0\noutput = 2.0\ncache_reed = 0.1\n')
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value).startswith(f'{path}:1: [prices."nobody*"]: needs input and output')
    assert "unknown: cache_reed" in str(raised.value)
    path.write_text('[prices."nobody*"]\ninput = "cheap"\noutput = 2.0\n')
    with pytest.raises(
        ConfigError,
        match=r"config\.toml:1: \[prices\.\"nobody\*\"\]: input is 'cheap'; a price must be a n",
    ):
        load_config(path)
    path.write_text('[models."y*"]\ncontext_window = 8000\n[prices."y*"]\ninput = 1\noutput = 2\n')
    assert load_config(path).models == {"y*": {"context_window": 8000}}


def test_a_broken_config_leaves_the_commands_that_read_the_record_working():
    """A malformed config.toml blocked `config path`, `conversations list` and export: the
    commands a person needs to find the file and rescue their data. They go on with the
    defaults, saying once on stderr what is broken and where; a turn is still refused."""
    from typer.testing import CliRunner

    from heron.cli import app

    async def one_turn() -> None:
        provider = ScriptedProvider([Reply([Text("kept answer")], "done", Usage(5, 1))])
        async with Engine.open(Settings.load(), provider=provider) as engine:
            await engine.turn("rescue", "keep this")

    asyncio.run(one_turn())
    home = Settings.load().paths.home
    (home / "config.toml").write_text("[agent\nname = 1\n")
    for args in (
        ["config", "path"],
        ["conversations", "list"],
        ["conversations", "show", "rescue"],
        ["conversations", "export", "rescue"],
        ["trace", "ls"],
    ):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, (args, result.output)
        said = result.stderr.splitlines()
        assert said[0].startswith(f"heron: {home / 'config.toml'}:1: malformed TOML"), args
        assert sum("malformed TOML" in line for line in said) == 1, args
        assert "goes on with the default settings" in result.stderr, args
    assert str(home / "config.toml") in CliRunner().invoke(app, ["config", "path"]).stdout
    assert "kept answer" in CliRunner().invoke(app, ["conversations", "export", "rescue"]).stdout
    refused = CliRunner().invoke(app, ["run", "-c", "rescue", "more"])
    assert refused.exit_code == 2 and "malformed TOML" in refused.stderr
    # a file that names a [store]: the record may be elsewhere, so it is not read around it
    (home / "config.toml").write_text('[store]\nurl = "postgresql://h/db"\n[agent\n')
    elsewhere = CliRunner().invoke(app, ["conversations", "list"])
    assert elsewhere.exit_code == 2 and "It names a [store]" in elsewhere.stderr
    assert "HERON_DATABASE_URL" in elsewhere.stderr
