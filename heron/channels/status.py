"""`heron status`: whether `heron serve` runs on this home and what the agent is doing, at a
glance, for a person or (with --json) a script.

`gather` reads files and the store only (no model call, no network, no socket): the serve's
lock and serve.json (heron/store/home_lock.py, as the store itself tells a running serve), the
turn leases that make one turn per conversation across processes, the runs, jobs, ticks and
memory suggestions, and today's usage as `heron usage` counts it. So it says the same with no
serve running, from the store, under a line saying so. It writes nothing.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heron import timefmt
from heron.channels.common import echo
from heron.channels.info import model_source, open_store
from heron.channels.jobs_cli import review_line
from heron.errors import HeronError, StoreLocked
from heron.memory.queue import count_waiting
from heron.messages import plural
from heron.proactive.heartbeat import heartbeat_lines
from heron.store import engine_state, goals, held, jobs, runs, waiting
from heron.store.home_lock import INFO_NAME, LOCK_NAME, read_info, serve_holder
from heron.store.runs import elapsed
from heron.tools.schedule import describe
from heron.trace.prices import PriceTable, format_cost
from heron.trace.render import usage_total

if TYPE_CHECKING:
    from heron.config import Settings
    from heron.store import Store, Turn

# `heron status` exits 0 when a serve runs, NOT_RUNNING when none does, 1 on an error.
NOT_RUNNING = 3
# Seconds status waits for another process's lock on heron.db (every other command waits 30):
# the person asking is often asking because something looks stuck.
BUSY_TIMEOUT_S = 1.5
# A serve writes serve.json within a second or two of taking the lock; one locked longer
# without it lost the file (deleted, overwritten) while it ran.
STARTING_S = 30.0
JOBS_SHOWN = 3  # the soonest of the person's jobs shown; `heron jobs list` has them all
# A run whose process ended: every Heron process that runs turns marks such runs interrupted
# as it starts (heron/proactive/subagents.py `start`), a subagent's partial result then told.
GONE = "interrupted (its process is gone; the next heron serve, heron chat or heron run ends it)"


@dataclass(frozen=True)
class Serve:
    """The home's `heron serve`: whether one holds its lock, and what its serve.json says.
    `started`, `version` and `model` are None for a serve of an earlier Heron (not written)."""

    running: bool
    home: str
    pid: int | None = None
    url: str | None = None
    socket: str | None = None
    started: float | None = None
    version: str | None = None
    model: str | None = None
    # Locked longer than a start takes, yet serve.json is missing or damaged: the serve runs,
    # where it listens is not known (a restart writes it again).
    unreadable: bool = False


@dataclass(frozen=True)
class RunningTurn:
    """A turn running now in some process of the home (its lease is live)."""

    conversation: str
    since: float
    step: str  # "starting", "with the model", "running tool bash" ...
    process: str  # "process 4242" (and "on HOST" for another machine's)
    pid: int
    mail: int  # messages of background work waiting to enter the conversation
    held: int = 0  # the person's own follow-ups sent during it, waiting to join it


@dataclass(frozen=True)
class Question:
    """A question of `ask_user` waiting for the person's answer."""

    id: str
    conversation: str
    text: str
    asked: float
    deadline: float | None
    state: str = "waiting"  # or "interrupted": the process that asked it is gone


@dataclass(frozen=True)
class Subagent:
    id: str
    conversation: str  # where it reports back
    state: str  # "running", how it waits for a slot, or "interrupted" (its process is gone)
    since: float
    task: str
    key: str | None = None  # its own conversation ("subagent:<lineage>")
    step: str | None = None  # what its turn does now, when one runs (`running_turns`)


@dataclass(frozen=True)
class Goal:
    conversation: str
    status: str  # active | parked
    objective: str
    budget: str


@dataclass(frozen=True)
class Job:
    """One of the person's scheduled jobs, as `heron jobs` and /status describe it."""

    id: int
    mode: str
    conversation: str
    next_run: float | None
    line: str


