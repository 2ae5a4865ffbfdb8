"""What tells that a maintenance run's process is gone, and the cheap look for runs still open.

A maintenance run (m025: `/compact`, idle compaction, `/learn`, the memory reviews) holds no
lease, so a process killed in the middle of one left its `turns` row `running` for good. Its
row now records the process that runs it (`host`, `pid`), as a scheduler's lease does: a
process of the same host finds the runs of processes that have ended and closes them
interrupted (heron/store/engine_state.py `close_dead_runs`). An ordinary turn is told dead by
its conversation's lease and leaves them NULL.

The partial indexes hold only what is open (a handful of rows, whatever the history): the look
for dead maintenance runs reads the running turns'; a running scheduler's look on every tick
for runs whose scheduler died (heron/store/jobs.py `left_to_recover`) the job runs without an
outcome yet (running, or interrupted and waiting to be run again).
"""

SQL = """ALTER TABLE turns ADD COLUMN host TEXT;
ALTER TABLE turns ADD COLUMN pid INTEGER;
CREATE INDEX turns_running ON turns (conversation_id) WHERE status = 'running';
CREATE INDEX job_runs_open ON job_runs (job_id) WHERE outcome IS NULL"""
