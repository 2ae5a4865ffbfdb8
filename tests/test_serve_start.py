"""A serve makes what its provider's first call needs (the `openai` SDK's import, the client)
on a worker thread before it says it is ready: the person's first message does not wait for it,
and the event loop never does it."""

from __future__ import annotations

import threading
from typing import Any

from serve_helpers import running_serve

from heron.providers.openai_compat import OpenAICompatProvider
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply


async def test_the_serve_is_ready_with_its_provider_warmed() -> None:
    with FakeOpenAIServer([ServerReply(text="hi")]) as server:
        provider = OpenAICompatProvider("fake-model", "k", base_url=server.base_url)
        made: list[bool] = []
        make = provider.client

        def client() -> Any:
            made.append(threading.current_thread() is threading.main_thread())
            return make()

        provider.client = client  # type: ignore[method-assign]
        async with running_serve(provider):
            assert made == [False]  # made once, off the loop's thread, before the banner
        assert server.requests == []  # warming asks the model nothing
