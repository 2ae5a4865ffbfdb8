"""`heron memory ...`: read, explain, forget and review the user's memory; recall history.

Memory is shared by every agent, so the commands name scopes and entry paths directly.
`review`, `accept`, `reject` and `forget` are the person's acts: they refuse when a Heron tool
started the command (heron/tools/person.py), so the agent cannot approve its own proposals.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import date
from typing import TYPE_CHECKING, Annotated, Any

import typer

from heron import timefmt
from heron.channels.common import echo
from heron.errors import HeronError

if TYPE_CHECKING:
    from prompt_toolkit.application import Application

    from heron.config import Settings
    from heron.memory.entries import Entry
    from heron.memory.queue import Suggestion
    from heron.memory.recall import Hit
    from heron.memory.service import MemoryService
    from heron.providers.base import Provider
    from heron.store import Store

app = typer.Typer(
    rich_markup_mode="markdown",
    help="Your memory: list, show, explain, forget, review; recall history, index it.",
    no_args_is_help=True,
)

PathArg = Annotated[
    str, typer.Argument(help="An entry: scope/always/slug.md or scope/when/topic/slug.md.")
]


@contextmanager
def _service(*, reading: bool = False) -> Iterator[MemoryService]:
    """The memory service of HERON_HOME. `reading`: the command only reads (list, show,
    explain, recall), so a home that refuses writes is read as it stands (`open_store`)."""
    from heron.channels.info import open_store
    from heron.config import Settings
    from heron.memory.service import MemoryService

    try:
        settings = Settings.load()
        paths = settings.paths.ensure()
        store = open_store(settings, reading=reading)
    except HeronError as e:
        _fail(e)
    try:
        yield MemoryService(paths.memory, store, settings.timezone)
    except HeronError as e:
        _fail(e)
    finally:
        store.close()


def _person_only(act: str) -> None:
    """Refuse `act` when a Heron tool started this command (heron/tools/person.py)."""
    from heron.tools.person import ensure_person

    try:
        ensure_person(act)
    except HeronError as e:
        _fail(e)


def _fail(error: HeronError) -> None:
    echo(f"heron: {error}", err=True)
    raise typer.Exit(1)


def _when(ts: float, zone: str, *, named: bool = False) -> str:
    """`ts` in the agent's `zone` (heron/timefmt.py); "?" for a time not known."""
    return timefmt.when(ts, zone, named=named) if ts else "?"


@app.command("list")
def list_entries(
    scope: Annotated[str | None, typer.Argument(help="Only this scope.")] = None,
) -> None:
    """List every scope and its entries, or one scope's.

    An entry too long for the prompt is flagged."""
    from heron.memory.section import ENTRY_CAP, over_cap

    with _service(reading=True) as service:
        entries = service.entries(scope)
        if not entries:
            echo(f"No entries{' in ' + scope if scope else ''}. Memory is in {service.files.root}")
            return
        current = None
        width = max(len("ENTRY"), *(len(e.path.rel) for e in entries))  # columns stay aligned
        echo(f"  {'ENTRY':{width}} {'ORIGIN':6} TEXT")
        for e in entries:
            if e.path.scope != current:
                current = e.path.scope
                echo(f"{current}/")
            text = " ".join(e.text.split())
            echo(f"  {e.path.rel:{width}} {e.origin:6} {text[:70]}")
            if over_cap(e):
                echo(
                    f"    ! {len(e.text.strip()):,} characters, over the {ENTRY_CAP:,} the prompt"
                    " shows: the model sees its head and reads the rest with view_memory."
                    " Shorten it, or split it into several entries."
                )


@app.command()
def show(path: PathArg) -> None:
    """Print an entry's file as it is (what is malformed in it is warned of)."""
    with _service(reading=True) as service:
        entry = service.get(path)  # warns of what it cannot read
        echo(service.files.text(entry.path) or "", nl=False)


