"""The turn engine's state: who runs a conversation's turn, who has it open, and the checkpoint
an interrupted tool phase leaves behind."""

SQL = """
-- At most one running turn per conversation, across processes. A row is a claim: `owner` names
-- the holder (host:pid:token), `expires` is renewed by its heartbeat; a row past `expires`, or
-- held by a dead process on this host, may be taken over. Rows are deleted on release.
CREATE TABLE turn_leases (
  conversation_id INTEGER PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
  owner TEXT NOT NULL,
  host TEXT NOT NULL,
  pid INTEGER NOT NULL,
  run_id TEXT,
  acquired REAL NOT NULL,
  expires REAL NOT NULL
);
-- Open chats (and other long-lived users of a conversation), so a delete can refuse and name
-- them. Many holders per conversation; same expiry rules as leases.
CREATE TABLE presence (
  conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  owner TEXT NOT NULL,
  host TEXT NOT NULL,
  pid INTEGER NOT NULL,
  what TEXT NOT NULL,
  expires REAL NOT NULL,
  PRIMARY KEY (conversation_id, owner)
);
-- The partial work of a tool phase in flight: the calls asked for, the results already back.
-- Written as each tool finishes; restored into the record when the turn is interrupted or the
-- process died, so the next turn sees the finished results instead of losing them.
CREATE TABLE checkpoints (
  conversation_id INTEGER PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
  turn_id INTEGER NOT NULL,
  epoch INTEGER NOT NULL,
  calls TEXT NOT NULL,
  results TEXT NOT NULL,
  updated REAL NOT NULL
)
"""
