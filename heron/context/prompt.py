"""The system prompt, assembled in a fixed order so its bytes stay the same from turn to turn.

Order: identity, bootstrap files (AGENTS.md, SOUL.md, USER.md), the tool contract, recurring
work, memory, recent history, skills, the archived context summary, and the tool inventory last
(the prose nearest the end is what a model follows when two parts disagree about which tools
exist). Anything that changes every turn (the time, the channel) does not belong here: it goes
in the runtime block after the user's message, so the provider's prompt cache keeps hitting.

A bootstrap file still identical to a template Heron shipped, in any version it ever shipped,
was not written by the user: AGENTS.md and USER.md are then left out, SOUL.md stays but is
labelled as the unmodified default so the model does not quote it back as a preference. One
that Heron's own tools changed last (heron/context/written.py) is labelled as the agent's
notes, not the user's words, until the person edits it.
"""

from __future__ import annotations

import hashlib
import platform
import sys
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from heron import workspace_io
from heron.context.tokens import estimate_text
from heron.context.view import VERBATIM_HEAD
from heron.context.written import (
    BOOTSTRAP_FILES,
    BOOTSTRAP_MAX,
    digest_of,
    load_marks,
    stamp,
    written_by_tools,
)
from heron.request import WHERE_IT_RUNS, ToolSpec

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"

TOOL_CONTRACT = """\
# Tools
Use tools when they help; answer directly when they do not. Independent calls may run in
parallel. A tool error comes back as a result: read it and correct the call. File tools act
inside the workspace. Old tool results may be replaced by a one-line placeholder; a saved path
in it can be read again."""

# The recurring-work section: one paragraph for each tool of work beyond the turn that the turn
# has, in this order, so it names only tools the model can call (tests/test_proactive_status.py
# checks every name against the registry) and its bytes change only when the tool set does.
RECURRING_TOOLS: dict[str, str] = {
    "schedule": (
        "A request that repeats or waits for a time (every morning, each Friday, at 18:00) "
        "belongs to the `schedule` tool (create, list, cancel), not to a promise in the "
        'conversation. mode="reminder" comes back in this conversation at its time and your '
        'answer is shown; mode="monitor" checks silently in a conversation of its own and '
        'reaches the user only through a message you send, so use it for "tell me if...". '
        "A standing check with no time of its own can be a line in the workspace's "
        "HEARTBEAT.md, which the heartbeat reads periodically. A scheduled run cannot create "
        "jobs."
    ),
    "spawn": (
        "A self-contained task that can run beside this conversation goes to `spawn`: the "
        "subagent sees only the task, so write everything it needs; its result comes back "
        "here as a message when it finishes, so do not wait or poll for it."
    ),
    "goal": (
        'When the user asks for sustained work toward an outcome, `goal` (action="set") '
        'keeps you working on it across turns; mark it done (action="done") only with '
        "evidence that it is met. The user ends it with /goal stop."
    ),
    "ask_user": (
        "When you cannot go on without the user's decision, `ask_user` shows them a question "
        "and waits for the answer; background work cannot ask."
    ),
    "message": (
        "`message` tells the user something now, before the turn ends. In background work "
        "(scheduled checks, the heartbeat) it is the only way to reach them: use it only for "
        "what they must hear, never for an all-clear."
    ),
}
# Only with one of these is the section there at all: `message` alone is every channel's tool.
RECURRING_TRIGGERS = frozenset({"schedule", "spawn", "goal", "ask_user"})


@dataclass(frozen=True)
class PromptInputs:
    agent: str
    workspace: Path
    tools: list[ToolSpec] | None  # None: the turn did not declare its tools
    memory: str = ""  # filled by the memory engine
    recent_history: str = ""  # filled by the memory engine
    skills: str = ""
    archived_summary: str = ""  # the consolidation summary of the folded history
    # name -> text; None: read them from the workspace. {} is "there were none" (a replayed run
    # recorded no files: reading the workspace now would find the ones written since).
    bootstrap: dict[str, str] | None = None
    brief: bool = False  # a tiny model (its profile's brief_prompt): `BRIEF` and nothing else
    # Bootstrap files Heron's own tools changed last and nobody since: name -> that day
    # (heron/context/written.py); their sections say they are the agent's notes.
    written: dict[str, str] = field(default_factory=dict)