@app.command()
def explain(path: PathArg) -> None:
    """Where an entry came from, and the recent model requests that carried it."""
    with _service(reading=True) as service:
        entry = service.get(path)
        src = entry.source
        echo(f"entry:        {entry.path.rel}")
        echo(f"origin:       {entry.origin}")
        zone = service.timezone
        created = _when(entry.created, zone, named=True)
        echo(f"created:      {created}   updated: {_when(entry.updated, zone, named=True)}")
        echo(f"conversation: {src.conversation or '-'}   message: {src.message or '-'}")
        # When the person said the quote: what the entry's relative words ("last month") are
        # read from, which may be days before it was created (kept from the review queue).
        echo(f"said:         {_when(src.said, zone, named=True) if src.said else '-'}")
        echo(f"quote:        {src.quote!r}" if src.quote else "quote:        -")
        if entry.mistake:
            echo(f"prevents:     {entry.mistake}")
        from heron.trace.read import requests_carrying

        rows = requests_carrying(service.store, entry.path.rel)
        echo("in model requests (most recent; presence, not proof of use):")
        for r in rows:
            echo(f"  {_when(r[1], zone)}  {r[0]}  {r[2]}  call {r[3]} ({r[4]})")
        if not rows:
            echo("  none recorded")


@app.command()
def forget(
    path: PathArg,
    purge: Annotated[
        bool,
        typer.Option(
            "--purge",
            help="Also take every version of it out of the memory folder's history (git), for "
            "an entry already forgotten too. An entry holding a secret is always taken out.",
        ),
    ] = False,
) -> None:
    """Delete an entry and revoke its quoted source, so it is not learned again."""
    from heron.memory.entries import EntryPath, MemoryRefused

    _person_only("forgetting a memory entry")
    with _service() as service:
        rel = EntryPath.parse(path).rel
        try:
            gone = service.forget(path, purge=purge)
        except MemoryRefused:
            if not (purge and service.history.holds(rel)):
                raise
            gone = None  # forgotten before: only its history is left to purge
            service.purge_history(rel)
        if gone is not None:
            echo(forgot_line(service, gone))
        echo(_history_note(service, rel, gone))
        scrubbed = service.scrub_line(rel)
        if scrubbed:
            echo(scrubbed)


def forgot_line(service: MemoryService, gone: Entry) -> str:
    """What a forget did, in one line: the statement is out of memory, or other entries still
    say it (then it stays in force and is not revoked: qa22x M1), named with the way out."""
    rel = gone.path.rel
    also = service.still_said(gone)
    if also:
        return f"Forgot {rel}. {also}"
    return f"Forgot {rel}: it is no longer in force, nor learned again."


def _history_note(service: MemoryService, rel: str, gone: Entry | None) -> str:
    """What the memory folder's history still holds of a forgotten entry, in one line."""
    if not service.history.available:
        return "Memory has no history (git is not installed): nothing of it is kept."
    if service.history.holds(rel):
        return (
            "Its text stays in the memory folder's history (git log -p there), which is how "
            f"`heron memory undo` brings it back; `heron memory forget --purge {rel}` takes it "
            "out for good."
        )
    if gone is None:
        return (
            f"{rel} was forgotten before; every version of it was taken out of the memory "
            "folder's history (for good)."
        )
    secret = service.holds_secret(gone)
    why = f"It held {secret}: every" if secret else "Every"
    return f"{why} version of it was taken out of the memory folder's history (for good)."


@app.command()
def review() -> None:
    """Review what waits, in checklists of up to 10.

    Checked items are kept, the rest dropped; Esc (or q) leaves this checklist and later ones
    waiting."""
    from heron.memory.commands import review_text
    from heron.memory.service import ensure_not_agent

    _person_only("reviewing memory suggestions")
    with _service() as service:
        ensure_not_agent()
        choose = _dialog_choose if sys.stdin.isatty() and sys.stdout.isatty() else _line_choose
        echo(review_text(service, choose, None))


@app.command()
def accept(
    number: Annotated[int, typer.Argument(help="The suggestion's id.")],
    path: Annotated[
        str | None,
        typer.Option(
            "--path",
            help="File a fact or lesson there instead: scope/always/slug.md or "
            "scope/when/topic/slug.md.",
        ),
    ] = None,
    quote: Annotated[
        str | None,
        typer.Option(
            "--quote",
            help="Keep only this sentence or clause of the words the suggestion quotes.",
        ),
    ] = None,
) -> None:
    """Keep one suggestion, as it is or filed elsewhere (--path) or narrowed (--quote)."""
    _person_only("accepting a memory suggestion")
    with _service() as service:
        decision = service.accept(number, path=path, quote=quote)
        echo(decision.message)
        if decision.status == "waiting":
            raise typer.Exit(1)


