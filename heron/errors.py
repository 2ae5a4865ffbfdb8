"""Heron's errors, one tree so callers catch at the level they can act on.

    HeronError                      anything Heron raises on purpose; the CLI catches only this
    ├── ConfigError                 config.toml, environment or flags are wrong (says what to fix)
    │   └── NoModelConfigured       nothing to talk to: no key, URL, model or offline model
    ├── ProviderError               a model call failed (status, body, retry_after when known)
    │   ├── ContextOverflow         the prompt is larger than the model's window
    │   ├── RateLimited             429 and friends: retry after `retry_after` seconds
    │   ├── TransientProviderError  5xx, a cut stream, a server down: retry with backoff
    │   │   └── Overloaded          the provider's service is overloaded (529): longer waits
    │   ├── DeadlineExceeded        no answer within the request's deadline: ends the turn
    │   ├── AuthError               bad or missing key: ends the turn, names the variable to set
    │   ├── UnknownModel            the server does not serve that model: ends the turn
    │   └── FatalProviderError      a wrong URL (no API there, https to http), anything else
    │                               the provider refused: ends the turn
    ├── StoreError                  the database is unreadable, locked or holds a corrupt row
    │   ├── BusyError               another process is running a turn on the conversation
    │   ├── StoreUnreachable        the database server's connection was lost or cannot be
    │   │                           made again yet (a restart): tried again at the next statement
    │   └── StoreRefused            the disk refused a write (nothing is damaged)
    │       ├── DiskFull            no space left on the disk holding the database
    │       └── ReadOnlyHome        the database or its folder cannot be written
    ├── ToolError                   a tool failed; the runner turns it into an is_error result
    │   └── PathEscape              a path leaves the folder it is confined to
    └── AttachmentError             a file to attach is missing, unreadable or over a cap

Misuse of the API by Heron's own code raises ordinary Python exceptions (TypeError, ValueError),
outside this tree, so a broad `except HeronError` never hides a bug.
"""

from __future__ import annotations

import logging


class HeronError(Exception):
    """Base of every error Heron raises on purpose. `hint` says what to do next."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    @property
    def summary(self) -> str:
        """The message without its hint: a progress line (a retry) says what happened, and
        the hint comes with the final error."""
        return super().__str__()

    def __str__(self) -> str:
        return f"{self.summary}\n{self.hint}" if self.hint else self.summary


class ConfigError(HeronError):
    pass


class NoModelConfigured(ConfigError):
    pass


class ProviderError(HeronError):
    retryable = False
    backoff: float | None = None  # seconds of the first wait before a retry (None: the policy's)

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        body: str | None = None,
        retry_after: float | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.status = status
        self.body = body
        self.retry_after = retry_after


class ContextOverflow(ProviderError):
    """`limit`: the window in tokens the server said the model has, when it said one."""

    def __init__(
        self,
        message: str,
        *,
        limit: int | None = None,
        status: int | None = None,
        body: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, status=status, body=body, hint=hint)
        self.limit = limit


class RateLimited(ProviderError):
    retryable = True


class TransientProviderError(ProviderError):
    retryable = True


class Overloaded(TransientProviderError):
    """The provider's whole service is overloaded (Anthropic's 529): not the account's limit,
    and not over in a second, so the waits between tries start longer."""

    backoff = 4.0


class DeadlineExceeded(ProviderError):
    pass


class AuthError(ProviderError):
    pass


class UnknownModel(ProviderError):
    pass


class FatalProviderError(ProviderError):
    pass


def model_unusable(error: BaseException | None) -> bool:
    """Whether a model call failed so that the same settings will fail again: the key refused
    (401/403), the model unknown, or no answer at all from the server (no HTTP status: down,
    unreachable, a broken stream). What a chat's memory review on close would meet too."""
    if isinstance(error, (AuthError, UnknownModel)):
        return True
    return isinstance(error, ProviderError) and error.retryable and error.status is None


class StoreError(HeronError):
    pass


class BusyError(StoreError):
    pass


class StoreLocked(StoreError):
    """Another process holds the SQLite file locked (an SQLite tool, a backup program) past
    the busy timeout: nothing is wrong with it; the same command later goes through."""


class StoreUnreachable(StoreError):
    """The connection to the database server was lost (a restart, a network cut), or cannot be
    made again yet. What the statement or transaction in flight was doing is not saved, unless
    the message says its outcome is unknown (a COMMIT cut off); the next statement connects
    again (heron/store/pg.py)."""


class StoreRefused(StoreError):
    """The disk refused a write: nothing is damaged, and nothing of it was stored
    (heron/store/disk.py tells these apart from a damaged file)."""


class DiskFull(StoreRefused):
    pass


class ReadOnlyHome(StoreRefused):
    pass


class ToolError(HeronError):
    pass


class PathEscape(ToolError):
    pass


class AttachmentError(HeronError):
    """A file the person attaches cannot be: missing, a folder, unreadable, or over a cap."""


class FailureLog:
    """A failure that repeats at every pass of a loop that polls (the database down while a
    watcher reads it once a second): its traceback logged once, the passes after it that fail
    too not at all, and the first pass that works again said in one line."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self.log, self.what = log, what
        self.failing = False

    def failed(self) -> None:
        """Called in the `except` block of a failed pass."""
        if not self.failing:
            self.log.exception("%s failed (said once: tried again until it works)", self.what)
        self.failing = True

    def worked(self) -> None:
        if self.failing:
            self.log.warning("%s works again", self.what)
        self.failing = False


def one_line(text: str) -> str:
    """An error said on one line (a log line, a table cell, a note in parentheses): its lines,
    the error then its hint, joined by ". " (a line that ends a sentence already by a space),
    so neither runs into the other ("refused Is the model ...") nor breaks the line."""
    said = ""
    for line in (s.strip() for s in text.splitlines()):
        if line:
            said += ("" if not said else " " if said[-1] in ".?!:;" else ". ") + line
    return said
