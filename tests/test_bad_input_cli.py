"""Bad input through the real `heron` command: each case gets a clear message, never a
traceback, and the store keeps everything afterwards. Streams without bounds, retries and the
empty reply are here too, against the fake servers on loopback."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from test_e2e_cli import heron, openai_env

from heron.store import Store
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ENDLESS_TEXT, ServerReply

pytestmark = pytest.mark.slow  # the real CLI in subprocesses
FFFD = "\ufffd"


def _texts(home: Path, key: str) -> list[tuple[str, str]]:
    store = Store(home / "heron.db")
    try:
        conversation = store.conversation(key)
        assert conversation is not None
        return [(r.role, r.message.text) for r in store.branch(conversation.id)]
    finally:
        store.close()


def _no_traceback(*results) -> None:
    for result in results:
        assert "Traceback" not in result.stderr, result.stderr


# ---- text that is not UTF-8 -------------------------------------------------------------------


def test_invalid_utf8_on_stdin_is_replaced_with_a_notice_and_kept(heron_home):
    with FakeOpenAIServer([ServerReply(text="got it")]) as server:
        env = openai_env(server.base_url)
        result = heron_bytes(heron_home, env, "run", "-c", "k", "-", stdin=b"bad \xff\xfe")
        sent = server.requests[0]["messages"][-1]["content"]
    assert result.returncode == 0, result.stderr
    assert "got it" in result.stdout.decode()
    notice = result.stderr.decode()
    assert "2 invalid UTF-8 sequence(s); each is kept as \ufffd" in notice
    assert sent.startswith(f"bad {FFFD}{FFFD}")
    assert _texts(heron_home, "k") == [("user", f"bad {FFFD}{FFFD}"), ("assistant", "got it")]


def heron_bytes(home, env_extra, *args, stdin: bytes):
    """`heron` with stdin and output as bytes (test_e2e_cli's helper speaks text)."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("HERON_", "OPENAI", "ANTHROPIC"))
    }
    env.update({"HERON_HOME": str(home), **env_extra})
    command = [sys.executable, "-m", "heron", *args]
    return subprocess.run(command, env=env, input=stdin, capture_output=True, timeout=120)


# ---- damaged rows and trace blobs ------------------------------------------------------------

TOOL_TURN = [
    ServerReply(text="Looking.", tool_calls=[("bash", {"command": "echo hi"})]),
    ServerReply(text="Done: hi."),
]


def _damage_rows(db: Path) -> list[int]:
    """The four damaged rows of the issue: parts that are an object, a number where text
    belongs, a tool result whose content is an object, invalid UTF-8 in a TEXT value."""
    conn = sqlite3.connect(db)
    ids = [r[0] for r in conn.execute("SELECT id FROM messages ORDER BY id")]
    conn.execute("UPDATE messages SET parts = ? WHERE id = ?", ('{"a":1}', ids[0]))
    conn.execute("UPDATE messages SET parts = 42 WHERE id = ?", (ids[1],))
    result = '[{"call_id":"x","content":{"o":1},"is_error":false,"kind":"tool_result"}]'
    conn.execute("UPDATE messages SET parts = ? WHERE id = ?", (result, ids[2]))
    bad = b'[{"kind":"text","text":"bad \xff here"}]'
    conn.execute("UPDATE messages SET parts = CAST(? AS TEXT) WHERE id = ?", (bad, ids[3]))
    conn.commit()
    conn.close()
    return ids


def test_damaged_rows_are_placeholders_that_name_them_and_stop_nothing(heron_home):
    with FakeOpenAIServer([*TOOL_TURN, ServerReply(text="Still here.")]) as server:
        env = openai_env(server.base_url)
        first = heron(heron_home, env, "run", "-c", "k", "look")
        assert first.returncode == 0, first.stderr
        ids = _damage_rows(heron_home / "heron.db")
        shown = heron(heron_home, env, "conversations", "show", "k")
        view = heron(heron_home, env, "conversations", "show", "k", "--model-view")
        again = heron(heron_home, env, "run", "-c", "k", "are you there?")
        run_id = _run_ids(heron_home)[0]
        trace = heron(heron_home, env, "trace", "show", run_id)
        export = heron(heron_home, env, "trace", "export", run_id)
        recall = heron(heron_home, env, "memory", "recall", "here")
    _no_traceback(shown, view, again, trace, export, recall)
    assert [r.returncode for r in (shown, view, again, trace, export, recall)] == [0] * 6
    assert f"[message #{ids[0]} could not be read (parts must be a list, not dict)" in shown.stdout
    assert f"[message #{ids[1]} could not be read (parts must be a list, not int)" in shown.stdout
    assert f"[message #{ids[2]} could not be read (content must be text, not dict)" in shown.stdout
    assert f"bad {FFFD} here" in shown.stdout  # decoded with replacement, not a placeholder
    assert f"[message #{ids[1]} could not be read" in view.stdout
    assert "Still here." in again.stdout
    # Nothing lost: the damaged rows are as they were, the new turn is stored after them.
    texts = _texts(heron_home, "k")
    assert texts[-2:] == [("user", "are you there?"), ("assistant", "Still here.")]
    conn = sqlite3.connect(heron_home / "heron.db")
    assert conn.execute("SELECT parts FROM messages WHERE id = ?", (ids[0],)).fetchone() == (
        '{"a":1}',
    )


