"""A person controls their jobs (heron/store/jobs.py): `status = 'paused'` joins active, done and
cancelled (a paused job keeps its schedule and fires nothing until resumed, across restarts), and
`run_now` holds the instant someone asked a job to run once now (`heron jobs run-now`), until a
scheduler fires it, without moving its schedule."""

# The status CHECK widens, which SQLite can only do by building the tables again, as m010 did:
# both copied aside and rebuilt (job_runs first out and last in, as it refers to jobs), every
# id kept; the column is added first so the copy has it.
SQL = """
ALTER TABLE jobs ADD COLUMN run_now REAL;
CREATE TABLE jobs_copy AS SELECT * FROM jobs;
CREATE TABLE job_runs_copy AS SELECT * FROM job_runs;
DROP TABLE job_runs;
DROP TABLE jobs;
CREATE TABLE jobs (
  id INTEGER PRIMARY KEY,
  kind TEXT NOT NULL CHECK (kind IN ('cron', 'every', 'at')),
  spec TEXT NOT NULL,
  timezone TEXT NOT NULL,
  conversation TEXT NOT NULL,
  agent TEXT NOT NULL DEFAULT 'default',
  mode TEXT NOT NULL CHECK (mode IN ('reminder', 'monitor', 'review')),
  prompt TEXT NOT NULL,
  catch_up TEXT NOT NULL DEFAULT 'once' CHECK (catch_up IN ('once', 'skip')),
  status TEXT NOT NULL DEFAULT 'active'
    CHECK (status IN ('active', 'paused', 'done', 'cancelled')),
  created REAL NOT NULL,
  created_by TEXT NOT NULL,
  next_run REAL,
  last_run REAL,
  last_outcome TEXT,
  lease_owner TEXT,
  lease_host TEXT,
  lease_pid INTEGER,
  lease_until REAL,
  run_now REAL
);
CREATE INDEX jobs_due ON jobs (status, next_run);
CREATE TABLE job_runs (
  id INTEGER PRIMARY KEY,
  job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
  due REAL NOT NULL,
  started REAL NOT NULL,
  ended REAL,
  status TEXT NOT NULL,
  outcome TEXT,
  detail TEXT,
  owner TEXT
);
CREATE INDEX job_runs_job ON job_runs (job_id, id);
INSERT INTO jobs SELECT * FROM jobs_copy;
INSERT INTO job_runs SELECT * FROM job_runs_copy;
DROP TABLE jobs_copy;
DROP TABLE job_runs_copy;
CREATE UNIQUE INDEX jobs_builtin ON jobs (mode) WHERE mode = 'review'
"""

# PostgreSQL widens a CHECK in place (the inline one is named <table>_<column>_check).
POSTGRES_SQL = """
ALTER TABLE jobs ADD COLUMN run_now DOUBLE PRECISION;
ALTER TABLE jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_check
  CHECK (status IN ('active', 'paused', 'done', 'cancelled'))
"""