@dataclass(frozen=True)
class Heartbeat:
    minutes: int | None  # 0: off; None: unknown (config.toml does not load)
    last: float | None = None  # its last beat, when one was recorded
    outcome: str | None = None
    detail: str | None = None
    # Whether the workspace's HEARTBEAT.md asks to check anything: else every beat is skipped.
    checks: bool = True


@dataclass(frozen=True)
class Today:
    """Today's usage (the agent's zone), as `heron usage` counts it."""

    turns: int
    runs: int  # turns and maintenance runs
    input: int
    output: int
    cache_read: int
    cache_write: int
    hit_rate: float | None  # None: no input counted
    cost_usd: float | None  # None: a price is not known
    unpriced: tuple[str, ...] = ()  # the models run today with no price ([prices] of config)


@dataclass
class Status:
    """Everything `heron status` shows. `store_error`: the store could not be read (then only
    the serve and the model are known)."""

    serve: Serve
    model: str
    model_note: str
    now: float
    zone: str
    turns: list[RunningTurn] = field(default_factory=list)
    mail: dict[str, int] = field(default_factory=dict)  # for conversations with no turn running
    held: dict[str, int] = field(default_factory=dict)  # the person's, likewise
    questions: list[Question] = field(default_factory=list)
    suggestions: int = 0
    jobs: list[Job] = field(default_factory=list)
    jobs_count: int = 0  # the person's active and paused jobs
    review: str | None = None  # the nightly review's line, as `heron jobs list` says it
    heartbeat: Heartbeat = field(default_factory=lambda: Heartbeat(0))
    subagents: list[Subagent] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)
    today: Today | None = None
    store_error: str | None = None
    store_locked: bool = False  # the error is another process's lock: the same call later works
    # config.toml does not load (its error's first line): heron serve and turns refuse it, and
    # what it sets is unknown (the model shown is the defaults' choice)
    config_error: str | None = None
    home_exists: bool = True  # False: no heron.db at the home (nothing has run there yet)

    @property
    def exit_code(self) -> int:
        if self.store_error is not None:
            return 1
        return 0 if self.serve.running else NOT_RUNNING

    def as_json(self) -> dict[str, Any]:
        """The status as one object; what is read from the store is null (unknown, not
        "none") when the store could not be read."""
        data = asdict(self)
        if self.store_error is not None:
            data.update(dict.fromkeys(FROM_STORE))
        return data


# The fields only the store tells; `heartbeat` stays: its interval is config.toml's.
FROM_STORE = (
    "turns",
    "mail",
    "held",
    "questions",
    "suggestions",
    "jobs",
    "jobs_count",
    "review",
    "subagents",
    "goals",
    "today",
)


# ---- gathering -----------------------------------------------------------------------------


def gather(
    settings: Settings, now: float | None = None, config_error: HeronError | None = None
) -> Status:
    """The home's status, from its files and its store; nothing is written. `config_error`:
    config.toml did not load, and `settings` are the defaults (`Settings.load_reading`)."""
    now = time.time() if now is None else now
    serve = serve_state(settings)
    model, note = _model(settings, serve)
    status = Status(serve, model, note, now, settings.timezone)
    checks = bool(heartbeat_lines(settings.paths.workspace))
    status.heartbeat = Heartbeat(settings.config.agent.heartbeat_minutes, checks=checks)
    if config_error is not None:
        status.config_error = config_error.summary.splitlines()[0]
        status.heartbeat = Heartbeat(None)
        if not serve.model:  # not the serve's: the defaults', not the file's
            status.model_note += "; config.toml does not load, so these are the defaults"
    if settings.store_url is None and not settings.paths.db.exists():
        status.home_exists = False  # a mistyped HERON_HOME: nothing is made there
        return status
    try:
        store = open_store(settings, reading=True, busy_timeout=BUSY_TIMEOUT_S, make_home=False)
    except HeronError as e:
        status.store_error, status.store_locked = str(e), isinstance(e, StoreLocked)
        return status
    try:
        _from_store(status, store, settings)
    except HeronError as e:
        status.store_error = str(e)
    finally:
        store.close()
    return status


