"""The `heron` command.

Heavy modules (SDKs, the engine, the terminal UI) are imported inside the commands that need
them, so `heron --help` and the start of `heron run` stay fast.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand

from heron.channels.common import conversation_key, fail, reading_settings, settings
from heron.channels.jobs_cli import app as jobs_app
from heron.channels.memory_cli import app as memory_app
from heron.channels.runs_cli import runs_app
from heron.channels.store_cli import app as store_app
from heron.channels.trace_cli import trace_app, usage
from heron.errors import ConfigError, HeronError

if TYPE_CHECKING:
    from heron.config import Settings
    from heron.messages import File


def _flags_take_no_placeholder() -> None:
    """typer's help panel (0.29) shows a flag's type as if it took a value: `--json <bool>`,
    `--help <bool>`. Its plain help leaves a flag bare; so does the panel from here on."""
    from typer.core import TyperOption

    typed = TyperOption.display_type_rich

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag and self.metavar is None else typed(self, ctx)

    setattr(TyperOption, "display_type_rich", display_type_rich)  # noqa: B010 (a method)


_flags_take_no_placeholder()

app = typer.Typer(
    rich_markup_mode="markdown",
    help="Heron: a personal AI agent that keeps long conversations whole.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
conversations_app = typer.Typer(
    rich_markup_mode="markdown",
    help="List, show, search, export and delete conversations.",
    no_args_is_help=True,
)
config_app = typer.Typer(
    rich_markup_mode="markdown", help="Show Heron's configuration.", no_args_is_help=True
)
app.add_typer(conversations_app, name="conversations")
app.add_typer(config_app, name="config")
app.add_typer(trace_app, name="trace")
app.add_typer(memory_app, name="memory")
app.add_typer(runs_app, name="runs")
app.add_typer(jobs_app, name="jobs")
app.add_typer(store_app, name="store")
app.command("usage")(usage)


def _version(show: bool) -> None:
    if show:
        from heron import __version__

        typer.echo(f"heron {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Heron: a personal AI agent that keeps long conversations whole."""


AgentOpt = Annotated[str, typer.Option("--agent", help="Agent name.")]
ConvOpt = Annotated[
    str | None,
    typer.Option(
        "--conversation",
        "-c",
        help="Conversation key; the same key continues it.",
        callback=conversation_key,
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option("--model", "-m", help="Model name, sent as is; or a path to a .gguf file."),
]
EphemeralOpt = Annotated[
    bool, typer.Option("--ephemeral", help="Keep nothing: no database writes, no memory.")
]


# click's UsageError (a bad option, a missing value), from the click typer parses with: its
# own copy since typer 0.22, click itself before.
_UsageError: type[Exception] = typer.BadParameter.__mro__[1]


class _RunCommand(TyperCommand):
    """`heron run`: with --json, a bad option is refused as the one JSON object --json
    promises too (typer's box still says why on stderr, exit 2)."""

    # `ctx` is typer's click Context, whichever click that is (see _UsageError)
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        given = list(args)  # the parser consumes the list it is given
        try:
            return super().parse_args(ctx, args)
        except _UsageError as e:
            options = given[: given.index("--")] if "--" in given else given
            if "--json" in options:
                from heron.channels.script import refusal_json

                refused = refusal_json(ConfigError(str(e)), None)
                typer.echo(json.dumps(refused, ensure_ascii=False))
            raise


@app.command(cls=_RunCommand)
def run(
    message: Annotated[
        str | None, typer.Argument(help="The message; '-' reads it from stdin.")
    ] = None,
    agent: AgentOpt = "default",
    conversation: ConvOpt = None,
    model: ModelOpt = None,
    ephemeral: EphemeralOpt = False,
    retry: Annotated[
        bool,
        typer.Option(
            "--retry", help="Answer the last message of -c KEY again, without storing it twice."
        ),
    ] = False,
    latest: Annotated[
        bool,
        typer.Option(
            "--continue", help="Continue the latest conversation (as -c with only a message)."
        ),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON object: reply, conversation, run_id, ok, error, hint, usage, "
            "cost_usd, stop.",
        ),
    ] = False,
    stream: Annotated[
        bool,
        typer.Option(
            "--stream",
            help="Stream the reply to stdout as it comes even when stdout is not a terminal "
            "(else it is written whole at the end; a cut stream then leaves its dead attempt "
            "and a marker line there).",
        ),
    ] = False,
    attach: Annotated[
        list[str] | None,
        typer.Option(
            "--attach",
            "-a",
            metavar="FILE",
            help="Attach a file to the message (repeatable): images and PDFs for models that "
            "take them, text files inline.",
        ),
    ] = None,
) -> None:
    """Send one message and print the reply (for scripts).

    Goes through `heron serve` when one runs on this home (unless --model or --ephemeral asks
    for what it cannot give). With a message and stdin piped in, stdin follows the message as
    a fenced block."""
    from heron.channels.script import RunCut, refusal_json, run_message

    try:
        if conversation is not None and message is None and not retry and _interactive():
            message, conversation = conversation, _latest_for(conversation)  # -c "message"
        if latest:
            if conversation is not None and message is not None:
                raise ConfigError("--continue continues the latest conversation; drop -c KEY")
            conversation = _latest_key()
        text = _retry_text(message, conversation) if retry else _message_text(message)
        files = _attached(attach or [])
        ok = asyncio.run(
            run_message(
                _load,
                text,
                agent,
                conversation,
                model,
                ephemeral,
                as_json=as_json,
                files=files,
                stream=stream,
            )
        )
    except HeronError as e:
        if as_json:  # a refusal is still the one JSON object --json promises
            typer.echo(json.dumps(refusal_json(e, conversation), ensure_ascii=False))
        fail(e)
    except RunCut as cut:  # a signal, or the reader of stdout gone: 130, 143 or 141
        raise typer.Exit(cut.code) from None
    raise typer.Exit(0 if ok else 1)


