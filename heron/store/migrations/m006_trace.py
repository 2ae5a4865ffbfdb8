"""Traces that grow linearly: content-addressed request pieces, what each run started from, and
the mailbox injections and breaks of a run, ordered against its model calls."""

SQL = """
-- Every distinct piece of a recorded request, stored once: one message, one tools list, one
-- system block (canonical JSON). Keyed by the sha256 of `body`; `id` is the short handle the
-- chains and requests use, so a reference costs a few bytes instead of 64.
CREATE TABLE trace_blobs (
  id INTEGER PRIMARY KEY,
  sha256 TEXT NOT NULL UNIQUE,
  kind TEXT NOT NULL,
  body TEXT NOT NULL
);
-- A request's message list as a path in a tree: a node is one message after its parent node
-- (0 = the start of a list). Consecutive requests share their prefix nodes, so a request that
-- adds two messages to the last one costs two nodes, not a copy of the history.
CREATE TABLE trace_nodes (
  id INTEGER PRIMARY KEY,
  parent_id INTEGER NOT NULL,
  blob_id INTEGER NOT NULL REFERENCES trace_blobs(id),
  UNIQUE (parent_id, blob_id)
);
-- New model_calls rows keep `request` empty and name their pieces here (JSON: the message
-- chain's last node and length, the system and tools blobs, the remaining top-level fields).
-- Rows written before this step keep the full payload in `request` and still read.
ALTER TABLE model_calls ADD COLUMN request_ref TEXT;
-- How many model calls of the run had completed when the tool call started (replay order).
ALTER TABLE tool_calls ADD COLUMN after_call INTEGER;
-- What a run started from, so a replay can rebuild the system prompt with the current code and
-- start the loop from the same messages: prompt inputs, the clock, the model profile, limits.
CREATE TABLE trace_runs (
  turn_id INTEGER PRIMARY KEY REFERENCES turns(id) ON DELETE CASCADE,
  start TEXT NOT NULL,
  fingerprints TEXT
);
-- Things that happened to a run between model calls: mailbox injections, soft and hard breaks.
-- `after_call` is how many model calls had completed, which is where a replay injects them.
CREATE TABLE trace_events (
  id INTEGER PRIMARY KEY,
  turn_id INTEGER NOT NULL REFERENCES turns(id) ON DELETE CASCADE,
  after_call INTEGER NOT NULL,
  kind TEXT NOT NULL,
  body TEXT,
  at REAL NOT NULL
);
CREATE INDEX trace_events_by_turn ON trace_events (turn_id, id)
"""