def serve_state(settings: Settings) -> Serve:
    """Whether a serve holds the home's lock (as the store and `heron run` tell one runs), and
    its details: a serve.json left by a killed serve is not read as one running."""
    home = settings.paths.home
    holder = serve_holder(home)
    if holder is None:
        return Serve(False, str(home))
    info = read_info(home)
    if info is None:  # locked, its details not written yet: starting, unless that was long ago
        return Serve(True, str(home), holder or None, unreadable=_locked_for(home) > STARTING_S)
    return Serve(
        True,
        str(home),
        info.pid,
        info.url,
        info.socket,
        info.started or None,
        info.version or None,
        info.model or None,
    )


def _locked_for(home: Path) -> float:
    """Seconds since the serve holding the home's lock wrote its pid there, as it started."""
    try:
        return time.time() - (home / LOCK_NAME).stat().st_mtime
    except OSError:
        return 0.0


def _model(settings: Settings, serve: Serve) -> tuple[str, str]:
    """The model turns run with, and where it was named (`heron config show`'s words): the
    serve's when one runs (`heron serve --model` may differ from the file), else the one
    `heron run` would choose here."""
    try:
        choice = settings.model()
    except HeronError as e:
        configured, note = None, f"none configured: {str(e).splitlines()[0]}"
    else:
        configured = f"{choice.provider}/{choice.model}"
        window = f"window {choice.profile.context_window:,}"
        note = f"{model_source(settings, choice)}; {window}"
    if serve.model and serve.model != configured:
        return serve.model, f"heron serve's; this shell's settings name {configured or 'none'}"
    return configured or "none", note


def _from_store(status: Status, store: Store, settings: Settings) -> None:
    mail, kept = waiting.counts(store), held.counts(store)
    status.turns = [
        replace(t, mail=mail.pop(t.conversation, 0), held=kept.pop(t.conversation, 0))
        for t in running_turns(store)
    ]
    # What waits for a conversation where no turn runs: its next turn reads it (the person's
    # own, of a process that ended, are stored there as their message with no answer yet).
    status.mail, status.held = mail, kept
    _runs(status, store)
    _subagents_own_turns(status)
    status.turns = [_asking(t, status.questions) for t in status.turns]
    status.suggestions = count_waiting(store)
    _jobs(status, store)
    beat = jobs.tick(store, "heartbeat")
    if beat is not None and beat.outcome not in (None, "started"):
        status.heartbeat = replace(
            status.heartbeat, last=beat.last, outcome=beat.outcome, detail=beat.detail
        )
    status.goals = _goals(store)
    status.today = _today(store, settings, status.now)


def running_turns(store: Store) -> list[RunningTurn]:
    """The turns running now, from the live turn leases (any process: the serve, a `heron run`
    or `heron chat` in its own, a worker), each with its step as the record tells it."""
    found = []
    for lease in engine_state.live_leases(store):
        turn = store.running_turn(lease.conversation_id)
        since = turn.started if turn is not None else lease.acquired
        step = _step(store, lease.conversation_id, turn)
        holder = lease.holder
        found.append(RunningTurn(lease.key, since, step, holder.where, holder.pid, 0))
    return sorted(found, key=lambda t: t.since)


def _step(store: Store, conversation_id: int, turn: Turn | None) -> str:
    """What the turn does now, as far as its rows say: the tools its last assistant message
    called that have no result yet, else the model (building its request, or answering)."""
    if turn is None:  # the lease is taken, the turn's row not written yet
        return "starting"
    head_id = store.conversation_by_id(conversation_id).head_id
    head = store.message(head_id) if head_id is not None else None
    calls = head.message.tool_calls if head and head.turn_id == turn.id else []
    if not calls or head is None or head.role != "assistant":
        return "with the model"
    checkpoint = engine_state.read_checkpoint(store, conversation_id)
    done = set()
    if checkpoint is not None and checkpoint.turn_id == turn.id:
        done = {r.call_id for r in checkpoint.results}
    left = list(dict.fromkeys(c.name for c in calls if c.id not in done))
    if not left:
        return "with the model"
    said = f"running {'tool' if len(left) == 1 else 'tools'} {', '.join(left)}"
    return said + (f" ({len(done)} of {len(calls)} calls done)" if done else "")


