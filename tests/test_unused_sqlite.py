"""An SQLite home pointed at PostgreSQL (HERON_DATABASE_URL or `[store] url`) starts from what
PostgreSQL holds: its heron.db is not used, and Heron says so once, naming the file and what it
holds, rather than showing an empty home in silence."""

from __future__ import annotations

from heron.config import Settings
from heron.messages import user
from heron.store import Store, jobs
from heron.store.schedule import parse

URL = "postgresql://heron@127.0.0.1:1/heron"  # never connected to: only the URL is built


def _used_home() -> Settings:
    settings = Settings.load()
    store = Store(settings.database)
    try:
        for key in ("k1", "tn", "cron:9"):  # cron:9 is internal: not counted
            conv = store.open_conversation(key)
            store.append(conv.id, user("hello"))
        store.open_conversation("empty")  # nothing said: not listed, not counted
        jobs.create_job(
            store, parse(every="1h", timezone="UTC"), conversation="k1", prompt="p", now=0.0
        )
    finally:
        store.close()
    return settings


def test_a_used_sqlite_home_on_postgresql_says_once_what_its_heron_db_holds(
    heron_home, capsys, monkeypatch
):
    db = _used_home().paths.db
    capsys.readouterr()
    monkeypatch.setenv("HERON_DATABASE_URL", URL)
    assert "postgresql://" in str(Settings.load().database)
    said = capsys.readouterr().err
    assert f"{db} is not used" in said, said
    assert "2 conversations and 1 scheduled job" in said and "HERON_DATABASE_URL" in said
    assert 'docs/scale.md, "Moving a home"' in said
    assert Settings.load().database
    assert capsys.readouterr().err == ""  # once: the note is kept beside it
    assert "is not used" in (heron_home / "heron.db.unused").read_text()


def test_a_new_or_empty_home_on_postgresql_says_nothing(heron_home, capsys, monkeypatch):
    Store(Settings.load().database).close()  # a heron.db with nothing in it
    capsys.readouterr()
    monkeypatch.setenv("HERON_DATABASE_URL", URL)
    assert Settings.load().database
    assert capsys.readouterr().err == ""
    assert not (heron_home / "heron.db.unused").exists()


def _copied_to(settings: Settings, url: str) -> None:
    """The mark `heron store copy` leaves once it copied the home into `url`'s tenant."""
    from heron.store.copy import Copied
    from heron.store.pg import redact
    from heron.store.unused import held_in, mark_copied

    held = held_in(settings.paths.db)
    assert held is not None
    target = redact(settings.tenant_url(url))
    mark_copied(settings.paths.db, Copied(target, "heron_x", {}, held.last_message, 0.0))


def test_a_home_copied_to_postgresql_is_not_told_its_heron_db_is_unused(
    heron_home, capsys, monkeypatch
):
    settings = _used_home()
    _copied_to(settings, URL)
    capsys.readouterr()
    monkeypatch.setenv("HERON_DATABASE_URL", URL)
    assert Settings.load().database
    assert capsys.readouterr().err == ""
    assert not (heron_home / "heron.db.unused").exists()
    # another database than the copy's is told, and where the copy went
    monkeypatch.setenv("HERON_DATABASE_URL", URL.replace("/heron", "/other"))
    assert Settings.load().database
    said = capsys.readouterr().err
    assert "is not used" in said and "It was copied on" in said and "not to this database" in said


def test_a_copied_home_that_said_more_on_sqlite_after_the_copy_is_told(
    heron_home, capsys, monkeypatch
):
    settings = _used_home()
    _copied_to(settings, URL)
    store = Store(settings.database)
    store.append(store.conversation("k1").id, user("said after the copy"))  # type: ignore[union-attr]
    store.close()
    capsys.readouterr()
    monkeypatch.setenv("HERON_DATABASE_URL", URL)
    assert Settings.load().database
    said = capsys.readouterr().err
    assert "is not used" in said and "has messages said after that copy" in said
    assert "heron store copy" in said
