"""`heron conversations search` and `heron conversations export` (heron/channels/export.py),
through the CLI as a person runs them, on SQLite and on PostgreSQL (`home_db`): search shares
`heron memory recall`'s function; export writes the current branch whole, as Markdown or as
JSON whose parts decode back to the stored messages; and the route the browser downloads from.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strength import examples
from typer.testing import CliRunner

from heron.channels.export import as_json, fenced, to_markdown
from heron.channels.info import known, read_record
from heron.cli import app
from heron.config import Settings
from heron.messages import (
    File,
    Message,
    Text,
    Thinking,
    ToolCall,
    ToolResult,
    Usage,
    parts_from_json,
    user,
)
from heron.store import Store, goals, runs

# The CLI tests once per backend: the home's SQLite file, and PostgreSQL (tests/pg.py).
both = pytest.mark.usefixtures("home_db")

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 40
# Longer than `show`'s cuts (200 and 300 characters), with runs of backticks inside.
LONG_ARG = "echo " + "wading bird " * 40
RESULT = "notes:\n```py\nprint('heron')\n```\nand a longer run: ```` here\n" + "x" * 400
REPLY = "The heron statue is in Lisbon. " * 12


def _record(store: Store) -> dict[str, Any]:
    """Conversation `trip`: a turn with an attachment, reasoning, a tool call whose arguments
    and result are long, an `ask_user` question answered, a goal, a second turn, and Heron's
    own note; `other` holds a message with the same words."""
    conv = store.open_conversation("trip")
    store.set_title(conv.id, "Plan my trip to the heron statue")  # as the first turn names it
    asked = Message(
        "user", [Text("Plan my trip to the heron statue"), File("image/png", PNG, "map.png")]
    )
    turn, first = store.begin_turn(conv.id, "run-one", asked, model="scripted")
    call = ToolCall("c1", "bash", {"command": LONG_ARG})
    store.append(
        conv.id, Message("assistant", [Thinking("Look first."), Text("Let me look."), call]),
        turn_id=turn,
    )  # fmt: skip
    store.append(conv.id, Message("user", [ToolResult("c1", RESULT)]), turn_id=turn)
    question = ToolCall("c2", "ask_user", {"question": "Which city?"})
    store.append(conv.id, Message("assistant", [question]), turn_id=turn)
    runs.create(store, "ask_1", "ask", "trip", "Which city?", status="waiting", call_id="c2")
    runs.finish(store, "ask_1", "answered", "Lisbon")
    store.append(
        conv.id, Message("user", [ToolResult("c2", "The user answered: Lisbon")]), turn_id=turn
    )
    store.append(conv.id, Message("assistant", [Text(REPLY)]), turn_id=turn)
    store.finish_turn(
        turn, status="done", stop_reason="done", usage=Usage(50, 9), model_calls=3, tool_calls=2
    )
    goals.set_goal(store, "trip", "Book the whole trip")
    turn2, _ = store.begin_turn(conv.id, "run-two", user("and the hotel near the statue?"))
    store.append(conv.id, Message("user", [Text("Continue.")]), turn_id=turn2, author="heron")
    store.append(conv.id, Message("assistant", [Text("Hotel Garça.")]), turn_id=turn2)
    store.finish_turn(
        turn2, status="done", stop_reason="done", usage=Usage(9, 2), model_calls=1, tool_calls=0
    )
    goals.end_goal(store, "trip", "done", "booked")  # a serve would nudge an open one on
    other = store.open_conversation("other")
    store.append(other.id, user("a heron statue in Porto too"))
    return {"first": first.id}


@pytest.fixture
def home(home_db: object) -> dict[str, Any]:
    store = Store(Settings.load().database)
    try:
        return _record(store)
    finally:
        store.close()


def heron(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


# ---- search -------------------------------------------------------------------------------------


def test_search_prints_key_date_message_who_and_snippet_then_how_to_open(home):
    out = heron("conversations", "search", "heron statue")
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    day = time.strftime("%Y-%m-%d")
    first = next(line for line in lines if f"message {home['first']} " in line)
    assert first.startswith(f"[trip · {day}") and f"· message {home['first']} · you]" in first
    assert "heron statue" in first
    assert any(line.startswith("[other · ") for line in lines)
    key, number = re.match(r"\[(\S+) · .* · message (\d+) · ", lines[0]).groups()  # type: ignore[union-attr]
    assert lines[-1] == (  # the best hit, ready to open (QA: it named the whole conversation)
        f"Open one: heron conversations show {key} --message {number} (that message whole, "
        "with its neighbours)"
    )


def test_show_message_prints_one_message_whole_with_its_neighbours(home):
    """A hit said `message 11`, and opening it meant reading the whole conversation (922
    messages): `--message N` prints that one whole, with two either side."""
    result = home["first"] + 2  # the bash call's long result, cut to 300 characters in `show`
    out = heron("conversations", "show", "trip", "--message", str(result))
    assert out.exit_code == 0, out.output
    text = out.stdout
    assert f"── message {result} · " in text and "(the one asked for)" in text
    assert "x" * 400 in text  # whole
    assert "Plan my trip to the heron statue" in text  # two before
    assert "Which city?" in text and "Lisbon" in text  # two after
    assert "Hotel Garça" not in text  # not the rest
    missing = heron("conversations", "show", "trip", "--message", "999")
    assert missing.exit_code == 1 and "no message 999 in conversation trip" in missing.output


def test_search_within_one_conversation_and_its_last_line_names_it(home):
    out = heron("conversations", "search", "heron statue", "-c", "trip")
    assert out.exit_code == 0, out.output
    hits = out.stdout.splitlines()[:-1]
    assert hits and all(line.startswith("[trip · ") for line in hits)
    assert out.stdout.splitlines()[-1].startswith(
        "Open one: heron conversations show trip --message "
    )
    # A row Heron wrote is Heron's, never the person's.
    note = heron("conversations", "search", "continue", "-c", "trip")
    assert "· heron] Continue." in note.stdout


def test_search_json_is_one_array_of_hits(home):
    out = heron("conversations", "search", "heron statue", "--json", "-n", "3")
    assert out.exit_code == 0, out.output
    hits = json.loads(out.stdout)
    assert isinstance(hits, list) and 0 < len(hits) <= 3
    assert set(hits[0]) == {
        "key",
        "message_id",
        "created",
        "date",
        "role",
        "who",
        "snippet",
        "score",
        "on_branch",
        "times",
    }
    mine = next(h for h in hits if h["message_id"] == home["first"])
    assert (mine["key"], mine["role"], mine["who"]) == ("trip", "user", "you")
    nothing = heron("conversations", "search", "zebra", "--json")
    assert nothing.exit_code == 0 and json.loads(nothing.stdout) == []


def test_search_exact_lists_only_the_messages_holding_the_phrase_newest_first(home):
    """A ranked search lends scores to a hit's neighbours and matches by meaning; --exact is
    the phrase a person remembers, and nothing else."""
    ranked = heron("conversations", "search", "heron statue", "-n", "20").stdout.splitlines()
    out = heron("conversations", "search", "--exact", "Heron Statue", "-n", "20")
    assert out.exit_code == 0, out.output
    hits = out.stdout.splitlines()[:-1]
    assert hits and all("heron statue" in line.lower() for line in hits)
    assert len(hits) < len(ranked) - 1  # the ranked one shows rows without the phrase too
    ids = [int(line.split("· message ")[1].split(" ")[0]) for line in hits]
    assert ids == sorted(ids, reverse=True)  # newest first
    assert hits[0].startswith("[other · ")  # the last message stored
    porto = heron("conversations", "search", "-e", "statue in porto", "--json")
    assert [h["key"] for h in json.loads(porto.stdout)] == ["other"]
    reordered = heron("conversations", "search", "--exact", "statue heron")
    [said] = reordered.stdout.splitlines()
    assert reordered.exit_code == 0 and said.startswith("Nothing found. Try fewer or other words")
    assert "(without --exact)" in said  # what to try next, not a dead end


def test_nothing_found_says_what_to_try():
    from heron.channels.memory_cli import nothing_found

    said = nothing_found("Halvorson", exact=False, meanings=False)
    assert "as it was written" in said and "[embeddings]" in said and "fewer" not in said
    assert "[embeddings]" not in nothing_found("Halvorson", exact=False, meanings=True)


def test_search_in_an_unknown_conversation_says_how_to_find_one(home):
    out = heron("conversations", "search", "heron", "-c", "nope")
    assert out.exit_code == 1
    assert "no conversation 'nope'" in out.stderr and "heron conversations list" in out.stderr


def test_memory_recall_is_the_same_search(home):
    """One function prints both: the same hits, lines and last line."""
    searched = heron("conversations", "search", "heron statue")
    recalled = heron("memory", "recall", "heron statue")
    assert recalled.exit_code == 0 and recalled.stdout == searched.stdout


# ---- export -------------------------------------------------------------------------------------


def test_markdown_export_is_whole_with_turns_authors_tools_question_goal_and_files(home):
    out = heron("conversations", "export", "trip")
    assert out.exit_code == 0, out.output
    md = out.stdout
    assert md.startswith("# Plan my trip to the heron statue\n")
    assert "## Turn 1 · " in md and "## Turn 2 · " in md
    assert md.index("## Turn 1") < md.index("**Goal set** (done): Book the whole trip")
    assert md.index("Book the whole trip") < md.index("## Turn 2")
    assert f"**you** · message {home['first']} · " in md
    assert "you attached `map.png` (image/png, 48 bytes, sha256 " in md
    assert "> Look first." in md  # reasoning, whole
    assert REPLY.strip() in md  # no cut
    # The call's arguments and its result whole, each in a fence no backtick run inside closes.
    assert LONG_ARG in md and fenced(RESULT) in md and fenced(RESULT).startswith("`````\n")
    assert "Tool call `bash` (`c1`):" in md and "Result of `bash` (`c1`):" in md
    # The question and the answer, not the tool's call and result.
    assert "**assistant asks:**\n\n> Which city?" in md and "**you** answered:\n\n> Lisbon" in md
    assert "The user answered" not in md
    assert "**heron** · message" in md and "Continue." in md
    assert md.count("**tool** · message") == 1  # the answered question's result shows nothing
    assert PNG.decode("latin-1") not in md


def test_json_export_shape_and_parts_decode_to_the_stored_messages(home):
    out = heron("conversations", "export", "trip", "--format", "json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert [doc[k] for k in ("key", "title", "agent")] == [
        "trip",
        "Plan my trip to the heron statue",
        "default",
    ]
    assert {"version", "key", "title", "agent", "created", "updated", "messages"} <= set(doc)
    store = Store(Settings.load().database)
    try:
        rows = store.branch(known(store, "trip").id)
    finally:
        store.close()
    assert [m["id"] for m in doc["messages"]] == [r.id for r in rows]
    for m, row in zip(doc["messages"], rows, strict=True):
        assert set(m) == {"id", "role", "author", "kind", "created", "turn", "parts"}
        assert parts_from_json(json.dumps(m["parts"])) == list(row.message.parts)
    authors = [m["author"] for m in doc["messages"]]
    turn_one = ["you", "assistant", "tool", "assistant", "tool", "assistant"]
    assert authors == [*turn_one, "you", "heron", "assistant"]
    assert [m["turn"] for m in doc["messages"]] == [1] * 6 + [2] * 3
    file = doc["messages"][0]["parts"][1]
    assert file["kind"] == "file" and file["size"] == len(PNG) and "data" not in file
    assert doc["questions"] == [
        {
            "message_id": doc["messages"][3]["id"],
            "call_id": "c2",
            "question": "Which city?",
            "status": "answered",
            "answer": "Lisbon",
            "asked": doc["questions"][0]["asked"],
        }
    ]
    assert [(g["objective"], g["status"]) for g in doc["goals"]] == [
        ("Book the whole trip", "done")
    ]
    assert [t["turn"] for t in doc["turns"]] == [1, 2] and doc["turns"][0]["usage"]["input"] == 50


def test_a_turn_stopped_before_its_usage_came_says_so_in_show_and_export(home):
    """0 tokens would read as a free call: the provider billed one it never counted here."""
    store = Store(Settings.load().database)
    try:
        conv = store.open_conversation("cut")
        turn, _ = store.begin_turn(conv.id, "run-cut", user("tell me a long story"))
        store.append(conv.id, Message("assistant", [Text("Once upon")]), turn_id=turn)
        store.finish_turn(
            turn, status="interrupted", stop_reason="stale", usage=Usage(0, 0),
            model_calls=1, tool_calls=0, usage_unknown=True,
        )  # fmt: skip
    finally:
        store.close()
    shown = heron("conversations", "show", "cut")
    assert "not all counted: a model call was stopped before its usage came" in shown.stdout
    doc = json.loads(heron("conversations", "export", "cut", "--format", "json").stdout)
    assert doc["turns"][0]["usage_unknown"] is True
    trip = json.loads(heron("conversations", "export", "trip", "--format", "json").stdout)
    assert [t["usage_unknown"] for t in trip["turns"]] == [False, False]
    assert "not all counted" not in heron("conversations", "show", "trip").stdout


def test_export_to_a_file_refuses_to_overwrite_without_force(home, tmp_path: Path):
    target = tmp_path / "trip.json"
    out = heron("conversations", "export", "trip", "-o", str(target))
    assert out.exit_code == 0, out.output
    assert f"to {target.resolve()}" in out.stdout and "json" in out.stdout  # told by the name
    assert json.loads(target.read_text())["key"] == "trip"
    again = heron("conversations", "export", "trip", "-o", str(target), "--format", "md")
    assert again.exit_code == 2 and "exists" in again.stderr and "--force" in again.stderr
    assert json.loads(target.read_text())["key"] == "trip"  # untouched
    forced = heron("conversations", "export", "trip", "-o", str(target), "-f", "md", "--force")
    assert forced.exit_code == 0 and target.read_text().startswith("# Plan my trip")


def test_export_refuses_an_unknown_key_and_format(home):
    unknown = heron("conversations", "export", "nope")
    assert unknown.exit_code == 1 and "heron conversations list" in unknown.stderr
    bad = heron("conversations", "export", "trip", "--format", "pdf")
    assert bad.exit_code == 2 and "--format markdown" in bad.stderr


def test_a_corrupt_row_exports_as_shows_placeholder(home):
    store = Store(Settings.load().database)
    try:
        with store.transaction() as c:
            c.execute("UPDATE messages SET parts = ? WHERE id = ?", ('{"a":1}', home["first"]))
    finally:
        store.close()
    placeholder = f"[message #{home['first']} could not be read (parts must be a list, not dict)"
    shown = heron("conversations", "show", "trip")
    md = heron("conversations", "export", "trip")
    js = heron("conversations", "export", "trip", "-f", "json")
    assert shown.exit_code == md.exit_code == js.exit_code == 0, md.output + js.output
    assert placeholder in shown.stdout and placeholder in md.stdout
    first = json.loads(js.stdout)["messages"][0]
    assert first["parts"][0]["text"].startswith(placeholder)


@both
def test_markdown_closes_a_fence_a_message_left_open():
    store = Store(Settings.load().database)
    try:
        conv = store.open_conversation("open")
        store.append(conv.id, user("look:\n```py\nprint('never closed')"))
        store.append(conv.id, Message("assistant", [Text("After it.")]))
        md = to_markdown(read_record(store, conv), "UTC")
    finally:
        store.close()
    assert "print('never closed')\n```\n\n**assistant**" in md


# ---- the browser's download route ----------------------------------------------------------------


async def test_the_export_route_downloads_what_the_cli_writes_behind_the_login(home):
    """GET /api/conversations/{key}/export through the real `heron serve` with a login
    required: refused without the session cookie, else the CLI's export as an attachment."""
    from serve_helpers import running_serve

    from heron.providers.scripted import ScriptedProvider

    route = "/api/conversations/trip/export"
    async with running_serve(ScriptedProvider([])) as served:
        async with served.http(cookies={}) as anonymous:
            refused = await anonymous.get(route, params={"format": "md"})
        async with served.http() as client:
            md = await client.get(route, params={"format": "md"})
            js = await client.get(route, params={"format": "json"})
            plain = await client.get(route)  # Markdown unless asked
            missing = await client.get("/api/conversations/nope/export")
            bad = await client.get(route, params={"format": "pdf"})
    assert refused.status_code == 401
    assert md.status_code == js.status_code == plain.status_code == 200
    assert md.headers["content-disposition"] == 'attachment; filename="heron-trip.md"'
    assert js.headers["content-disposition"] == 'attachment; filename="heron-trip.json"'
    assert md.headers["content-type"].startswith("text/markdown")
    assert md.text == plain.text == heron("conversations", "export", "trip").stdout
    assert js.json() == json.loads(heron("conversations", "export", "trip", "-f", "json").stdout)
    assert (
        missing.status_code == 404
        and "no conversation 'nope'" in missing.json()["detail"]["message"]
    )
    assert bad.status_code == 400 and "json" in bad.json()["detail"]["hint"]


