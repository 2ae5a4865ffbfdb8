"""`heron status`: whether heron serve runs on the home and what the agent is doing, read from
the files and the store (heron/channels/status.py), with exit code 0 (serve up), 3 (none) or 1
(an error)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time

from serve_helpers import running_serve
from typer.testing import CliRunner

from heron import __version__
from heron.channels import status as status_module
from heron.channels.status import NOT_RUNNING, gather, lines
from heron.cli import app
from heron.config import Settings
from heron.memory import queue
from heron.messages import Message, Text, ToolCall, ToolResult, Usage
from heron.providers.scripted import ScriptedProvider
from heron.serve.lock import SOCKET_NAME, ServeLock
from heron.store import Store, goals, held, jobs, runs, waiting
from heron.store import engine_state as es
from heron.store.home_lock import INFO_NAME
from heron.store.schedule import parse
from heron.tools.registry import ToolRegistry


def _store() -> Store:
    return Store(Settings.load().paths.ensure().db)


def _running_turn(store: Store, *, done: int, key: str = "personal") -> int:
    """A turn of `key` holding its lease, its model having called bash and read_file, `done`
    of them finished (a checkpoint holds their results); returns the turn's id."""
    conv = store.open_conversation(key)
    message = Message("user", [Text("look at the files")])
    turn_id, _ = store.begin_turn(conv.id, "run_a", message, provider="openai", model="m")
    claim = es.try_lease(store, conv.id, "owner", ttl=60.0)
    assert claim.holder is None
    calls = [ToolCall("c1", "bash", {"command": "ls"}), ToolCall("c2", "read_file", {"p": "a"})]
    store.append(conv.id, Message("assistant", list(calls)), turn_id=turn_id)
    if done:
        results = [ToolResult("c1", "a b")]
        cp = es.Checkpoint(conv.id, turn_id, claim.epoch, ["c1", "c2"], results)
        assert es.write_checkpoint(store, cp, "owner")
    return turn_id


def _home_at_work(store: Store) -> None:
    """A running turn, mail waiting, a question, a suggestion, jobs, a heartbeat beat, a
    subagent, a goal and a finished turn of today."""
    _running_turn(store, done=1)
    waiting.hold(store, "personal", "default", "the backup failed", "job 3", "cron:3")
    waiting.hold(store, "notes", "default", "disk almost full", "the heartbeat", "heartbeat")
    waiting.hold(store, "notes", "default", "and again", "the heartbeat", "heartbeat")
    runs.create(store, "ask_1", "ask", "personal", "Which city?", status="waiting")
    runs.create(store, "sa_1", "subagent", "personal", "Summarise the logs", status="running")
    runs.create(store, "sa_2", "subagent", "personal", "Done work", status="running")
    runs.finish(store, "sa_2", "done", "ok")  # ended: no longer going
    queue.add(store, "fact", origin="review", path="p.md", text="likes tea", quote="I like tea")
    every = parse(every="1h", timezone="UTC")
    for n in range(4):
        jobs.create_job(store, every, conversation="k", prompt=f"check {n}", now=time.time())
    workspace = Settings.load().paths.workspace
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "HEARTBEAT.md").write_text("- is the backup fresh?\n")
    jobs.claim_tick(store, "heartbeat", "me", 100.0, 60.0)
    jobs.claim_tick(store, "heartbeat", "me", 200.0, 60.0)
    jobs.end_tick(store, "heartbeat", "skipped", "HEARTBEAT.md has nothing to check")
    goals.set_goal(store, "personal", "Migrate the blog")
    other = store.open_conversation("earlier")
    turn = store.start_turn(
        other.id, "run_b", user_message_id=None, provider="openai", model="gpt-4.1-mini"
    )
    used = Usage(input=1000, output=100, cache_read=600)
    store.finish_turn(
        turn, status="done", stop_reason="end", usage=used, model_calls=1, tool_calls=0
    )


