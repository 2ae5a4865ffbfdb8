"""The offline model's server process, without a model: what fails at once, what fails in the
child, and that either reaches the user as a ConfigError that says what to check."""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from pathlib import Path

import openai  # noqa: F401  (imported here: a client is made at once in the test below)
import pytest

from heron.errors import ConfigError
from heron.messages import user
from heron.providers import warm
from heron.providers.local import LocalProvider, LocalServer
from heron.providers.profiles import profile_for
from heron.request import ChatRequest
from heron.testing.fake_openai import FakeOpenAIServer, ServerReply

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


class _Started(LocalServer):
    """A local server that is a fake chat-completions server already running: its address is
    reported once `loaded` is set, as a model that takes a while to load."""

    def __init__(self, url: str, loaded: threading.Event) -> None:
        super().__init__(Path("fake.gguf"), profile=PROFILE)
        self.url, self.loaded = url, loaded

    def check(self) -> None:
        pass

    def spawn(self) -> None:
        pass

    def wait_ready(self) -> str:
        self.loaded.wait(30)
        self.base_url = self.url
        return self.url

    def stop(self) -> None:
        self.base_url = ""


async def test_a_serve_warming_the_offline_model_sends_its_turns_to_the_models_server():
    """`heron serve` warms its provider as it starts (heron.providers.warm): for the offline
    model that made the SDK's client before the server had an address, so every turn of the
    serve went to the SDK's default URL and failed ("cannot find the host")."""
    loaded = threading.Event()
    replies = [ServerReply(text="ok"), ServerReply(text="Paris.")]  # the warm-up's, the turn's
    with FakeOpenAIServer(replies) as server:
        provider = LocalProvider(_Started(server.base_url, loaded), "m", PROFILE)
        provider.open()
        warming = asyncio.create_task(warm(provider))  # as heron serve starts
        await asyncio.wait({warming}, timeout=0.5)
        loaded.set()  # the model has loaded
        await warming
        reply = await provider.chat(ChatRequest("m", "", [user("capital of France?")], [], 8))
        await provider.aclose()
    assert reply.text == "Paris."
