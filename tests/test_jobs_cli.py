"""`heron jobs`: add, list, cancel and runs through the typer app, in the test's home."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import time
from zoneinfo import ZoneInfo

from typer.testing import CliRunner

from heron.cli import app
from heron.config import Settings
from heron.store import Store
from heron.store import jobs as js
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

runner = CliRunner()


def jobs(*args: str):
    return runner.invoke(app, ["jobs", *args])


def test_add_without_serve_says_it_waits_for_one_then_list_and_cancel(heron_home):
    added = jobs("add", "Water the plants.", "-c", "chat-1", "--cron", "0 18 * * *")
    assert added.exit_code == 0, added.output
    made = re.search(r"Created job (\d+) \[reminder, active\] cron 0 18 \* \* \*", added.output)
    assert made, added.output
    assert "saved; it fires while `heron serve` runs" in added.output
    listed = jobs("list")
    header, *rows = listed.output.splitlines()
    assert header.split() == [
        "ID",
        "MODE",
        "STATUS",
        "SCHEDULE",
        "NEXT",
        "CONVERSATION",
        "LAST",
        "PROMPT",
    ]
    (row,) = [r for r in rows if r.startswith(f"{made[1]} ")]
    assert "chat-1" in row and "Water the plants." in row
    cancelled = jobs("cancel", made[1])
    assert cancelled.exit_code == 0 and "cancelled" in cancelled.output
    assert "Water the plants." not in jobs("list").output
    assert "cancelled" in jobs("list", "--all").output


def test_add_while_serve_runs_says_nothing_about_waiting(heron_home):
    (heron_home / "serve.json").write_text(json.dumps({"pid": os.getpid()}))
    added = jobs("add", "Check the feed.", "-c", "chat-1", "--every", "2h", "--mode", "monitor")
    assert added.exit_code == 0 and "monitor" in added.output
    assert "heron serve" not in added.output


def test_bad_schedules_and_unknown_jobs_get_a_clear_error_and_save_nothing(heron_home):
    for args in (
        ["--cron", "soon"],
        ["--every", "10s"],
        ["--every", "1h", "--at", "2030-01-01 10:00"],
        [],
    ):
        bad = jobs("add", "x", "-c", "chat-1", *args)
        assert bad.exit_code == 1 and "heron:" in bad.output and "Traceback" not in bad.output
    assert jobs("add", "x", "-c", "c", "--every", "1h", "--mode", "loud").exit_code == 1
    missing = jobs("cancel", "42")
    assert missing.exit_code == 1 and "there is no job 42" in missing.output
    store = Store(Settings.load().paths.db)
    try:
        assert [j for j in js.list_jobs(store, everything=True) if not j.builtin] == []
    finally:
        store.close()


def test_a_blank_prompt_and_a_bad_mode_or_catch_up_are_refused_by_name(heron_home):
    for prompt in ("", "   \n"):
        blank = jobs("add", prompt, "-c", "jobsconv", "--every", "1m")
        assert blank.exit_code == 1 and "the job's prompt is empty" in blank.output
    mode = jobs("add", "x", "-c", "c", "--every", "1h", "--mode", "bogus")
    assert mode.exit_code == 1 and "--mode 'bogus' is unknown" in mode.output
    assert "reminder or monitor" in mode.output and "'once'" not in mode.output
    late = jobs("add", "x", "-c", "c", "--every", "1h", "--catch-up", "always")
    assert late.exit_code == 1 and "--catch-up 'always' is unknown" in late.output
    assert "once or skip" in late.output and "'reminder'" not in late.output
    store = Store(Settings.load().paths.db)
    try:
        assert [j for j in js.list_jobs(store, everything=True) if not j.builtin] == []
    finally:
        store.close()


def test_runs_lists_fires_and_skips_with_why(heron_home):
    assert jobs("runs").output.strip() == "No runs yet."
    store = Store(Settings.load().paths.ensure().db)
    try:
        from heron.store.schedule import parse

        job = js.create_job(
            store, parse(every="1h", timezone="UTC"), conversation="c", prompt="p", now=0.0,
            catch_up="skip",
        )  # fmt: skip
        js.claim_due(store, "me", os.getpid(), 5 * 3600.0 + 120, 3600.0)
        (fired,) = js.claim_due(store, "me", os.getpid(), 6 * 3600.0, 3600.0)
        why = "cannot connect: connection refused\nIs the model server running?"
        js.finish_run(store, fired.run_id, status="failed", outcome="failed", now=6 * 3600.0,
                      detail=why)  # fmt: skip
    finally:
        store.close()
    out = jobs("runs", str(job.id)).output.splitlines()
    assert out[0].split()[:6] == ["RUN", "JOB", "DUE", "STARTED", "STATUS", "OUTCOME"]
    assert "skipped" in out[2] and "catch_up = skip" in out[2]
    # A failure's error and its hint in its one cell (qa24c L2): the table keeps its rows.
    assert len(out) == 3
    assert out[1].endswith("connection refused. Is the model server running?")


def test_every_jobs_command_has_help():
    for sub in ("list", "show", "add", "pause", "resume", "run-now", "cancel", "runs"):
        shown = jobs(sub, "--help")
        assert shown.exit_code == 0 and "Usage" in shown.output


def test_a_cron_that_never_fires_is_refused_without_a_traceback(heron_home):
    for cron in ("0 9 30 2 *", "0 9 31 4 *"):
        refused = jobs("add", "x", "-c", "chat-1", "--cron", cron)
        assert refused.exit_code == 1, refused.output
        assert "never fires" in refused.output and "cron=" not in refused.output
        # the forms as this command takes them, not the tool's `cron="..."` (QA22u L7)
        assert '--cron "0 9 * * 1-5"' in refused.output and "--every 30m" in refused.output
        assert refused.exception is None or isinstance(refused.exception, SystemExit)


def test_runs_of_an_unknown_job_and_a_second_cancel_say_so(heron_home):
    missing = jobs("runs", "999")
    assert missing.exit_code == 1 and "there is no job 999" in missing.output
    added = jobs("add", "Water the plants.", "-c", "chat-1", "--every", "1d")
    job_id = re.search(r"Created job (\d+)", added.output).group(1)
    assert jobs("cancel", job_id).output.startswith(f"Cancelled job {job_id}")
    again = jobs("cancel", job_id)
    assert again.exit_code == 0 and f"Job {job_id} was already cancelled" in again.output


def test_adding_to_a_conversation_that_does_not_exist_says_its_first_run_opens_it(heron_home):
    added = jobs("add", "Water the plants.", "-c", "TYPO", "--every", "1d")
    assert added.exit_code == 0
    assert "Conversation 'TYPO' does not exist yet: the job's first run opens it" in added.output
    store = Store(Settings.load().paths.db)
    try:
        store.open_conversation("chat-1", "default")
    finally:
        store.close()
    known = jobs("add", "Water the plants.", "-c", "chat-1", "--every", "1d")
    assert "does not exist yet" not in known.output


def _added(*args: str) -> str:
    added = jobs("add", "Water the plants.", "-c", "chat-1", *args)
    assert added.exit_code == 0, added.output
    return re.search(r"Created job (\d+)", added.output).group(1)


def test_pause_resume_and_show_say_what_happens(heron_home):
    job_id = _added("--cron", "0 9 * * 1")
    paused = jobs("pause", job_id)
    assert paused.exit_code == 0 and f"Paused job {job_id} [reminder, paused]" in paused.output
    assert f"heron jobs resume {job_id}" in paused.output
    again = jobs("pause", job_id)
    assert again.exit_code == 0 and "was already paused" in again.output
    (row,) = [r for r in jobs("list").output.splitlines() if r.startswith(f"{job_id} ")]
    assert row.split()[1:3] == ["reminder", "paused"] and "paused" in row.split()[3:]
    shown = jobs("show", job_id)
    assert shown.exit_code == 0, shown.output
    for said in (
        f"Job {job_id}: reminder, paused",
        "schedule:     cron 0 9 * * 1",
        "zone:         ",
        "next:         - (paused; resumed now, next ",
        "conversation: chat-1",
        "Prompt:\n  Water the plants.",
        "No runs yet.",
    ):
        assert said in shown.output, shown.output
    resumed = jobs("resume", job_id)
    assert resumed.exit_code == 0
    assert re.search(rf"Resumed job {job_id}: next Mon \d{{4}}-\d\d-\d\d 09:00 ", resumed.output)
    assert "not made up" in resumed.output
    assert "is not paused" in jobs("resume", job_id).output


def test_unknown_and_cancelled_jobs_get_a_clear_error_and_exit_1(heron_home):
    job_id = _added("--every", "1d")
    jobs("cancel", job_id)
    for sub in ("show", "pause", "resume", "run-now", "cancel", "runs"):
        missing = jobs(sub, "999")
        assert missing.exit_code == 1 and "there is no job 999" in missing.output, sub
    for sub in ("pause", "resume", "run-now"):
        refused = jobs(sub, job_id)
        assert refused.exit_code == 1, (sub, refused.output)
        assert f"job {job_id} is cancelled" in refused.output
    assert "cancelled" in jobs("show", job_id).output


def _model(monkeypatch, server: FakeOpenAIServer) -> None:
    monkeypatch.setenv("HERON_BASE_URL", server.base_url)
    monkeypatch.setenv("HERON_API_KEY", "dummy")
    monkeypatch.setenv("HERON_MODEL", "fake-model")


def test_run_now_without_a_serve_runs_the_job_here_and_keeps_its_schedule(heron_home, monkeypatch):
    job_id = _added("--every", "1d")
    with FakeOpenAIServer([ServerReply(text="Time to water the plants!")]) as server:
        _model(monkeypatch, server)
        before = _job(job_id)
        ran = runner.invoke(app, ["jobs", "run-now", job_id])
    assert ran.exit_code == 0, ran.output
    assert ran.stdout == "Time to water the plants!\n"
    assert f"no heron serve is running: job {job_id} runs here" in ran.stderr
    assert f"job {job_id} ran here: done (delivered)." in ran.stderr
    # The model was asked as a serve's scheduler asks it: the reminder's wrapper and prompt.
    (asked,) = server.requests
    said = json.dumps(asked["messages"][-1])
    assert f"Scheduled reminder, job {job_id}" in said and "Water the plants." in said
    after = _job(job_id)
    assert after.next_run == before.next_run and after.run_now is None
    (run,) = _runs(job_id)
    assert (run.status, run.outcome, run.detail) == ("done", "delivered", js.RUN_NOW)
    shown = runner.invoke(app, ["conversations", "show", "chat-1"])
    assert "Time to water the plants!" in shown.output


def test_run_now_here_that_fails_says_so_records_it_and_exits_1(heron_home, monkeypatch):
    job_id = _added("--every", "1d")
    monkeypatch.setenv("HERON_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens there
    monkeypatch.setenv("HERON_API_KEY", "dummy")
    monkeypatch.setenv("HERON_MODEL", "fake-model")
    ran = runner.invoke(app, ["jobs", "run-now", job_id])
    assert ran.exit_code == 1, ran.output
    assert f"job {job_id} ran here: failed." in ran.stderr
    assert f"heron jobs runs {job_id} lists its runs." in ran.stderr
    assert [r.status for r in _runs(job_id)] == ["failed"]


def test_run_now_here_refuses_a_cancelled_job_and_a_bad_config_asks_nothing(
    heron_home, monkeypatch
):
    job_id = _added("--every", "1d")
    monkeypatch.setenv("HERON_MODEL", "no-such-model-anywhere")  # no provider serves it
    refused = runner.invoke(app, ["jobs", "run-now", job_id])
    assert refused.exit_code != 0 and "heron:" in refused.stderr
    assert _job(job_id).run_now is None and _runs(job_id) == []


def _job(job_id: str) -> js.Job:
    store = Store(Settings.load().paths.db)
    try:
        found = js.get_job(store, int(job_id))
        assert found is not None
        return found
    finally:
        store.close()


def _runs(job_id: str) -> list[js.JobRun]:
    store = Store(Settings.load().paths.db)
    try:
        return js.runs(store, int(job_id))
    finally:
        store.close()


def _zone(home, name: str) -> None:
    (home / "config.toml").write_text(f'[agent]\ntimezone = "{name}"\n', encoding="utf-8")


def test_a_job_made_in_another_zone_is_shown_in_the_agents_zone_and_says_its_own(heron_home):
    # Made while the agent's zone was UTC; the person then moved to Tokyo (UTC+9, no DST).
    _zone(heron_home, "Etc/UTC")
    old = _added("--cron", "0 9 * * *")
    _zone(heron_home, "Asia/Tokyo")
    new = _added("--cron", "0 9 * * *")
    store = Store(Settings.load().paths.db)
    try:
        # Fire the old job once at 09:00 UTC on its first day, which is 18:00 in Tokyo.
        store.conn.execute("UPDATE jobs SET next_run = ? WHERE id = ?", (9 * 3600.0, int(old)))
        store.conn.commit()
        (fire,) = js.claim_due(store, "me", os.getpid(), 9 * 3600.0 + 30, 3600.0)
        # Ended: a run still going would show its next time as waiting for it.
        js.finish_run(store, fire.run_id, status="done", outcome="delivered", now=9 * 3600.0 + 60)
    finally:
        store.close()
    listed = jobs("list").output
    rows = {r.split()[0]: r for r in listed.splitlines()[1:] if r.split()}
    assert re.search(r"\d{4}-\d\d-\d\d 18:00", rows[old]), listed  # 09:00 UTC, in Tokyo
    assert re.search(r"\d{4}-\d\d-\d\d 09:00", rows[new]), listed
    assert f"Job {old}'s cron reads its times in Etc/UTC" in listed, listed
    assert f"Job {new}'s cron" not in listed
    shown = jobs("show", old).output
    assert "zone:         Etc/UTC, not Asia/Tokyo" in shown, shown
    assert re.search(r"next:         \d{4}-\d\d-\d\d 18:00 JST", shown), shown
    assert re.search(r"made:         \d{4}-\d\d-\d\d \d\d:\d\d JST by cli", shown), shown
    assert "zone:         Asia/Tokyo\n" in jobs("show", new).output
    ran = jobs("runs", old).output.splitlines()
    assert ran[1].split()[2:6] == ["1970-01-01", "18:00", "1970-01-01", "18:00"], ran


def test_set_zone_moves_a_cron_job_to_the_agents_zone_or_a_named_one(heron_home):
    _zone(heron_home, "Etc/UTC")
    daily = _added("--cron", "0 9 * * *")
    hourly = _added("--every", "1h")
    _zone(heron_home, "Asia/Tokyo")
    assert f"heron jobs set-zone {daily}" in jobs("list").output  # the note says how
    moved = jobs("set-zone", daily)
    assert moved.exit_code == 0, moved.output
    assert re.search(
        r"Moved job \d+ .*cron 0 9 \* \* \* \(Asia/Tokyo\), next \S+ 09:00 JST", moved.output
    )
    job = _job(daily)
    assert job.schedule.timezone == "Asia/Tokyo" and job.status == "active"
    local = dt.datetime.fromtimestamp(job.next_run, ZoneInfo("Asia/Tokyo"))
    assert (local.hour, local.minute) == (9, 0) and job.next_run > time.time()
    assert "cron reads its times" not in jobs("list").output
    again = jobs("set-zone", daily)
    assert again.exit_code == 0 and "already reads its times in Asia/Tokyo" in again.output
    slipped = jobs("set-zone", daily, "europe/berlin")  # a case slip means the zone
    assert slipped.exit_code == 0 and "(Europe/Berlin)" in slipped.output, slipped.output
    offset = jobs("set-zone", daily, "UTC+2")
    assert offset.exit_code == 1 and "Etc/GMT-2 is UTC+2" in offset.output
    assert "[agent] timezone" not in offset.output  # this command's hint, not the config's
    named = jobs("set-zone", daily, "America/New_York")
    assert named.exit_code == 0 and "(America/New_York)" in named.output
    assert _job(daily).schedule.timezone == "America/New_York"
    for said in (jobs("list").output, jobs("show", daily).output):  # moved, not made there
        assert "America/New_York" in said and "the zone it was made in" not in said, said
    for refused, said in (
        (jobs("set-zone", hourly), "an instant, the same in every zone"),
        (jobs("set-zone", daily, "Mars/Olympus"), "unknown timezone 'Mars/Olympus'"),
        (jobs("set-zone", "999"), "there is no job 999"),
    ):
        assert refused.exit_code == 1 and said in refused.output, refused.output
    assert _job(daily).schedule.timezone == "America/New_York"  # the refusals moved nothing


def test_set_zone_keeps_a_paused_job_paused(heron_home):
    _zone(heron_home, "Etc/UTC")
    daily = _added("--cron", "0 9 * * *")
    jobs("pause", daily)
    _zone(heron_home, "Asia/Tokyo")
    assert jobs("set-zone", daily).exit_code == 0
    job = _job(daily)
    assert job.status == "paused" and job.schedule.timezone == "Asia/Tokyo"
    resumed = jobs("resume", daily)
    assert re.search(r"next \S+ \S+ 09:00 JST", resumed.output), resumed.output


def test_an_absurd_interval_or_time_is_refused_and_saves_nothing(heron_home):
    for args, said in (
        (["--every", "99999999d"], "over a year"),
        (["--every", "100000w"], "over a year"),
        (["--at", "9999-12-31 23:00"], "more than 10 years"),
        (["--at", "0001-01-01 00:00+05:00"], "not a date and time"),
    ):
        bad = jobs("add", "huge", "-c", "late", *args)
        assert bad.exit_code == 1 and said in bad.output, (args, bad.output)
        assert "Traceback" not in bad.output
    assert "huge" not in jobs("list", "--all").output


def test_a_stored_row_that_cannot_be_read_is_shown_damaged_and_cancellable(heron_home):
    from heron.tools.schedule import status_lines

    good, bad = _added("--every", "1d"), _added("--every", "2d")
    store = Store(Settings.load().paths.db)
    try:  # as an older Heron saved `--every 99999999d`: next in the year 275817
        with store.transaction() as c:
            c.execute(
                "UPDATE jobs SET spec = ?, next_run = ? WHERE id = ?",
                (str(99999999 * 86400), 8.6e12, int(bad)),
            )
        status = status_lines(store, "chat-1", "Europe/Berlin")
    finally:
        store.close()
    listed = jobs("list")
    assert listed.exit_code == 0, listed.output
    (row,) = [r for r in listed.output.splitlines() if r.startswith(f"{bad} ")]
    assert "damaged" in row and f"heron jobs cancel {bad}" in listed.output
    assert any(r.startswith(f"{good} ") for r in listed.output.splitlines())
    shown = jobs("show", bad)
    assert shown.exit_code == 0 and "damaged" in shown.output, shown.output
    assert any("damaged" in line for line in status)
    assert jobs("cancel", bad).exit_code == 0
    assert not any(r.startswith(f"{bad} ") for r in jobs("list").output.splitlines())


def test_cancel_takes_several_ids_a_conversation_or_all_but_never_the_review(heron_home):
    a, b, c = (_added("--every", "1h") for _ in range(3))
    other = jobs("add", "Elsewhere.", "-c", "chat-2", "--every", "1h")
    assert other.exit_code == 0
    several = jobs("cancel", a, b)
    assert several.exit_code == 0 and several.output.count("Cancelled job") == 2
    here = jobs("cancel", "-c", "chat-1")
    assert here.exit_code == 0 and f"Cancelled job {c} " in here.output
    assert "Elsewhere." in jobs("list").output
    everything = jobs("cancel", "--all")
    assert everything.exit_code == 0 and "Elsewhere." in everything.output
    assert "No active or paused jobs." in jobs("cancel", "--all").output
    assert "Built-in: the nightly review" in jobs("list").output  # not among "all"
    neither = jobs("cancel")
    assert neither.exit_code == 1 and "--conversation KEY, or --all" in neither.output
    mixed = jobs("cancel", "1", "999")
    assert (
        mixed.exit_code == 1 and "nightly review" in mixed.output and "no job 999" in mixed.output
    )


def test_adding_a_monitor_on_a_model_with_no_tools_says_its_runs_are_skipped(
    heron_home, monkeypatch
):
    monkeypatch.setenv("HERON_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("HERON_MODEL", "fake-model")
    added = jobs(
        "add", "Is notes.txt there?", "-c", "personal", "--every", "1h", "--mode", "monitor"
    )
    assert added.exit_code == 0, added.output
    assert "has no tools" not in added.output  # a model with tools: nothing to say
    (heron_home / "config.toml").write_text('[models."fake-model"]\ntools = false\n')
    added = jobs(
        "add", "Is notes.txt there?", "-c", "personal", "--every", "1h", "--mode", "monitor"
    )
    assert added.exit_code == 0, added.output
    said = " ".join(added.output.split())
    assert "is a monitor, which reaches you only by calling the message tool" in said
    assert "the model in use (openai/fake-model) has no tools: its runs are skipped" in said
    reminder = jobs("add", "Drink water.", "-c", "personal", "--every", "1h")
    assert "has no tools" not in reminder.output  # a reminder speaks by its reply


def test_pause_and_resume_take_several_ids_as_cancel_does(heron_home):
    """`heron jobs pause 2 3` said "Got unexpected extra argument(s)" (qa24c L10)."""
    first, second = _added("--every", "1h"), _added("--every", "2h")
    refused = jobs("pause", first, "999")
    assert refused.exit_code != 0 and "there is no job 999" in refused.output
    assert "Paused" not in refused.output  # nothing paused: the ids are checked first
    paused = jobs("pause", first, second)
    assert paused.exit_code == 0, paused.output
    assert f"Paused job {first} " in paused.output and f"Paused job {second} " in paused.output
    resumed = jobs("resume", first, second)
    assert resumed.exit_code == 0, resumed.output
    assert f"Resumed job {first}" in resumed.output and f"Resumed job {second}" in resumed.output