@app.command()
def reject(number: Annotated[int, typer.Argument(help="The suggestion's id.")]) -> None:
    """Drop one suggestion."""
    _person_only("rejecting a memory suggestion")
    with _service() as service:
        echo(service.reject(number).message)


@app.command()
def recall(
    query: Annotated[str, typer.Argument(help="What to look for.")],
    limit: Annotated[int, typer.Option("--limit", "-n", help="How many snippets.")] = 10,
) -> None:
    """Search what recall gives the model: every conversation, compacted messages included,
    only what you still stand by (the current branch, nothing you had forgotten)."""
    with _service(reading=True) as service:
        print_recall(service.store, query, limit, zone=service.timezone, standing=True)


def print_recall(
    store: Store,
    query: str,
    limit: int,
    *,
    key: str | None = None,
    as_json: bool = False,
    exact: bool = False,
    zone: str | None = None,
    standing: bool = False,
) -> None:
    """Search what was said (in conversation `key` only, when given) and print the hits, best
    first: `heron memory recall` and `heron conversations search` both run this. A line is
    `[key · date · message id · who] snippet`, and a last one says how to open a conversation;
    `as_json`: one JSON array of the hits and nothing else on stdout. An unknown `key` is a
    StoreError saying how to find one. `exact`: only the messages holding the query's words in
    its order, newest first (`Recall.exact`). Dates are in `zone`, the agent's (None: the
    system's). `standing`: only what recall gives the model (`Recall.search`), else every
    message said, one off its conversation's current branch marked so."""
    from heron.memory import spelling
    from heron.memory.recall import Recall
    from heron.memory.vectors import default_embedder

    conversation_id = None
    if key is not None:
        from heron.channels.info import known

        conversation_id = known(store, key).id
    searched = Recall(store, default_embedder(), zone)
    left_out = None  # the line saying how many matches a forget left out
    if exact:
        hits = searched.exact(query, limit, conversation_id)
    else:  # a word no message holds (a typo) is searched as the nearest one the history holds
        query, respelled = searched.respelled(query)
        if respelled:  # stdout stays one JSON array with --json
            typer.echo(spelling.note(respelled), err=as_json)
        found = searched.search(query, limit, conversation_id=conversation_id, standing=standing)
        every = "; `heron conversations search` shows every message"
        hits, left_out = found, found.forgotten_note("you", every)
        listing = searched.day_listing(query, conversation_id)
        if listing is not None:  # said before the hits; stdout stays one JSON array with --json
            note = listing.note(len(hits), limit, "you", f"--limit {listing.total} lists all")
            if note:
                typer.echo(note, err=as_json)
    if as_json:
        typer.echo(json.dumps([_hit_json(h) for h in hits], ensure_ascii=False, indent=2))
    else:
        for hit in hits:
            for line in hit.lines(hit.who):
                echo(line)
        if not hits:
            days = [] if exact else searched.days_named(query)
            echo(nothing_found(query, exact, searched.embedder is not None, days))
        else:  # the first hit's message, in its conversation: the command is ready to copy
            first = hits[0]
            echo(
                f"Open one: heron conversations show {first.conversation_key} --message "
                f"{first.message_id} (that message whole, with its neighbours)"
            )
    if left_out and not as_json:
        echo(left_out)
    if searched.behind:
        _behind_notice(store, searched.embedder)


def nothing_found(query: str, exact: bool, meanings: bool, days: Sequence[date] = ()) -> str:
    """What an empty search says, with what to try next: the search matches words as written
    (a word typed far from any the history holds finds nothing), by meaning only with the
    embeddings extra. A query that names days found nothing written then: it says which days
    it read, and meanings would not help."""
    if days:
        named = ", ".join(f"{d:%a %Y-%m-%d}" for d in days)
        return f"Nothing found on {named} (the day the query names), nor for its other words."
    tips = []
    if len(query.split()) > 2 or exact:
        tips.append("fewer or other words" + (" (without --exact)" if exact else ""))
    tips.append("a word as it was written (a name's spelling)")
    if not meanings:
        tips.append("to search by meaning too: .venv/bin/pip install -e '.[embeddings]'")
    return "Nothing found. Try " + "; ".join(tips) + "."


