from __future__ import annotations

import socket

import pytest
import rewrite_cache
from hypothesis import HealthCheck, settings
from pg import db, home_db, new_db, own_pg_server, pg_server, pg_url  # noqa: F401  (fixtures: a real PostgreSQL, tests/pg.py)
from strength import FAST

# No test asserts a wall time (docs/testing.md), hypothesis's included: no per-example deadline
# and no "too slow" health check, which fail on a loaded machine whatever the code does.
UNTIMED = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("untimed", **UNTIMED)
# Tests that leave max_examples to the profile get the light one in the fast run too.
settings.register_profile("fast", max_examples=15, **UNTIMED)
settings.load_profile("fast" if FAST else "untimed")


def pytest_configure(config: pytest.Config) -> None:
    # Before the xdist workers start: else each rewrites every test module's asserts itself.
    rewrite_cache.warm_for_workers(config)


@pytest.fixture(autouse=True)
def heron_home(tmp_path, monkeypatch):
    """Every test runs in its own HERON_HOME, with no real credentials in reach."""
    home = tmp_path / "heron-home"
    home.mkdir(mode=0o700)  # as Heron makes a home (one others can read is made so, and said)
    monkeypatch.setenv("HERON_HOME", str(home))
    for var in (
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
        "HERON_BASE_URL",
        "HERON_API_KEY",
        "HERON_MODEL",
        "HERON_CONTEXT_WINDOW",
        "OPENAI_BASE_URL",
        "ANTHROPIC_BASE_URL",
        "HERON_DATABASE_URL",
    ):
        monkeypatch.delenv(var, raising=False)
    # The sentence model stays out whether or not the embeddings extra is installed: the
    # engine's recall is BM25 in every test, and tests of the fused path pass a fake embedder.
    monkeypatch.setenv("HERON_EMBEDDINGS", "0")
    return home


_real_connect = socket.socket.connect


def _loopback_only(self, address):
    host = address[0] if isinstance(address, tuple) else address
    if isinstance(host, str) and not (
        host.startswith("127.") or host in ("localhost", "::1") or host.startswith("/")
    ):
        raise RuntimeError(f"tests may not reach the network (tried {address!r})")
    return _real_connect(self, address)


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    monkeypatch.setattr(socket.socket, "connect", _loopback_only)
