from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from strength import examples

from heron.context.repair import is_well_formed
from heron.context.tokens import Calibration, estimate_messages
from heron.context.view import (
    Said,
    ViewOptions,
    ViewPlan,
    budgeted,
    derive_view,
    not_shown_whole,
    placeholder_count,
    snip,
    turn_starts,
)
from heron.messages import Message, Text, ToolCall, ToolResult
from heron.saved import cut_middle
from heron.store.records import StoredMessage


def rows_of(messages: list[Message]) -> list[StoredMessage]:
    return [
        StoredMessage(i + 1, 1, i or None, None, "message", m, None, 0.0)
        for i, m in enumerate(messages)
    ]


def recall_pair(call_id: str, found: str = "[c · message 2] old words") -> list[Message]:
    """Auto-recall's call and result, as heron/memory/auto.py stores them before a message."""
    call = ToolCall(call_id, "recall_history", {"query": "old words", "limit": 1})
    return [Message("assistant", [call]), Message("user", [ToolResult(call_id, found)])]


@st.composite
def histories(draw):
    """Random conversations: turns of text, tool rounds (some calls unanswered, as after a
    crash), mail riding with results, and stray results without a call."""
    messages: list[Message] = []
    n = 0
    for _ in range(draw(st.integers(1, 8))):
        if draw(st.integers(0, 3)) == 0:  # auto-recall's pair, stored before the message
            messages += recall_pair(f"ar{len(messages)}")
        messages.append(Message("user", [Text(f"u{len(messages)}")]))
        for _ in range(draw(st.integers(0, 4))):
            calls = []
            for _ in range(draw(st.integers(1, 3))):
                n += 1
                calls.append(
                    ToolCall(
                        f"c{n}",
                        draw(st.sampled_from(["read_file", "bash", "write_file"])),
                        {"path": "p"},
                    )
                )
            messages.append(Message("assistant", [Text("working"), *calls]))
            answered = [c for c in calls if draw(st.booleans()) or draw(st.booleans())]
            parts = [ToolResult(c.id, "r" * draw(st.integers(0, 400))) for c in answered]
            if draw(st.integers(0, 9)) == 0:
                parts.append(ToolResult("stray", "no call"))
            if draw(st.integers(0, 9)) == 0:
                parts.append(Text("mail from the user"))
            if parts:
                messages.append(Message("user", parts))
        if draw(st.booleans()):
            messages.append(Message("assistant", [Text("answer")]))
    return messages


@settings(max_examples=examples(300), deadline=None)
@given(histories(), st.data())
def test_view_never_holds_an_orphaned_call_or_result(messages, data):
    rows = rows_of(messages)
    ids = [r.id for r in rows]
    folded = data.draw(st.sampled_from([None, *ids]))
    compacted = frozenset(data.draw(st.lists(st.sampled_from(ids), max_size=6)))
    anchor = data.draw(st.sampled_from(ids))
    plan = ViewPlan(folded, compacted, {anchor: "checkpoint"})
    view = derive_view(rows, plan, ViewOptions(result_chars=150))
    assert is_well_formed(view)
    assert not view or view[0].role == "user"
    budget = data.draw(st.integers(10, 400))
    assert is_well_formed(snip(view, budget, Calibration()))


def reads(k: int) -> list[Message]:
    out = [Message("user", [Text("read them")])]
    for i in range(k):
        out.append(Message("assistant", [ToolCall(f"r{i}", "read_file", {"path": f"f{i}.txt"})]))
        out.append(Message("user", [ToolResult(f"r{i}", f"content {i} " + "z" * 300)]))
    return out


def intact(view: list[Message]) -> int:
    return sum(1 for m in view for r in m.tool_results if r.content.startswith("content"))


def test_micro_compaction_goes_ten_at_a_time_keeping_5_to_14():
    assert [placeholder_count(k) for k in (4, 14, 15, 24, 25, 34, 35)] == [0, 0, 10, 10, 20, 20, 30]
    for k in range(1, 40):
        view = derive_view(rows_of(reads(k)), ViewPlan())
        kept = intact(view)
        assert kept == k if k < 15 else 5 <= kept <= 14