def _run_ids(home: Path) -> list[str]:
    conn = sqlite3.connect(home / "heron.db")
    try:
        return [r[0] for r in conn.execute("SELECT run_id FROM turns ORDER BY id")]
    finally:
        conn.close()


def test_a_damaged_trace_blob_is_named_in_show_export_and_replay(heron_home):
    with FakeOpenAIServer(TOOL_TURN) as server:
        first = heron(heron_home, openai_env(server.base_url), "run", "-c", "k", "look")
    assert first.returncode == 0, first.stderr
    conn = sqlite3.connect(heron_home / "heron.db")
    conn.execute("UPDATE trace_blobs SET body = 'not json' WHERE kind = 'message'")
    conn.commit()
    conn.close()
    run_id = _run_ids(heron_home)[0]
    shown = heron(heron_home, {}, "trace", "show", run_id)
    export = heron(heron_home, {}, "trace", "export", run_id)
    replay = heron(heron_home, {}, "trace", "replay", run_id)
    _no_traceback(shown, export, replay)
    assert shown.returncode == 0 and export.returncode == 0
    assert "damaged: the run's start cannot be read from the trace: message chain" in shown.stdout
    assert "the request of call #1 (request_ref" in shown.stdout
    assert (
        '"problems": [' in export.stdout and '"damaged": "the request of call #1' in export.stdout
    )
    assert replay.returncode == 1
    assert f"run {run_id} cannot be replayed: the run's start cannot be read" in replay.stderr
    # The conversation itself is untouched.
    assert _texts(heron_home, "k")[-1] == ("assistant", "Done: hi.")


# ---- config and HERON_HOME -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[agent]\nmax_turns = -5\n", "[agent] max_turns must be above 0, got -5"),
        ("[agent]\nresult_budget = 0\n", "[agent] result_budget must be above 0, got 0"),
        (
            "[agent]\nconsolidation_ratio = 2\n",
            "[agent] consolidation_ratio must be between 0 and 1 (above 0), got 2.0",
        ),
        ("[agent]\nstall_timeout = 'soon'\n", "[agent] stall_timeout must be a number"),
    ],
)
def test_config_values_out_of_range_name_file_section_and_key(heron_home, body, message):
    config = heron_home / "config.toml"
    config.write_text(body)
    result = heron(heron_home, {"HERON_NO_EMBEDDED": "1"}, "run", "hi")
    _no_traceback(result)
    assert result.returncode == 2
    assert f"{config}: {message}" in result.stderr
    assert not (heron_home / "heron.db").exists()  # nothing was started


def test_a_context_window_of_one_token_is_refused(heron_home):
    env = {"HERON_BASE_URL": "http://127.0.0.1:9/v1", "HERON_CONTEXT_WINDOW": "1"}
    result = heron(heron_home, env, "run", "hi")
    _no_traceback(result)
    assert result.returncode == 2
    assert "HERON_CONTEXT_WINDOW must be between 1024 and 100000000, got 1" in result.stderr


def test_config_with_invalid_utf8_names_the_line(heron_home):
    (heron_home / "config.toml").write_bytes(b'model = "x"\n# caf\xe9\n')
    result = heron(heron_home, {}, "run", "hi")
    _no_traceback(result)
    assert result.returncode == 2
    assert "config.toml:2: not valid UTF-8 (byte 0xe9)" in result.stderr


def test_config_that_is_a_folder_is_reported(heron_home):
    (heron_home / "config.toml").mkdir()
    result = heron(heron_home, {}, "run", "hi")
    _no_traceback(result)
    assert result.returncode == 2
    assert "config.toml is a folder, not a file" in result.stderr


def test_a_heron_home_that_is_a_file_is_reported(tmp_path):
    home = tmp_path / "home-file"
    home.write_text("not a folder")
    results = [heron(home, {}, "run", "hi"), heron(home, {}, "conversations", "list")]
    _no_traceback(*results)
    for result in results:
        assert result.returncode == 2
        assert f"HERON_HOME {home} is a file, not a folder" in result.stderr
    assert home.read_text() == "not a folder"


