"""A config.toml error names what is wrong without printing a value that may be a secret: a
misplaced table by its keys, a string with anything shaped like a secret masked (the error
lands in a serve's log when it fails to start)."""

from __future__ import annotations

from pathlib import Path

import pytest

from heron.config import load_config
from heron.errors import ConfigError

KEY = "sk-configfile-KEY-zzzz999988887777"
PLAIN = "hunter2-not-key-shaped"


def _error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    return f"{raised.value} {raised.value.hint or ''}"


def test_a_provider_table_in_the_wrong_place_is_named_by_its_keys(tmp_path: Path) -> None:
    """The QA's slip: `[provider]` for `[providers.openai]` printed the whole key."""
    said = _error(tmp_path, f'[provider]\napi_key = "{KEY}"\nbase_url = "{PLAIN}"\n')
    assert KEY not in said and PLAIN not in said
    assert "not a table with api_key, base_url" in said and "[providers.openai]" in said


@pytest.mark.parametrize(
    "text",
    [
        f'[tools]\nnetwork = {{ api_key = "{PLAIN}" }}\n',
        f'[review]\nenabled = {{ token = "{PLAIN}" }}\n',
        f'[agent]\nmax_model_calls = ["{PLAIN}"]\n',
        f'[tools]\nnetwork = "{KEY}"\n',
    ],
)
def test_a_wrong_value_is_described_not_printed(tmp_path: Path, text: str) -> None:
    said = _error(tmp_path, text)
    assert KEY not in said and PLAIN not in said, said
