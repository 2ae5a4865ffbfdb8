"""A request body is encoded once: the pieces, the text the trace records and the value the adapter
posts all agree, and the tool list and system prompt are not rebuilt while nothing changed."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from heron.context.prompt import PromptInputs, PromptMemo, ReadFiles, build_system_prompt
from heron.messages import Message, Text, dumps
from heron.providers.anthropic import build_payload
from heron.providers.openai_compat import OpenAICompatProvider
from heron.providers.scripted import ScriptedProvider
from heron.providers.wire import (
    EncodedDict,
    EncodedList,
    ToolsMemo,
    body_of,
    dumps_fields,
    encode_body,
)
from heron.request import ChatRequest, ToolSpec

READ = ToolSpec("read_file", "Read a file.", {"type": "object", "properties": {"path": {}}})
SHELL = ToolSpec("bash", "Run a command.", {"type": "object", "properties": {"cmd": {}}})

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=12,
)


@given(st.dictionaries(st.text(min_size=1), json_values, max_size=5), st.lists(json_values))
def test_encoded_body_is_the_canonical_json_of_the_value(value, messages):
    value = {**value, "messages": messages, "tools": EncodedList.of([{"name": "x"}])}
    body = encode_body(value)
    assert body.text == dumps(value)
    assert body.pieces["messages"] == [dumps(m) for m in messages]
    assert json.loads(body.text) == json.loads(dumps(value))


@given(st.dictionaries(st.text(), json_values, max_size=4), st.dictionaries(st.text(), json_values))
def test_fields_with_kept_encodings_encode_like_the_plain_value(value, inner):
    mixed = {**value, "kept": EncodedDict.of(inner), "list": EncodedList.of([inner])}
    plain = {**value, "kept": dict(inner), "list": [dict(inner)]}
    assert dumps_fields(mixed) == dumps(plain) == encode_body(mixed).text


def test_tools_memo_builds_once_for_the_same_specs_and_again_when_they_change():
    memo, built = ToolsMemo(), []

    def wire(spec: ToolSpec) -> dict:
        built.append(spec.name)
        return {"name": spec.name}

    first = memo.get([READ, SHELL], wire)
    assert memo.get([READ, SHELL], wire) is first
    assert built == ["read_file", "bash"]
    other = memo.get([READ], wire)
    assert other == [{"name": "read_file"}] and other.json == '[{"name":"read_file"}]'
    assert built == ["read_file", "bash", "read_file"]


def test_body_of_is_encoded_once_per_request_and_provider():
    provider = OpenAICompatProvider("m", "key", base_url="http://127.0.0.1:1/v1")
    request = ChatRequest("m", "be brief", [Message("user", [Text("hi")])], [READ])
    body = body_of(provider, request)
    assert body_of(provider, request) is body
    assert body.text == dumps(provider.payload(request))
    other = ScriptedProvider([])
    assert body_of(other, request) is not body  # another wire, another body
    assert body_of(other, request).text == dumps(other.payload(request))


def test_anthropic_payload_keeps_its_tool_list_between_requests():
    memo = ToolsMemo()
    one = build_payload(ChatRequest("m", "s", [Message("user", [Text("a")])], [READ]), memo)
    two = build_payload(ChatRequest("m", "s", [Message("user", [Text("b")])], [READ]), memo)
    assert one["tools"] is two["tools"]
    assert one["tools"] == [
        {
            "name": "read_file",
            "description": "Read a file.",
            "input_schema": READ.parameters,
            "cache_control": {"type": "ephemeral"},
        }
    ]


def _inputs(tmp_path: Path, memory: str = "", tools: list[ToolSpec] | None = None) -> PromptInputs:
    files = ReadFiles({"AGENTS.md": "Answer in French."})
    return PromptInputs("default", tmp_path, tools or [READ], memory=memory, bootstrap=files)


def test_prompt_memo_gives_the_same_prompt_and_finds_its_inputs(tmp_path):
    memo = PromptMemo()
    inputs = _inputs(tmp_path)
    text = memo.build(inputs)
    assert text == build_system_prompt(inputs)
    again = _inputs(tmp_path)  # equal inputs, a new object: remembered
    assert memo.build(again) is text
    assert memo.built(text).inputs is inputs
    changed = memo.build(_inputs(tmp_path, memory="- likes tea"))
    assert "likes tea" in changed and changed != text
    assert memo.build(_inputs(tmp_path, tools=[READ, SHELL])) != text
    assert memo.built("a prompt it never built") is None


def test_prompt_memo_stays_bounded(tmp_path):
    memo = PromptMemo(size=2)
    texts = [memo.build(_inputs(tmp_path, memory=f"fact {i}")) for i in range(3)]
    assert memo.built(texts[0]) is None
    assert memo.built(texts[2]) is not None


def test_prompt_memo_fingerprints_each_prompt_once(tmp_path, monkeypatch):
    from heron.context import prompt

    memo = PromptMemo()
    text = memo.build(_inputs(tmp_path))
    made: list[str] = []
    real = prompt.fingerprint
    monkeypatch.setattr(prompt, "fingerprint", lambda t: made.append(t) or real(t))
    assert memo.fingerprint(text) == memo.fingerprint(text) == real(text)
    assert made == [text]
    assert memo.fingerprint("not built here") == real("not built here")
