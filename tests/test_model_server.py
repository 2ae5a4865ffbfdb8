"""Pointing Heron at a model server: a base URL in config.toml is that server, as HERON_BASE_URL
is (the same model name and window, a placeholder key when none is set); a malformed URL is
refused when the settings load; `heron models` asks the server what it offers; and a server
that is down, a path with no API (a base URL without /v1), https:// to a plain-HTTP server or
a 501 say which URL and what to do, on both wires: a wrong URL at once, a server that is down
after its retries. Every server here is on 127.0.0.1 and speaks the real protocol."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from heron.cli import app
from heron.config import Config, choose_model, load_config
from heron.errors import ConfigError, FatalProviderError, ProviderError, TransientProviderError
from heron.messages import user
from heron.providers.anthropic import AnthropicProvider
from heron.providers.base import RetryPolicy, call_with_retries
from heron.providers.openai_compat import OpenAICompatProvider
from heron.providers.profiles import PLACEHOLDER_KEY, ModelProfile
from heron.request import ChatRequest
from heron.store import Store
from heron.testing.fake_anthropic import FakeAnthropicServer
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

CONFIG_URL = "[providers.openai] base_url in config.toml"


def closed_port() -> int:
    """A port nothing listens on: a server that is down."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(home: Path, text: str) -> None:
    (home / "config.toml").write_text(text)


class Sleeps:
    """asyncio.sleep for call_with_retries, recording each wait instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def request(model: str = "fake-model") -> ChatRequest:
    return ChatRequest(model, "You are terse.", [user("hi")], [], 64)


async def attempt(provider: OpenAICompatProvider | AnthropicProvider) -> tuple[ProviderError, int]:
    """One call with retries: the error it ends with, and how many times it waited to retry."""
    sleeps = Sleeps()
    with pytest.raises(ProviderError) as caught:
        await call_with_retries(
            lambda: provider.chat(request()), RetryPolicy(attempts=3), sleep=sleeps
        )
    await provider.aclose()
    return caught.value, len(sleeps.delays)


# ---- config.toml names the server ----------------------------------------------------------------


def test_a_base_url_alone_in_config_toml_is_the_server_used(heron_home, monkeypatch):
    monkeypatch.setenv("HERON_NO_EMBEDDED", "1")  # no offline model to fall back on
    with FakeOpenAIServer([ServerReply(text="from the server")]) as server:
        write_config(heron_home, f'[providers.openai]\nbase_url = "{server.base_url}"\n')
        shown = CliRunner().invoke(app, ["config", "show"]).stdout
        assert f"server:      {server.base_url} (from {CONFIG_URL})" in shown
        assert "offline fallback" not in shown and "not-needed' is sent" in shown
        result = CliRunner().invoke(app, ["run", "-c", "k", "hi"])
    assert result.exit_code == 0, result.output
    store = Store(heron_home / "heron.db")
    conversation = store.conversation("k")
    assert conversation is not None
    assert [r.message.text for r in store.branch(conversation.id)][-1] == "from the server"
    store.close()
    # what a local server gets: the model `default` and the placeholder as its bearer token
    assert server.requests[0]["model"] == "default"
    assert server.headers[0]["authorization"] == f"Bearer {PLACEHOLDER_KEY}"


@pytest.mark.parametrize("key", [None, "sk-local"])
def test_config_toml_and_the_environment_choose_the_same_model_and_window(tmp_path, key):
    url = "http://127.0.0.1:8000/v1"
    (tmp_path / "config.toml").write_text(
        f'[providers.openai]\nbase_url = "{url}"\n' + (f'api_key = "{key}"\n' if key else "")
    )
    from_config = choose_model(load_config(tmp_path / "config.toml"), {})
    env = {"HERON_BASE_URL": url} | ({"HERON_API_KEY": key} if key else {})
    from_env = choose_model(Config(), env)
    for choice in (from_config, from_env):
        assert (choice.provider, choice.model, choice.base_url) == ("openai", "default", url)
        assert choice.profile.context_window == ModelProfile().context_window == 128_000
        assert choice.api_key == (key or PLACEHOLDER_KEY)
    assert (from_config.url_source, from_env.url_source) == (CONFIG_URL, "HERON_BASE_URL")


def test_the_key_written_beside_a_configured_server_is_the_one_it_gets(tmp_path):
    """An OpenAI key in the environment went to any server config.toml named, its own key
    beside it notwithstanding: a third-party server could be sent the person's OpenAI key."""
    path = tmp_path / "config.toml"
    path.write_text(
        '[providers.openai]\nbase_url = "https://llm.example.com/v1"\napi_key = "sk-mine"\n'
    )
    env = {"OPENAI_API_KEY": "sk-openai"}
    assert choose_model(load_config(path), env).api_key == "sk-mine"
    path.write_text('base_url = "https://llm.example.com/v1"\n[providers.openai]\napi_key = "x1"\n')
    assert choose_model(load_config(path), env).api_key == "x1"
    path.write_text('[providers.openai]\nbase_url = "https://llm.example.com/v1"\n')
    # no key of its own: the placeholder (QA: the person's OpenAI key went there)
    assert choose_model(load_config(path), env).api_key == PLACEHOLDER_KEY
    assert choose_model(load_config(path), env | {"HERON_API_KEY": "h"}).api_key == "h"
    # a server HERON_BASE_URL names takes HERON_API_KEY, never OPENAI_API_KEY
    url_env = {"HERON_BASE_URL": "http://127.0.0.1:8000/v1"}
    assert choose_model(Config(), url_env | env).api_key == PLACEHOLDER_KEY
    assert choose_model(Config(), url_env | env | {"HERON_API_KEY": "h"}).api_key == "h"
    # OPENAI_BASE_URL is the SDK's pair of OPENAI_API_KEY; OpenAI itself takes its key
    sdk_env = {"OPENAI_BASE_URL": "https://proxy.example.com/v1"} | env
    assert choose_model(Config(), sdk_env).api_key == "sk-openai"
    assert choose_model(Config(), env).api_key == "sk-openai"


