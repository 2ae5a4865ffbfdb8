"""What a forget promises, in the rows that held what was forgotten (qa22x H1, H2, M1).

- `memory_snapshots.thawed`: a forget thaws the frozen Memory section of every conversation
  whose section holds the entry, and blanks the section's text at once (it may hold a secret):
  the conversation's next turn takes a fresh section (one cache miss) and is told what was
  removed. Sections frozen before this step that hold an entry forgotten since are thawed here.
- `memory_revocations.held`: 1 while an entry in force says the statement (a forget undone,
  another entry saying the same): the revocation is then void, for the save guard and recall
  alike (heron/memory/service.py keeps it in step).
- `memory_revocations.checked`: 1 once the statement was checked for a secret and the secret's
  words left out; the rows stored before are checked by the memory service when it next opens
  (the check is memory's, heron/memory/refuse.py, which the store does not import).
"""

SQL = """
ALTER TABLE memory_snapshots ADD COLUMN thawed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE memory_revocations ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
ALTER TABLE memory_revocations ADD COLUMN checked INTEGER NOT NULL DEFAULT 0;
UPDATE memory_snapshots SET section = '', thawed = 1 WHERE EXISTS (
  SELECT 1 FROM memory_revocations r
  WHERE r.path IS NOT NULL AND memory_snapshots.digests LIKE '%"' || r.path || '"%'
);
"""
