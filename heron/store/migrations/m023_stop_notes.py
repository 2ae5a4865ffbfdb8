"""What stopped a conversation's turn: the words of the last /stop or /new that bumped its epoch.

`/stop` and `/new` from another process bump the stored epoch; the process whose turn it was
notices the bump (heron/agent/turn.py watches the epoch while a turn runs) and tells its person
what stopped it, e.g. `/stop from heron run (process 4242)`. Set with every bump that says why
(`engine_state.bump_epoch`), NULL where none did (an older Heron, a cancelled subagent's run).
"""

SQL = "ALTER TABLE conversations ADD COLUMN stopped_by TEXT"