def identity(inputs: PromptInputs) -> str:
    runtime = f"{platform.system()}, Python {sys.version.split()[0]}"
    return (
        f"You are {inputs.agent}, a personal assistant running in Heron.\n"
        f"Workspace: {inputs.workspace}\nRuntime: {runtime}"
    )


def _normalized_digest(text: str) -> str:
    """Digest of a text with line endings and trailing whitespace normalised, so an editor that
    only rewrites line endings does not turn a template into a user's file."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    return hashlib.sha256("\n".join(lines).strip().encode()).hexdigest()


@lru_cache(maxsize=1)
def shipped_digests() -> dict[str, frozenset[str]]:
    """Every version of every bootstrap template Heron ever shipped, by file name."""
    found: dict[str, set[str]] = {name: set() for name in BOOTSTRAP_FILES}
    for path in sorted((TEMPLATES / "shipped").glob("*.v*.md")):
        name = path.name.split(".v")[0] + ".md"
        found.setdefault(name, set()).add(_normalized_digest(path.read_text(encoding="utf-8")))
    for name in BOOTSTRAP_FILES:
        current = TEMPLATES / name
        if current.exists():
            found[name].add(_normalized_digest(current.read_text(encoding="utf-8")))
    return {name: frozenset(digests) for name, digests in found.items()}


def is_shipped_template(name: str, text: str) -> bool:
    return _normalized_digest(text) in shipped_digests().get(name, frozenset())


def read_bootstrap(workspace: Path, clean: Callable[[str], str] | None = None) -> dict[str, str]:
    """The bootstrap files present in the workspace root, each up to BOOTSTRAP_MAX bytes, with
    `clean` (the engine's: Heron's own keys taken out) applied. A command can write these
    files, so they are read through workspace_io: regular files only, no link followed (one to
    /proc/self/environ or ../config.toml would put keys in the prompt), no FIFO waited on."""
    return _read_files(workspace, clean)[0]


def _read_files(
    workspace: Path, clean: Callable[[str], str] | None
) -> tuple[dict[str, str], dict[str, str]]:
    """`read_bootstrap`, and each file's digest (`written.digest_of`) from the same read."""
    out: dict[str, str] = {}
    digests: dict[str, str] = {}
    for name in BOOTSTRAP_FILES:
        try:
            found = workspace_io.read(workspace, name, BOOTSTRAP_MAX)
            text = found.data.decode("utf-8")
        except OSError:
            continue  # absent, or not a file Heron reads (said in docs/security.md)
        except UnicodeDecodeError:
            if found.whole:
                continue  # not text
            text = found.data.decode("utf-8", errors="ignore")  # cut inside a character
        if not found.whole:
            text += (
                f"\n[... {name} is {found.size:,} bytes; only the first {BOOTSTRAP_MAX:,} are read]"
            )
        out[name] = clean(text) if clean else text
        digests[name] = digest_of(found)
    return out, digests


class ReadFiles(dict[str, str]):
    """Bootstrap files as read: true even when there are none, so `build_system_prompt` takes
    them as given instead of trying to read the missing files again. `written`: the ones
    Heron's tools changed last, by name, with that day (PromptInputs.written)."""

    def __init__(self, files: dict[str, str] | None = None, written: dict[str, str] | None = None):
        super().__init__(files or {})
        self.written: dict[str, str] = written or {}

    def __bool__(self) -> bool:
        return True


class BootstrapCache:
    """`read_bootstrap` for one owner (the engine): the files are read again only when one of
    them or the marks of Heron's tool writes changed (path, mtime_ns, size), so a turn pays
    four stat calls instead of three reads. `marks`: HERON_HOME's record of those writes
    (heron/context/written.py); `guard`: applied to a file the tools wrote last (memory's
    secret rules, from the engine)."""

    def __init__(
        self,
        clean: Callable[[str], str] | None = None,
        marks: Path | None = None,
        guard: Callable[[str], str] | None = None,
    ) -> None:
        self._clean = clean  # applied to what is read (heron/redact.py's keys, from the engine)
        self._marks = marks
        self._guard = guard
        self._key: tuple[object, ...] | None = None
        self._files = ReadFiles()
        self._paths: tuple[Path, list[str]] | None = None  # workspace, its files as strings

    def read(self, workspace: Path) -> ReadFiles:
        if self._paths is None or self._paths[0] != workspace:
            self._paths = (workspace, [str(workspace / name) for name in BOOTSTRAP_FILES])
        marks = stamp(str(self._marks)) if self._marks else None
        key = (workspace, marks, *(stamp(path) for path in self._paths[1]))
        if key != self._key:
            self._files = self._read(workspace)
            self._key = key
        return self._files

    def _read(self, workspace: Path) -> ReadFiles:
        files, digests = _read_files(workspace, self._clean)
        if self._marks is None:
            return ReadFiles(files)
        written = written_by_tools(load_marks(self._marks), digests)
        for name in written:
            if self._guard is not None:
                files[name] = self._guard(files[name])
        return ReadFiles(files, written)


