"""A serve makes what its provider's first call needs (the `openai` SDK's import, the client)
on a worker thread before it says it is ready: the person's first message does not wait for it,
and the event loop never does it."""

from __future__ import annotations

from serve_helpers import running_serve
from test_provider_openai import clients_made

from heron.providers.openai_compat import OpenAICompatProvider
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply


async def test_the_serve_is_ready_with_its_provider_warmed() -> None:
    with FakeOpenAIServer([ServerReply(text="hi")]) as server:
        provider = OpenAICompatProvider("fake-model", "k", base_url=server.base_url)
        made = clients_made(provider)
        async with running_serve(provider):
            assert made == [False]  # made once, off the loop's thread, before the banner
        assert server.requests == []  # warming asks the model nothing