def _attached(paths: list[str]) -> tuple[File, ...]:
    """`-a` files, every one checked before any is sent; a refusal is a refusal before any
    turn (exit 2, as a missing or oversized message is) and says nothing was sent."""
    from heron.channels.script import attached_files
    from heron.errors import AttachmentError

    try:
        return attached_files(paths, _load)
    except AttachmentError as e:
        then = f"{e.hint} " if e.hint else ""
        raise ConfigError(e.summary, hint=f"{then}Nothing was sent or stored.") from None


def _load() -> Settings:
    """The settings, or the HeronError that stopped them (`heron run` reports it itself)."""
    from heron.config import Settings

    return Settings.load()


def _message_text(message: str | None) -> str:
    """The message, from the argument or stdin; bytes that are not UTF-8 are replaced (and the
    user told), never a reason to fail. No message, an empty one or one too large: a
    ConfigError (exit 2)."""
    from heron.channels.script import message_from

    if message is None:
        raise ConfigError(NO_MESSAGE)
    text, bad = message_from(message)
    if bad:
        typer.echo(
            f"heron: the message had {bad} invalid UTF-8 sequence(s); each is kept as \ufffd",
            err=True,
        )
    if not text.strip():
        raise ConfigError("the message is empty")
    from heron.messages import oversized

    too_large = oversized(text)
    if too_large is not None:  # refused before it is sent, with a serve or without
        raise ConfigError(too_large)
    return text


NO_MESSAGE = (
    "give a message, '-' to read it from stdin, --retry -c KEY, or --continue TEXT to "
    "continue the latest conversation"
)


def _latest_for(words: str) -> str:
    """`heron run -c WORDS` with no message, in a terminal: the latest conversation, to send
    WORDS to as a message (said on stderr), when they read as one: never a single word (a key
    the person meant, whose message is missing) nor the key of a conversation that exists."""
    from heron.channels.info import open_store

    store = open_store(_load())
    try:
        exists = store.conversation(words) is not None
    finally:
        store.close()
    if exists or len(words.split()) < 2:
        raise ConfigError(
            f"-c {words} needs a message: heron run -c {words} TEXT "
            "(--continue TEXT continues the latest conversation)"
        )
    latest = _latest_key()
    typer.echo(
        f"heron: -c with no message: sending it to the latest conversation {latest!r} "
        "(--continue TEXT says so)",
        err=True,
    )
    return latest


def _interactive() -> bool:
    """stdin is a terminal: `-c WORD` with no message is then the message, not a key (piped
    input would be the message otherwise)."""
    return sys.stdin.isatty()


def _latest_key() -> str:
    """The conversation most recently active, internal ones (cron:, heartbeat, subagent:)
    skipped, for `heron run -c MESSAGE` and --continue."""
    from heron.channels.info import open_store

    found = open_store(_load()).conversations(1)
    if not found:
        raise ConfigError("no conversation to continue yet; start one: heron run TEXT")
    return found[0].key


def _retry_text(message: str | None, conversation: str | None) -> str:
    """--retry: the turn answers the conversation's last message again when its turn failed or
    was stopped (the /retry command, told to refuse one already answered)."""
    if message is not None or conversation is None:
        raise ConfigError("--retry takes no message and needs -c KEY")
    from heron.bus import RETRY_UNANSWERED
    from heron.channels.info import open_store

    # A mistyped key said "Nothing to retry yet." and exited 0, as if it were a conversation.
    store = open_store(_load(), reading=True)
    try:
        if store.conversation(conversation) is None:
            raise ConfigError(
                f"no conversation {conversation!r}", hint="See: heron conversations list"
            )
    finally:
        store.close()
    return f"/retry {RETRY_UNANSWERED}"


