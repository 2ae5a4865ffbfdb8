"""Memory entries: Markdown files with a small front matter, under HERON_HOME/memory.

    <scope>/always/<slug>.md           in force on every turn
    <scope>/when/<topic>/<slug>.md     in force in the situation its topic names

The files are the record: the user may edit or delete them by hand, and every read goes back to
disk, so a change made in an editor is seen on the next turn. Every name that reaches a path is
validated first, and every path is checked to stay inside the memory folder after symlinks are
resolved, so no name or link can make Heron read or write elsewhere.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from heron.errors import HeronError

log = logging.getLogger(__name__)

Kind = Literal["always", "when"]
Origin = Literal["user", "auto", "lesson", "hand"]

NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$")
NAME_RULE = "lowercase letters, digits and hyphens, 1 to 64 characters, no - at either end"
DEFAULT_SCOPE = "personal"


class MemoryRefused(HeronError):
    """A memory operation was refused (a bad name, a quote not found, a secret, a stale edit)."""


class BadMemoryPath(MemoryRefused):
    pass


def check_name(value: str, what: str) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise BadMemoryPath(
            f"invalid {what} name {value!r}",
            hint=f"A {what} name is {NAME_RULE} (e.g. 'personal', 'writing-to-friends').",
        )
    return value


@dataclass(frozen=True, order=True)
class EntryPath:
    """Where an entry lives, relative to the memory folder; every part is a validated name."""

    scope: str
    kind: Kind
    topic: str | None
    slug: str

    def __post_init__(self) -> None:
        check_name(self.scope, "scope")
        check_name(self.slug, "slug")
        if self.kind == "always":
            if self.topic is not None:
                raise BadMemoryPath("an always/ entry has no topic", hint="Drop the topic.")
        elif self.kind == "when":
            check_name(self.topic or "", "topic")
        else:
            raise BadMemoryPath(f"unknown kind {self.kind!r}", hint="Use 'always' or 'when'.")

    @property
    def rel(self) -> str:
        middle = "always" if self.kind == "always" else f"when/{self.topic}"
        return f"{self.scope}/{middle}/{self.slug}.md"

    def __str__(self) -> str:
        return self.rel

    @classmethod
    def parse(cls, text: str) -> EntryPath:
        """'personal/always/x.md', 'personal/when/cooking/x' (the .md is optional)."""
        raw = text.strip()
        if raw.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:", raw):
            raise BadMemoryPath(
                f"{text!r} is an absolute path",
                hint="Name an entry relative to the memory folder: scope/always/slug.md.",
            )
        raw = raw.removesuffix(".md")
        parts = raw.split("/")
        if any(p in ("", ".", "..") for p in parts) or "\\" in raw:
            raise BadMemoryPath(
                f"{text!r} is not an entry path",
                hint="Use scope/always/slug.md or scope/when/topic/slug.md; '..' is refused.",
            )
        if len(parts) == 3 and parts[1] == "always":
            return cls(parts[0], "always", None, parts[2])
        if len(parts) == 4 and parts[1] == "when":
            return cls(parts[0], "when", parts[2], parts[3])
        raise BadMemoryPath(
            f"{text!r} is not an entry path",
            hint="Use scope/always/slug.md or scope/when/topic/slug.md.",
        )


@dataclass(frozen=True)
class Source:
    """The user's words an entry stands on: which conversation, which message, the quote, and
    when they said it (the message's time, epoch seconds). An entry's words are read from the
    day they were said ("last month"), which is not the day they were saved when a suggestion
    waited in the review queue; None: not known (written by hand, or before Heron kept it)."""

    conversation: str | None = None
    message: int | None = None
    quote: str | None = None
    said: float | None = None


@dataclass(frozen=True)
class Entry:
    path: EntryPath
    text: str
    origin: str = "user"
    created: float = 0.0
    updated: float = 0.0
    source: Source = field(default_factory=Source)
    mistake: str | None = None  # for a lesson: the mistake it prevents

    @property
    def digest(self) -> str:
        """Identifies this version of the entry (front matter and body): a suggestion to change
        an entry remembers it, and is refused once the entry has moved on."""
        return hashlib.sha256(render(self).encode()).hexdigest()[:16]


# ---- file format -----------------------------------------------------------------------------

_FIELDS = ("created", "updated", "origin", "conversation", "message", "said", "quote", "mistake")


def _stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(ts))


def _unstamp(value: str) -> float:
    """A stamp back to epoch seconds. One with its offset (what `_stamp` writes) is that
    instant whatever this process's zone: `time.mktime` would drop the offset and read it
    in local time, an hour or more off for a file written by a process in another zone. A
    date or time without one (written by hand) is read in this process's local time."""
    with contextlib.suppress(ValueError):
        return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%S%z").timestamp()
    for fmt in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%d"):
        try:
            return time.mktime(time.strptime(value, fmt))
        except ValueError:
            continue
    return 0.0


def render(entry: Entry) -> str:
    """The file's text. Values are JSON-quoted where free text could break the format."""
    lines = ["---", f"created: {_stamp(entry.created)}", f"updated: {_stamp(entry.updated)}"]
    lines.append(f"origin: {entry.origin}")
    if entry.source.conversation is not None:
        lines.append(f"conversation: {json.dumps(entry.source.conversation)}")
    if entry.source.message is not None:
        lines.append(f"message: {entry.source.message}")
    if entry.source.said is not None:
        lines.append(f"said: {_stamp(entry.source.said)}")
    if entry.source.quote is not None:
        lines.append(f"quote: {json.dumps(entry.source.quote, ensure_ascii=False)}")
    if entry.mistake is not None:
        lines.append(f"mistake: {json.dumps(entry.mistake, ensure_ascii=False)}")
    lines.append("---")
    return "\n".join(lines) + "\n" + entry.text.strip() + "\n"


def parse(path: EntryPath, text: str, mtime: float = 0.0, *, quiet: bool = False) -> Entry:
    """Read a file's text; a file without front matter (written by hand) is all body.
    `quiet`: no warning of what is malformed (an old version, read from the history)."""
    meta: dict[str, str] = {}
    body = text
    if text.startswith("---\n"):
        end = text.find("\n---", 4)
        meta = _front_matter(text[4:] if end == -1 else text[4:end])
        if end != -1:
            body = text[end + 4 :].lstrip("\n")
        elif meta:  # cut short (a disk that filled, an editor that crashed) inside its header
            if not quiet:
                log.warning(
                    "memory file %s ends inside its front matter: read from its quote", path.rel
                )
            body = _unjson(meta.get("quote")) or ""  # a saved entry's text is its quote
    odd = _malformed(meta)
    if odd and not quiet:
        log.warning("memory file %s: %s", path.rel, "; ".join(odd.values()))
    message = meta.get("message", "")
    created, updated = (
        _unstamp(meta[k]) if k in meta and k not in odd else mtime for k in ("created", "updated")
    )
    said = _unstamp(meta["said"]) if meta.get("said") and "said" not in odd else None
    return Entry(
        path=path,
        text=body.strip(),
        origin="hand" if "origin" in odd else meta.get("origin", "hand") or "hand",
        created=created,
        updated=updated,
        source=Source(
            _unjson(meta.get("conversation")),
            int(message) if message.isdigit() else None,
            _unjson(meta.get("quote")),
            said,
        ),
        mistake=_unjson(meta.get("mistake")),
    )


ORIGINS = ("user", "auto", "lesson", "hand")


# How far ahead of this machine's clock a said may be and still be read: a message typed on
# a device whose clock runs ahead, or a zone written wrong by hand, is not a typo of the year.
_CLOCK_SKEW = 86_400.0


def _malformed(meta: dict[str, str]) -> dict[str, str]:
    """The front matter's values Heron cannot read (a hand edit gone wrong), each with what
    is read instead: the field's name -> what to say of it."""
    odd = {}
    origin = meta.get("origin")
    if origin and origin not in ORIGINS:
        odd["origin"] = f"origin {origin!r} is not one of {', '.join(ORIGINS)}: read as hand"
    message = meta.get("message")
    if message and not message.isdigit():
        odd["message"] = f"message {message!r} is not a message number: left out"
    for key in ("created", "updated", "said"):
        value = meta.get(key)
        if value and _unstamp(value) == 0.0:
            instead = "left out" if key == "said" else "the file's time"
            odd[key] = f"{key} {value!r} is not a date (2025-05-01T10:12:03+0200): {instead}"
    said = meta.get("said")
    if said and "said" not in odd and _unstamp(said) > time.time() + _CLOCK_SKEW:
        # A year typed wrong by hand: the model would read "last month" from a day to come.
        odd["said"] = f"said {said!r} is in the future: left out"
    return odd


def _front_matter(header: str) -> dict[str, str]:
    """The known fields of a front matter's lines."""
    meta: dict[str, str] = {}
    for line in header.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in _FIELDS:
            meta[key.strip()] = value.strip()
    return meta


def _unjson(value: str | None) -> str | None:
    if value is None or value == "":
        return None
    try:
        loaded = json.loads(value)
    except ValueError:
        return value  # hand-written, unquoted: keep as typed
    return str(loaded)


# ---- the folder ------------------------------------------------------------------------------


def decoded(data: bytes, path: EntryPath) -> str:
    """A memory file's text. Heron writes UTF-8; a file the person saved from an editor set to
    a legacy encoding is read as Windows-1252 (Latin-1 where it has no character), which every
    byte decodes in, rather than stop every turn on one file. Its next edit by Heron writes it
    back as UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        log.warning("memory file %s is not UTF-8: read as Windows-1252; save it as UTF-8", path.rel)
    try:
        return data.decode("cp1252")
    except UnicodeDecodeError:  # the five bytes cp1252 leaves undefined
        return data.decode("latin-1")


# C0 and C1 control characters but tab and line breaks: a NUL or a stray byte of a hand-edited
# file (a legacy encoding read as Windows-1252 passes them through) is nothing the person wrote
# to the model, and some wires or terminals choke on it.
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def without_controls(text: str, path: EntryPath) -> str:
    """`text` less its control characters, with a warning naming the file and what it held."""
    found = _CONTROLS.findall(text)
    if not found:
        return text
    codes = ", ".join(sorted({f"U+{ord(c):04X}" for c in found}))
    log.warning(
        "memory file %s holds %d control character(s) (%s): read without them; save it as "
        "plain UTF-8 text",
        path.rel,
        len(found),
        codes,
    )
    return _CONTROLS.sub("", text)


class MemoryFiles:
    """The entries on disk. The files are the truth: every read goes back to the folder, and
    listing every entry (each turn does) re-reads only what changed since the last listing."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._listing = _Listing()
        self._warned: set[str] = set()  # the misnamed files already warned of, by path

    def _real_root(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root.resolve()

    def file(self, path: EntryPath) -> Path:
        """The file for `path`, refused when a symlink on the way leads out of the folder."""
        root = self._real_root()
        target = root / path.rel
        resolved = target.resolve()
        if not resolved.is_relative_to(root):
            raise BadMemoryPath(
                f"{path.rel} leads outside the memory folder (a symbolic link)",
                hint=f"Remove the link, or keep memory files inside {root}.",
            )
        return target

    def text(self, path: EntryPath) -> str | None:
        """The file of `path` as it is (None: no such file): what `heron memory show`
        prints, a malformed front matter line and all."""
        try:
            return decoded(self.file(path).read_bytes(), path)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def read(self, path: EntryPath) -> Entry | None:
        text = self.text(path)
        if text is None:
            return None
        return parse(path, without_controls(text, path), self.file(path).stat().st_mtime)

    def write(self, entry: Entry) -> Path:
        """Write atomically (temp file + rename), so a reader never sees half an entry."""
        target = self.file(entry.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        self.file(entry.path)  # re-check: the folders just made must still be inside
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(render(entry), encoding="utf-8")
        os.replace(tmp, target)
        return target

    def delete(self, path: EntryPath) -> bool:
        target = self.file(path)
        try:
            target.unlink()
        except FileNotFoundError:
            return False
        self._prune(target.parent)
        return True

    def _prune(self, folder: Path) -> None:
        """Remove folders left empty by a delete, up to the scope (never the root)."""
        root = self._real_root()
        while folder.resolve() != root and folder.resolve().parent != root:
            try:
                folder.rmdir()
            except OSError:
                return
            folder = folder.parent

    def scopes(self) -> list[str]:
        root = self._real_root()
        return sorted(
            p.name for p in root.iterdir() if p.is_dir() and NAME.match(p.name) and _inside(p, root)
        )

    def entries(self, scope: str | None = None) -> list[Entry]:
        """Every readable entry (of one scope, or all), in a deterministic order: scope, always
        before when, topic, slug. Files with names outside the rules are skipped."""
        if scope is None:
            return self._listing.entries(self)
        self.warn_strays()
        found: list[Entry] = []
        for path in self._paths(check_name(scope, "scope")):
            entry = self.read(path)
            if entry is not None:
                found.append(entry)
        return sorted(found, key=lambda e: _order(e.path))

    def _walk(self) -> tuple[list[EntryPath], list[Path]]:
        """Every entry path of every scope, and every folder looked into to find them."""
        root = self._real_root()
        scopes = self.scopes()
        paths = [path for name in scopes for path in self._paths(name)]
        self.warn_strays(paths)
        folders = [root]
        for name in scopes:
            base = root / name
            folders += [base, base / "always", base / "when"]
            folders += [p for p in (base / "when").glob("*") if p.is_dir()]
        return paths, folders

    def _paths(self, scope: str) -> list[EntryPath]:
        root = self._real_root()
        base = root / scope
        paths: list[EntryPath] = []
        for file in base.glob("always/*.md"):
            if _inside(file, root) and NAME.match(file.stem):
                paths.append(EntryPath(scope, "always", None, file.stem))
        for file in base.glob("when/*/*.md"):
            topic = file.parent.name
            if _inside(file, root) and NAME.match(file.stem) and NAME.match(topic):
                paths.append(EntryPath(scope, "when", topic, file.stem))
        return paths

    def strays(self, paths: list[EntryPath] | None = None) -> list[tuple[str, str]]:
        """The Markdown files in the folder that are not read as entries (a name with a space
        or a capital, a folder deeper than when/<topic>/, a .markdown extension; a symbolic
        link that leads out of the folder or to nothing, a file's or a folder's), relative to
        the folder, each with what to say of it. `paths`: the entries found, when the caller
        has them."""
        root = self._real_root()
        read = {p.rel for p in (paths if paths is not None else self._all_paths())}
        found = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # .git, an editor's
            for name in dirs:  # a folder linked out is not walked into: say so
                link = Path(folder) / name
                if link.is_symlink() and not _inside(link, root):
                    found.append(_link_stray(link, root, "folder"))
            for name in sorted(names):
                file = Path(folder) / name
                if name.startswith(".") or file.suffix.lower() not in MARKDOWN:
                    continue
                rel = file.relative_to(root).as_posix()
                if file.is_symlink():  # refused for where it leads, not for its name
                    if not _inside(file, root) or not file.exists():
                        found.append(_link_stray(file, root, "file"))
                elif rel not in read:
                    found.append((rel, stray_warning(rel)))
        return found

    def _all_paths(self) -> list[EntryPath]:
        return [path for name in self.scopes() for path in self._paths(name)]

    def warn_strays(self, paths: list[EntryPath] | None = None) -> None:
        """Warn once per file of each Markdown file that is not read as an entry, naming it
        and the name it would be read under: renamed by hand, it silently left memory."""
        for rel, warning in self.strays(paths):
            if rel not in self._warned:
                self._warned.add(rel)
                log.warning("%s", warning)


MARKDOWN = (".md", ".markdown")


def stray_warning(rel: str) -> str:
    """What to say of a Markdown file whose name is not an entry's (`rel`)."""
    rule = (
        "an entry is named <scope>/always/<slug>.md or <scope>/when/<topic>/<slug>.md in "
        "lowercase letters, digits and hyphens"
    )
    name = valid_name(rel)
    fix = f"; rename it {name}" if name else ""
    return f"memory file {rel} is not read: {rule}{fix}"


def _link_stray(link: Path, root: Path, what: str) -> tuple[str, str]:
    """A symbolic link in the memory folder that is not read (it leads out of the folder, or
    to nothing), and what to say of it: where it leads, and what to do instead."""
    rel = link.relative_to(root).as_posix()
    target = os.readlink(link)
    if not link.exists():
        return rel, f"memory {what} {rel} is not read: it is a symbolic link to nothing ({target})"
    return rel, (
        f"memory {what} {rel} is not read: it is a symbolic link that leads outside the memory "
        f"folder ({target}), where Heron never reads; copy it into the memory folder instead"
    )


def valid_name(rel: str) -> str | None:
    """The entry path a misnamed file would be read under (`Olives Love.md` in a topic:
    olives-love.md; a folder deeper than its topic joined to it; .markdown as .md), or None
    when it stands where no entry does (the folder's top, a scope's top)."""
    *folders, name = rel.split("/")
    slug = slugify(name.rsplit(".", 1)[0], 60)
    if len(folders) < 2:
        return None
    scope, kind, *topics = folders
    if kind.lower() == "always" and not topics:
        return f"{slugify(scope)}/always/{slug}.md"
    if kind.lower() == "when" and topics:
        return f"{slugify(scope)}/when/{slugify('-'.join(topics), 60)}/{slug}.md"
    return None


Stamp = tuple[int, int, int] | None


def _file_stamp(path: Path) -> Stamp:
    # The inode too: an entry is written by renaming a new file over the old one.
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


@dataclass
class _Listing:
    """All entries as last listed. A file added, removed or renamed changes its folder's stamp,
    so the folders are listed again only then; an entry is parsed again only when its own
    stamp changed. Each turn then costs a stat per folder and per file instead of a walk and
    a parse of every file."""

    folders: dict[Path, Stamp] | None = None
    paths: list[EntryPath] = field(default_factory=list)
    parsed: dict[EntryPath, tuple[Stamp, Entry | None]] = field(default_factory=dict)

    def entries(self, files: MemoryFiles) -> list[Entry]:
        if self.folders is None or any(_file_stamp(f) != s for f, s in self.folders.items()):
            paths, folders = files._walk()
            self.folders = {f: _file_stamp(f) for f in folders}
            self.paths = paths
            kept = set(paths)
            self.parsed = {p: held for p, held in self.parsed.items() if p in kept}
        found: list[Entry] = []
        for path in self.paths:
            stamp = _file_stamp(files.root / path.rel)
            held = self.parsed.get(path)
            if held is None or held[0] != stamp or stamp is None:
                held = (stamp, files.read(path))
                self.parsed[path] = held
            if held[1] is not None:
                found.append(held[1])
        return sorted(found, key=lambda e: _order(e.path))


def _inside(path: Path, root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root)
    except OSError:
        return False


def _order(path: EntryPath) -> tuple[str, int, str, str]:
    return (path.scope, 0 if path.kind == "always" else 1, path.topic or "", path.slug)


def slugify(text: str, limit: int = 48) -> str:
    """A slug from free text: 'Prefers concise replies.' -> 'prefers-concise-replies'."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    slug = ""
    for word in words:
        candidate = f"{slug}-{word}" if slug else word
        if len(candidate) > limit:
            break
        slug = candidate
    return slug or "entry"


def touched(entry: Entry, text: str, now: float) -> Entry:
    return replace(entry, text=text, updated=now)
