"""`heron run` in-process with a command no model answers (/stop, /new) on the offline model:
the model is neither loaded (its start and stop took seconds of a /stop's wait) nor named by its
banner; a message for the model still gets both (QA21r #16)."""

from __future__ import annotations

from io import StringIO

import pytest
from test_gguf import write_gguf

from heron.agent import commands
from heron.bus import MODEL_FREE_COMMANDS, needs_model
from heron.channels.script import EMBEDDED_BANNER, run_once
from heron.config import Settings
from heron.providers import local


@pytest.fixture
def starts(heron_home, monkeypatch) -> list[str]:
    """The offline model as a small GGUF file; each start of its server is counted and fails
    at once (no llama.cpp here), which a message for the model reports as its error."""
    gguf = write_gguf(heron_home / "smollm2.gguf")
    monkeypatch.setattr(local, "find_smollm2", lambda: gguf)
    monkeypatch.setattr(local.LocalServer, "check", lambda self: None)
    started: list[str] = []

    def start(self: local.LocalProvider) -> str:
        started.append(self.model)
        raise OSError("no llama.cpp in this test")

    monkeypatch.setattr(local.LocalProvider, "_start", start)
    return started


@pytest.mark.parametrize("text", ["/stop", "/new", " /status ", "/help"])
async def test_a_command_no_model_answers_neither_loads_nor_names_the_offline_model(starts, text):
    out, err = StringIO(), StringIO()
    ok = await run_once(Settings.load(), text, "default", "k", None, False, out, err)
    assert ok and out.getvalue().strip(), err.getvalue()
    assert starts == []
    assert EMBEDDED_BANNER not in err.getvalue()


async def test_a_message_for_the_model_still_loads_it_and_names_it(starts):
    out, err = StringIO(), StringIO()
    ok = await run_once(Settings.load(), "hi", "default", "k", None, False, out, err)
    assert not ok and "no llama.cpp in this test" in err.getvalue()
    assert starts == ["smollm2-135m-instruct"]
    assert EMBEDDED_BANNER in err.getvalue()


def test_the_model_free_commands_are_commands_and_only_they_skip_the_model():
    assert MODEL_FREE_COMMANDS.issubset(commands.NAMES)
    assert not needs_model("/stop") and not needs_model("  /new  ")
    assert not needs_model("/memory review")
    for text in ("/retry", "/compact", "/learn", "/goal write it", "/stopx", "stop", "/stop\nx"):
        assert needs_model(text), text