def test_a_named_model_or_provider_still_decides_and_public_apis_still_need_their_key(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(  # the README's example: Claude, with a local server configured beside it
        'model = "claude-sonnet-4-5"\n[providers.anthropic]\napi_key = "sk-ant-x"\n'
        '[providers.openai]\nbase_url = "http://127.0.0.1:8000/v1"\n'
    )
    assert choose_model(load_config(path), {}).provider == "anthropic"
    path.write_text('[providers.openai]\nbase_url = "https://api.openai.com/v1"\n')
    with pytest.raises(ConfigError, match="no OpenAI API key"):
        choose_model(load_config(path), {})
    openai = choose_model(load_config(path), {"OPENAI_API_KEY": "sk-x"})
    assert openai.model == "gpt-4.1-mini"  # OpenAI's own API: its default model
    path.write_text('[providers.anthropic]\nbase_url = "http://127.0.0.1:8001"\n')
    with pytest.raises(ConfigError, match="no Anthropic API key"):
        choose_model(load_config(path), {})


@pytest.mark.parametrize(
    ("cli", "env", "named"),
    [
        ("foo-bar", {}, "--model"),
        (None, {"HERON_MODEL": "gtp-4o"}, "HERON_MODEL"),
    ],
)
def test_an_unknown_model_name_without_a_key_says_it_went_to_openai(cli, env, named):
    """`heron run --model foo-bar` (a typo, no key) said only "no OpenAI API key" (QA22u L5):
    it now names the model, where it was named, and why OpenAI."""
    model = cli or env["HERON_MODEL"]
    with pytest.raises(ConfigError) as caught:
        choose_model(Config(), env, cli)
    said = caught.value.summary
    assert said.startswith("no OpenAI API key")
    assert f"{model!r} ({named})" in said and "no model Heron knows" in said
    assert "heron models" in str(caught.value.hint) and "spelling" in str(caught.value.hint)
    with pytest.raises(ConfigError) as known:  # a name Heron knows needs only the key
        choose_model(Config(), {}, "gpt-4o")
    assert known.value.summary == "no OpenAI API key"


@pytest.mark.parametrize(
    "url", ["127.0.0.1:8000/v1", "ftp://host/v1", "http:///v1", "http://h:x/v1"]
)
def test_a_malformed_base_url_is_refused_when_the_settings_load(tmp_path, url):
    path = tmp_path / "config.toml"
    for text, key in (
        (f'base_url = "{url}"\n', "base_url"),
        (f'[providers.openai]\nbase_url = "{url}"\n', "[providers.openai] base_url"),
        (f'[providers.anthropic]\nbase_url = "{url}"\n', "[providers.anthropic] base_url"),
    ):
        path.write_text(text)
        with pytest.raises(ConfigError) as caught:
            load_config(path)
        assert f"{path}: {key}" in str(caught.value) and "http://127.0.0.1:11434/v1" in str(
            caught.value
        )
    with pytest.raises(ConfigError, match=r"^HERON_BASE_URL "):
        choose_model(Config(), {"HERON_BASE_URL": url})


def test_a_run_with_a_url_without_scheme_is_refused_before_any_request(monkeypatch):
    monkeypatch.setenv("HERON_BASE_URL", "127.0.0.1:8000/v1")
    result = CliRunner().invoke(app, ["run", "hi"])
    assert result.exit_code == 2
    assert result.stderr.startswith("heron: HERON_BASE_URL must start with http:// or https://")


# ---- heron models --------------------------------------------------------------------------------


def _models_listed(heron_home, overrides: str) -> tuple[str, list[str]]:
    """`heron models` with llama3.2 in use on a server listing it and qwen2.5:7b; its server's
    URL and the lines it printed."""
    with FakeOpenAIServer([], models=["qwen2.5:7b", "llama3.2"]) as server:
        write_config(
            heron_home,
            f'model = "llama3.2"\n[providers.openai]\nbase_url = "{server.base_url}"\n' + overrides,
        )
        result = CliRunner().invoke(app, ["models"])
    assert result.exit_code == 0, result.output
    assert server.requests == []  # it only asked: GET /models, no chat
    return server.base_url, result.stdout.splitlines()


def test_heron_models_lists_the_servers_models_and_the_overrides(heron_home):
    base_url, lines = _models_listed(heron_home, '[models."qwen*"]\ncontext_window = 16000\n')
    at = lines.index(f"Models at {base_url} ({CONFIG_URL}), with the profile each would run with:")
    assert lines[at + 1].split() == ["MODEL", "WINDOW", "OUTPUT", "TOOLS"]
    assert lines[at + 2].split() == ["llama3.2", "131,072", "8,192", "native", "(in", "use)"]
    assert lines[at + 3].split() == ["qwen2.5:7b", "16,000", "8,192", "native"]  # overridden
    assert '[models."qwen*"]  context_window = 16000' in lines
    assert not lines[lines.index('[models."qwen*"]  context_window = 16000') + 1].startswith("  (")


def test_heron_models_flags_an_override_that_matches_no_model_it_knows(heron_home):
    """`[models."other*"]` matched nothing (a typo, or a model not added yet): listed as if it
    applied. A warning, not an error: the override may be for a model added later."""
    _, lines = _models_listed(heron_home, '[models."other*"]\nmax_output = 900\n')
    flagged = lines.index('[models."other*"]  max_output = 900')
    assert lines[flagged + 1] == (
        "  (matches no model here: not llama3.2, the model in use, nor any the server lists;"
        " check the pattern, or it waits for a model added later)"
    )


def test_heron_models_says_in_one_line_why_a_server_that_is_down_lists_nothing(monkeypatch):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    monkeypatch.setenv("HERON_BASE_URL", url)
    result = CliRunner().invoke(app, ["models"])
    assert result.exit_code == 1  # a script hears of it; the rest is still printed
    lines = result.stdout.splitlines()
    assert (
        f"The models at {url} (HERON_BASE_URL) could not be listed: cannot connect to {url} "
        "(HERON_BASE_URL): connection refused"
    ) in lines
    assert "Is the model server running? Start it, or check HERON_BASE_URL." in lines
    assert "Built-in profiles:" in lines  # what Heron knows is still shown


# ---- the OpenAI wire -----------------------------------------------------------------------------


async def test_a_server_that_is_down_is_retried_then_named_with_what_to_do():
    port = closed_port()
    url = f"http://user:sekrit@127.0.0.1:{port}/v1"  # credentials in a URL never show
    provider = OpenAICompatProvider("m", "sk-key", base_url=url, url_source="HERON_BASE_URL")
    error, waits = await attempt(provider)
    assert isinstance(error, TransientProviderError) and waits == 2  # retried, as before
    assert error.summary == (
        f"cannot connect to http://127.0.0.1:{port}/v1 (HERON_BASE_URL): connection refused"
    )
    assert error.hint == "Is the model server running? Start it, or check HERON_BASE_URL."
    assert "sekrit" not in str(error) and "sk-key" not in str(error)


@pytest.mark.parametrize(
    ("source", "hint"),
    [
        (None, "Check the network connection: the host's name could not be looked up."),
        ("HERON_BASE_URL", "Check the host name in HERON_BASE_URL and the network connection."),
    ],
)
def test_a_host_that_cannot_be_found_says_what_to_check_once(source, hint):
    """With a public API (no setting named its URL) the hint read "Check the host name (check
    the network connection) and the network connection." (QA22u L3)."""
    from heron.providers.endpoint import Endpoint, connection_error

    lookup = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    try:
        raise ConnectionError("connect failed") from lookup
    except ConnectionError as failed:
        error = connection_error(failed, Endpoint.of("https://api.example.com/v1", source))
    assert isinstance(error, TransientProviderError)
    assert error.summary.startswith("cannot find the host of https://api.example.com/v1")
    assert error.hint == hint


async def test_a_base_url_without_v1_fails_at_once_saying_so():
    with FakeOpenAIServer([ServerReply(text="never")]) as server:
        root = server.base_url.removesuffix("/v1")
        provider = OpenAICompatProvider("m", "k", base_url=root, url_source="HERON_BASE_URL")
        error, waits = await attempt(provider)
    assert isinstance(error, FatalProviderError) and waits == 0 and error.status == 404
    assert error.summary == f"HTTP 404 from POST {root}/chat/completions: 404 page not found"
    assert f"try {root}/v1 in HERON_BASE_URL" in str(error)
    assert "heron models" not in str(error)  # not a model the server lacks


async def test_https_to_a_plain_http_server_fails_at_once_saying_so():
    with FakeOpenAIServer([ServerReply(text="never")]) as server:
        url = server.base_url.replace("http://", "https://")
        provider = OpenAICompatProvider("m", "k", base_url=url, url_source=CONFIG_URL)
        error, waits = await attempt(provider)
    assert isinstance(error, FatalProviderError) and waits == 0
    assert error.summary.startswith(f"cannot talk TLS with {url} ({CONFIG_URL})")
    assert f"write http:// instead of https:// (check {CONFIG_URL})" in str(error)


@pytest.mark.parametrize("status", [501, 405])
async def test_a_server_without_that_method_fails_at_once_naming_the_url(status):
    with FakeOpenAIServer([ServerReply(status=status)] * 3) as server:
        provider = OpenAICompatProvider("m", "k", base_url=server.base_url)
        error, waits = await attempt(provider)
    assert isinstance(error, FatalProviderError) and waits == 0 and len(server.requests) == 1
    assert error.summary.startswith(f"HTTP {status} from POST {server.base_url}/chat/completions")
    assert "The URL looks wrong" in str(error)


@pytest.mark.slow  # the real CLI in a subprocess, and its four waits before giving up
def test_a_run_against_a_server_that_is_down_shows_its_retries_then_what_to_do(heron_home):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERON_", "OPENAI"))}
    env |= {"HERON_HOME": str(heron_home), "HERON_BASE_URL": url, "HERON_MODEL": "m"}
    result = subprocess.run(
        [sys.executable, "-m", "heron", "run", "hi"],
        env=env,
        input="",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    said = f"cannot connect to {url} (HERON_BASE_URL): connection refused"
    lines = result.stderr.splitlines()
    retries = [line for line in lines if line.startswith("[retrying in ")]
    assert len(retries) == 4 and all(line.endswith(f"s: {said}]") for line in retries)
    at = lines.index(f"heron: the turn failed: {said}")
    assert lines[at + 1] == "Is the model server running? Start it, or check HERON_BASE_URL."


# ---- the Anthropic wire --------------------------------------------------------------------------


async def test_anthropic_down_is_retried_then_named():
    port = closed_port()
    url = f"http://127.0.0.1:{port}"
    provider = AnthropicProvider("claude-x", "sk-ant-key", url, url_source="ANTHROPIC_BASE_URL")
    error, waits = await attempt(provider)
    assert isinstance(error, TransientProviderError) and waits == 2
    assert error.summary == f"cannot connect to {url} (ANTHROPIC_BASE_URL): connection refused"
    assert "check ANTHROPIC_BASE_URL" in str(error) and "sk-ant-key" not in str(error)


async def test_anthropic_base_url_with_v1_or_https_fails_at_once():
    with FakeAnthropicServer([ServerReply(text="never")] * 2) as server:
        url = server.base_url + "/v1"  # the SDK adds /v1/messages itself
        provider = AnthropicProvider("claude-x", "k", url, url_source="ANTHROPIC_BASE_URL")
        error, waits = await attempt(provider)
        assert isinstance(error, FatalProviderError) and waits == 0 and error.status == 404
        assert error.summary.startswith(f"HTTP 404 from POST {url}/v1/messages")
        assert f"try {server.base_url} in ANTHROPIC_BASE_URL" in str(error)
        tls = server.base_url.replace("http://", "https://")
        error, waits = await attempt(AnthropicProvider("claude-x", "k", tls))
        assert isinstance(error, FatalProviderError) and waits == 0
        assert "write http:// instead of https://" in str(error)
        assert server.requests == []


def test_heron_models_lists_what_the_anthropic_api_offers(monkeypatch):
    with FakeAnthropicServer([], models=["claude-opus-4-1", "claude-sonnet-4-5"]) as server:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        result = CliRunner().invoke(app, ["models"])
    lines = result.stdout.splitlines()
    at = lines.index(
        f"Models at {server.base_url} (ANTHROPIC_BASE_URL), with the profile each would run with:"
    )
    assert lines[at + 2].split() == ["claude-opus-4-1", "200,000", "32,000", "native"]
    assert lines[at + 3].split() == [
        "claude-sonnet-4-5",
        "200,000",
        "16,000",
        "native",
        "(in",
        "use)",
    ]
    assert "sk-ant-test" not in result.stdout and server.requests == []
