from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from strength import examples

from heron.messages import (
    File,
    Message,
    Reply,
    Text,
    Thinking,
    ToolCall,
    ToolResult,
    Usage,
    dumps,
    from_json,
    reply_from_dict,
    reply_to_dict,
    size_label,
    to_json,
)

json_scalars = st.none() | st.booleans() | st.integers() | st.text()
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)
parts = st.one_of(
    st.builds(Text, st.text()),
    st.builds(
        ToolCall,
        st.text(min_size=1),
        st.text(min_size=1),
        st.dictionaries(st.text(), json_values, max_size=4),
    ),
    st.builds(ToolResult, st.text(), st.text(), st.booleans()),
    st.builds(Thinking, st.none() | st.text(), st.none() | st.text(), st.none() | st.text()),
    st.builds(
        File, st.text(min_size=1), st.binary(), st.none() | st.text(), pages=st.integers(0, 10**4)
    ),
)
messages = st.builds(Message, st.sampled_from(["user", "assistant"]), st.lists(parts, max_size=5))
usages = st.builds(Usage, *(st.integers(0, 10**9) for _ in range(4)))


@given(messages)
def test_message_json_round_trip_is_lossless(message):
    text = to_json(message)
    assert from_json(text) == message
    assert to_json(from_json(text)) == text  # canonical: the same bytes again


@given(st.lists(parts, max_size=5), st.sampled_from(["done", "tool", "length"]), usages)
def test_reply_round_trip(ps, stop, usage):
    reply = Reply(ps, stop, usage)
    assert reply_from_dict(json.loads(json.dumps(reply_to_dict(reply)))) == reply


@given(st.text(), st.text())
def test_thinking_provider_state_is_byte_exact(text, state):
    opaque = state + "\x00\u2028\ud7ff"
    back = from_json(to_json(Message("assistant", [Thinking(text, opaque, "anthropic")])))
    assert back.parts[0].provider_state == opaque


def test_helpers_pick_parts():
    m = Message("assistant", [Text("a"), ToolCall("1", "bash", {"command": "ls"}), Text("b")])
    assert m.text == "ab"
    assert [c.name for c in m.tool_calls] == ["bash"]
    assert Usage(1, 2, 3, 4) + Usage(1, 1, 1, 1) == Usage(2, 3, 4, 5)


@settings(max_examples=examples(500))
@given(
    st.recursive(
        st.one_of(st.text(), st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False)),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
        max_leaves=8,
    )
)
def test_dumps_is_canonical_json_for_any_value(value):
    """The direct paths for strings and ints write what the encoder would (content addressing
    relies on one value having one encoding)."""
    expected = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    assert dumps(value) == expected


def test_new_conversation_keys_have_one_shape_for_every_channel():
    import re

    from heron.messages import new_key

    made = {new_key(prefix) for prefix in ("c", "run", "web") for _ in range(3)}
    assert len(made) == 9
    assert all(re.fullmatch(r"(c|run|web)-\d{8}-\d{6}-[0-9a-f]{4}", key) for key in made)


def test_size_labels_read_at_a_glance_from_bytes_to_gigabytes():
    assert [size_label(n) for n in (812, 4096, 126_000, 4_404_019, 3_328_599_654)] == [
        "812 bytes",
        "4 kB",
        "123 kB",
        "4.2 MB",
        "3.1 GB",
    ]