def _hit_json(hit: Hit) -> dict[str, Any]:
    """A hit as `--json` prints it (docs/terminal.md, "Searching and exporting")."""
    return {
        "key": hit.conversation_key,
        "message_id": hit.message_id,
        "created": hit.created,
        "date": timefmt.when(hit.created, hit.zone, timefmt.ISO),
        "role": hit.role,
        "who": hit.who,
        "snippet": " ".join(hit.snippet.split()),
        "score": float(hit.score),
        "on_branch": not hit.elsewhere,
        "times": hit.times,
    }


# Messages embedded a second on two busy cores (docs/memory.md: 27-42), for an estimate.
EMBED_RATE = 30


def _behind_notice(store: Store, embedder: Any) -> None:
    from heron.memory.vectors import backlog

    missing = backlog(store, embedder)
    minutes = max(1, round(missing / EMBED_RATE / 60))
    echo(
        f"heron: {missing:,} messages have no sentence vector yet, so this search found them by"
        f" their words only. Run `heron memory index` to embed them (about {minutes} min);"
        " `heron serve` does it in the background.",
        err=True,
    )


@app.command()
def index() -> None:
    """Embed every message that has no sentence vector yet, with progress.

    Semantic recall needs the embeddings extra (docs/memory.md). A search embeds the few
    messages added since the last one itself; a long history without vectors (the extra
    installed later, a new model) is filled here, or in the background by `heron serve`.
    Stopping keeps every batch done; running it again goes on from there."""
    from rich.progress import Progress

    from heron.memory.vectors import backfill, backlog, default_embedder

    embedder = default_embedder()
    if embedder is None:
        _fail(
            HeronError(
                "semantic recall is off: the embeddings extra is not installed"
                " (or HERON_EMBEDDINGS=0)",
                hint="Install it as docs/memory.md says, then run this again.",
            )
        )
        return
    with _service() as service:
        missing = backlog(service.store, embedder)
        if not missing:
            echo("Every message has its vector.")
            return
        with Progress(transient=False) as progress:
            task = progress.add_task("Embedding messages", total=missing)
            done = backfill(service.store, embedder, lambda n: progress.advance(task, n))
        echo(f"Embedded {done:,} messages.")


@app.command("log")
def log(
    limit: Annotated[
        int, typer.Option("--limit", "-n", help="How many changes, newest first.")
    ] = 20,
) -> None:
    """Every change to the memory folder (it is a git repository), newest first."""
    with _service() as service:
        if not service.history.available:
            echo("No history: git is not installed, so memory changes are not recorded.")
            return
        for change in service.history.log(limit):
            echo(f"{change.commit}  {_when(change.when, service.timezone)}  {change.message}")


@app.command()
def undo() -> None:
    """Take back the last change to the memory folder not undone yet.

    Run again, it takes back the change before; `heron memory redo` makes an undone change
    again. Edits you made by hand are never undone."""
    _step("undo", "Nothing to undo.", "heron memory redo makes it again")


@app.command()
def redo() -> None:
    """Make the last change you undid again (`heron memory undo` took it back)."""
    _step("redo", "Nothing to redo: no change was undone since the last one.", "")


def _step(verb: str, nothing: str, then: str) -> None:
    """`heron memory undo` or `redo`: the person's act, one commit of the memory folder."""
    from heron.memory.history import what_it_did

    _person_only(f"{verb[:-1]}ing a memory change")
    with _service() as service:
        history = service.history
        if not history.available:
            _fail(HeronError("memory has no history: git is not installed", hint="Install git."))
        change = history.undo() if verb == "undo" else history.redo()
        service.sync_revocations()  # an entry back in force voids its revocation, for recall too
        if change is None:
            echo(nothing)
            return
        for passed in change.skipped:  # a change whose text a purge took out of the history
            echo(f"Passed over: {passed} (what it changed was taken out of the history).")
        done = f"{verb[:-1].capitalize()}id: {what_it_did(change.message)}"
        echo(f"{done} ({then})" if then else done)


@app.command("review-pass", hidden=True)
def review_pass_command(
    conversation: Annotated[
        list[str], typer.Option("--conversation", "-c", help="Conversation key (repeatable).")
    ],
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="The chat's model (default: configured).")
    ] = None,
) -> None:
    """What `heron chat` starts in the background when it ends: the review pass over what was
    said since the last review, for each conversation, with the chat's model. It only adds
    suggestions to the queue."""
    import asyncio

    from heron.config import Settings

    try:
        queued = asyncio.run(run_review_pass(Settings.load(), conversation, model=model))
    except HeronError as e:
        _fail(e)
    echo(f"{len(queued)} suggestion(s) queued for review.")


