"""Model calls Heron makes outside any turn are recorded as runs of their own.

`/compact`, idle compaction, `/learn`, the memory review a chat starts as it closes, the one
/new starts and the nightly review each call the model without a person's turn around them.
Each is now a `turns` row of the conversation it worked on, with `kind` naming what it was
(`compact`, `idle-compact`, `learn`, `close-review`, `new-review`, `nightly-review`,
`nightly-tidy`); a person's turn (and any turn Heron runs itself: a schedule, a subagent, a
goal's nudge) is `turn`. Its model calls are rows like a turn's, so `heron usage` and
`heron trace` count them; what counts turns (the turn count, /status, the web's list) reads
`kind = 'turn'` only (docs/traces.md).
"""

SQL = "ALTER TABLE turns ADD COLUMN kind TEXT NOT NULL DEFAULT 'turn'"