def _runs(status: Status, store: Store) -> None:
    """The questions waiting for the person, and the subagents still going; a run whose
    process is gone (killed, crashed) is interrupted, whatever its row still says: nothing
    can answer or run it, and the next Heron process to start marks it so."""
    for run in runs.open_work(store):
        gone = runs.process_gone(run.pid)
        if run.kind == "ask":
            state = "interrupted" if gone else "waiting"
            status.questions.append(
                Question(run.id, run.origin_key, run.task, run.created, run.deadline, state)
            )
        elif gone:
            status.subagents.append(
                Subagent(run.id, run.origin_key, "interrupted", run.created, run.task)
            )
        elif run.status == "waiting":  # for a slot: not started
            state = runs.waiting_for_slot(store, run)
            status.subagents.append(Subagent(run.id, run.origin_key, state, run.created, run.task))
        else:
            status.subagents.append(
                Subagent(
                    run.id, run.origin_key, "running", run.created, run.task, run.conversation_key
                )
            )


def _subagents_own_turns(status: Status) -> None:
    """A running subagent's turn is shown on its line, as its step, not again among the
    turns under its lineage's key, which nothing ties to the run's id (qa24a L2)."""
    turns = {t.conversation: t for t in status.turns}
    for n, s in enumerate(status.subagents):
        turn = turns.pop(s.key, None) if s.key else None
        if turn is not None:
            status.subagents[n] = replace(s, step=turn.step)
    status.turns = list(turns.values())


def _asking(turn: RunningTurn, questions: list[Question]) -> RunningTurn:
    """A turn whose only tool left is `ask_user`, its question waiting: it waits for the
    person, not for a tool."""
    if turn.step != "running tool ask_user":
        return turn
    for q in questions:
        if q.conversation == turn.conversation and q.state == "waiting":
            return replace(turn, step=f"waiting for your answer (question {q.id})")
    return turn


def _jobs(status: Status, store: Store) -> None:
    """The person's jobs soonest first (as `heron jobs list` and /status describe each) and
    the nightly review's line; the review's row is read as stored (`heron jobs list` and the
    serve bring it in line with config.toml; this only reads)."""
    listed = jobs.list_jobs(store)
    mine = [j for j in listed if not j.builtin]
    status.jobs_count = len(mine)
    serving = status.serve.running
    status.jobs = [
        Job(
            j.id,
            j.mode,
            j.conversation,
            j.next_run,
            describe(j, status.zone, status.now, serving=serving),
        )
        for j in mine[:JOBS_SHOWN]
    ]
    review = jobs.review_job(store)
    if review is not None and review.status == "active" and review.next_run is None:
        # A home no serve (nor `heron jobs list`) has scheduled it in yet: when it would run.
        review = replace(review, next_run=review.schedule.next_after(status.now))
    if review is not None and review.status != "cancelled":
        status.review = review_line(review, status.zone, status.now)


def _goals(store: Store) -> list[Goal]:
    found = []
    for key in goals.open_keys(store):  # a parked one waits on the person
        goal = goals.open_goal(store, key)
        if goal is not None:
            found.append(Goal(key, goal.status, goal.objective, goal.budget()))
    return found


def _today(store: Store, settings: Settings, now: float) -> Today:
    zone = settings.timezone
    midnight = timefmt.day_bounds(timefmt.local_date(now, zone), zone)[0]
    total = usage_total(store, PriceTable.from_config(settings.config.prices), midnight)
    u = total.usage
    return Today(
        total.turns,
        total.runs,
        u.input,
        u.output,
        u.cache_read,
        u.cache_write,
        total.hit_rate,
        total.cost,
        total.unpriced,
    )


# ---- rendering -----------------------------------------------------------------------------


