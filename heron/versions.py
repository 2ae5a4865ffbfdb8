"""What tells one Heron from another, and one config.toml from another, cheaply.

A running `heron serve` and a client of it may be different Herons (an upgrade installed
while the serve runs) or the serve may hold settings its config.toml no longer says (edited
since it started). Its welcome carries `schema` (the newest migration this code knows) and
`config_digest` (of the file it loaded), and a client compares them with its own
(heron/channels/remote.py). The store refuses a database that holds a migration this code
does not know (heron/store/migrations). Both read the names of the migration modules here,
from their folder: importing the store would cost a thin client more than the rest of its
message (docs/serve.md).
"""

from __future__ import annotations

import hashlib
import pkgutil
from pathlib import Path

MIGRATIONS = Path(__file__).parent / "store" / "migrations"


def schema_steps() -> list[str]:
    """The migrations this code has, in the order they apply (their names sort that way)."""
    found = pkgutil.iter_modules([str(MIGRATIONS)])
    return sorted(m.name for m in found if m.name.startswith("m"))


def newest_step() -> str:
    """The last migration this code has: what a database it has opened is migrated to."""
    return schema_steps()[-1]


def digest(data: bytes) -> str:
    """The SHA-256 of a config file's bytes, as the welcome carries it."""
    return hashlib.sha256(data).hexdigest()


def file_digest(path: Path) -> str | None:
    """`digest` of a file (None: there is no such file, or it cannot be read)."""
    try:
        return digest(path.read_bytes())
    except OSError:
        return None
