"""heron/store/pg_url.py: a store URL's password never reaches a message, and which of its
servers the agent's commands could reach on this machine's loopback."""

from __future__ import annotations

import socket

import pytest

from heron.config import Settings
from heron.errors import ConfigError, StoreError
from heron.store.pg_url import has_password, loopback_ports, redact

SECRET = "PgS3cretPassw0rd"


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://heronpw:{SECRET}@127.0.0.1:5432/heron",
        f"postgresql://heronpw@127.0.0.1:5432/heron?password={SECRET}",
        f"postgresql://heronpw@127.0.0.1:5432/heron?sslmode=disable&password={SECRET}&x=1",
        f"postgresql://:{SECRET}@127.0.0.1:5432/heron",
        f"postgres ql://heronpw:{SECRET}@127.0.0.1:5432/heron",  # a typo
    ],
)
def test_redact_masks_the_password_wherever_the_url_carries_it(url: str) -> None:
    shown = redact(url)
    assert SECRET not in shown and "***" in shown
    assert "127.0.0.1:5432/heron" in shown  # the rest stays readable


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://heronpw@127.0.0.1:{{port}}/heron?password={SECRET}",
        f"postgresql://:{SECRET}@127.0.0.1:{{port}}/heron",
    ],
)
def test_a_store_that_cannot_be_reached_names_it_without_the_password(url: str, tmp_path) -> None:
    """What the QA saw with the server down: the whole URL, password included, in the error
    (and so in a serve's or a worker's log)."""
    from heron.store import Store

    with pytest.raises(StoreError) as raised:
        Store(url.format(port=closed_port()))
    said = f"{raised.value} {getattr(raised.value, 'hint', '')}"
    assert SECRET not in said and "127.0.0.1" in said


def test_a_url_that_fails_validation_is_shown_masked(tmp_path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    bad = f"postgres ql://heronpw:{SECRET}@127.0.0.1:44959/heron"
    with pytest.raises(ConfigError) as raised:
        _ = Settings.load({"HERON_HOME": str(home), "HERON_DATABASE_URL": bad}).database
    assert SECRET not in str(raised.value) and "postgres ql://heronpw:***@" in str(raised.value)


@pytest.mark.parametrize(
    ("url", "ports"),
    [
        ("postgresql://heron@127.0.0.1:5433/heron", (5433,)),
        ("postgresql://heron@localhost/heron", (5432,)),
        ("postgresql://heron@[::1]:7000/heron", (7000,)),
        ("postgresql://heron@127.0.0.2/heron?port=6000", (6000,)),
        ("postgresql://a@192.0.2.1:5432,127.0.0.1:5434/x", (5434,)),
        ("postgresql://heron@192.0.2.1:5432/heron", ()),
        # qa21v M1: a server reached over its Unix socket usually listens on loopback TCP at
        # the same port too (Debian's default); an unspecified or IPv4-mapped address is this
        # machine as well.
        ("postgresql:///heron?host=/run/postgresql", (5432,)),
        ("postgresql:///heron", (5432,)),  # libpq's default host: its socket folder
        ("postgresql://h:pw@/heron?host=/tmp/pgsock&port=6001", (6001,)),
        ("postgresql://h@0.0.0.0:6002/x", (6002,)),
        ("postgresql://h@[::]:6003/x", (6003,)),
        ("postgresql://h@[::ffff:127.0.0.1]:6004/x", (6004,)),
        ("postgresql://h@[::ffff:192.0.2.1]:6005/x", ()),
    ],
)
def test_loopback_ports_are_the_ones_the_sandbox_must_not_forward(url, ports) -> None:
    assert loopback_ports(url, {}) == ports


def test_the_pg_variables_name_the_host_of_a_url_without_one() -> None:
    assert loopback_ports("postgresql:///heron", {"PGHOST": "192.0.2.1"}) == ()
    assert loopback_ports("postgresql:///heron", {"PGHOST": "/run/pg", "PGPORT": "7"}) == (7,)


# qa21v L1: generated passwords hold characters a URL must percent-encode; libpq then misreads
# the URL, but the message that says so must still not show them.
UNENCODED = [
    f"postgresql://heronpw:{SECRET[:8]}/{SECRET[8:]}@127.0.0.1:{{port}}/heron",
    f"postgresql://heronpw:{SECRET[:8]}@{SECRET[8:]}@127.0.0.1:{{port}}/heron",
    f"postgresql://heronpw:{SECRET[:8]}?{SECRET[8:]}@127.0.0.1:{{port}}/heron",
    f"postgresql://heronpw:{SECRET[:8]}?{SECRET[8:]}@127.0.0.1:{{port}}/heron?sslmode=disable",
]


def shows_no_part_of_the_secret(said: str) -> bool:
    return SECRET[:8] not in said and SECRET[8:] not in said


@pytest.mark.parametrize("url", UNENCODED)
def test_redact_masks_a_password_that_holds_unencoded_characters(url: str) -> None:
    shown = redact(url.format(port=5432))
    assert shows_no_part_of_the_secret(shown), shown
    assert "heronpw:***@127.0.0.1:5432/heron" in shown


@pytest.mark.parametrize("url", UNENCODED)
def test_a_store_url_with_unencoded_characters_is_never_shown_whole(url: str, tmp_path) -> None:
    """Through the tenant's schema (`with_schema`) and psycopg's own message, as the QA saw."""
    from heron.store import Store

    home = tmp_path / "home"
    home.mkdir()
    env = {"HERON_HOME": str(home), "HERON_DATABASE_URL": url.format(port=closed_port())}
    database = Settings.load(env).database
    with pytest.raises(StoreError) as raised:
        Store(database)
    said = f"{raised.value} {getattr(raised.value, 'hint', '')}"
    assert shows_no_part_of_the_secret(said), said
    assert "percent-encode" in said


def test_the_tenants_schema_keeps_a_url_without_a_host_a_url() -> None:
    """qa21v M2: `postgresql:///heron` lost its `//` and was opened as a SQLite file named
    `postgresql:`, which then "was read-only"."""
    from heron.store.pg import url_schema, with_schema

    for url in ("postgresql:///heron", "postgresql:///heron?host=/run/pg&port=5433"):
        tenant = with_schema(url, "heron_t")
        assert tenant.startswith(url.split("?")[0] + "?"), tenant
        assert url_schema(tenant) == "heron_t"
    from heron.store.copy import where

    assert where(with_schema("postgresql:///heron", "heron_t")) == (
        "postgresql:///heron, schema heron_t"
    )
    kept = with_schema(f"postgresql://u:{SECRET[:8]}?{SECRET[8:]}@h/db", "heron_t")
    assert kept.startswith(f"postgresql://u:{SECRET[:8]}?{SECRET[8:]}@h/db?options=")


def test_a_database_url_without_a_host_opens_postgresql(tmp_path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {"HERON_HOME": str(home), "HERON_DATABASE_URL": "postgresql:///heron"}
    database = Settings.load(env).database
    assert isinstance(database, str) and database.startswith("postgresql:///heron?options=")


def test_a_password_counts_in_the_url_or_pgpassword_only() -> None:
    assert has_password(f"postgresql://u:{SECRET}@127.0.0.1/x", {})
    assert has_password(f"postgresql://u@127.0.0.1/x?password={SECRET}", {})
    assert has_password("postgresql://u@127.0.0.1/x", {"PGPASSWORD": SECRET})
    assert not has_password("postgresql://u@127.0.0.1/x", {})