def lines(status: Status) -> list[str]:
    """The status as a person reads it: the serve first, then what the agent does."""
    out = _serve_lines(status)
    if status.config_error is not None:
        out.append(
            f"config:    config.toml does not load: {status.config_error}; heron serve and "
            "turns refuse until it is fixed"
        )
    out.append(f"model:     {status.model} ({status.model_note})")
    if status.store_error is not None:
        return [*out, *_store_error_lines(status)]
    if not status.home_exists:
        home = status.serve.home
        said = f"no heron.db in {home} yet" if Path(home).is_dir() else f"no Heron home at {home}"
        return [*out, f"store:     {said} (nothing has run here yet)"]
    out += _turn_lines(status)
    out += _waiting_lines(status)
    out += _job_lines(status)
    out += _heartbeat_lines(status)
    out += _work_lines(status)
    if status.today is not None:
        out.append(f"today:     {_today_words(status.today)}")
    return out


def _store_error_lines(status: Status) -> list[str]:
    """Why the store could not be read: its first line on the `store:` line, the rest (the
    hint) indented under it."""
    first, *rest = (status.store_error or "").splitlines()
    if status.store_locked:  # its hint says no more than this
        return [f"store:     locked by another process ({first}); try again in a moment"]
    return [f"store:     not readable: {first}", *_indented(rest)]


def _indented(rest: list[str]) -> list[str]:
    """The lines after an entry's first, under it (a message's hint, a detail's second line)."""
    return [f"           {line}" for line in rest if line.strip()]


def _serve_lines(status: Status) -> list[str]:
    serve, zone = status.serve, status.zone
    if not serve.running:
        start = "start it with: heron serve"
        if status.config_error is not None:
            start = "fix config.toml first (heron serve refuses until it loads)"
        return [
            f"heron serve: not running on {serve.home}; {start}",
            "(what follows is read from the store)",
        ]
    if serve.unreadable:
        pid = f", pid {serve.pid}" if serve.pid else ""
        return [
            f"heron serve: running{pid} on {serve.home}, but {INFO_NAME} (where it listens)"
            " is missing or damaged; restarting it writes it again"
        ]
    if serve.pid is None or serve.url is None:
        return [f"heron serve: starting on {serve.home} (its details are not written yet)"]
    said = f"heron serve: running, pid {serve.pid}"
    if serve.started is not None:
        up = elapsed(status.now - serve.started)
        said += f", up {up} (since {timefmt.when(serve.started, zone, named=True)})"
    said += f", heron {serve.version}" if serve.version else ", an earlier Heron"
    return [
        said,
        f"  web UI:  {serve.url}  (heron web: a login address)",
        f"  socket:  {serve.socket}",
    ]


def _turn_lines(status: Status) -> list[str]:
    if not status.turns:
        out = ["turns:     none running"]
    else:
        out = [f"turns:     {len(status.turns)} running"]
    for t in status.turns:
        mail = f"; {plural(t.mail, 'message')} waiting for it" if t.mail else ""
        if t.held:
            mail += f"; {t.held} of your messages waiting to join the turn"
        took = elapsed(status.now - t.since)
        where = "heron serve" if t.pid == status.serve.pid else t.process
        out.append(f"  {t.conversation}: {t.step}, for {took}, in {where}{mail}")
    for key, count in sorted(status.mail.items()):
        out.append(f"  {key}: {plural(count, 'message')} waiting to enter at its next turn")
    for key, count in sorted(status.held.items()):
        out.append(f"  {key}: {count} of your messages waiting to go in at its next turn")
    return out


def _waiting_lines(status: Status) -> list[str]:
    questions = [q for q in status.questions if q.state == "waiting"]
    parked = [g for g in status.goals if g.status == "parked"]
    if not questions and not status.suggestions and not parked:
        return ["waiting on you: nothing"]
    said = [plural(len(questions), "question")] if questions else []
    if parked:
        said.append(plural(len(parked), "parked goal"))
    if status.suggestions:
        said.append(plural(status.suggestions, "memory suggestion"))
    out = [f"waiting on you: {', '.join(said)}"]
    for q in questions:
        deadline = timefmt.when(q.deadline, status.zone, named=True) if q.deadline else ""
        until = f", until {deadline}" if deadline else ""
        asked = elapsed(status.now - q.asked)
        out.append(
            f"  question {q.id} in {q.conversation}, asked {asked} ago{until}: {_line(q.text)}"
        )
    if questions:
        out.append("  (answer in its conversation; heron runs list shows them)")
    out += [
        f"  goal in {g.conversation}: parked, its budget ran out (/goal budget TURNS there"
        f" continues it): {_line(g.objective)}"
        for g in parked
    ]
    if status.suggestions:
        out.append("  (memory: heron memory review)")
    return out


