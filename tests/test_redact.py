"""heron/redact.py: what is scrubbed out of tool results and errors, and what stays readable."""

from __future__ import annotations

import pytest

from heron.errors import AuthError
from heron.redact import Redactor, configured_keys, scrub_error, scrub_patterns

KEY = "sk-test-CONFIGUREDKEY0123456789"


@pytest.mark.parametrize(
    ("secret", "kind"),
    [
        ("sk-ant-api03-abcdefghijklmnopqrstuvwx", "api key"),
        ("sk-proj-abcdefghijklmnopqrstuvwx", "api key"),
        ("ghp_abcdefghijklmnopqrstuvwxyz0123", "github token"),
        ("xoxb-1234567890-abcdefghij", "slack token"),
        ("AKIAABCDEFGHIJKLMNOP", "aws key"),
        ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abcdefghij", "json web token"),
        ("aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI2kM", "token"),
    ],
)
def test_each_kind_of_secret_is_replaced_by_its_mark(secret, kind):
    out = scrub_patterns(f"before {secret} after")
    assert out == f"before [redacted: {kind}] after"


@pytest.mark.parametrize(
    "line",
    [
        "API_KEY=abcd1234efgh",
        "DB_PASSWORD=hunter22",
        'api_key = "abcd1234efgh"',
        "SECRET: s3cr3tvalue",
        "pwd=/Xy8#k2!p",  # a password that starts with a slash is still a password
    ],
)
def test_assignments_keep_their_name_and_lose_their_value(line):
    name = line.split("=")[0].split(":")[0]
    out = scrub_patterns(line)
    assert out.startswith(name) and "[redacted: assignment]" in out
    assert line.split("=")[-1].split(":")[-1].strip(' "') not in out


def test_a_quoted_value_keeps_its_quotes():
    printed = "{'HOME': '/home/me', 'API_KEY': 'abcd1234efgh'}"
    assert scrub_patterns(printed) == "{'HOME': '/home/me', 'API_KEY': '[redacted: assignment]'}"


def test_a_pem_private_key_goes_whole():
    pem = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\nAAAA\n"
    pem += "-----END OPENSSH PRIVATE KEY-----"
    assert scrub_patterns(f"x\n{pem}\ny") == "x\n[redacted: private key]\ny"


@pytest.mark.parametrize(
    "text",
    [
        "commit 4f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a39",  # git ids stay readable
        "/home/user/projects/heron/tests/test_redact_run.py",
        "heron.memory.guard.find_secret",
        "KEYBOARD=us monkey = bananas",
        "PATH=/usr/local/bin:/usr/bin",
        "PWD=/home/user/work",  # the shell's working directory, in every `env` and os.environ
        "OLDPWD=/tmp/build-2",
        "'PWD': '/workspace/data',",
        "ssh_key: ~/.ssh/id_ed25519",  # where a key is, not the key
        "The weather in Paris is mild today.",
    ],
)
def test_ordinary_output_is_left_alone(text):
    assert scrub_patterns(text) == text


def test_configured_keys_go_even_with_the_patterns_off():
    redactor = Redactor.of([KEY, "not-needed", "short"], patterns=False)
    assert redactor.keys == (KEY,)
    text = f"HERON_API_KEY={KEY} ghp_abcdefghijklmnopqrstuvwxyz0123"
    assert redactor.clean(text) == (
        "HERON_API_KEY=[redacted: configured key] ghp_abcdefghijklmnopqrstuvwxyz0123"
    )


def test_configured_keys_come_from_config_the_provider_variables_and_credential_names():
    env = {"OPENAI_API_KEY": "a" * 20, "GITLAB_TOKEN": "b" * 20, "HOME": "/home/x"}
    found = configured_keys({"anthropic": "c" * 20}, env, "d" * 20)
    assert {"a" * 20, "b" * 20, "c" * 20, "d" * 20} <= set(found)
    assert "/home/x" not in found


def test_scrub_error_keeps_the_class_and_status_and_cleans_message_hint_and_body():
    error = AuthError(f"bad key {KEY}", status=401, body=f'{{"key": "{KEY}"}}', hint="Set it.")
    same = scrub_error(error, Redactor.of([KEY]))
    assert same is error and error.status == 401
    assert KEY not in str(error) and KEY not in (error.body or "")
    assert "[redacted: configured key]" in str(error)


def test_no_key_is_in_the_repr_of_the_configuration_or_the_model_choice(tmp_path):
    from heron.config import choose_model, load_config

    (tmp_path / "config.toml").write_text(f'[providers.openai]\napi_key = "{KEY}"\n')
    config = load_config(tmp_path / "config.toml")
    choice = choose_model(config, {})
    assert choice.api_key == KEY  # held, for the adapter to send
    assert KEY not in repr(config) and KEY not in repr(choice)


def test_only_the_lines_holding_a_credential_word_change_whatever_their_letters():
    text = "İstanbul notes\nplain line\nAPI_KEY=abcd1234efgh\nlast"
    assert (
        scrub_patterns(text) == "İstanbul notes\nplain line\nAPI_KEY=[redacted: assignment]\nlast"
    )
    long = ("ordinary words " * 3000 + "\n") * 3 + "TOKEN=abcd1234efgh\n"
    assert scrub_patterns(long) == long.replace("abcd1234efgh", "[redacted: assignment]")


@pytest.mark.parametrize("user", ["heron", ""])
def test_a_password_in_a_url_is_masked_with_or_without_a_user(user):
    """The QA's form `postgresql://:pw@host` (an empty user) came through whole."""
    out = scrub_patterns(f"url postgresql://{user}:Pw0rd@127.0.0.1:5432/heron end")
    assert "Pw0rd" not in out and "[redacted: password in a url]@127.0.0.1:5432/heron" in out
