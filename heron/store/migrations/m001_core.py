"""The core record: conversations, the message tree, turns, and every model and tool call."""

SQL = """
-- One row per thread of conversation. `key` is what users and scripts name it by;
-- `head_id` is the current tip of the message tree (branches share their prefix rows);
-- `epoch` is bumped by /stop and /new so a stale turn can tell it must not write.
CREATE TABLE conversations (
  id INTEGER PRIMARY KEY,
  key TEXT NOT NULL UNIQUE,
  agent TEXT NOT NULL DEFAULT 'default',
  title TEXT,
  head_id INTEGER,
  epoch INTEGER NOT NULL DEFAULT 0,
  created REAL NOT NULL,
  updated REAL NOT NULL
);
-- Messages form an append-only tree through parent_id: a retry or an edit adds a sibling,
-- nothing is ever overwritten. `parts` is what was said (what the user typed);
-- `sent_parts` is exactly what went to the model when that differs (a runtime block appended),
-- so the next request can replay it byte for byte.
CREATE TABLE messages (
  id INTEGER PRIMARY KEY,
  conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,
  turn_id INTEGER,
  role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
  kind TEXT NOT NULL DEFAULT 'message',
  parts TEXT NOT NULL,
  sent_parts TEXT,
  meta TEXT,
  created REAL NOT NULL
);
CREATE INDEX messages_by_conversation ON messages (conversation_id, id);
CREATE INDEX messages_by_parent ON messages (parent_id);
-- One row per turn (one user message and everything the agent did about it).
-- status: running | done | failed | interrupted. run_id names its trace.
CREATE TABLE turns (
  id INTEGER PRIMARY KEY,
  conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  run_id TEXT NOT NULL UNIQUE,
  user_message_id INTEGER REFERENCES messages(id) ON DELETE SET NULL,
  status TEXT NOT NULL,
  stop_reason TEXT,
  provider TEXT,
  model TEXT,
  input_tokens INTEGER NOT NULL DEFAULT 0,
  output_tokens INTEGER NOT NULL DEFAULT 0,
  cache_read_tokens INTEGER NOT NULL DEFAULT 0,
  cache_write_tokens INTEGER NOT NULL DEFAULT 0,
  model_calls INTEGER NOT NULL DEFAULT 0,
  tool_calls INTEGER NOT NULL DEFAULT 0,
  system_fingerprint TEXT,
  error TEXT,
  started REAL NOT NULL,
  ended REAL
);
CREATE INDEX turns_by_conversation ON turns (conversation_id, id);
-- Every model request of a run (the exact payload, credentials never included) and its reply,
-- enough to replay the run without calling the model.
CREATE TABLE model_calls (
  id INTEGER PRIMARY KEY,
  turn_id INTEGER NOT NULL REFERENCES turns(id) ON DELETE CASCADE,
  seq INTEGER NOT NULL,
  purpose TEXT NOT NULL DEFAULT 'turn',
  request TEXT NOT NULL,
  reply TEXT,
  error TEXT,
  input_tokens INTEGER NOT NULL DEFAULT 0,
  output_tokens INTEGER NOT NULL DEFAULT 0,
  cache_read_tokens INTEGER NOT NULL DEFAULT 0,
  cache_write_tokens INTEGER NOT NULL DEFAULT 0,
  started REAL NOT NULL,
  ended REAL
);
CREATE INDEX model_calls_by_turn ON model_calls (turn_id, seq);
-- Every tool call of a run: arguments, a digest of the result, side effects, timing.
CREATE TABLE tool_calls (
  id INTEGER PRIMARY KEY,
  turn_id INTEGER NOT NULL REFERENCES turns(id) ON DELETE CASCADE,
  call_id TEXT NOT NULL,
  name TEXT NOT NULL,
  args TEXT NOT NULL,
  result TEXT,
  result_sha256 TEXT,
  is_error INTEGER NOT NULL DEFAULT 0,
  effects TEXT,
  started REAL NOT NULL,
  ended REAL
);
CREATE INDEX tool_calls_by_turn ON tool_calls (turn_id, id)
"""
