"""The test PostgreSQL (tests/pg.py) is real, and each test's schema is its own."""

from __future__ import annotations

import psycopg
import pytest

pytestmark = pytest.mark.pg


def test_a_real_server_answers(pg_url):
    with psycopg.connect(pg_url) as conn:
        version = conn.execute("SHOW server_version_num").fetchone()[0]
    assert int(version) >= 150000


def test_each_test_gets_a_schema_of_its_own(pg_url, pg_server):
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE mine (x INTEGER)")
        conn.execute("INSERT INTO mine VALUES (1)")
        schema = conn.execute("SELECT current_schema()").fetchone()[0]
    assert schema.startswith("t_")
    # The default search_path (public) does not see it.
    with psycopg.connect(pg_server.url) as other, pytest.raises(psycopg.errors.UndefinedTable):
        other.execute("SELECT * FROM mine")


def test_a_missing_installation_says_what_to_do(monkeypatch):
    import pg

    monkeypatch.setattr(pg.shutil, "which", lambda name: None)
    monkeypatch.setattr(pg.glob, "glob", lambda pattern: [])
    with pytest.raises(pg.PgUnavailable, match="make postgres"):
        pg.start()
