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
