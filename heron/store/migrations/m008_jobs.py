"""Scheduled jobs and the record of every time one fired or was skipped (heron/store/jobs.py)."""

SQL = """
-- A job: when it fires (`kind` cron | every | at with its `spec`, read in `timezone`), the
-- conversation it was bound to when it was made (a key, so it survives /new and is known before
-- the conversation has a row), what a fire does (`mode`: reminder speaks in that conversation,
-- monitor runs silently in cron:<id>), and what to do about instants missed while no scheduler
-- ran (`catch_up`). `next_run` is NULL once a one-off job is done or a job is cancelled. The
-- lease (owner host:pid:token, `lease_until`) is taken in the transaction that claims a due
-- job and held until its turn ends, so two schedulers on one home never fire it twice.
CREATE TABLE jobs (
  id INTEGER PRIMARY KEY,
  kind TEXT NOT NULL CHECK (kind IN ('cron', 'every', 'at')),
  spec TEXT NOT NULL,
  timezone TEXT NOT NULL,
  conversation TEXT NOT NULL,
  agent TEXT NOT NULL DEFAULT 'default',
  mode TEXT NOT NULL CHECK (mode IN ('reminder', 'monitor')),
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
-- The scheduler's question every wake: which active jobs are due.
CREATE INDEX jobs_due ON jobs (status, next_run);
-- One row per fire or skip: the instant it was due, when it started and ended, and how it
-- went (running, done, failed, skipped, interrupted), with a line saying why.
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
-- Periodic work that is not a job (the heartbeat): when it last ticked, claimed in a write
-- transaction so one process ticks per period however many serve, and how that tick went.
CREATE TABLE ticks (
  name TEXT PRIMARY KEY,
  last REAL NOT NULL,
  owner TEXT,
  outcome TEXT,
  detail TEXT
)
"""
