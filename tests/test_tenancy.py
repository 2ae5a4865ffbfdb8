"""Tenancy on one PostgreSQL database: each home (or `[store] tenant`) has its own schema,
created with the migrations on first use, and nothing of one is visible to another. Each test
here tries to read, search, list, lease or trace across two tenants and fails on a leak."""

from __future__ import annotations

from pathlib import Path

import pytest
from pg import PgServer
from typer.testing import CliRunner

from heron.agent.engine import Engine
from heron.cli import app
from heron.config import Settings
from heron.errors import ConfigError
from heron.memory.recall import Recall
from heron.messages import Reply, Text
from heron.providers.scripted import ScriptedProvider
from heron.store import Store
from heron.store import engine_state as es
from heron.store.migrations import latest
from heron.trace.blobs import collect_garbage
from heron.trace.read import list_runs

pytestmark = pytest.mark.pg

SECRET = "the vault code is tangerine seventeen"


def _home(root: Path, name: str, tenant: str | None = None) -> Path:
    home = root / name
    home.mkdir()
    if tenant is not None:
        (home / "config.toml").write_text(f'[store]\ntenant = "{tenant}"\n')
    return home


def _env(home: Path, server: PgServer) -> dict[str, str]:
    return {"HERON_HOME": str(home), "HERON_DATABASE_URL": server.url}


async def _say(settings: Settings, key: str, text: str) -> str:
    provider = ScriptedProvider(lambda request: Reply([Text("noted")], "done"))
    async with Engine.open(settings, provider=provider) as engine:
        result = await engine.turn(key, text)
    return result.run_id


def _schemas(server: PgServer) -> set[str]:
    import psycopg

    with psycopg.connect(server.url) as conn:
        rows = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'heron_%'")
        return {r[0] for r in rows}


async def test_two_homes_on_one_database_see_nothing_of_each_other(tmp_path, pg_server):
    alice = Settings.load(_env(_home(tmp_path, "alice"), pg_server))
    bob = Settings.load(_env(_home(tmp_path, "bob"), pg_server))
    assert alice.database != bob.database  # one URL given, a schema each
    run_id = await _say(alice, "plans", SECRET)
    await _say(bob, "mine", "nothing to hide here")
    a, b = Store(alice.database), Store(bob.database)
    # read and list
    assert a.conversation("plans") is not None and b.conversation("plans") is None
    assert [c.key for c in b.conversations()] == ["mine"]
    assert not b.query("SELECT 1 FROM messages WHERE parts LIKE ?", ("%tangerine%",))
    # search, as recall does (its own full-text index, per schema)
    assert Recall(a).search("vault code tangerine") and not Recall(b).search("vault code tangerine")
    # trace
    assert [r.run_id for r in list_runs(a)] == [run_id]
    assert run_id not in {r.run_id for r in list_runs(b)}
    # the same ids on both sides, and still two conversations: a lease held in one tenant does
    # not hold the other's conversation with the same id
    cid = a.conversation("plans").id  # type: ignore[union-attr]
    assert b.conversation("mine").id == cid  # type: ignore[union-attr]
    assert es.try_lease(a, cid, "alice-turn", ttl=30.0).holder is None
    assert es.try_lease(b, cid, "bob-turn", ttl=30.0).holder is None
    assert es.lease_holder(a, cid).owner == "alice-turn"  # type: ignore[union-attr]
    # the trace's garbage collection of one tenant leaves the other's trace whole
    b.delete_conversation(b.conversation("mine").id)  # type: ignore[union-attr]
    with b.transaction() as conn:
        collect_garbage(conn)
    assert len(list_runs(a)) == 1 and a.query("SELECT COUNT(*) FROM trace_blobs")[0][0] > 0


