"""Model providers: one adapter per wire, plus the scripted one for tests and replay."""

from __future__ import annotations

from contextlib import AsyncExitStack

from heron.providers.base import Provider
from heron.providers.profiles import PLACEHOLDER_KEY, ModelChoice

__all__ = ["Provider", "open_provider", "warm"]


async def warm(provider: Provider) -> None:
    """Load now, off the event loop, what the provider's first call would (the `openai` SDK's
    import): `heron serve` does it as it starts, so the person's first message does not wait
    for it. A provider with nothing to load is left as it is."""
    inner = getattr(provider, "inner", provider)  # FencedTools wraps the adapter
    load = getattr(inner, "warm", None)
    if load is not None:
        await load()


async def open_provider(
    choice: ModelChoice, stack: AsyncExitStack, *, start: bool = True
) -> Provider:
    """Build the adapter for `choice`; anything it starts (a local model server) is closed with
    `stack`. `start=False`: a local model loads at its first request rather than at once."""
    provider: Provider
    if choice.provider == "anthropic":
        from heron.providers.anthropic import AnthropicProvider

        assert choice.api_key is not None
        provider = AnthropicProvider(
            choice.model,
            choice.api_key,
            choice.base_url,
            profile=choice.profile,
            url_source=choice.url_source,
        )
    elif choice.provider == "openai":
        from heron.providers.openai_compat import OpenAICompatProvider

        provider = OpenAICompatProvider(
            choice.model,
            choice.api_key or PLACEHOLDER_KEY,
            choice.base_url,
            profile=choice.profile,
            url_source=choice.url_source,
        )
    elif choice.provider == "local":
        provider = _local(choice, start)
    else:
        raise ValueError(f"cannot open provider {choice.provider!r} from a ModelChoice")
    stack.push_async_callback(provider.aclose)
    if choice.profile.tool_mode == "fenced":
        from heron.providers.fenced import FencedTools

        provider = FencedTools(provider)
    return provider


def _local(choice: ModelChoice, start: bool) -> Provider:
    """The model loads in the background from here on (`start`), or from the first request
    on; that request waits for it."""
    from heron.providers.local import LocalProvider, LocalServer

    assert choice.model_path is not None
    profile = choice.profile
    server = LocalServer(choice.model_path, ctx_size=profile.context_window, profile=profile)
    provider = LocalProvider(server, choice.model, profile)
    if start:
        provider.open()  # aclose (pushed by the caller) stops the server
    return provider
