"""The web UI's REST routes (heron/serve/api.py) against a home whose turns ran through the real
AgentLoop with a scripted model: transcripts rebuilt from the store, conversations (list,
search, new, rename, delete with the CLI's refusals), branches, memory and its review queue,
the compaction inspector, status and uploads."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from heron import timefmt
from heron.agent.engine import Engine
from heron.channels.inprocess import connect
from heron.config import AttachmentCaps, Settings
from heron.memory.entries import EntryPath
from heron.memory.service import MemoryService
from heron.messages import Reply, Text, Thinking, ToolCall, Usage
from heron.providers.scripted import ScriptedProvider
from heron.serve import api
from heron.store import Store
from heron.store import engine_state as es
from heron.tools.context import ToolContext
from heron.tools.registry import ToolRegistry, tool
from heron.web import uploads
from heron.web.transcript import build


@tool
def lookup(ctx: ToolContext, word: str) -> str:
    """Look a word up.

    Args:
        word: the word.
    """
    return f"{word}: a wading bird"


async def _turns(messages: list[str], replies: Any, key: str = "personal") -> None:
    """Run `messages` as turns of `key`, one after the other, answered by `replies`."""
    settings = Settings.load()
    provider = ScriptedProvider(replies)
    async with Engine.open(settings, provider=provider, registry=ToolRegistry([lookup])) as eng:
        done: list[str] = []

        async def deliver(item) -> None:
            if getattr(item, "kind", None) == "turn_end":
                done.append(item.key)

        async with connect(eng, "web", "tab", deliver) as agent:
            for text in messages:
                await agent.send(text, key)
                await agent.settle()


def _tool_turn() -> list[Reply]:
    call = ToolCall("c1", "lookup", {"word": "heron"})
    return [
        Reply([Thinking("The user asks a word."), Text("Let me look."), call], "tool", Usage(5, 2)),
        Reply([Text("A **heron** is a wading bird.")], "done", Usage(9, 3)),
    ]


@pytest.fixture
def client() -> TestClient:
    app = FastAPI()
    api.install(app, Settings.load())
    return TestClient(app)


def test_transcript_has_the_user_message_reasoning_text_and_a_tool_pill_with_its_result(client):
    asyncio.run(_turns(["what is a heron?"], _tool_turn()))
    body = client.get("/api/conversations/personal/transcript").json()
    kinds = [i["kind"] for i in body["items"]]
    assert kinds == ["user", "assistant"]
    user, reply = body["items"]
    assert user["text"] == "what is a heron?" and not user["mail"]
    segs = reply["segments"]
    assert [s["kind"] for s in segs] == ["reasoning", "text", "tool", "text"]
    assert segs[0]["text"] == "The user asks a word."
    assert segs[2]["name"] == "lookup" and segs[2]["args"] == {"word": "heron"}
    assert segs[2]["result"] == "heron: a wading bird" and not segs[2]["is_error"]
    assert segs[3]["text"] == "A **heron** is a wading bird."
    assert not any(i["running"] for i in body["items"])
    # Rebuilt from the store, the same rows give the same transcript.
    assert client.get("/api/conversations/personal/transcript").json() == body


def test_new_shows_a_separator_and_a_missing_conversation_is_empty(client):
    asyncio.run(_turns(["hi", "/new", "again"], lambda request: Reply([Text("hello")], "done")))
    items = client.get("/api/conversations/personal/transcript").json()["items"]
    assert [i["kind"] for i in items] == ["user", "assistant", "separator", "user", "assistant"]
    empty = client.get("/api/conversations/nothing-yet/transcript").json()
    assert empty["items"] == []


def test_a_stopped_reply_is_the_agents_markdown_then_a_note_and_nothing_streamed_a_note():
    from heron.agent.turn import REPLY_STOPPED, STOPPED
    from heron.messages import Message

    store = Store(Settings.load().paths.ensure().db)
    conv = store.open_conversation("personal")
    for asked, said in [("go on", f"I will **go on**\n\n{REPLY_STOPPED}"), ("again", STOPPED)]:
        turn, _ = store.begin_turn(conv.id, "run-" + asked, Message("user", [Text(asked)]))
        es.close_turn(store, conv.id, turn, said)  # what a stopped turn leaves
    built = build(store, "personal")
    store.close()
    assert built is not None
    user, stopped, again, nothing = built.items
    assert (user.kind, stopped.kind, again.kind) == ("user", "assistant", "user")
    assert [(s.kind, s.text) for s in stopped.segments] == [
        ("text", "I will **go on**"),
        ("note", "The reply was stopped here."),
    ]
    # No reply at all: Heron's note, without the brackets the model reads it in.
    assert (nothing.kind, nothing.text) == ("note", "This turn was stopped before it finished.")
    assert f"[{nothing.text}]" == STOPPED


def test_a_failed_turns_note_follows_that_turn_and_a_failed_retry_follows_it(client):
    from heron.errors import ProviderError

    said = iter(["refused once", "refused twice", None, "refused later"])

    def replies(request: Any) -> Reply:
        error = next(said)
        if error is not None:
            raise ProviderError(error, status=400)
        return Reply([Text("Answered.")], "done")

    asyncio.run(_turns(["first try", "/retry", "/retry", "second"], replies))
    items = client.get("/api/conversations/personal/transcript").json()["items"]
    shown = [(i["kind"], i["failed"], i["text"].split("\n")[0]) for i in items]
    assert shown == [
        ("user", False, "first try"),
        ("note", True, "The turn failed: refused once"),
        ("note", True, "The turn failed: refused twice"),
        ("assistant", False, ""),
        ("user", False, "second"),
        ("note", True, "The turn failed: refused later"),
    ]
    assert "send /retry" in items[-1]["text"]
    assert [i["rows"] for i in items if i["failed"]] == [[], [], []]  # no row of their own


def test_the_list_says_each_conversations_turns_and_last_activity(client):
    """The turns of the current branch (a /retry's answer replaces the one it retried), and
    the branches when there are more than one."""
    answer = lambda request: Reply([Text("ok")], "done")  # noqa: E731
    asyncio.run(_turns(["wading herons", "more", "/retry"], answer))
    asyncio.run(_turns(["wading herons"], [Reply([Text("ok")], "done")], key="other"))
    rows = client.get("/api/conversations").json()["conversations"]
    assert {c["key"]: (c["turns"], c["branches"]) for c in rows} == {
        "personal": (2, 2),
        "other": (1, 1),
    }
    assert all(c["updated"] > 0 for c in rows)
    found = client.get("/api/conversations", params={"q": "herons"}).json()["conversations"]
    assert {c["key"]: c["turns"] for c in found} == {"personal": 2, "other": 1}


def test_a_running_turn_is_flagged_so_the_stream_replaces_it(tmp_path):
    store = Store(Settings.load().paths.ensure().db)
    conv = store.open_conversation("personal")
    from heron.messages import Message

    store.begin_turn(conv.id, "run-1", Message("user", [Text("still going")]))
    built = build(store, "personal")
    assert built is not None and built.items[0].running


def test_list_search_new_rename_and_delete(client):
    asyncio.run(_turns(["tell me about pelicans"], [Reply([Text("Pelicans fish.")], "done")]))
    asyncio.run(_turns(["and kingfishers"], [Reply([Text("They dive.")], "done")], key="other"))
    keys = [c["key"] for c in client.get("/api/conversations").json()["conversations"]]
    assert set(keys) == {"personal", "other"}
    found = client.get("/api/conversations", params={"q": "pelicans"}).json()["conversations"]
    assert [c["key"] for c in found] == ["personal"]
    assert "pelicans" in found[0]["snippet"].lower()

    made = client.post("/api/conversations", json={}).json()["key"]
    assert made.startswith("web-")
    bad = client.post("/api/conversations", json={"key": "has space"})
    assert bad.status_code == 400 and "hint" in bad.json()["detail"]

    renamed = client.patch("/api/conversations/other", json={"title": "Birds that dive"})
    assert renamed.status_code == 200
    rows = client.get("/api/conversations").json()["conversations"]
    assert {c["key"]: c["title"] for c in rows}["other"] == "Birds that dive"
    assert client.patch("/api/conversations/other", json={"title": " "}).status_code == 400
    assert client.patch("/api/conversations/nope", json={"title": "x"}).status_code == 404

    assert client.delete("/api/conversations/other").status_code == 200
    keys = [c["key"] for c in client.get("/api/conversations").json()["conversations"]]
    assert "other" not in keys
    assert client.delete("/api/conversations/other").status_code == 404


def test_a_new_conversation_stores_nothing_until_its_first_message(client):
    made = client.post("/api/conversations", json={})
    assert made.status_code == 201 and made.json()["key"].startswith("web-")
    key = made.json()["key"]
    assert Store(Settings.load().paths.ensure().db).conversation(key) is None
    assert client.get("/api/conversations").json()["conversations"] == []
    assert client.get(f"/api/conversations/{key}/transcript").json()["items"] == []
    asyncio.run(_turns(["first words"], [Reply([Text("Heard.")], "done")], key=key))
    keys = [c["key"] for c in client.get("/api/conversations").json()["conversations"]]
    assert keys == [key]


def test_an_empty_conversation_is_never_listed(client):
    store = Store(Settings.load().paths.ensure().db)
    store.open_conversation("left-unused")  # as an older Heron, or a chat still open, left it
    asyncio.run(_turns(["hello"], [Reply([Text("hi")], "done")], key="used"))
    keys = [c["key"] for c in client.get("/api/conversations").json()["conversations"]]
    assert keys == ["used"]
    assert [c.key for c in store.conversations()] == ["used"]


def test_keys_reserved_for_herons_own_conversations_are_refused(client):
    for key in ("cron:evil", "heartbeat", "subagent:x"):
        refused = client.post("/api/conversations", json={"key": key})
        assert refused.status_code == 400, key
        assert "reserved" in refused.json()["detail"]["message"]
    assert Store(Settings.load().paths.ensure().db).conversation("cron:evil") is None


def test_a_request_that_fails_validation_answers_the_documented_shape(client):
    bad = client.get("/api/conversations", params={"limit": "abc"})
    assert bad.status_code == 422
    detail = bad.json()["detail"]
    assert set(detail) == {"message", "hint"}
    assert detail["message"].startswith("limit: ") and "integer" in detail["message"]
    assert detail["hint"] and detail["hint"] not in detail["message"]


def test_an_error_message_does_not_repeat_its_hint(client):
    big = client.post("/api/uploads?name=x.bin", content=b"x" * (21 * 1024 * 1024))
    detail = big.json()["detail"]
    assert big.status_code == 413 and detail["hint"] and detail["hint"] not in detail["message"]
    api_error = api._detail(api.HeronError("no conversation 'x'", hint="Pick one."))
    assert api_error == {"message": "no conversation 'x'", "hint": "Pick one."}


def test_delete_refuses_while_a_chat_holds_the_conversation_and_names_it(client):
    asyncio.run(_turns(["hi"], [Reply([Text("hello")], "done")]))
    store = Store(Settings.load().paths.db)
    conv = store.conversation("personal")
    es.enter(store, conv.id, "chat-1", "an open chat", ttl=60)
    refused = client.delete("/api/conversations/personal")
    assert refused.status_code == 409
    detail = refused.json()["detail"]
    assert "still in use" in detail["message"] and "open chat" in detail["message"]
    assert detail["hint"]
    assert store.conversation("personal") is not None  # nothing lost


def test_delete_refuses_while_a_job_is_bound_and_names_how_to_cancel(client):
    from heron.store import jobs
    from heron.store.schedule import parse

    asyncio.run(_turns(["hi"], [Reply([Text("hello")], "done")]))
    store = Store(Settings.load().paths.db)
    when = parse(every="1h", timezone="UTC")
    job = jobs.create_job(store, when, conversation="personal", prompt="Water", now=0.0)
    refused = client.delete("/api/conversations/personal")
    assert refused.status_code == 409
    message = refused.json()["detail"]["message"]
    assert f"reminder job {job.id} is bound to it" in message
    assert f"heron jobs cancel {job.id}" in message
    jobs.cancel_job(store, job.id)
    assert client.delete("/api/conversations/personal").status_code == 200


def test_delete_refuses_while_the_serve_runs_a_turn_in_it():
    asyncio.run(_turns(["hi"], [Reply([Text("hello")], "done")]))
    app = FastAPI()
    api.install(app, Settings.load(), busy=lambda key: key == "personal")
    refused = TestClient(app).delete("/api/conversations/personal")
    assert refused.status_code == 409 and "a turn runs" in refused.json()["detail"]["message"]


def test_branches_after_a_retry(client):
    replies = [Reply([Text("first answer")], "done"), Reply([Text("second answer")], "done")]
    asyncio.run(_turns(["question", "/retry"], replies))
    body = client.get("/api/conversations/personal/branches").json()
    assert len(body["branches"]) == 2
    assert [b["current"] for b in body["branches"]] == [False, True]
    # as /tree labels it, saying which message the branch redoes
    assert body["branches"][1]["text"] == "question → second answer (retry of message 1)"
    # Two branches that end alike are told apart by when their last message came (QA20m #4)
    zone = Settings.load().timezone
    store = Store(Settings.load().paths.db)
    created = [store.message(b["id"]).created for b in body["branches"]]
    assert [b["when"] for b in body["branches"]] == [timefmt.when(t, zone) for t in created]
    assert [m["text"] for m in body["messages"]] == ["question"]
    users = [
        i
        for i in client.get("/api/conversations/personal/transcript").json()["items"]
        if i["kind"] == "user"
    ]
    assert [(u["number"], u["id"]) for u in users] == [(m["n"], m["id"]) for m in body["messages"]]
    items = client.get("/api/conversations/personal/transcript").json()["items"]
    assert items[-1]["segments"][0]["text"] == "second answer"


def test_memory_by_scope_with_quote_review_and_forget(client):
    asyncio.run(
        _turns(["remember that I live in Lyon", "I prefer tea"], [Reply([Text("ok")], "done")] * 2)
    )
    settings = Settings.load()
    store = Store(settings.paths.db)
    conv = store.conversation("personal")
    service = MemoryService(settings.paths.memory, store)
    service.save(
        conv.id,
        EntryPath.parse("user/always/home.md"),
        "I live in Lyon",
        conversation_key="personal",
    )
    sid = service.suggest_fact(conv.id, EntryPath.parse("user/always/tea.md"), "I prefer tea")
    assert sid is not None

    scopes = client.get("/api/memory").json()["scopes"]
    assert [s["scope"] for s in scopes] == ["user"]
    entry = scopes[0]["entries"][0]
    assert entry["path"] == "user/always/home.md" and entry["quote"] == "I live in Lyon"
    assert entry["origin"] == "user" and entry["conversation"] == "personal"
    said = store.message(entry["message"]).created  # the day of the message it quotes
    assert entry["said"] == timefmt.when(said, service.timezone, timefmt.DAY)
    assert entry["day"] == f"said {entry['said']}"

    waiting = client.get("/api/memory/review").json()["suggestions"]
    assert [s["id"] for s in waiting] == [sid] and "I prefer tea" in waiting[0]["line"]
    accepted = client.post(f"/api/memory/review/{sid}/accept")
    assert accepted.status_code == 200 and accepted.json()["status"] == "accepted"
    assert client.get("/api/memory/review").json()["suggestions"] == []
    paths = [e["path"] for e in client.get("/api/memory").json()["scopes"][0]["entries"]]
    assert "user/always/tea.md" in paths

    gone = client.delete("/api/memory/entries/user/always/home.md")
    assert gone.status_code == 200
    paths = [e["path"] for e in client.get("/api/memory").json()["scopes"][0]["entries"]]
    assert "user/always/home.md" not in paths
    assert client.post(f"/api/memory/review/{sid}/maybe").status_code == 404


def test_every_memory_entry_has_the_day_the_model_is_shown(client):
    """The panel showed a day only inside an entry's conversation line, and none for an entry
    without `said`, where the model reads "saved <day>" (qa24b L1). `day` is what the model
    is shown: "said <day>" when known, else "saved <day>", conversation or not."""
    memory = Settings.load().paths.memory
    folder = memory / "user" / "always"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bike.md").write_text("I cycle to work.\n")  # by hand: no front matter at all
    (folder / "run.md").write_text(
        "---\nsaid: 2026-05-01T10:00:00+0000\n---\nI ran a marathon last month.\n"
    )
    os.utime(folder / "bike.md", (1_793_000_000, 1_793_000_000))  # 2026-10-26 UTC
    zone = Settings.load().timezone
    entries = {e["path"]: e for e in client.get("/api/memory").json()["scopes"][0]["entries"]}
    saved = timefmt.when(1_793_000_000, zone, timefmt.DAY)
    assert entries["user/always/bike.md"]["day"] == f"saved {saved}"
    run = entries["user/always/run.md"]
    assert run["conversation"] is None and run["day"] == f"said {run['said']}"
    assert run["said"] == timefmt.when(1_777_629_600, zone, timefmt.DAY)


def test_reject_drops_a_suggestion(client):
    asyncio.run(_turns(["I prefer coffee"], [Reply([Text("ok")], "done")]))
    settings = Settings.load()
    store = Store(settings.paths.db)
    service = MemoryService(settings.paths.memory, store)
    conv = store.conversation("personal")
    sid = service.suggest_fact(conv.id, EntryPath.parse("user/always/coffee.md"), "I prefer coffee")
    assert client.post(f"/api/memory/review/{sid}/reject").json()["status"] == "rejected"
    assert client.get("/api/memory").json()["scopes"] == []


def test_compaction_inspector_and_status(client):
    asyncio.run(_turns(["hi"], [Reply([Text("hello")], "done", Usage(100, 5, cache_read=40))]))
    found = client.get("/api/conversations/personal/compactions").json()
    assert found["compactions"] == []
    assert [m["role"] for m in found["view"]] == ["user", "assistant"]
    assert found["view"][1]["text"] == "hello" and found["system"]
    status = client.get("/api/conversations/personal/status").json()
    assert status["turns"] == 1 and status["context"] == 105 and status["busy"] is False
    assert status["cache_hit"] == pytest.approx(0.4)


def test_upload_is_kept_and_over_the_cap_refused(client, monkeypatch):
    made = client.post(
        "/api/uploads",
        params={"name": "notes.txt"},
        content=b"hello",
        headers={"Content-Type": "text/plain"},
    )
    assert made.status_code == 201
    body = made.json()
    assert body["name"] == "notes.txt" and body["mime"] == "text/plain" and body["size"] == 5
    found = uploads.load_upload(Settings.load().paths.home, body["upload_id"])
    assert found is not None and found[1] == b"hello"
    assert uploads.load_upload(Settings.load().paths.home, "../../etc/passwd") is None

    state = client.app.state.web
    config = dataclasses.replace(state.settings.config, attachments=AttachmentCaps(max_file_mb=1))
    monkeypatch.setattr(state, "settings", dataclasses.replace(state.settings, config=config))
    big = client.post("/api/uploads", params={"name": "big.bin"}, content=b"x" * (1024**2 + 1))
    assert big.status_code == 413
    detail = big.json()["detail"]
    assert detail["message"] == "big.bin is 1.0 MB, over the 1 MB cap per file"
    assert "max_file_mb" in detail["hint"]


def test_attachments_are_listed_and_served(client):
    from heron.messages import File, Message

    store = Store(Settings.load().paths.ensure().db)
    conv = store.open_conversation("personal")
    png = b"\x89PNG\r\n\x1a\nfake"
    store.begin_turn(conv.id, "r1", Message("user", [Text("see"), File("image/png", png, "a.png")]))
    items = client.get("/api/conversations/personal/transcript").json()["items"]
    files = items[0]["files"]
    assert files == [
        {
            "name": "a.png",
            "mime": "image/png",
            "size": len(png),
            "url": f"/api/conversations/personal/files/{items[0]['id']}/1",
            "inline": False,
        }
    ]
    got = client.get(files[0]["url"])
    assert got.status_code == 200 and got.content == png
    assert got.headers["content-type"] == "image/png"
    assert client.get(f"/api/conversations/personal/files/{items[0]['id']}/0").status_code == 404
    assert client.get("/api/conversations/other/files/1/1").status_code == 404


def test_a_text_file_the_model_got_inline_is_an_attachment_in_the_transcript(client):
    """A text file goes into the message inline for the model, as a fenced block; the person
    sees the message they typed and the file as an attachment (name, size, its text from the
    files route), from a turn run through the loop, from an empty message with the file alone,
    and from a row stored before its meta named the inline files. A typed fence stays text."""
    from heron.messages import File, Message

    notes = File("text/plain", b"line one\nline ZEBRA42\n\n", "notes.txt")
    png = File("image/png", b"\x89PNG\r\n\x1a\nfake", "red.png")

    async def attached() -> None:
        settings = Settings.load()
        provider = ScriptedProvider([Reply([Text("seen")], "done")] * 2)
        opened = Engine.open(settings, provider=provider, registry=ToolRegistry([]))
        async with opened as eng, connect(eng, "web", "tab", lambda _: asyncio.sleep(0)) as agent:
            await agent.send("two files", "personal", files=(notes, png))
            await agent.settle()
            await agent.send("", "personal", files=(notes,))
            await agent.settle()
        sent = provider.requests[0].messages[-1].parts  # the model still reads it inline
        assert Text("\n\nnotes.txt:\n```\nline one\nline ZEBRA42\n```") in sent

    asyncio.run(attached())
    store = Store(Settings.load().paths.ensure().db)
    conv = store.open_conversation("personal")
    earlier = Message("user", [Text("from before"), Text("\n\nold.txt:\n````\nx ``` y\n````")])
    store.begin_turn(conv.id, "r-old", earlier)
    typed = "mine.txt:\n```\nI typed this fence\n```"
    store.begin_turn(conv.id, "r-typed", Message("user", [Text(typed)]))
    items = client.get("/api/conversations/personal/transcript").json()["items"]
    users = [i for i in items if i["kind"] == "user"]
    assert [u["text"] for u in users] == ["two files", "", "from before", typed]
    shown = [[(f["name"], f["size"], f["inline"]) for f in u["files"]] for u in users]
    assert shown == [
        [("notes.txt", 23, True), ("red.png", png.size, False)],
        [("notes.txt", 23, True)],
        [("old.txt", 7, True)],
        [],
    ]
    text = client.get(users[0]["files"][0]["url"])
    assert text.status_code == 200 and text.text == "line one\nline ZEBRA42"
    assert client.get(users[2]["files"][0]["url"]).text == "x ``` y"
    typed_row = users[3]["id"]  # a message's own text is no file
    assert client.get(f"/api/conversations/personal/files/{typed_row}/0").status_code == 404


def test_internal_conversations_are_never_listed(client):
    from heron.messages import Message

    store = Store(Settings.load().paths.ensure().db)
    for key in ("subagent:abc", "heartbeat", "personal"):  # each with something said in it
        store.append(store.open_conversation(key).id, Message("user", [Text("hi")]))
    keys = [c["key"] for c in client.get("/api/conversations").json()["conversations"]]
    assert keys == ["personal"]
    assert json.dumps(keys)


def test_uploads_become_file_parts_in_order_and_an_unknown_one_is_refused(client):
    from heron.errors import HeronError

    home = Settings.load().paths.home
    ids = []
    for name, body, mime in (
        ("a.txt", b"alpha", "text/plain"),
        ("b.png", b"\x89PNG..", "image/png"),
    ):
        made = client.post(
            "/api/uploads", params={"name": name}, content=body, headers={"Content-Type": mime}
        )
        ids.append(made.json()["upload_id"])
    files = uploads.uploaded_files(home, [{"upload_id": i} for i in ids], AttachmentCaps())
    assert [(f.name, f.media_type, f.data) for f in files] == [
        ("a.txt", "text/plain", b"alpha"),
        ("b.png", "image/png", b"\x89PNG.."),
    ]
    with pytest.raises(HeronError, match="no upload"):
        uploads.uploaded_files(home, [{"upload_id": "0" * 24}], AttachmentCaps())


async def test_a_send_with_uploads_carries_them_as_file_parts_and_a_missing_one_is_refused():
    """The turn wiring: a `send` naming uploads reaches the bus as one InboundMessage whose
    `files` are the uploaded bytes, in order; an unknown upload is refused to that client
    alone and nothing is sent."""
    from heron.serve.hub import Hub
    from heron.serve.session import Session
    from heron.web.uploads import Upload, save

    home = Settings.load().paths.ensure().home
    save(home, Upload("a" * 24, "notes.txt", "text/plain", 5), b"hello")
    sent: list[tuple[Any, ...]] = []

    class Runtime:
        hub = Hub()
        engine = type("E", (), {"settings": Settings.load()})()

        def submit(self, *args: Any) -> None:
            sent.append(args)

        async def config_problem(self) -> None:
            return None  # config.toml loads

    replies: list[dict[str, Any]] = []
    session = Session(Runtime(), None, "web")  # type: ignore[arg-type]

    async def reply(event: dict[str, Any]) -> None:
        replies.append(event)

    session._reply = reply  # type: ignore[method-assign]
    await session.handle({"type": "hello", "conversation": "personal", "last_seq": None})
    files = [{"name": "notes.txt", "mime": "text/plain", "upload_id": "a" * 24}]
    await session.handle({"type": "send", "text": "see the file", "files": files})
    assert len(sent) == 1
    text, key, *_rest, attached = sent[0]
    assert (text, key) == ("see the file", "personal")
    assert [(f.name, f.media_type, f.data) for f in attached] == [
        ("notes.txt", "text/plain", b"hello")
    ]

    await session.handle({"type": "send", "text": "", "files": [{"upload_id": "b" * 24}]})
    assert len(sent) == 1
    assert replies[-1]["type"] == "error" and "no upload" in replies[-1]["message"]
    assert replies[-1]["hint"]


def _branching_turns() -> None:
    """Turns with what a page must not cut: a tool loop, a /new separator, a failed turn and
    its /retry, an /edit that leaves an older branch behind."""
    from heron.errors import ProviderError

    calls = iter(range(100))

    def replies(request: Any) -> Reply:
        n = next(calls)
        if n == 1:
            return Reply([Text("Let me look."), ToolCall("c1", "lookup", {"word": "x"})], "tool")
        if n == 4:
            raise ProviderError("refused", status=400)
        return Reply([Text(f"answer {n}")], "done")

    said = ["first", "look it up", "/new", "third", "fails", "/retry", "fifth"]
    asyncio.run(_turns([*said, "/edit 5 fifth, changed", "sixth", "seventh"], replies))


def _pages(client: TestClient, limit: int) -> list[list[dict[str, Any]]]:
    """Every page of the personal transcript, newest first, as the page reads them."""
    url = "/api/conversations/personal/transcript"
    pages, before = [], None
    while True:
        params = {"limit": limit} if before is None else {"limit": limit, "before": before}
        body = client.get(url, params=params).json()
        pages.append(body["items"])
        assert body["start"] == body["items"][0]["id"]
        if body["earlier"] is None:
            return pages
        assert body["earlier"] == body["start"]
        before = body["earlier"]


def test_a_transcript_read_in_pages_is_the_whole_one_in_order_with_true_numbers(client):
    _branching_turns()
    url = "/api/conversations/personal/transcript"
    whole = client.get(url).json()
    assert whole["earlier"] is None and len(whole["items"]) >= 12
    numbered = [(m["n"], m["id"]) for m in client.get(f"{url[:-11]}/branches").json()["messages"]]
    for limit in (1, 2, 3, 5, 100):
        pages = _pages(client, limit)
        assert len(pages) > 1 or limit == 100
        # Newest first: put back in order, they are the whole transcript, nothing twice.
        joined = [item for page in reversed(pages) for item in page]
        assert joined == whole["items"], limit
        users = [(i["number"], i["id"]) for i in joined if i["kind"] == "user"]
        assert users == numbered
        for page in pages:  # a page starts where a turn does: a failure note is never first
            assert not page[0]["failed"] and page[0]["kind"] != "assistant"
    newest = client.get(url, params={"limit": 3}).json()
    # Read again from a page's first row: every item from there on.
    again = client.get(url, params={"since": newest["start"]}).json()
    assert again["start"] == newest["start"] and again["earlier"] == newest["earlier"]
    assert again["items"] == whole["items"][-len(again["items"]) :]


def test_a_read_again_from_a_row_off_the_branch_gives_the_newest_page():
    _branching_turns()
    store = Store(Settings.load().paths.ensure().db)
    conv = store.conversation("personal")
    assert conv is not None
    on = {m.id for m in store.branch(conv.id)}
    off = max(m.id for m in store.all_messages(conv.id) if m.id not in on)  # the old "fifth"
    app = FastAPI()
    api.install(app, Settings.load())
    url = "/api/conversations/personal/transcript"
    body = TestClient(app).get(url, params={"since": off, "limit": 2}).json()
    newest = TestClient(app).get(url, params={"limit": 2}).json()
    assert body == newest and body["start"] != off


def test_a_page_of_a_long_branch_decodes_only_its_own_rows(monkeypatch):
    from heron.messages import Message
    from heron.store import db
    from heron.web.transcript import Page

    store = Store(Settings.load().paths.ensure().db)
    conv = store.open_conversation("personal")
    with store.transaction():
        for n in range(300):
            turn, _ = store.begin_turn(conv.id, f"run-{n}", Message("user", [Text(f"q{n}")]))
            store.append(conv.id, Message("assistant", [Text(f"a{n}")]), turn_id=turn)
    decoded = []
    real = db._message
    monkeypatch.setattr(db, "_message", lambda r: decoded.append(r["id"]) or real(r))
    page = build(store, "personal", page=Page(limit=20))
    assert page is not None and len(page.items) == 20 and len(decoded) == 20
    assert [i.text for i in page.items if i.kind == "user"] == [f"q{n}" for n in range(290, 300)]
    assert [i.number for i in page.items if i.kind == "user"] == list(range(291, 301))
    assert page.earlier == page.items[0].id


def test_the_list_comes_in_pages_and_search_finds_a_conversation_by_its_key(client):
    from heron.messages import Message

    store = Store(Settings.load().paths.ensure().db)
    for n in range(7):
        key = f"trip-{n}" if n != 3 else "lisbon-plans"
        store.append(store.open_conversation(key).id, Message("user", [Text(f"note {n}")]))
    seen, more = [], []
    for offset in (0, 3, 6):
        body = client.get("/api/conversations", params={"limit": 3, "offset": offset}).json()
        seen += [c["key"] for c in body["conversations"]]
        more.append(body["more"])
    assert sorted(seen) == sorted({*seen}) and len(seen) == 7 and more == [True, True, False]
    assert seen[0] == "trip-6"  # newest first
    found = client.get("/api/conversations", params={"q": "LISBON"}).json()
    assert [c["key"] for c in found["conversations"]] == ["lisbon-plans"] and not found["more"]
    by_words = client.get("/api/conversations", params={"q": "note", "limit": 4}).json()
    assert len(by_words["conversations"]) == 4 and by_words["more"]


def test_a_search_hit_on_another_branch_says_which_branch_holds_it(client):
    """A hit on the old text of an /edit opened the conversation on its current branch, where
    it is not, and nothing said so: the hit now says it is off the current branch and the
    /tree number of the branch that holds it."""
    asyncio.run(
        _turns(
            ["my cat is called Biscuit", "/edit 1 my dog is called Waffles"],
            [Reply([Text("Nice cat.")], "done"), Reply([Text("Nice dog.")], "done")],
        )
    )
    (old,) = client.get("/api/conversations", params={"q": "Biscuit"}).json()["conversations"]
    (new,) = client.get("/api/conversations", params={"q": "Waffles"}).json()["conversations"]
    assert old["on_branch"] is False and new["on_branch"] is True
    tree = client.get("/api/conversations/personal/branches").json()["branches"]
    holding = next(b for b in tree if b["n"] == old["branch"])
    assert not holding["current"] and "Biscuit" in holding["text"]