def test_gather_reads_the_work_from_the_store_with_no_serve():
    store = _store()
    try:
        _home_at_work(store)
    finally:
        store.close()
    status = gather(Settings.load())
    assert not status.serve.running and status.exit_code == NOT_RUNNING
    [turn] = status.turns
    assert (turn.conversation, turn.mail) == ("personal", 1)
    assert turn.step == "running tool read_file (1 of 2 calls done)"
    assert turn.process == f"process {os.getpid()}"
    assert status.mail == {"notes": 2}  # no turn runs there: it waits for the next
    assert [(q.id, q.conversation, q.text) for q in status.questions] == [
        ("ask_1", "personal", "Which city?")
    ]
    assert status.suggestions == 1
    assert [s.id for s in status.subagents] == ["sa_1"]
    assert [(g.conversation, g.status) for g in status.goals] == [("personal", "active")]
    assert status.jobs_count == 4 and len(status.jobs) == 3  # the soonest three shown
    assert status.jobs[0].line.startswith(f"job {status.jobs[0].id} [reminder, active] every 1h")
    assert status.review is not None and "nightly review" in status.review
    assert (status.heartbeat.minutes, status.heartbeat.outcome) == (30, "skipped")
    today = status.today
    assert today is not None and (today.turns, today.input, today.output) == (2, 1000, 100)
    assert today.hit_rate == 0.6 and today.cost_usd is None  # model `m` has no price
    assert today.unpriced == ("m",)


def test_the_step_is_the_model_until_its_answer_calls_a_tool():
    store = _store()
    try:
        turn_id = _running_turn(store, done=0)
        tools = gather(Settings.load()).turns[0].step
        conv = store.conversation("personal")
        assert conv is not None
        results = Message("user", [ToolResult("c1", "x"), ToolResult("c2", "y")])
        store.append(conv.id, results, turn_id=turn_id)
        model = gather(Settings.load()).turns[0].step
    finally:
        store.close()
    assert tools == "running tools bash, read_file"
    assert model == "with the model"


def test_the_cli_says_no_serve_runs_how_to_start_one_and_exits_3():
    store = _store()
    try:
        _home_at_work(store)
    finally:
        store.close()
    result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == NOT_RUNNING == 3, result.output
    out = result.output
    assert "heron serve: not running on" in out and "start it with: heron serve" in out
    assert "(what follows is read from the store)" in out
    assert "personal: running tool read_file (1 of 2 calls done), for " in out
    assert "1 message waiting for it" in out
    assert "waiting on you: 1 question, 1 memory suggestion" in out
    assert "question ask_1 in personal" in out and "heron memory review" in out
    assert "jobs:      4 scheduled; the next 3 (heron jobs list)" in out
    assert "heartbeat: on, every 30 minutes while heron serve runs; last " in out
    assert "subagent sa_1 for personal: running" in out
    assert "goal in personal: active" in out
    assert (
        "today:     2 turns, 1,000 tokens in, 100 out, cache hit 60%, cost unknown: no price"
        " for m ([prices] in config.toml)" in out
    )
    shown = CliRunner().invoke(app, ["status", "--json"])
    assert shown.exit_code == 3
    data = json.loads(shown.output)
    assert data["serve"]["running"] is False and data["suggestions"] == 1
    assert data["turns"][0]["conversation"] == "personal"


def test_a_serve_holding_the_home_is_shown_with_its_details_and_exits_0():
    home = Settings.load().paths.ensure().home
    store = _store()
    try:
        _running_turn(store, done=0)
    finally:
        store.close()
    with ServeLock(home) as lock:
        info = lock.publish("http://127.0.0.1:8765", "openai/gpt-4.1-mini")
        status = gather(Settings.load())
        result = CliRunner().invoke(app, ["status"])
    serve = status.serve
    assert serve.running and serve.pid == os.getpid() and serve.url == info.url
    assert serve.socket == str(home / SOCKET_NAME) and serve.version == __version__
    assert serve.started is not None and abs(serve.started - time.time()) < 600
    assert status.model == "openai/gpt-4.1-mini"  # the serve's, not the offline fallback
    assert status.model_note.startswith("heron serve's; this shell's settings name local/")
    assert result.exit_code == 0, result.output
    assert f"heron serve: running, pid {os.getpid()}, up " in result.output
    assert f"web UI:  {info.url}" in result.output and "turns:     1 running" in result.output
    # the lease's process is the serve's: said so (a `heron run` of its own shows its pid)
    assert "personal: running tools bash, read_file, for " in result.output
    assert ", in heron serve" in result.output