async def test_the_commands_of_one_home_show_nothing_of_another(tmp_path, pg_server, monkeypatch):
    alice_home, bob_home = _home(tmp_path, "alice"), _home(tmp_path, "bob")
    run_id = await _say(Settings.load(_env(alice_home, pg_server)), "plans", SECRET)
    monkeypatch.setenv("HERON_DATABASE_URL", pg_server.url)
    cli = CliRunner()
    for home, sees in ((alice_home, True), (bob_home, False)):
        monkeypatch.setenv("HERON_HOME", str(home))
        listed = cli.invoke(app, ["conversations", "list"])
        recalled = cli.invoke(app, ["memory", "recall", "vault code tangerine"])
        traced = cli.invoke(app, ["trace", "ls"])
        assert listed.exit_code == recalled.exit_code == traced.exit_code == 0, listed.output
        assert ("plans" in listed.output) is sees
        assert ("tangerine" in recalled.output) is sees
        assert (run_id[:12] in traced.output) is sees
        shown = cli.invoke(app, ["trace", "show", run_id])
        assert (shown.exit_code == 0) is sees


def test_a_tenant_is_a_schema_made_with_the_migrations_on_first_use(tmp_path, pg_server):
    settings = Settings.load(_env(_home(tmp_path, "h", tenant="family"), pg_server))
    assert "heron_family" not in _schemas(pg_server)
    store = Store(settings.database)
    assert "heron_family" in _schemas(pg_server)
    assert store.query("SELECT current_schema()")[0][0] == "heron_family"
    assert latest() in {r[0] for r in store.query("SELECT name FROM _migrations")}
    Store(settings.database).close()  # opened again: nothing applied twice
    # the name, not the folder, is the tenant: another home naming it shares its rows
    store.open_conversation("shared")
    other = Settings.load(_env(_home(tmp_path, "elsewhere", tenant="family"), pg_server))
    assert Store(other.database).conversation("shared") is not None
    third = Settings.load(_env(_home(tmp_path, "third", tenant="work"), pg_server))
    assert Store(third.database).conversation("shared") is None


def test_two_processes_opening_a_new_tenant_at_once_both_succeed(tmp_path, pg_server):
    import threading

    settings = Settings.load(_env(_home(tmp_path, "h", tenant="race"), pg_server))
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def open_it() -> None:
        try:
            start.wait(timeout=30)
            Store(settings.database).close()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    store = Store(settings.database)
    names = [r[0] for r in store.query("SELECT name FROM _migrations")]
    assert len(names) == len(set(names))  # each step once


def test_the_default_tenant_comes_from_the_home_or_the_user(tmp_path, pg_server, monkeypatch):
    one = Settings.load(_env(_home(tmp_path, "one"), pg_server))
    again = Settings.load(_env(tmp_path / "one", pg_server))
    two = Settings.load(_env(_home(tmp_path / "one", "one"), pg_server))  # same name, elsewhere
    assert one.tenant == again.tenant and one.tenant != two.tenant
    assert one.tenant.startswith("one_")
    monkeypatch.setenv("HOME", str(tmp_path))  # ~/.heron, the default home, is the user's
    default = Settings.load({"USER": "Ada.Lovelace", "HERON_DATABASE_URL": pg_server.url})
    assert default.tenant == "ada_lovelace"
    assert default.database.endswith("search_path%3Dheron_ada_lovelace")  # type: ignore[union-attr]


def test_a_bad_tenant_or_two_schemas_named_is_a_clear_error(tmp_path, pg_server):
    home = _home(tmp_path, "h", tenant="No Spaces!")
    with pytest.raises(ConfigError, match=r"\[store\] tenant"):
        Settings.load(_env(home, pg_server))
    named = _home(tmp_path, "named", tenant="ok")
    pinned = f"{pg_server.url}?options=-csearch_path%3Dmine"
    with pytest.raises(ConfigError, match="search_path"):
        _ = Settings.load({"HERON_HOME": str(named), "HERON_DATABASE_URL": pinned}).database
    plain = _home(tmp_path, "plain")
    env = {"HERON_HOME": str(plain), "HERON_DATABASE_URL": pinned}
    assert Settings.load(env).database == pinned  # a URL that names its schema is kept as it is


def test_on_sqlite_the_home_s_file_is_its_own_and_a_tenant_changes_nothing(tmp_path):
    home = _home(tmp_path, "h", tenant="family")
    assert Settings.load({"HERON_HOME": str(home)}).database == home / "heron.db"