# ---- the JSON's parts, for any message ---------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
parts = st.one_of(
    st.builds(Text, st.text()),
    st.builds(
        ToolCall, st.text(min_size=1), st.text(min_size=1),
        st.dictionaries(st.text(), json_values, max_size=3),
    ),
    st.builds(ToolResult, st.text(), st.text(), st.booleans()),
    st.builds(Thinking, st.none() | st.text(), st.none() | st.text(), st.none() | st.text()),
    st.builds(File, st.text(min_size=1), st.binary(max_size=64), st.none() | st.text()),
)  # fmt: skip
messages = st.lists(
    st.builds(Message, st.sampled_from(["user", "assistant"]), st.lists(parts, max_size=4)),
    min_size=1,
    max_size=4,
)


# On a SQLite store of its own: a PostgreSQL schema per example would cost seconds.
@settings(max_examples=examples(60, fast=15))
@given(said=messages)
def test_exported_parts_decode_to_what_was_stored(said, tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("prop") / "h.db")
    try:
        conv = store.open_conversation("p")
        for message in said:
            store.append(conv.id, message)
        doc = as_json(read_record(store, conv))
        md = to_markdown(read_record(store, conv), "UTC")
    finally:
        store.close()
    decoded = [parts_from_json(json.dumps(m["parts"])) for m in doc["messages"]]
    assert decoded == [list(m.parts) for m in said]
    assert all("data" not in p for m in doc["messages"] for p in m["parts"])
    assert md.startswith("# ")


