"""A system prompt that changes is stored as the sections that changed: the trace grows with
what is new, not with the whole prompt each time it moves."""

from __future__ import annotations

from heron.messages import dumps
from heron.store import Store
from heron.trace.blobs import collect_garbage, get_blob, put_blob, put_payload, rebuild


def _prompt(summary: str) -> str:
    fixed = "\n\n".join(f"# Section {i}\n" + f"fixed text {i} " * 200 for i in range(6))
    return fixed + "\n\n# Archived context summary\n" + summary


def _blob_bytes(store: Store) -> int:
    return int(store.query("SELECT SUM(LENGTH(body)) FROM trace_blobs")[0][0] or 0)


def test_a_changed_section_adds_only_that_section(db):  # once per backend (tests/pg.py)
    store = Store(db)
    first, second = _prompt("the first summary " * 20), _prompt("the second one " * 20)
    with store.transaction() as conn:
        a = put_blob(conn, "system", first)
    before = _blob_bytes(store)
    with store.transaction() as conn:
        b = put_blob(conn, "system", second)
        assert (get_blob(conn, a), get_blob(conn, b)) == (first, second)  # byte for byte
    assert _blob_bytes(store) - before < len(second) // 4
    store.close()


def test_a_system_message_in_a_request_rebuilds_exactly_and_is_collected(db):
    store = Store(db)
    bodies = []
    with store.transaction() as conn:
        for summary in ("one " * 50, "two " * 50, "three " * 50):
            payload = {
                "messages": [
                    {"content": _prompt(summary), "role": "system"},
                    {"content": "hello", "role": "user"},
                ],
                "model": "m",
            }
            bodies.append(dumps(payload))
        refs = [put_payload(conn, body) for body in bodies]
        assert [rebuild(conn, ref) for ref in refs] == bodies
        shared = conn.execute("SELECT COUNT(*) FROM trace_blobs WHERE kind = 'section'")
        # six fixed sections stored once, plus one summary section per prompt (and the tail)
        assert shared.fetchone()[0] < 6 + 3 * 2 + 1
        # Nothing refers to these payloads (no model_calls rows): collection takes it all.
        collect_garbage(conn)
        assert conn.execute("SELECT COUNT(*) FROM trace_blobs").fetchone()[0] == 0
    store.close()