def test_the_prefix_breaks_once_per_ten_results():
    breaks = 0
    previous = derive_view(rows_of(reads(1)), ViewPlan())
    for k in range(2, 45):
        view = derive_view(rows_of(reads(k)), ViewPlan())
        if view[: len(previous)] != previous:
            breaks += 1
        previous = view
    assert breaks == 3  # at 15, 25 and 35 results


def test_placeholders_keep_saved_paths_and_say_not_to_rerun_commands(tmp_path):
    messages = [Message("user", [Text("go")])]
    for i in range(16):
        name = "bash" if i == 0 else "read_file"
        messages.append(
            Message("assistant", [ToolCall(f"k{i}", name, {"command": "make", "path": "a"})])
        )
        body = "out " * 100 + ("saved in .heron/results/k1.txt; read it" if i == 1 else "")
        messages.append(Message("user", [ToolResult(f"k{i}", body)]))
    view = derive_view(rows_of(messages), ViewPlan(), ViewOptions(workspace=tmp_path))
    first, second = view[2].tool_results[0].content, view[4].tool_results[0].content
    assert "Do not run the call again" in first and "bash(" in first
    (saved,) = (tmp_path / ".heron/results").glob("k0-*.txt")
    assert saved.read_text().startswith("out out") and saved.name in first
    assert ".heron/results/k1.txt" in second and len(second) < 200


def test_a_result_over_the_budget_shows_its_head_and_where_it_is(tmp_path):
    messages = [
        Message("user", [Text("go")]),
        Message("assistant", [ToolCall("big", "run_cell", {"code": "x"})]),
        Message("user", [ToolResult("big", "\n".join(f"row {i}" for i in range(5000)))]),
    ]
    view = derive_view(rows_of(messages), ViewPlan(), ViewOptions(1000, tmp_path))
    shown = view[2].tool_results[0].content
    assert shown.startswith("row 0\nrow 1") and len(shown) < 1200
    (saved,) = (tmp_path / ".heron/results").glob("big-*.txt")
    assert f".heron/results/{saved.name}" in shown
    assert saved.read_text() == messages[2].tool_results[0].content


def test_snip_keeps_the_newest_words_verbatim_and_points_at_the_rest():
    messages = []
    for i in range(20):
        messages += [
            Message("user", [Text(f"ask {i} " + "w" * 200)]),
            Message("assistant", [Text("ok " * 50)]),
        ]
    ids = [Said(100 + i, f"ask {i} " + "w" * 200, True) for i in range(20)]
    cut = snip(messages, 600, Calibration(), record=ids)
    assert estimate_messages(cut) <= 600  # the note itself fits: the bug was an unbounded note
    text = "".join(p.text for m in cut for p in m.parts if isinstance(p, Text))
    kept = [i for i in range(20) if f"ask {i} " + "w" * 200 in text]
    dropped = [i for i in range(20) if i not in kept]
    # every message is whole in the view, named by its row id, or inside a range of row ids
    spans = [tuple(map(int, m)) for m in re.findall(r"\[#(\d+)–#(\d+)\]", text)]
    for i in dropped:
        assert f"[#{100 + i}]" in text or any(a <= 100 + i <= b for a, b in spans)
    assert kept and kept == list(range(kept[0], 20))  # the newest are the verbatim ones


def test_snip_of_one_huge_old_message_points_at_it():
    huge = "paste " + "x" * 50_000
    messages = [Message("user", [Text(huge)]), Message("assistant", [Text("ok")])]
    messages += [Message("user", [Text("next")]), Message("assistant", [Text("fine")])]
    cut = snip(messages, 2_000, Calibration(), record=[Said(7, huge, True)])
    text = "".join(p.text for m in cut for p in m.parts if isinstance(p, Text))
    assert huge not in text and "[#7] paste" in text
    assert estimate_messages(cut) <= 2_000