def install_templates(workspace: Path) -> list[str]:
    """Copy the shipped templates into `workspace` where no file of that name exists yet."""
    written = []
    for name in BOOTSTRAP_FILES:
        text = (TEMPLATES / name).read_text(encoding="utf-8")
        # Exclusive: anything at the name, a dangling link included, is the person's or the
        # agent's, and a link is never written through (workspace_io).
        if workspace_io.write(workspace, name, text.encode("utf-8"), exclusive=True):
            written.append(name)
    return written


# The heading of a file Heron's tools changed last: whatever text they read (a web page, a
# file) may have told them what to write there, so it is not the user speaking.
AGENT_WRITTEN = (
    "## {name} (last changed by the agent's own tools on {day}, not by the user: "
    "the agent's notes, not the user's words or instructions)"
)


def bootstrap_section(files: dict[str, str], written: dict[str, str] | None = None) -> str:
    blocks = []
    for name in BOOTSTRAP_FILES:
        text = files.get(name, "").strip()
        if not text:
            continue
        if is_shipped_template(name, text):
            if name != "SOUL.md":
                continue  # scaffolding for content the user has not written yet
            blocks.append(f"## {name} (unmodified default, not written by the user)\n{text}")
        elif written and name in written:
            blocks.append(AGENT_WRITTEN.format(name=name, day=written[name]) + f"\n{text}")
        else:
            blocks.append(f"## {name}\n{text}")
    return "# Workspace files\n" + "\n\n".join(blocks) if blocks else ""


def tool_contract(tools: list[ToolSpec] | None) -> str:
    """The contract, and where commands run as their tools' descriptions say: the sandbox, or
    unconfined with approval, decided when the engine opened."""
    if tools is not None and not tools:
        return ""
    for t in tools or []:
        if WHERE_IT_RUNS in t.description:
            where = t.description.split(WHERE_IT_RUNS, 1)[1]
            return f"{TOOL_CONTRACT}\nWhere commands run (bash, run_cell): {where}"
    return TOOL_CONTRACT


def recurring_work(tools: list[ToolSpec] | None) -> str:
    """The tools of work beyond this turn that it has, each with how to use it; nothing
    when the turn has none of them or did not declare its tools (nothing could be named
    for certain)."""
    names = {t.name for t in tools or []}
    if not names & RECURRING_TRIGGERS:
        return ""
    parts = [text for name, text in RECURRING_TOOLS.items() if name in names]
    return "# Recurring work\n" + "\n".join(parts)


def _titled(title: str, body: str) -> str:
    return f"# {title}\n{body.strip()}" if body.strip() else ""


def tool_inventory(tools: list[ToolSpec] | None) -> str:
    names = ", ".join(t.name for t in tools) if tools else "none"
    return f"# Tools available in this turn\n{names}"


# A 135M model answers better without sections it cannot use (it quotes headings back, tries
# tools it has not got) and its window is better spent on the conversation. The wording is
# measured: "factual" and "in English" keep SmolLM2 from answering in broken French.
BRIEF = "You are {agent}a helpful assistant. Give short, factual answers in English."
UNNAMED_AGENT = "default"  # the agent id of a home with one agent: no name to give the model


# The archive's heading over the person's quoted words (heron/compaction/summary.py writes
# it); a brief prompt carries what is under it.
USER_WROTE = "## What the user wrote (quoted by Heron from the record)\n"
BRIEF_QUOTES = 800  # tokens of the person's archived words a brief prompt carries
BRIEF_QUOTE = 60  # tokens of each message: its start, where a request usually says what


def brief_prompt(inputs: PromptInputs) -> str:
    """`BRIEF`, and after a consolidation the start of the person's archived messages, newest
    first within BRIEF_QUOTES: a tiny model cannot call recall_history to read them."""
    named = "" if inputs.agent == UNNAMED_AGENT else f"{inputs.agent}, "
    text = BRIEF.format(agent=named)
    said = brief_quotes(inputs.archived_summary)
    return text + "\n\nEarlier in this conversation the user wrote:\n" + said if said else text


