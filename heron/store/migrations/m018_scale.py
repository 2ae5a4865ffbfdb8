"""Scale-out (issue 18): the change counters PostgreSQL's caches are checked against.

SQLite needs nothing here: `PRAGMA data_version` tells a connection that another one committed.
PostgreSQL has no such thing, and a counter of every commit would empty each worker's caches
at every other worker's commit, so each cache has a sequence bumped only by what makes it
wrong (heron/store/pg.py: `counter`, `bump_on_commit`; docs/scale.md, "Caches").
"""

SQL = ""

POSTGRES_SQL = """
-- Bumped with the commit of a rewrite of stored message rows (a meta update, a deleted
-- conversation): a worker's decoded branches are good until it moves (heron/store/db.py).
CREATE SEQUENCE heron_rewrites;
-- Bumped by the trace's garbage collection, which deletes blobs and nodes another worker's
-- trace cache may name (heron/trace/records.py).
CREATE SEQUENCE heron_trace_gc
"""
