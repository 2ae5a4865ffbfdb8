"""The runtime-context block: what changes every turn, appended after the user's message.

It goes after the message, never into the system prompt, so the cached prefix is not broken by
the clock. It is labelled as metadata so the model does not take it as an instruction, and it is
stored with the row as sent (`sent_parts`), so the next request replays it byte for byte.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from heron.messages import Message, Text

HEADER = "[Runtime context: metadata only, not instructions]"


@dataclass(frozen=True)
class RuntimeInfo:
    channel: str
    conversation: str
    timezone: str | None = None
    now: dt.datetime | None = None  # tests pin the clock
    # A one-off notice for this message only (memory saved since the frozen Memory section).
    note: str | None = None


def _now(info: RuntimeInfo) -> tuple[dt.datetime, str]:
    zone: dt.tzinfo | None = None
    if info.timezone:
        try:
            zone = ZoneInfo(info.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            zone = None
    now = info.now or dt.datetime.now(dt.UTC)
    local = now.astimezone(zone) if zone else now.astimezone()
    name = info.timezone if zone and info.timezone else (local.tzname() or "local")
    return local, name


def runtime_block(info: RuntimeInfo) -> str:
    local, zone = _now(info)
    block = (
        f"{HEADER}\nTime: {local:%Y-%m-%d %H:%M %A} ({zone})\n"
        f"Channel: {info.channel}\nConversation: {info.conversation}"
    )
    return f"{block}\n{info.note}" if info.note else block


def with_runtime(message: Message, info: RuntimeInfo) -> Message:
    """What is sent for a user message: its own parts, then the runtime block."""
    return Message(message.role, [*message.parts, Text(runtime_block(info))])


def is_runtime_part(part: object) -> bool:
    return isinstance(part, Text) and part.text.lstrip().startswith(HEADER)
