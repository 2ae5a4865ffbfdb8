"""The offline model's server process, without a model: what fails at once, what fails in the
child, and that either reaches the user as a ConfigError that says what to check."""

from __future__ import annotations

import importlib.util

import pytest

from heron.errors import ConfigError
from heron.messages import user
from heron.providers.local import LocalProvider, LocalServer
from heron.providers.profiles import profile_for
from heron.request import ChatRequest

PROFILE = profile_for("smollm2-135m-instruct")


async def test_a_missing_model_file_fails_at_open(tmp_path):
    provider = LocalProvider(LocalServer(tmp_path / "none.gguf"), "none", PROFILE)
    with pytest.raises(ConfigError, match="no model file at"):
        provider.open()
    await provider.aclose()  # nothing started: closes cleanly


@pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None, reason="needs xllamacpp")
async def test_a_file_llama_cpp_cannot_load_fails_at_the_first_request(tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_text("not a model")
    server = LocalServer(bad, ctx_size=512, profile=PROFILE)
    provider = LocalProvider(server, "notes", PROFILE)
    provider.open()  # returns at once: the child loads in the background
    request = ChatRequest("notes", "", [user("hi")], [], 8)
    with pytest.raises(ConfigError, match="did not start") as caught:
        await provider.chat(request)
    assert "GGUF" in (caught.value.hint or "")
    await provider.aclose()
    assert server._child is None  # the child is gone
