"""What crosses between processes as JSON: an inbound message (a workflow's input), and what
a turn sends out (a NOTIFY's payload). Parts use the record's own encoding (heron/messages.py).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, cast

from heron.bus import (
    ApprovalAsk,
    InboundMessage,
    Outbound,
    OutboundMessage,
    TurnEnd,
    TurnEvent,
    TurnOptions,
)
from heron.messages import (
    File,
    ToolCall,
    ToolResult,
    part_from_dict,
    part_to_dict,
    usage_from_dict,
    usage_to_dict,
)


def inbound_to_dict(m: InboundMessage) -> dict[str, Any]:
    d = dict(vars(m))  # every field, shallow; the nested ones are encoded below
    d["options"] = None if m.options is None else dataclasses.asdict(m.options)
    d["files"] = [part_to_dict(f) for f in m.files]
    d["meta"] = dict(m.meta)
    return d


def inbound_from_dict(d: dict[str, Any]) -> InboundMessage:
    d = dict(d)
    options = d.pop("options")
    if options is not None:
        tools = options.get("tools")
        options["tools"] = None if tools is None else tuple(tools)
        options["without"] = tuple(options.get("without") or ())
        d["options"] = TurnOptions(**options)
    d["files"] = tuple(cast(File, part_from_dict(f)) for f in d.get("files") or [])
    d["held"] = tuple(d.get("held") or ())
    return InboundMessage(**d)


def end_to_dict(end: TurnEnd) -> dict[str, Any]:
    d = dataclasses.asdict(end)
    d["usage"] = None if end.usage is None else usage_to_dict(end.usage)
    return d


def end_from_dict(d: dict[str, Any]) -> TurnEnd:
    d = dict(d)
    d["usage"] = None if d.get("usage") is None else usage_from_dict(d["usage"])
    return TurnEnd(**d)


def outbound_to_json(o: Outbound) -> str:
    if isinstance(o, OutboundMessage):
        return json.dumps({"t": "out", **dataclasses.asdict(o)})
    result = o.result
    return json.dumps(
        {
            "t": "event",
            "channel": o.channel,
            "chat_id": o.chat_id,
            "key": o.key,
            "kind": o.kind,
            "text": o.text,
            "call": None if o.call is None else part_to_dict(o.call),
            "result": None if result is None else part_to_dict(result),
            "seconds": o.seconds,
            "end": None if o.end is None else end_to_dict(o.end),
            "message_id": o.message_id,
            "provenance": o.provenance,
            "approval": None if o.approval is None else dataclasses.asdict(o.approval),
        }
    )


def outbound_from_dict(d: dict[str, Any]) -> Outbound:
    d = dict(d)
    if d.pop("t") == "out":
        return OutboundMessage(**d)
    call, result, end = d.pop("call"), d.pop("result"), d.pop("end")
    approval = d.pop("approval", None)
    return TurnEvent(
        **d,
        call=None if call is None else cast(ToolCall, part_from_dict(call)),
        result=None if result is None else cast(ToolResult, part_from_dict(result)),
        end=None if end is None else end_from_dict(end),
        approval=None if approval is None else ApprovalAsk(**approval),
    )
