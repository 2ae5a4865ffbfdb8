"""Where two request payloads differ (heron/trace/diff.py), a secret the trace kept redacted
included."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from heron.trace.diff import first_difference

KEY = "sk-live-4f9a8b7c6d5e4f3a2b1c"


def _payload(text: str) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}


def test_a_secret_the_trace_kept_redacted_is_no_difference():
    """qa24g M1: the trace keeps a key the person typed as `[redacted: ...]`, the conversation
    keeps it whole: replay said the unchanged run differed (exit 1) and printed the key."""
    recorded = _payload("my key is [redacted: api key], keep it safe")
    assert first_difference(recorded, _payload(f"my key is {KEY}, keep it safe")) is None


def test_a_real_change_next_to_a_redaction_is_still_found():
    recorded = _payload("my key is [redacted: api key], keep it safe")
    found = first_difference(recorded, _payload(f"my key is {KEY}, keep it close"))
    assert found is not None and found.path[-1] == "text"
    # the redaction stands for a secret, not for nothing
    assert first_difference(recorded, _payload("my key is , keep it safe")) is not None


@given(st.text(max_size=30), st.text(max_size=30))
def test_texts_without_a_redaction_compare_as_they_are(a: str, b: str):
    assert (first_difference(_payload(a), _payload(b)) is None) == (a == b)