def test_an_export_shows_where_a_compaction_folded_and_its_summary(home):
    """An export carried no compaction: a reader could not see what the model worked from after
    a fold. The summary comes after the last message it folded, in both formats."""
    from heron.store import compactions as folds

    store = Store(Settings.load().database)
    try:
        conv = known(store, "trip")
        rows = store.branch(conv.id)
        fold = folds.add_compaction(
            store, conv.id, kind="consolidation", reason="budget",
            summary="Trip: Lisbon, a statue.", first_row_id=rows[0].id,
            last_row_id=rows[5].id, rows_folded=6,
            tokens_before=9_000, tokens_after=700,
        )  # fmt: skip
    finally:
        store.close()
    md = heron("conversations", "export", "trip").stdout
    assert "**Folded** (consolidation, 6 messages, 9,000 → 700 tokens" in md
    assert md.index("Trip: Lisbon, a statue.") > md.index(REPLY.strip()[:40])  # after the fold
    assert md.index("Trip: Lisbon, a statue.") < md.index("and the hotel near the statue?")
    doc = json.loads(heron("conversations", "export", "trip", "--format", "json").stdout)
    [told] = doc["compactions"]
    assert (told["id"], told["last_message_id"], told["summary"]) == (
        fold,
        rows[5].id,
        "Trip: Lisbon, a statue.",
    )


def test_export_with_force_replaces_a_link_at_the_name_never_writes_through_it(home, tmp_path):
    """A link the agent planted in its workspace (`export.md -> a file outside`): --force wrote
    the transcript into the file it pointed at."""
    outside = tmp_path / "victim.txt"
    outside.write_text("keep me")
    link = tmp_path / "workspace-export.md"
    link.symlink_to(outside)
    out = heron("conversations", "export", "trip", "-o", str(link), "--force")
    assert out.exit_code == 0, out.output
    assert outside.read_text() == "keep me"
    assert not link.is_symlink() and "heron statue" in link.read_text().lower()
    assert f"to {link.absolute()}" in out.stdout