def test_reused_call_ids_are_paired_with_the_call_just_before():
    # Some servers number calls per reply (call_0 every time): results pair by position.
    messages = [Message("user", [Text("go")])]
    for i in range(16):
        name = "read_file" if i % 2 else "write_file"
        messages.append(Message("assistant", [ToolCall("call_0", name, {"path": f"f{i}"})]))
        messages.append(Message("user", [ToolResult("call_0", f"result {i} " + "q" * 300)]))
    view = derive_view(rows_of(messages), ViewPlan())
    shown = [m.tool_results[0].content for m in view if m.tool_results]
    assert all(s.startswith(f"result {i}") for i, s in enumerate(shown) if i % 2 == 0)


def test_a_view_opening_with_heron_s_lookup_points_to_a_summary_only_when_one_exists():
    """A view opens with the user's side: before an opening assistant message (auto-recall's
    lookup before an edited first message) it says the conversation starts there, and names
    the archived summary only when a fold made one."""
    from heron.context.view import EARLIER, OPENING

    call = ToolCall("r1", "recall_history", {"query": "capybara"})
    messages = [
        Message("assistant", [call]),
        Message("user", [ToolResult("r1", "[br · message 2] old")]),
        Message("user", [Text("where is the festival")]),
    ]
    fresh = derive_view(rows_of(messages), ViewPlan())
    assert fresh[0].role == "user" and fresh[0].text == OPENING
    earlier = [Message("user", [Text("old question")]), Message("assistant", [Text("old")])]
    folded = derive_view(rows_of(earlier + messages), ViewPlan(folded_upto=2))
    assert folded[0].text == EARLIER and is_well_formed(folded)


def test_rows_snipped_folded_or_cut_are_not_shown_whole():
    """What recall_history may still return of a conversation: the rows its view does not
    show whole. A row kept as it is counts as shown, a checkpoint or snip note added to it
    too; one snipped away, folded in flight or cut to head and tail does not. Rows folded by
    the consolidation are not in the view at all: they are not counted."""
    said = [Message("user", [Text(f"turn {i}: " + "words " * 200)]) for i in range(8)]
    messages = [m for s in said for m in (s, Message("assistant", [Text("ok")]))]
    messages.append(Message("user", [Text("x" * 40_000)]))  # over its share of the view
    rows = rows_of(messages)
    plan = ViewPlan(folded_upto=2, compacted=frozenset({5}), checkpoints={3: "so far"})
    view = derive_view(rows, plan, ViewOptions(user_chars=2_000))
    assert not_shown_whole(rows, plan, view) == {5, 17}  # folded in flight, cut
    fitted = snip(view, 1_500, Calibration())
    dropped = not_shown_whole(rows, plan, fitted)
    assert {3, 5, 17} <= dropped and 16 not in dropped
    kept = [r.id for r in rows[2:] if r.id not in dropped]
    assert kept and all(r > max(dropped - {17}) for r in kept)


def test_a_turn_starts_at_its_auto_recall_pair():
    """Auto-recall's pair is stored just before the message it was found for: the turn starts
    there, so a cut (a fold, a snip) never keeps the message and drops its evidence."""
    ask = Message("user", [Text("what did I say")])
    messages = [Message("user", [Text("hi")]), Message("assistant", [Text("hello")])]
    messages += [*recall_pair("ar1"), ask, Message("assistant", [Text("you said")])]
    assert turn_starts(messages) == [2]
    assert turn_starts(messages, 2) == []  # the first turn after a fold at the pair: no cut
    # the model's own recall_history call in a turn is not auto-recall's pair
    own = [Message("user", [Text("look it up")]), *recall_pair("c1"), ask]
    own[1] = Message("assistant", [Text("Let me look."), *own[1].parts])
    assert turn_starts(own) == [3]


def test_snip_keeps_a_turns_auto_recall_with_its_message():
    old = [Message("user", [Text("read it")]), Message("assistant", [Text("x " * 2_000)])]
    found = "[c · message 2] My passport expires on 12 March 2031."
    messages = [*old, *recall_pair("ar1", found), Message("user", [Text("When does it expire?")])]
    cut = snip(messages, 300, Calibration())
    assert is_well_formed(cut) and cut[0].role == "user"
    assert any(found in r.content for m in cut for r in m.tool_results)
    assert cut[-1].text == "When does it expire?"


