"""A stored message's canonical JSON is its stored parts as they are, and a corrupt row is
encoded from its placeholder, never copied into a trace as broken JSON."""

from __future__ import annotations

import json
from pathlib import Path

from heron.messages import (
    Message,
    Text,
    ToolCall,
    ToolResult,
    dumps,
    message_json,
    message_to_dict,
)
from heron.store import Store


def test_stored_messages_encode_like_plain_ones(tmp_path: Path):
    store = Store(tmp_path / "heron.db")
    conv = store.open_conversation("c1")
    sent = [
        Message("user", [Text('héllo "quoted"\n')]),
        Message("assistant", [Text("let me look"), ToolCall("c1", "read_file", {"path": "a"})]),
        Message("user", [ToolResult("c1", "contents", False)]),
    ]
    for message in sent:
        store.append(conv.id, message)
    stored = [row.message for row in store.branch(conv.id)]
    assert [message_json(m) for m in stored] == [dumps(message_to_dict(m)) for m in sent]
    assert [message_json(m) for m in sent] == [dumps(message_to_dict(m)) for m in sent]


def test_a_corrupt_row_is_encoded_from_its_placeholder(tmp_path: Path):
    store = Store(tmp_path / "heron.db")
    conv = store.open_conversation("c1")
    row = store.append(conv.id, Message("user", [Text("fine")]))
    bad = '[{"kind": "hologram", "text": "keep me"}]'  # JSON, but no part Heron knows
    with store.transaction() as c:
        c.execute("UPDATE messages SET parts = ? WHERE id = ?", (bad, row.id))
    (stored,) = [r.message for r in store.branch(conv.id)]
    encoded = json.loads(message_json(stored))
    assert encoded["role"] == "user"
    assert encoded["parts"][0]["kind"] == "text"
    assert "could not be read" in encoded["parts"][0]["text"]