def test_a_subagent_s_turn_is_shown_on_its_line_not_again_among_the_turns():
    """qa24a L2: a running subagent was listed twice, its turn under its lineage's key and its
    run under its id, with nothing tying the two."""
    store = _store()
    try:
        runs.create(store, "sa_9", "subagent", "personal", "Count", status="running", lineage="ab")
        _running_turn(store, done=0, key="subagent:ab")
        status = gather(Settings.load())
    finally:
        store.close()
    out = "\n".join(lines(status))
    assert status.turns == [] and "turns:     none running" in out
    [sub] = status.subagents
    assert sub.step == "running tools bash, read_file"
    assert "(running tools bash, read_file): Count" in out and "subagent:ab" not in out


def test_a_heartbeat_with_nothing_to_check_is_said_to_skip_each_beat():
    """qa24e L6: "heartbeat: on" read as checking something when HEARTBEAT.md asks nothing."""
    _store().close()  # a home that has run
    empty = "\n".join(lines(gather(Settings.load())))
    workspace = Settings.load().paths.workspace
    (workspace / "HEARTBEAT.md").write_text("# Heartbeat\n- is the backup fresh?\n")
    checking = "\n".join(lines(gather(Settings.load())))
    assert "has nothing to check: each beat is skipped" in empty
    assert "heartbeat: on, every 30 minutes while heron serve runs" in checking
    assert "nothing to check" not in checking


def test_a_serve_whose_details_are_lost_is_running_not_starting_forever():
    """qa24a L8: serve.json deleted or overwritten while the serve ran read as "starting"
    for as long as the serve ran. Just after the lock is taken it is starting; later the
    serve runs and where it listens is not known."""
    home = Settings.load().paths.ensure().home
    with ServeLock(home) as lock:
        lock.publish("http://127.0.0.1:8765", "openai/gpt-4.1-mini")
        (home / INFO_NAME).write_text("{damaged")
        starting = gather(Settings.load()).serve
        long_ago = time.time() - 3600
        os.utime(home / "serve.lock", (long_ago, long_ago))
        lost = gather(Settings.load()).serve
        result = CliRunner().invoke(app, ["status"])
    assert starting.running and not starting.unreadable
    assert lost.running and lost.unreadable and lost.pid == os.getpid()
    assert result.exit_code == 0, result.output
    assert "serve.json (where it listens) is missing or damaged" in result.output
    assert not result.output.startswith("heron serve: starting")


def test_a_serve_json_left_by_a_killed_serve_is_not_a_running_serve():
    home = Settings.load().paths.ensure().home
    (home / INFO_NAME).write_text(json.dumps({"pid": 999999, "url": "http://x", "socket": "s"}))
    assert not gather(Settings.load()).serve.running
    assert CliRunner().invoke(app, ["status"]).exit_code == 3


def test_a_store_that_cannot_be_read_is_an_error_exit_1():
    home = Settings.load().paths.ensure().home
    (home / "heron.db").write_bytes(b"not a database, " * 1000)
    result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == 1, result.output
    assert "heron serve: not running" in result.output  # what could be known is still said
    assert "store:     not readable: " in result.output


async def test_a_real_serve_writes_what_status_shows():
    async with running_serve(ScriptedProvider([]), ToolRegistry([])) as running:
        status = gather(Settings.load())
    assert status.serve.running and status.serve.url == running.url
    assert status.serve.pid == os.getpid() and status.serve.version == __version__
    assert status.model == status.serve.model and status.model.startswith("scripted/")


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_runs_of_a_process_that_is_gone_are_interrupted_not_waiting():
    """qa24a M1: a serve killed while a question waited and a subagent ran left both rows
    open; nothing runs them, and the next Heron process marks them interrupted."""
    store = _store()
    try:
        runs.create(store, "ask_1", "ask", "asking", "Which city?", status="waiting")
        runs.create(store, "sa_1", "subagent", "subs", "count sheep", status="running")
        runs.create(store, "sa_2", "subagent", "subs", "still going", status="running")
        with store.transaction() as c:  # the process that ran them was killed
            c.execute("UPDATE runs SET pid = ? WHERE id != 'sa_2'", (_dead_pid(),))
    finally:
        store.close()
    status = gather(Settings.load())
    assert [(q.id, q.state) for q in status.questions] == [("ask_1", "interrupted")]
    assert [(s.id, s.state) for s in status.subagents] == [
        ("sa_1", "interrupted"),
        ("sa_2", "running"),
    ]
    out = CliRunner().invoke(app, ["status"]).output
    assert "waiting on you: nothing" in out  # nobody can answer it
    gone = "interrupted (its process is gone; the next heron serve, heron chat or heron run"
    assert f"question ask_1 in asking: {gone}" in out
    assert f"subagent sa_1 for subs: {gone}" in out
    assert "subagent sa_2 for subs: running " in out


