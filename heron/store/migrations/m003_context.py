"""Context and compaction: what each compaction folded, marks on the rows it folded, the
per-conversation compaction state, work state, todos, and per-model token calibration.

Compaction never deletes or rewrites a message: it adds a `compactions` row and marks rows in
`message_marks`; the model-facing view is derived from both.
"""

SQL = """
-- One row per compaction. kind: consolidation (older turns folded into a summary),
-- inflight (one long turn's steps folded into a checkpoint), fallback (a summary written
-- without the model after repeated failures). `last_row_id` is the last row folded by a
-- consolidation: every row of the branch up to it is replaced by `summary` in the view.
-- `anchor_row_id` is the row that carries an in-flight checkpoint (the turn's request).
CREATE TABLE compactions (
  id INTEGER PRIMARY KEY,
  conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  kind TEXT NOT NULL,
  reason TEXT NOT NULL,
  created REAL NOT NULL,
  first_row_id INTEGER,
  last_row_id INTEGER,
  anchor_row_id INTEGER,
  rows_folded INTEGER NOT NULL DEFAULT 0,
  tokens_before INTEGER NOT NULL DEFAULT 0,
  tokens_after INTEGER NOT NULL DEFAULT 0,
  summary TEXT NOT NULL,
  working_state TEXT NOT NULL DEFAULT '',
  meta TEXT
);
CREATE INDEX compactions_by_conversation ON compactions (conversation_id, id);
-- Marks on message rows: 'compacted' (folded by an in-flight compaction, shown only through
-- its checkpoint) or 'checkpoint' (the row carrying one). Rows themselves stay untouched.
CREATE TABLE message_marks (
  message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
  compaction_id INTEGER NOT NULL REFERENCES compactions(id) ON DELETE CASCADE,
  mark TEXT NOT NULL,
  PRIMARY KEY (message_id, compaction_id)
);
CREATE INDEX message_marks_by_compaction ON message_marks (compaction_id);
-- Per-conversation compaction state: consecutive failing turns (after the third a fallback
-- is written), and when an idle compaction may be retried after a failure.
CREATE TABLE context_state (
  conversation_id INTEGER PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
  failed_turns INTEGER NOT NULL DEFAULT 0,
  last_failed_turn INTEGER,
  idle_retry_after REAL NOT NULL DEFAULT 0,
  updated REAL NOT NULL
);
-- The agent's account of the work (goal, constraints, decisions, open questions, next step),
-- one JSON document per conversation, written by the work_state tool.
CREATE TABLE work_state (
  conversation_id INTEGER PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
  state TEXT NOT NULL,
  updated REAL NOT NULL
);
-- The todo list of a conversation; verified_by holds the evidence that an item is done.
CREATE TABLE todos (
  id INTEGER PRIMARY KEY,
  conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  text TEXT NOT NULL,
  status TEXT NOT NULL DEFAULT 'pending',
  priority TEXT NOT NULL DEFAULT 'medium',
  verified_by TEXT,
  created REAL NOT NULL,
  updated REAL NOT NULL
);
CREATE INDEX todos_by_conversation ON todos (conversation_id, id);
-- How a model's tokenizer relates to Heron's offline estimate: reported input tokens over the
-- estimate, averaged. last_call_id is the last model_calls row folded in.
CREATE TABLE model_calibration (
  model TEXT PRIMARY KEY,
  factor REAL NOT NULL,
  samples INTEGER NOT NULL,
  last_call_id INTEGER NOT NULL DEFAULT 0,
  updated REAL NOT NULL
)
"""