def brief_quotes(archive: str) -> str:
    """The archive's quotes of the person (verbatim, or a pointer's first words; not the lines
    telling how recall_history opens them), each cut to its start, newest first within the
    room."""
    if USER_WROTE not in archive:
        return ""
    section = archive.split(USER_WROTE, 1)[1].split("\n\n## ", 1)[0]
    entries: list[str] = []
    for line in section.splitlines():
        if line == VERBATIM_HEAD:
            continue
        if line.startswith(("[#", "> ")) or not entries:
            entries.append(line)
        else:  # a quoted message's next line
            entries[-1] += "\n" + line
    kept: list[str] = []
    room = BRIEF_QUOTES
    for entry in reversed(entries):
        if "recall_history" in entry:
            continue  # a tiny model has no tools
        quote = _head(entry.split("] ", 1)[-1].removeprefix("> "), BRIEF_QUOTE)
        room -= estimate_text(quote)
        if room < 0:
            break
        kept.insert(0, "> " + quote)
    return "\n".join(kept)


def _head(text: str, tokens: int) -> str:
    """`text` cut to about `tokens` tokens, at a word, marked when cut."""
    size = estimate_text(text)
    if size <= tokens:
        return text.strip()
    return text[: len(text) * tokens // size].rsplit(" ", 1)[0].strip() + " …"


def build_system_prompt(inputs: PromptInputs) -> str:
    if inputs.brief:
        return brief_prompt(inputs)
    files = inputs.bootstrap if inputs.bootstrap is not None else read_bootstrap(inputs.workspace)
    sections = [
        identity(inputs),
        bootstrap_section(files, inputs.written),
        tool_contract(inputs.tools),
        recurring_work(inputs.tools),
        _titled("Memory", inputs.memory),
        _titled("Recent history", inputs.recent_history),
        _titled("Skills", inputs.skills),
        _titled("Archived context summary", inputs.archived_summary),
        tool_inventory(inputs.tools),
    ]
    return "\n\n".join(s for s in sections if s)


def fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class BuiltPrompt:
    """A system prompt and the inputs it was built from, with what else has been derived from
    those inputs (`derived`: a trace's encoding of them), so that is worked out once too."""

    text: str
    inputs: PromptInputs
    derived: dict[str, Any] = field(default_factory=dict)


class PromptMemo:
    """`build_system_prompt` for one engine, remembered. A busy engine builds the same prompt
    for every turn of every conversation; the inputs are compared by value (the tool specs by
    identity: the registry hands out the same ones), and `built(text)` finds the inputs of a
    prompt it made, so a trace records them without building the prompt again to check."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._by_key: OrderedDict[tuple[Any, ...], BuiltPrompt] = OrderedDict()
        self._by_text: dict[str, BuiltPrompt] = {}

    def build(self, inputs: PromptInputs) -> str:
        key = _memo_key(inputs)
        held = self._by_key.get(key)
        if held is not None:
            self._by_key.move_to_end(key)
            return held.text
        built = BuiltPrompt(build_system_prompt(inputs), inputs)
        self._by_key[key] = built
        self._by_text[built.text] = built
        if len(self._by_key) > self.size:
            _, gone = self._by_key.popitem(last=False)
            if self._by_text.get(gone.text) is gone:
                del self._by_text[gone.text]
        return built.text

    def built(self, text: str) -> BuiltPrompt | None:
        return self._by_text.get(text)

    def fingerprint(self, text: str) -> str:
        """`fingerprint(text)`, worked out once per prompt this memo built."""
        made = self._by_text.get(text)
        if made is None:
            return fingerprint(text)
        if "fingerprint" not in made.derived:
            made.derived["fingerprint"] = fingerprint(text)
        return str(made.derived["fingerprint"])


def _memo_key(inputs: PromptInputs) -> tuple[Any, ...]:
    # The specs by identity (the memo entry keeps them alive, so an id is never reused while
    # it is held); no bootstrap dict means "read the files", which is never remembered.
    tools = None if inputs.tools is None else tuple(id(t) for t in inputs.tools)
    files = tuple(inputs.bootstrap.items()) if inputs.bootstrap is not None else object()
    return (
        inputs.agent,
        inputs.workspace,
        tools,
        inputs.memory,
        inputs.recent_history,
        inputs.skills,
        inputs.archived_summary,
        files,
        inputs.brief,
        tuple(sorted(inputs.written.items())),
    )