def test_the_persons_own_messages_held_for_a_turn_are_counted_apart_from_mail():
    """qa24a M2: follow-ups sent mid-turn (held_messages) were not counted at all."""
    store = _store()
    try:
        _running_turn(store, done=0)
        waiting.hold(store, "personal", "default", "the backup failed", "job 3", "cron:3")
        for words in ("followup one", "from a script"):
            held.hold(store, "personal", "default", Message("user", [Text(words)]), None)
        held.hold(store, "notes", "default", Message("user", [Text("later")]), None)
    finally:
        store.close()
    status = gather(Settings.load())
    [turn] = status.turns
    assert (turn.mail, turn.held) == (1, 2)
    assert status.held == {"notes": 1} and status.mail == {}
    out = CliRunner().invoke(app, ["status"]).output
    assert "1 message waiting for it; 2 of your messages waiting to join the turn" in out
    assert "  notes: 1 of your messages waiting to go in at its next turn" in out
    data = json.loads(CliRunner().invoke(app, ["status", "--json"]).output)
    assert data["turns"][0]["held"] == 2 and data["held"] == {"notes": 1}


def test_a_locked_store_is_said_at_once_and_its_fields_read_unknown(monkeypatch):
    """qa24a M3: an SQLite tool holding heron.db in an exclusive lock made status wait 30 s
    (the store's busy timeout) before it said anything; --json then gave [] and 0 for what
    was not known."""
    store = _store()
    store.close()
    monkeypatch.setattr(status_module, "BUSY_TIMEOUT_S", 0.05)  # its own short wait, shorter
    locker = sqlite3.connect(Settings.load().paths.db, isolation_level=None)
    try:
        locker.execute("PRAGMA locking_mode=EXCLUSIVE")
        locker.execute("BEGIN EXCLUSIVE")
        locker.execute("CREATE TABLE held_by_a_tool (x)")
        result = CliRunner().invoke(app, ["status"])
        data = json.loads(CliRunner().invoke(app, ["status", "--json"]).stdout)
    finally:
        locker.close()
    assert result.exit_code == 1, result.output
    assert "store:     locked by another process (" in result.output
    assert "); try again in a moment" in result.output
    assert data["store_locked"] is True and data["store_error"]
    for unknown in ("turns", "questions", "jobs", "jobs_count", "subagents", "goals", "today"):
        assert data[unknown] is None, unknown


def test_the_store_opens_with_the_busy_timeout_asked_for():
    store = Store(Settings.load().paths.ensure().db, busy_timeout=1.5)
    try:
        assert store.query("PRAGMA busy_timeout")[0][0] == 1500
    finally:
        store.close()
    store = _store()  # every other command still waits as long as before
    try:
        assert store.query("PRAGMA busy_timeout")[0][0] == 30000
    finally:
        store.close()


def test_a_store_error_is_said_once_its_hint_indented_under_it():
    """qa24a L7: the hint wrapped onto an unindented line, and the error came twice (stdout
    and stderr)."""
    home = Settings.load().paths.ensure().home
    (home / "heron.db").write_bytes(b"not a database, " * 1000)
    result = CliRunner().invoke(app, ["status"])
    lines = result.output.splitlines()
    [at] = [n for n, line in enumerate(lines) if line.startswith("store:     not readable: ")]
    assert (
        lines[at + 1]
        == "           If the file is damaged, move it aside; Heron creates a fresh one."
    )
    assert result.output.count("not a database") == 1


def test_a_config_that_does_not_load_is_said_and_the_serve_hint_waits_for_it():
    """qa24a M4: a broken config.toml was only on stderr; status said "start it with: heron
    serve", which then refused, and showed the defaults as the home's settings."""
    _store().close()
    home = Settings.load().paths.home
    (home / "config.toml").write_text("[agent]\nheartbeat_minutes = -5\n")
    result = CliRunner().invoke(app, ["status"])
    out = result.stdout
    assert result.exit_code == NOT_RUNNING, result.output
    assert "config:    config.toml does not load: " in out and "got -5" in out
    assert "heron serve and turns refuse until it is fixed" in out
    assert "start it with: heron serve" not in out
    assert "heron serve: not running on" in out and "fix config.toml first" in out
    assert "heartbeat: unknown until config.toml loads" in out
    data = json.loads(CliRunner().invoke(app, ["status", "--json"]).stdout)
    assert "got -5" in data["config_error"]
    assert data["heartbeat"]["minutes"] is None  # not the default's 30


