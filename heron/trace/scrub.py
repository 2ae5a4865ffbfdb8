"""Credentials never reach a trace: the secrets a process knows are searched for in everything a
recorder writes and in every export, and replaced.

Payloads are built without credentials (adapters put keys in headers), so a hit here means a
secret travelled through a message or a tool result; it is still never written.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

REDACTED = "[redacted]"
# Values that stand in for "no key" and may legitimately appear in text.
_DUMMIES = {"not-needed", "local", "replay", "none", "dummy"}
_SECRET_SUFFIXES = ("API_KEY", "_TOKEN", "_SECRET", "_PASSWORD")
MIN_SECRET = 8


@dataclass(frozen=True)
class Scrubber:
    secrets: tuple[str, ...] = ()

    @classmethod
    def of(cls, values: Iterable[str | None]) -> Scrubber:
        found = {v for v in values if v and len(v) >= MIN_SECRET and v.lower() not in _DUMMIES}
        # Longest first, so a key that contains another is replaced whole.
        return cls(tuple(sorted(found, key=len, reverse=True)))

    def clean(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def clean_opt(self, text: str | None) -> str | None:
        return None if text is None else self.clean(text)

    def found_in(self, text: str) -> bool:
        return any(secret in text for secret in self.secrets)


def secrets_in_env(env: Mapping[str, str]) -> list[str]:
    return [v for k, v in env.items() if k.upper().endswith(_SECRET_SUFFIXES)]


def scrubber_for(
    env: Mapping[str, str], config_keys: Mapping[str, str], *keys: str | None
) -> Scrubber:
    """Every credential in reach: key-like environment variables, keys from config.toml, and
    the `keys` given (the model choice's, which the provider in use was opened with)."""
    return Scrubber.of([*secrets_in_env(env), *config_keys.values(), *keys])
