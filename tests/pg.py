"""A real PostgreSQL for the tests that need one (marker `pg`): no mock stands in for it.

The server is started the first time a test asks for it, once per pytest process (each xdist
worker has its own), and stopped when the run ends: `initdb` and `pg_ctl` into a temporary
folder, run as the `postgres` user when the tests run as root (initdb refuses root), on a free
port of 127.0.0.1, fsync off (a test's data need not survive a power cut). Each test gets a
schema of its own on it (`pg_url`), so tests never see each other's rows and nothing has to be
dropped between them.

When the server cannot be started the test fails with what is wrong and what to do next
(`make postgres` installs Debian's package); it never skips silently.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

USER = "postgres"


@dataclass
class PgServer:
    """A running test cluster: connect as `postgres` (trust auth on 127.0.0.1) to `heron`."""

    folder: Path
    port: int
    bindir: Path
    as_user: list[str]
    options: str = ""  # the server's own (port, socket folder): `start_again` needs them

    @property
    def url(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/heron"

    def pg_ctl(self, *args: str) -> None:
        """pg_ctl on this cluster (its log kept in the folder, so no pipe is held open)."""
        data, log = str(self.folder / "data"), str(self.folder / "log")
        _run([*self.as_user, str(self.bindir / "pg_ctl"), "-D", data, "-l", log, "-w", *args])

    def restart(self) -> None:
        """What a package upgrade or a reboot does: every connection is dropped."""
        self.pg_ctl("-m", "fast", "restart")

    def start_again(self) -> None:
        """After `pg_ctl("-m", "fast", "stop")`: the same server on the same port."""
        self.pg_ctl("-o", self.options, "start")

    def stop(self) -> None:
        _run([*self.as_user, str(self.bindir / "pg_ctl"), "-D", str(self.folder / "data"),
              "-m", "immediate", "stop"], check=False)  # fmt: skip
        shutil.rmtree(self.folder, ignore_errors=True)


class PgUnavailable(RuntimeError):
    pass


def _bindir() -> Path:
    """Debian's newest /usr/lib/postgresql/N/bin (its PATH has only wrappers), else PATH's."""
    dirs = [d for d in glob.glob("/usr/lib/postgresql/*/bin") if Path(d, "initdb").exists()]
    if dirs:
        return Path(max(dirs, key=lambda d: int(d.split("/")[-2])))
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise PgUnavailable(
        "PostgreSQL is not installed (no pg_ctl on PATH, nothing in /usr/lib/postgresql/*/bin). "
        "Run `make postgres` (as root it installs Debian's `postgresql`), or "
        "`sudo apt-get install postgresql`."
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(cmd: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PgUnavailable(f"`{' '.join(cmd)}` could not run: {e}") from e
    if check and done.returncode != 0:
        raise PgUnavailable(f"`{' '.join(cmd)}` failed:\n{done.stdout}{done.stderr}")
    return done


def start() -> PgServer:
    """initdb, pg_ctl start and CREATE DATABASE heron; raises PgUnavailable saying why not."""
    bindir = _bindir()
    as_user: list[str] = []
    folder = Path(tempfile.mkdtemp(prefix="heron-pg-"))
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            raise PgUnavailable(
                "root needs `runuser` to run initdb as postgres: apt-get install util-linux"
            )
        try:
            shutil.chown(folder, USER, USER)
        except (LookupError, PermissionError) as e:
            raise PgUnavailable(
                f"cannot give {folder} to the `{USER}` user ({e}); the Debian package "
                "`postgresql` creates that user: `make postgres`"
            ) from e
        as_user = ["runuser", "-u", USER, "--"]
    data = folder / "data"
    port = _free_port()
    options = (
        f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off "
        "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
    )
    server = PgServer(folder, port, bindir, as_user, options)
    try:
        _run([*as_user, str(bindir / "initdb"), "-D", str(data), "-U", USER, "--auth=trust",
              "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"])  # fmt: skip
        _run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-o", options,
              "-l", str(folder / "log"), "-w", "-t", "60", "start"])  # fmt: skip
        _create_database(port)
    except BaseException as e:
        log = folder / "log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        server.stop()
        if not isinstance(e, PgUnavailable):
            raise
        raise PgUnavailable(f"{e}\nserver log:\n{tail}") from e
    return server


def _create_database(port: int) -> None:
    import psycopg

    try:
        url = f"postgresql://{USER}@127.0.0.1:{port}/postgres"
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE heron")
    except psycopg.Error as e:
        raise PgUnavailable(f"the server started but CREATE DATABASE failed: {e}") from e


def _running() -> Iterator[PgServer]:
    """A cluster for as long as the fixture lives; the test fails saying why when it cannot
    start."""
    try:
        server = start()
    except PgUnavailable as e:
        pytest.fail(f"cannot start PostgreSQL for the pg tests: {e}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    yield from _running()


def schema_url(server: PgServer) -> str:
    """A URL whose connections see only a fresh schema of their own (search_path)."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{server.url}?options=-csearch_path%3D{schema}"


@pytest.fixture(scope="module")
def own_pg_server() -> Iterator[PgServer]:
    """A cluster of the module's own, for tests that restart or stop it (the session's is
    shared with every other test of the process)."""
    yield from _running()


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    """A URL whose connections see only a fresh schema of this test's own (search_path)."""
    return schema_url(pg_server)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.pg)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str | Path:
    """What a test opens its Store on, once per backend: a SQLite file, a PostgreSQL URL (a
    schema of this test's own). PostgreSQL is started only for the tests that ask."""
    if request.param == "sqlite":
        return tmp_path / "h.db"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.pg)])
def new_db(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str | Path]:
    """Once per backend: a function that gives a fresh database for each name it is called
    with (a SQLite file under tmp_path, or a new schema on the test server), for a test that
    needs several."""
    if request.param == "sqlite":
        return lambda name: tmp_path / f"{name}.db"
    server = request.getfixturevalue("pg_server")
    return lambda name: schema_url(server)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.pg)])
def home_db(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str | Path]:
    """The database of the test's HERON_HOME, once per backend: its `heron.db`, or a PostgreSQL
    schema of the test's own named by HERON_DATABASE_URL, which every engine, `heron` command
    and child process the test starts inherits. On PostgreSQL the test fails if a SQLite file
    appeared in the home meanwhile: something it ran did not use the server."""
    home = Path(os.environ["HERON_HOME"])
    if request.param == "sqlite":
        yield home / "heron.db"
        return
    url = str(request.getfixturevalue("pg_url"))
    monkeypatch.setenv("HERON_DATABASE_URL", url)
    yield url
    stray = home / "heron.db"
    assert not stray.exists(), f"{stray} was opened: the test did not run on PostgreSQL alone"


def raw_count(db: str | Path, sql: str, params: tuple[object, ...] = ()) -> object:
    """The first value of `sql` read through a connection of its own, not the store's: what
    another process would see (psycopg's %s placeholders or sqlite's ?)."""
    if isinstance(db, Path):
        import sqlite3

        with sqlite3.connect(db) as conn:
            return conn.execute(sql, params).fetchone()[0]
    import psycopg

    with psycopg.connect(db) as conn:
        row = conn.execute(sql.replace("?", "%s"), params).fetchone()
        return None if row is None else row[0]