async def run_review_pass(
    settings: Settings,
    keys: list[str],
    provider: Provider | None = None,
    *,
    model: str | None = None,
) -> list[int]:
    """Open the engine (the chat's `model`, the configured one, or `provider`) and run
    review_pass per key, each recorded as a `close-review` run of its conversation."""

    from heron.agent.engine import Engine
    from heron.store.records import CLOSE_REVIEW

    queued: list[int] = []
    async with Engine.open(settings, model=model, provider=provider) as engine:
        if engine.memory is None or engine.choice.embedded:
            return queued  # the tiny offline model cannot do this pass usefully
        for key in keys:
            found = await engine.store.call(engine.store.conversation, key)
            if found is not None:
                queued += await engine.review_pass(found.id, CLOSE_REVIEW)
    return queued


CHECKLIST_TEXT = (
    "Check what to keep (Space), then Enter or Ok. Unchecked items are dropped; Esc, q or "
    "Cancel leaves this checklist and the later ones waiting."
)


def checklist(pairs: list[tuple[int, str]]) -> Application[list[int] | None]:
    """One checklist of the memory review, (id, line) pairs: its result is the ids to keep,
    or None for Esc, q or Cancel. prompt_toolkit's checkboxlist_dialog, which this follows,
    toggles the focused item on Enter as on Space (Space then Enter unchecked it again, and Ok
    needed Tab first); here Space toggles and Enter in the list keeps what is checked, as Ok."""
    from prompt_toolkit.application import Application
    from prompt_toolkit.filters import has_focus
    from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent, merge_key_bindings
    from prompt_toolkit.key_binding.bindings.focus import focus_next, focus_previous
    from prompt_toolkit.key_binding.defaults import load_key_bindings
    from prompt_toolkit.layout import HSplit, Layout
    from prompt_toolkit.widgets import Button, CheckboxList, Dialog, Label

    items = CheckboxList(values=[(i, f"#{i} {line}") for i, line in pairs])
    app: Application[list[int] | None]
    buttons = [
        Button(text="Ok", handler=lambda: app.exit(result=list(items.current_values))),
        Button(text="Cancel", handler=lambda: app.exit(result=None)),
    ]
    body = HSplit([Label(text=CHECKLIST_TEXT, dont_extend_height=True), items], padding=1)
    dialog = Dialog(title="Memory review", body=body, buttons=buttons, with_background=True)
    keys = KeyBindings()
    keys.add("tab")(focus_next)
    keys.add("s-tab")(focus_previous)

    @keys.add("escape", eager=True)
    @keys.add("q")
    def _(event: KeyPressEvent) -> None:
        event.app.exit(result=None)

    @keys.add("enter", filter=has_focus(items), eager=True)
    def _keep(event: KeyPressEvent) -> None:
        event.app.exit(result=list(items.current_values))

    app = Application(
        layout=Layout(dialog),
        key_bindings=merge_key_bindings([load_key_bindings(), keys]),
        mouse_support=True,
        full_screen=True,
    )
    return app


def _dialog_choose(batch: list[Suggestion]) -> set[int] | None:
    picked = checklist([(s.id, s.describe()) for s in batch]).run()
    return None if picked is None else set(picked)


# The line prompt's terms are the checklist's: what is not kept is dropped for good (not
# proposed again), and q leaves this batch and the later ones waiting.
LINE_PROMPT = (
    "Keep which ids? (space-separated, 'all'; the ones not listed are dropped for good, empty "
    "drops them all; q stops and leaves them waiting)"
)


def _line_choose(batch: list[Suggestion]) -> set[int] | None:
    for s in batch:
        echo(f"  [{s.id}] {s.describe()}")
    try:
        answer = typer.prompt(
            LINE_PROMPT,
            default="",
            show_default=False,
        ).strip()
    except typer.Abort:  # stdin ended (no terminal): nothing more is decided
        echo(
            "\nNo answer on standard input: these still wait. Review in a terminal, pipe the"
            " answers in (e.g. echo all | heron memory review), or use heron memory accept ID"
            " or reject ID.",
            err=True,
        )
        return None
    if answer.lower() in ("q", "quit", "esc"):
        return None
    if answer.lower() == "all":
        return {s.id for s in batch}
    return {int(w.lstrip("#")) for w in answer.replace(",", " ").split() if w.lstrip("#").isdigit()}
