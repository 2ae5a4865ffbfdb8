"""Proactive work that outlives a turn: subagent runs and questions that wait (`runs`), the
sustained goal of a conversation (`goals`), and the nightly review's cursor (`review_cursor`)."""

SQL = """
-- One row per subagent run or parked question, written before the work starts so a restart
-- finds it. kind: 'subagent' | 'ask'. status: running, done, failed, timed_out, interrupted,
-- cancelled (subagents); waiting, answered, expired, cancelled, interrupted (questions).
-- `announced` is set once the result is in the origin conversation's record: the record is
-- the truth (a message whose meta names the run), this column only saves the look-up.
CREATE TABLE runs (
  id TEXT PRIMARY KEY,
  kind TEXT NOT NULL,
  origin_key TEXT NOT NULL,
  origin_channel TEXT NOT NULL DEFAULT 'subagent',
  origin_chat TEXT NOT NULL DEFAULT '',
  origin_internal INTEGER NOT NULL DEFAULT 0,
  lineage TEXT,
  task TEXT NOT NULL,
  tools TEXT,
  status TEXT NOT NULL,
  result TEXT,
  partial INTEGER NOT NULL DEFAULT 0,
  announced REAL,
  deadline REAL,
  pid INTEGER,
  created REAL NOT NULL,
  finished REAL
);
CREATE INDEX runs_origin ON runs(origin_key, status);
CREATE INDEX runs_lineage ON runs(lineage);
-- The sustained goal of a conversation (at most one open). status: active, parked, done,
-- stopped. `shown` is the objective text the runtime block last sent in full, so it is sent
-- once and then named unchanged (the cache-safe tail after the user's message).
CREATE TABLE goals (
  id INTEGER PRIMARY KEY,
  conversation_key TEXT NOT NULL,
  objective TEXT NOT NULL,
  status TEXT NOT NULL,
  max_turns INTEGER NOT NULL,
  max_tokens INTEGER NOT NULL,
  turns_used INTEGER NOT NULL DEFAULT 0,
  tokens_used INTEGER NOT NULL DEFAULT 0,
  shown TEXT,
  evidence TEXT,
  created REAL NOT NULL,
  updated REAL NOT NULL
);
CREATE INDEX goals_open ON goals(conversation_key, status);
-- Where the nightly review of memory stopped: the last message id it read, and when it ran.
CREATE TABLE review_cursor (
  name TEXT PRIMARY KEY,
  message_id INTEGER NOT NULL,
  ran REAL NOT NULL
)
"""