CHAT_NEEDS_A_TERMINAL = (
    "heron chat needs a terminal on stdin; for piped input or scripts use heron run "
    "(`echo TEXT | heron run -`, or `heron run -c KEY TEXT` to continue a conversation)"
)


@app.command()
def chat(
    agent: AgentOpt = "default",
    conversation: ConvOpt = None,
    model: ModelOpt = None,
    ephemeral: EphemeralOpt = False,
) -> None:
    """Talk with your agent in the terminal (Ctrl-C stops a turn, Ctrl-D leaves)."""
    loaded = settings()  # a broken config.toml is said first, as by every command
    if not _interactive():  # a pipe or a file: no prompt to read it with
        fail(ConfigError(CHAT_NEEDS_A_TERMINAL))
    from heron.channels.terminal import run_chat

    try:
        asyncio.run(run_chat(loaded, agent, conversation, model, ephemeral))
    except HeronError as e:
        fail(e)


@app.command()
def serve(
    host: Annotated[
        str, typer.Option(help="Address to listen on (127.0.0.1: this machine only).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port of the web UI (0: any free one).")] = 8765,
    model: ModelOpt = None,
    workers: Annotated[
        int,
        typer.Option(help="Run turns in this many `heron worker` processes (PostgreSQL only)."),
    ] = 0,
    open_: Annotated[
        bool, typer.Option("--open", help="Open the login address in your browser.")
    ] = False,
) -> None:
    """Run the agent for this home: the web UI, and the socket heron run and heron chat use.

    It prints a one-time login address for the web UI (every bind needs a login);
    `heron web` prints a fresh one later, for another browser."""
    from heron.serve.logs import log_to_stderr
    from heron.serve.main import serve as run_serve

    log_to_stderr()
    try:
        asyncio.run(
            run_serve(
                settings(),
                host=host,
                port=port,
                model=model,
                workers=workers,
                open_browser=open_,
            )
        )
    except HeronError as e:
        fail(e)


@app.command()
def status(
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON object: serve, model, turns, questions, suggestions, jobs, "
            "heartbeat, subagents, goals, today.",
        ),
    ] = False,
) -> None:
    """Whether heron serve runs on this home and what the agent is doing: turns running, what
    waits for you, the next jobs, today's usage.

    Reads files and the store only (no model call, no network), so it answers without a serve
    too. Exits 0 when heron serve runs, 3 when none runs on this home, 1 on an error."""
    from heron.channels.common import settings_as_they_load
    from heron.channels.status import show

    loaded, broken = settings_as_they_load()  # a broken config.toml: said in the status
    raise typer.Exit(show(loaded, as_json=as_json, config_error=broken))


# The help's figures are the serve's own (heron/serve/auth.py: it said 10 minutes for a code
# that works 2); a light import, stdlib only.
WEB_HELP = (
    "Log a browser in to the web UI of the running heron serve.\n\n"
    "Asks the serve of this home for a fresh one-time login address (it works once, for "
    "{code}) and prints it; the browser that opens it stays logged in for {session}, across "
    "restarts of the serve."
)


