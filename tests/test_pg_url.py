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
        ("postgresql:///heron?host=/run/postgresql", ()),  # a Unix socket: seccomp's business
    ],
)
def test_loopback_ports_are_the_ones_the_sandbox_must_not_forward(url, ports) -> None:
    assert loopback_ports(url, {}) == ports


def test_a_password_counts_in_the_url_or_pgpassword_only() -> None:
    assert has_password(f"postgresql://u:{SECRET}@127.0.0.1/x", {})
    assert has_password(f"postgresql://u@127.0.0.1/x?password={SECRET}", {})
    assert has_password("postgresql://u@127.0.0.1/x", {"PGPASSWORD": SECRET})
    assert not has_password("postgresql://u@127.0.0.1/x", {})