# ---- streams, retries, empty replies ---------------------------------------------------------


def test_a_cut_stream_is_retried_with_a_marker_and_no_text_twice(heron_home):
    script = [
        ServerReply(text="partial text that will be cut", cut_after_events=3),
        ServerReply(text="second try complete"),
        ServerReply(text="the same start, then more", cut_after_events=3),
        ServerReply(text="the same start, then more"),
        ServerReply(text="partial text that will be cut", cut_after_events=3),
        ServerReply(text="second try complete"),
    ]
    with FakeOpenAIServer(script) as server:
        env = openai_env(server.base_url)
        differs = heron(heron_home, env, "run", "-c", "k", "one")
        same = heron(heron_home, env, "run", "--stream", "-c", "k", "two")
        streamed = heron(heron_home, env, "run", "--stream", "-c", "k", "three")
    assert differs.returncode == same.returncode == streamed.returncode == 0
    # a pipe gets the reply as stored, whole; the retry is said on stderr
    assert differs.stdout == "second try complete\n"
    assert "[retrying in" in differs.stderr
    # streamed to a pipe (--stream): what the dead attempt showed, the marker, the reply anew;
    # a retry that repeats the start shows it once
    marker = "[the stream was cut; the reply starts again]"
    assert streamed.stdout == f"partial text tha\n{marker}\nsecond try complete\n"
    assert same.stdout == "the same start, then more\n"
    assert _texts(heron_home, "k")[1] == ("assistant", "second try complete")


def test_an_endless_stream_is_cut_at_the_output_cap_and_kept(heron_home):
    (heron_home / "config.toml").write_text("[models.fake-model]\nmax_output = 100\n")
    script = [ServerReply(text="Start. ", endless="text")] + [
        ServerReply(endless="text") for _ in range(3)
    ]
    with FakeOpenAIServer(script) as server:
        result = heron(heron_home, openai_env(server.base_url), "run", "-c", "k", "talk")
        requests = len(server.requests)
    _no_traceback(result)
    assert result.returncode == 0
    # One request: the cut text repeats itself, so it is not continued (bounded continuation).
    assert requests == 1
    texts = _texts(heron_home, "k")
    assert texts[1][0] == "assistant" and texts[1][1].startswith("Start. " + ENDLESS_TEXT)
    # The cap counts tokens (about four characters each): 100 x 1.25 + 64 of them, and a chunk.
    assert len(texts[1][1]) < 4 * (100 * 1.25 + 64) + 2 * len(ENDLESS_TEXT)


def test_a_server_that_never_answers_ends_at_the_deadline_with_the_message_kept(heron_home):
    (heron_home / "config.toml").write_text(
        "[agent]\nstall_timeout = 0.2\nrequest_deadline = 1.0\n"
    )
    with FakeOpenAIServer([ServerReply(hang=True)] * 20) as server:
        result = heron(heron_home, openai_env(server.base_url), "run", "-c", "k", "hello?")
    _no_traceback(result)
    assert result.returncode == 1
    assert "the model did not answer within 1 s" in result.stderr
    assert "heron run --retry -c k" in result.stderr
    assert _texts(heron_home, "k") == [("user", "hello?")]


def test_an_always_empty_reply_is_an_error_then_retry_answers_without_storing_twice(heron_home):
    script = [ServerReply(text=""), ServerReply(text=""), ServerReply(text="Here I am.")]
    with FakeOpenAIServer(script) as server:
        env = openai_env(server.base_url)
        empty = heron(heron_home, env, "run", "-c", "k", "hello")
        retried = heron(heron_home, env, "run", "--retry", "-c", "k")
        sent = [m["content"] for m in server.requests[-1]["messages"] if m["role"] == "user"]
    assert empty.returncode == 1
    assert "the model sent an empty reply twice (no text and no tool call)" in empty.stderr
    assert "`heron run --retry -c k` answers it again without storing it twice" in empty.stderr
    assert retried.returncode == 0 and retried.stdout == "Here I am.\n"
    assert len(sent) == 1 and sent[0].startswith("hello")  # the model saw the message once
    assert _texts(heron_home, "k") == [("user", "hello"), ("assistant", "Here I am.")]
    conn = sqlite3.connect(heron_home / "heron.db")
    turns = conn.execute("SELECT status, user_message_id FROM turns ORDER BY id").fetchall()
    assert [t[0] for t in turns] == ["failed", "done"] and turns[0][1] == turns[1][1]


def test_retry_needs_a_conversation_and_no_message(heron_home):
    for args in (("run", "--retry"), ("run", "--retry", "-c", "k", "text")):
        result = heron(heron_home, {}, *args)
        assert result.returncode == 2
        assert "--retry takes no message and needs -c KEY" in result.stderr