def web_help() -> str:
    from heron.messages import plural
    from heron.serve.auth import CODE_SECONDS, SESSION_SECONDS

    code = plural(CODE_SECONDS // 60, "minute")
    return WEB_HELP.format(code=code, session=plural(SESSION_SECONDS // 86400, "day"))


@app.command(help=web_help())
def web(
    open_: Annotated[
        bool, typer.Option("--open", help="Open the address in your browser too.")
    ] = False,
) -> None:
    from heron.channels.web_login import web_login

    try:
        # Only the home is needed: a config.toml being edited must not keep a browser out of
        # a running serve (which says what is wrong with the file there).
        web_login(reading_settings(), open_)
    except HeronError as e:
        fail(e)


@app.command()
def worker(
    model: ModelOpt = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Log every turn taken and ended (stderr).")
    ] = False,
    face: Annotated[
        int | None,
        typer.Option("--face", hidden=True, help="The pid of the heron serve that started it."),
    ] = None,
) -> None:
    """Run turns from the PostgreSQL store's queue (one of the workers; docs/scale.md)."""
    from heron.scale.cluster import cluster_of

    try:
        cluster_of(settings().database)  # SQLite: say so before importing DBOS
        from heron.scale.worker import run_worker

        asyncio.run(run_worker(settings(), model=model, verbose=verbose, face=face))
    except HeronError as e:
        fail(e)


@app.command()
def models(model: ModelOpt = None) -> None:
    """Show the model Heron would use (or --model), what its server offers, and the built-in
    profiles. Exits 1 when the server in use could not list its models."""
    from heron.channels.info import print_models

    try:
        listed = print_models(settings(), model)
    except HeronError as e:
        fail(e)
    if not listed:
        raise typer.Exit(1)


@conversations_app.command("list")
def conversations_list(
    limit: Annotated[int, typer.Option(help="How many, newest first.")] = 30,
) -> None:
    """List conversations, most recently active first."""
    from heron.channels.info import list_conversations

    try:
        list_conversations(reading_settings(), limit)
    except HeronError as e:
        fail(e)


@conversations_app.command("show")
def conversations_show(
    key: Annotated[str, typer.Argument(help="The conversation key.", callback=conversation_key)],
    compactions: Annotated[
        bool, typer.Option("--compactions", help="List each compaction: when, why, what.")
    ] = False,
    model_view: Annotated[
        bool, typer.Option("--model-view", help="Print exactly what the model receives next.")
    ] = False,
    budget: Annotated[
        bool, typer.Option("--budget", help="Each part's budget of the window, and its use.")
    ] = False,
    message: Annotated[
        int | None,
        typer.Option(
            "--message",
            help="Only message N (a search hit's number), whole, with its neighbours.",
        ),
    ] = None,
) -> None:
    """Print a conversation's current branch: every turn, tool call and result."""
    from heron.channels.info import show_conversation

    try:
        s = reading_settings()
        show_conversation(
            s, key, compactions=compactions, model_view=model_view, budget=budget, message=message
        )
    except HeronError as e:
        fail(e)


@conversations_app.command("search")
def conversations_search(
    query: Annotated[str, typer.Argument(help="What to look for.")],
    conversation: Annotated[
        str | None,
        typer.Option(
            "--conversation",
            "-c",
            help="Search this conversation only.",
            callback=conversation_key,
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="How many hits.")] = 10,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print one JSON array of hits: key, message_id, who, ..."),
    ] = False,
    exact: Annotated[
        bool,
        typer.Option(
            "--exact", "-e", help="Only messages holding these words in this order, newest first."
        ),
    ] = False,
) -> None:
    """Search every message said, compacted ones included (as `heron memory recall`)."""
    from heron.channels.info import open_store
    from heron.channels.memory_cli import print_recall

    try:
        s = reading_settings()
        store = open_store(s, reading=True)
        try:
            print_recall(
                store, query, limit, key=conversation, as_json=as_json, exact=exact, zone=s.timezone
            )
        finally:
            store.close()
    except HeronError as e:
        fail(e)


@conversations_app.command("export")
def conversations_export(
    key: Annotated[str, typer.Argument(help="The conversation key.", callback=conversation_key)],
    form: Annotated[
        str | None,
        typer.Option(
            "--format",
            "-f",
            help="markdown (md) or json; default: json for an -o FILE ending in .json, "
            "else markdown.",
        ),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write to this file, not stdout.")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace the -o file if it exists.")
    ] = False,
) -> None:
    """Export a conversation's current branch, whole: every turn, tool call and result."""
    from heron.channels.export import export_conversation

    try:
        export_conversation(reading_settings(), key, form, output, force=force)
    except HeronError as e:
        fail(e)


@conversations_app.command("delete")
def conversations_delete(
    key: Annotated[str, typer.Argument(help="The conversation key.", callback=conversation_key)],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask to confirm.")] = False,
) -> None:
    """Delete a conversation and everything recorded about it."""
    from heron.channels.info import delete_conversation
    from heron.tools.person import ensure_person

    try:
        ensure_person("deleting a conversation")
    except HeronError as e:
        fail(e)

    def confirm(question: str) -> None:
        typer.confirm(question, abort=True)

    try:
        delete_conversation(settings(), key, None if yes else confirm)
    except HeronError as e:
        fail(e)


@config_app.command("path")
def config_path() -> None:
    """Print where the config file and Heron's home are."""
    s = reading_settings()
    typer.echo(f"home:      {s.paths.home}\nconfig:    {s.paths.config}\ndatabase:  {s.paths.db}")
    typer.echo(f"workspace: {s.paths.workspace}\nmemory:    {s.paths.memory}")


@config_app.command("show")
def config_show() -> None:
    """Print the configuration in force (API keys masked)."""
    from heron.channels.info import show_config

    show_config(settings())


def main() -> None:
    app()


if __name__ == "__main__":
    main()