def test_a_heartbeat_detail_of_several_lines_is_indented_under_its_line():
    store = _store()
    try:
        jobs.claim_tick(store, "heartbeat", "me", 100.0, 60.0)
        detail = "cannot find the host of http://x/v1\nCheck the host name in config.toml."
        jobs.end_tick(store, "heartbeat", "failed", detail)
    finally:
        store.close()
    lines = CliRunner().invoke(app, ["status"]).stdout.splitlines()
    [at] = [n for n, line in enumerate(lines) if line.startswith("heartbeat: ")]
    assert lines[at].endswith("failed (cannot find the host of http://x/v1)")
    assert lines[at + 1] == "           Check the host name in config.toml."


def test_a_path_with_no_heron_home_is_said_and_nothing_is_made(tmp_path, monkeypatch):
    """qa24a L1: status on a mistyped HERON_HOME made the home, heron.db, memory/ and
    workspace/ there."""
    missing = tmp_path / "typo" / "nested" / "home"
    monkeypatch.setenv("HERON_HOME", str(missing))
    result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == NOT_RUNNING, result.output
    assert f"no Heron home at {missing} (nothing has run here yet)" in result.stdout
    assert not (tmp_path / "typo").exists()
    data = json.loads(CliRunner().invoke(app, ["status", "--json"]).stdout)
    assert data["home_exists"] is False and data["turns"] == []  # none: nothing ran here


def test_status_leaves_a_home_others_can_read_as_it_is(heron_home):
    """qa24a L1: status made an existing home 0700 (and said so): it writes nothing."""
    _store().close()
    heron_home.chmod(0o755)
    result = CliRunner().invoke(app, ["status"])
    assert "now 0700" not in result.output
    assert heron_home.stat().st_mode & 0o777 == 0o755


def test_a_turn_asking_the_person_waits_for_their_answer_named_with_its_zone():
    """qa24a L5: the turn read "running tool ask_user", and the question's deadline had no
    zone where the job lines name theirs."""
    store = _store()
    try:
        conv = store.open_conversation("asking")
        message = Message("user", [Text("ask me")])
        turn_id, _ = store.begin_turn(conv.id, "run_a", message, provider="openai", model="m")
        assert es.try_lease(store, conv.id, "owner", ttl=60.0).holder is None
        call = ToolCall("c1", "ask_user", {"question": "Which city?"})
        store.append(conv.id, Message("assistant", [call]), turn_id=turn_id)
        runs.create(store, "ask_9", "ask", "asking", "Which city?", status="waiting")
        with store.transaction() as c:
            c.execute("UPDATE runs SET deadline = ? WHERE id = 'ask_9'", (time.time() + 900,))
    finally:
        store.close()
    [turn] = gather(Settings.load()).turns
    assert turn.step == "waiting for your answer (question ask_9)"
    out = CliRunner().invoke(app, ["status"]).stdout
    [line] = [line for line in out.splitlines() if "question ask_9 in asking" in line]
    assert " UTC: Which city?" in line  # the deadline's zone named


def test_a_job_due_with_no_serve_says_it_runs_when_the_serve_runs():
    """qa24a L4: an overdue job read "next 05:25" (in the past) with no serve to run it."""
    store = _store()
    try:
        every = parse(every="1m", timezone="UTC")
        jobs.create_job(store, every, conversation="k", prompt="check", now=time.time() - 3600)
    finally:
        store.close()
    [job] = gather(Settings.load()).jobs
    assert "every 1m, due; runs when heron serve runs: check" in job.line


def test_a_parked_goal_waits_on_the_person():
    """qa24a L3: a goal parked when its budget ran out read "goals: none active"."""
    store = _store()
    try:
        goal = goals.set_goal(store, "personal", "Migrate the blog")
        goals.set_status(store, goal.id, "parked")
    finally:
        store.close()
    status = gather(Settings.load())
    assert [(g.conversation, g.status) for g in status.goals] == [("personal", "parked")]
    out = CliRunner().invoke(app, ["status"]).stdout
    assert "waiting on you: 1 parked goal" in out
    assert "  goal in personal: parked, its budget ran out (/goal budget TURNS there" in out
    assert "goals: none active" in out  # none goes on by itself