def _one_result(name: str, content: str) -> list[Message]:
    return [
        Message("user", [Text("go")]),
        Message("assistant", [ToolCall("c", name, {"command": "make"})]),
        Message("user", [ToolResult("c", content, True)]),
    ]


def test_a_result_over_the_budget_keeps_its_end_the_exit_code_and_footer(tmp_path):
    """The view's cut keeps head and tail: a command's error and exit code, read_file's
    footer, run_cell's note are a result's last lines (the bug: the head only)."""
    body = "".join(f"compiling unit {i}\n" for i in range(3000))
    content = body + "FATAL: undefined symbol bar\n[exit code 2]"
    messages = _one_result("bash", content)
    opts = ViewOptions(1000, tmp_path)
    shown = derive_view(rows_of(messages), ViewPlan(), opts)[2].tool_results[0].content
    assert shown.startswith("compiling unit 0\n")
    assert shown.endswith("compiling unit 2999\nFATAL: undefined symbol bar\n[exit code 2]")
    head, line, tail = re.split(r"\n(\[\.\.\. .*\])\n", shown)
    left = len(content) - len(head) - len(tail)
    assert line.startswith(f"[... {left:,} of {len(content):,} characters left out here.")
    assert len(head) + len(tail) <= 1000
    (saved,) = (tmp_path / ".heron/results").glob("c-*.txt")
    assert f"saved in .heron/results/{saved.name}" in line
    again = derive_view(rows_of(messages), ViewPlan(), opts)[2].tool_results[0].content
    assert again == shown  # the same bytes in every later request: the cached prefix holds


def test_a_result_the_tool_cut_is_cut_again_with_one_count_of_the_original(tmp_path):
    """A command's output the bash tool kept head and tail of: the view takes from its head
    and its tail and says once how much of what the command printed is left out (the bug:
    the tool's "omitted" line stayed inside, under a second count of the tool's text)."""
    head = "".join(f"line {i}\n" for i in range(1000))
    tail = "".join(f"line {i}\n" for i in range(9000, 10000)) + "[exit code 1]"
    content = f"{head}\n[... 50000 characters omitted ...]\n{tail}"
    shown = budgeted(ToolResult("c", content), 2000, tmp_path).content
    assert shown.count("[...") == 1 and "50000 characters omitted" not in shown
    assert shown.startswith("line 0\n") and shown.endswith("line 9999\n[exit code 1]")
    first, line, last = re.split(r"\n(\[\.\.\. .*\])\n", shown)
    total = len(head) + 50_000 + len(tail)
    left = total - len(first) - len(last)
    assert line.startswith(f"[... {left:,} of {total:,} characters left out here.")
    (saved,) = (tmp_path / ".heron/results").glob("c-*.txt")
    assert saved.read_text() == content
    assert f"What the tool returned ({len(content):,} characters) is saved in" in line


def test_a_result_the_registry_cut_points_to_the_file_it_saved(tmp_path):
    """The registry cut a result to its budget and saved all of it; the view's smaller cut
    names that file (which holds the whole) and counts from the original."""
    original = "".join(f"row {i}\n" for i in range(20_000)) + "[lines 1-20000 of 90000]"
    where = " The full result is saved in .heron/results/r-0123456789.txt; read it."
    stored = cut_middle(original, 5000).text(where)
    shown = budgeted(ToolResult("r", stored), 1000, tmp_path).content
    assert shown.count("[...") == 1 and shown.endswith("row 19999\n[lines 1-20000 of 90000]")
    first, line, last = re.split(r"\n(\[\.\.\. .*\])\n", shown)
    left = len(original) - len(first) - len(last)
    assert line.startswith(f"[... {left:,} of {len(original):,} characters left out here.")
    assert "The full result is saved in .heron/results/r-0123456789.txt" in line
    assert not (tmp_path / ".heron").exists()  # nothing saved twice
