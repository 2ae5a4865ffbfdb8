"""The PostgreSQL store: the same migrations and the same interface, on a real server."""

from __future__ import annotations

import psycopg
import pytest

from heron.errors import StoreError
from heron.messages import Message, Text
from heron.store.db import Store
from heron.store.migrations import latest

pytestmark = pytest.mark.pg


def test_every_migration_applies_on_postgres(pg_url):
    store = Store(pg_url)
    assert store.backend == "postgresql"
    names = {r[0] for r in store.query("SELECT name FROM _migrations")}
    assert latest() in names
    Store(pg_url)  # opening again applies nothing twice


def test_a_schema_a_newer_heron_migrated_is_refused_on_postgres(pg_url):
    store = Store(pg_url)
    with store.transaction() as conn:
        conn.execute("INSERT INTO _migrations VALUES (?, ?)", ("m999_from_the_future", 0.0))
    store.close()
    with pytest.raises(StoreError, match="migrated by a newer Heron") as refused:
        Store(pg_url)
    assert "m999_from_the_future" in str(refused.value)


def test_full_text_is_indexed_by_postgres(pg_url):
    store = Store(pg_url)
    conv = store.open_conversation("k")
    store.append(conv.id, Message("user", [Text("the heron stands in the river")]))
    store.append(conv.id, Message("user", [Text("nothing about birds")]))
    rows = store.query(
        "SELECT id FROM messages WHERE body_tsv @@ plainto_tsquery('english', ?)", ("rivers",)
    )
    assert len(rows) == 1


def test_an_unreachable_server_is_a_clear_error():
    with pytest.raises(StoreError, match="cannot connect") as e:
        Store("postgresql://heron:secret@127.0.0.1:1/heron")
    assert "secret" not in str(e.value)
    assert "HERON_DATABASE_URL" in e.value.hint


def test_a_bad_url_is_a_clear_error():
    with pytest.raises(StoreError, match="cannot connect"):
        Store("postgresql://127.0.0.1:notaport/x")


def test_psycopg_is_the_real_driver(pg_url):
    store = Store(pg_url)
    assert isinstance(store.conn._conn, psycopg.Connection)


def test_the_database_is_chosen_by_env_then_config_then_the_home(tmp_path):
    from heron.config import Settings

    home = tmp_path / "home"
    home.mkdir()
    assert Settings.load({"HERON_HOME": str(home)}).database == home / "heron.db"
    (home / "config.toml").write_text('[store]\nurl = "postgresql://a@127.0.0.1/x"\n')
    tenant = Settings.load({"HERON_HOME": str(home)}).tenant  # the home's schema on the server
    in_schema = f"?options=-csearch_path%3Dheron_{tenant}"
    assert (
        Settings.load({"HERON_HOME": str(home)}).database
        == "postgresql://a@127.0.0.1/x" + in_schema
    )
    env = {"HERON_HOME": str(home), "HERON_DATABASE_URL": "postgresql://b@127.0.0.1/y"}
    assert Settings.load(env).database == "postgresql://b@127.0.0.1/y" + in_schema


def test_a_url_that_is_not_postgresql_says_what_one_looks_like(tmp_path):
    from heron.config import Settings
    from heron.errors import ConfigError

    home = tmp_path / "home"
    home.mkdir()
    env = {"HERON_HOME": str(home), "HERON_DATABASE_URL": "mysql://x"}
    with pytest.raises(ConfigError, match="HERON_DATABASE_URL must be a postgresql://") as e:
        _ = Settings.load(env).database
    assert "postgresql://heron@" in e.value.hint
    (home / "config.toml").write_text('[store]\nurl = "heron.db"\n')
    with pytest.raises(ConfigError, match=r"\[store\] url must be"):
        Settings.load({"HERON_HOME": str(home)})


def test_a_store_opened_while_another_worker_migrates_knows_the_new_tables(pg_url):
    """Two workers on a fresh database: the one that waited for the migration lock while the
    other created the tables must still translate INSERT OR REPLACE and return new ids."""
    import threading
    import time

    from heron.store import engine_state as es
    from heron.store.migrations import migrate
    from heron.store.pg import PgConnection

    first = PgConnection(pg_url)
    lock = "1751, hashtext(current_schema())"  # the migration lock (the schema's), by `first`
    first.execute(f"SELECT pg_advisory_lock({lock})")
    opened: list[Store] = []
    waiter = threading.Thread(target=lambda: opened.append(Store(pg_url)))
    waiter.start()
    deadline = time.monotonic() + 60
    while not first.execute(
        "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    ).fetchone()[0]:
        assert time.monotonic() < deadline, "the second store never waited for the lock"
        time.sleep(0.02)
    migrate(first, postgres=True)  # `first` migrates while the other waits
    first.execute(f"SELECT pg_advisory_unlock({lock})")
    waiter.join(60)
    first.close()
    store = opened[0]
    try:
        conversation = store.open_conversation("k")
        assert conversation.id > 0
        assert es.try_lease(store, conversation.id, "me", 60).holder is None
        assert store.append(conversation.id, Message("user", (Text("hi"),))).id > 0
    finally:
        store.close()


def test_workers_opening_a_fresh_database_at_the_same_moment_all_open_it(pg_url):
    """`heron serve --workers 4` starts its workers together on a new database: each one's
    first statements race to create the tables, and none may fail on it."""
    import threading

    together = threading.Barrier(4, timeout=60)
    errors: list[BaseException] = []

    def open_store() -> None:
        together.wait()
        try:
            Store(pg_url).close()
        except BaseException as e:  # reported below, with what it was
            errors.append(e)

    threads = [threading.Thread(target=open_store) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