def _job_lines(status: Status) -> list[str]:
    if not status.jobs_count:
        out = ["jobs:      none scheduled"]
    else:
        more = f"; the next {len(status.jobs)}" if status.jobs_count > len(status.jobs) else ""
        out = [f"jobs:      {status.jobs_count} scheduled{more} (heron jobs list)"]
    out += [f"  {job.line}" for job in status.jobs]
    if status.review is not None:
        out.append(f"  {status.review}")
    return out


def _heartbeat_lines(status: Status) -> list[str]:
    """The heartbeat's interval and its last beat; a detail of several lines (a failure's
    hint) has its first in parentheses, the rest indented under it."""
    beat = status.heartbeat
    rest: list[str] = []
    if beat.minutes is None:
        said = "unknown until config.toml loads"
    elif beat.minutes <= 0:
        said = "off (heartbeat_minutes = 0)"
    else:
        said = f"on, every {plural(beat.minutes, 'minute')}"
        if not status.serve.running:
            said += " while heron serve runs"
        if not beat.checks:  # qa24e L6: "on" read as checking something
            said += " (HEARTBEAT.md in the workspace has nothing to check: each beat is skipped)"
    if beat.last is not None:
        why = ""
        if beat.detail:
            first, *rest = beat.detail.splitlines() or [""]
            why = f" ({first})"
        said += f"; last {timefmt.when(beat.last, status.zone)} {beat.outcome}{why}"
    return [f"heartbeat: {said}", *_indented(rest)]


def _work_lines(status: Status) -> list[str]:
    lost = [q for q in status.questions if q.state == "interrupted"]
    active = [g for g in status.goals if g.status == "active"]
    if not status.subagents and not active and not lost:
        return ["subagents: none running; goals: none active"]
    out = [f"question {q.id} in {q.conversation}: {GONE}: {_line(q.text)}" for q in lost]
    for s in status.subagents:
        state = s.state
        if state == "running":
            state = f"running {elapsed(status.now - s.since)}"
            state += f" ({s.step})" if s.step else ""
        elif state == "interrupted":
            state = GONE
        out.append(f"subagent {s.id} for {s.conversation}: {state}: {_line(s.task)}")
    for g in active:
        out.append(f"goal in {g.conversation}: {g.status}, {g.budget}: {_line(g.objective)}")
    return out


def _today_words(today: Today) -> str:
    if not today.runs:
        return "no turns yet"
    hit = "-" if today.hit_rate is None else f"{today.hit_rate:.0%}"
    cost = format_cost(today.cost_usd)
    if today.cost_usd is None and today.unpriced:  # why, as `heron usage` says on stderr
        cost = f"unknown: no price for {', '.join(today.unpriced)} ([prices] in config.toml)"
    return (
        f"{plural(today.turns, 'turn')}, {today.input:,} tokens in, {today.output:,} out, "
        f"cache hit {hit}, cost {cost} (heron usage)"
    )


def _line(text: str, limit: int = 60) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def show(
    settings: Settings, *, as_json: bool = False, config_error: HeronError | None = None
) -> int:
    """Print the status (one JSON object with `as_json`); the exit code it calls for.
    `config_error`: config.toml did not load (`settings` are the defaults)."""
    import json

    status = gather(settings, config_error=config_error)
    if as_json:
        echo(json.dumps(status.as_json(), ensure_ascii=False))
    else:
        for line in lines(status):
            echo(line)
    if as_json and status.store_error is not None:  # printed above, in words, otherwise
        echo(f"heron: {status.store_error}", err=True)
    return status.exit_code
