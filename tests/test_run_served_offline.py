"""`heron run` through a serve on the offline model: its notice says what to do from there (a key
set in this shell does not reach the serve: restart it, or, when this shell names a real model
already, that one), and only once a turn takes the message, never before a refusal (qa24c M2,
L6). A fake control socket stands in for the serve."""

from __future__ import annotations

from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from test_run_serve_gone import KEY, _dying_serve

from heron.channels.script import EMBEDDED_BANNER, run_remote
from heron.errors import ConfigError

ANSWERED = [
    {"type": "turn_start", "message_id": 7, "text": "hi"},
    {"type": "delta", "text": "Hello."},
    {"type": "turn_end", "ok": True, "outcome": "delivered", "reply": "Hello."},
]
REFUSED = [
    {
        "type": "error",
        "code": "refused",
        "message": "config.toml:3: malformed TOML",
        "hint": "Fix that line.",
    }
]


def _offline_serve(folder: Path, events: list[dict[str, Any]]) -> Any:
    """A serve on the offline model that answers the message with `events`."""
    return _dying_serve(folder, events, False, embedded=True, model="local/smollm2-135m-instruct")


async def _run(folder: Path, events: list[dict[str, Any]]) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    async with _offline_serve(folder, events) as path:
        await run_remote(path, "hi", "default", KEY, out, err)
    return out.getvalue(), err.getvalue()


async def test_a_shell_that_names_a_real_model_is_told_to_restart_the_serve(
    heron_home, tmp_path, monkeypatch
):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("HERON_MODEL", "gpt-4.1-mini")
    out, err = await _run(tmp_path, ANSWERED)
    assert out == "Hello.\n"
    assert EMBEDDED_BANNER not in err  # "set OPENAI_API_KEY", to one who just did
    said = " ".join(err.split())
    assert "heron serve runs the offline demo model" in said
    assert "this shell's settings name openai/gpt-4.1-mini: restart heron serve to use it" in said


async def test_a_shell_with_no_model_is_told_to_set_one_and_start_the_serve_again(
    heron_home, tmp_path, monkeypatch
):
    monkeypatch.setenv("HERON_NO_EMBEDDED", "1")
    _, err = await _run(tmp_path, ANSWERED)
    assert "or HERON_BASE_URL and start heron serve again (see README)" in err


async def test_a_refused_message_gets_no_offline_notice(heron_home, tmp_path):
    err = StringIO()
    async with _offline_serve(tmp_path, REFUSED) as path:
        with pytest.raises(ConfigError, match="malformed TOML"):
            await run_remote(path, "hi", "default", KEY, StringIO(), err)
    assert "offline" not in err.getvalue().lower()  # no model ran: nothing to say of it
