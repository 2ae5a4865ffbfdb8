"""The nightly review of memory as a built-in job: `mode = 'review'` joins reminder and monitor,
and the migration adds the one row for it (heron/store/jobs.py, `sync_review`)."""

# The mode's CHECK widens, which SQLite can only do by building the tables again: both are
# copied aside and rebuilt (job_runs first out and last in, as it refers to jobs) so no run is
# lost and every id stays. The review's row starts without a next run: the scheduler sets its
# schedule from config.toml ([review] time, [agent] timezone) when it starts.
SQL = """
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
  status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'done', 'cancelled')),
  created REAL NOT NULL,
  created_by TEXT NOT NULL,
  next_run REAL,
  last_run REAL,
  last_outcome TEXT,
  lease_owner TEXT,
  lease_host TEXT,
  lease_pid INTEGER,
  lease_until REAL
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
-- One built-in review job, however many processes open the store.
CREATE UNIQUE INDEX jobs_builtin ON jobs (mode) WHERE mode = 'review';
INSERT INTO jobs (kind, spec, timezone, conversation, mode, prompt, created, created_by)
  VALUES ('cron', '0 3 * * *', 'UTC', '', 'review', 'The nightly review of memory',
  (julianday('now') - 2440587.5) * 86400.0, 'heron')
"""

# PostgreSQL widens a CHECK in place (the inline one is named <table>_<column>_check).
POSTGRES_SQL = """
ALTER TABLE jobs DROP CONSTRAINT jobs_mode_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_mode_check
  CHECK (mode IN ('reminder', 'monitor', 'review'));
CREATE UNIQUE INDEX jobs_builtin ON jobs (mode) WHERE mode = 'review';
INSERT INTO jobs (kind, spec, timezone, conversation, mode, prompt, created, created_by)
  VALUES ('cron', '0 3 * * *', 'UTC', '', 'review', 'The nightly review of memory',
  EXTRACT(EPOCH FROM now()), 'heron')
"""
