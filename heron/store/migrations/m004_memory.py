"""Memory: the review queue, revoked quotes, the frozen memory section, recall's indexes."""

import sqlite3

SQL = """
-- What waits for the user's review: facts picked by an extraction pass, lessons the agent
-- proposed, removals and amendments of existing entries. Nothing here is in memory until the
-- user accepts it. `base_digest` is the digest of the entry when a removal or amendment was
-- suggested: accepting is refused once the file has changed since.
CREATE TABLE memory_suggestions (
  id INTEGER PRIMARY KEY,
  kind TEXT NOT NULL CHECK (kind IN ('fact', 'lesson', 'removal', 'amendment')),
  path TEXT,
  text TEXT,
  quote TEXT,
  mistake TEXT,
  reason TEXT,
  origin TEXT NOT NULL,
  conversation_id INTEGER REFERENCES conversations(id) ON DELETE SET NULL,
  message_id INTEGER REFERENCES messages(id) ON DELETE SET NULL,
  base_digest TEXT,
  status TEXT NOT NULL DEFAULT 'waiting'
    CHECK (status IN ('waiting', 'accepted', 'rejected', 'dropped')),
  created REAL NOT NULL,
  decided REAL
);
CREATE INDEX memory_suggestions_waiting ON memory_suggestions (status, id);
-- Quotes the user took back by forgetting an entry. A later save or pass that quotes the same
-- words from a message written before the revocation is refused; saying it again later is a
-- new statement and counts.
CREATE TABLE memory_revocations (
  id INTEGER PRIMARY KEY,
  quote_key TEXT NOT NULL,
  path TEXT,
  conversation_id INTEGER,
  message_id INTEGER,
  created REAL NOT NULL
);
CREATE INDEX memory_revocations_by_quote ON memory_revocations (quote_key);
-- The memory section as a conversation's system prompt carries it, frozen until the next
-- compaction or /new so the cached prefix does not move. `digests` maps each entry path to the
-- digest it had; `announced` the changes already told to the model in a runtime block.
CREATE TABLE memory_snapshots (
  conversation_id INTEGER PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
  section TEXT NOT NULL,
  digests TEXT NOT NULL,
  announced TEXT NOT NULL DEFAULT '{}',
  taken REAL NOT NULL
);
-- Per-conversation cursors: the last message a review pass read, the floor /new writes so a
-- cleared conversation does not return as recent history, the start of the chat for /learn.
CREATE TABLE memory_cursors (
  conversation_id INTEGER PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
  reviewed_message_id INTEGER NOT NULL DEFAULT 0,
  history_floor REAL NOT NULL DEFAULT 0
);
-- Full-text index of what was said (the text parts of every message, compacted ones included),
-- kept in sync by triggers so no writer can forget it. rowid = messages.id.
CREATE VIRTUAL TABLE messages_fts USING fts5(body, tokenize = 'porter unicode61');
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
  INSERT INTO messages_fts (rowid, body)
  SELECT new.id, t FROM (
    SELECT group_concat(json_extract(value, '$.text'), char(10)) AS t
    FROM json_each(new.parts) WHERE json_extract(value, '$.kind') = 'text')
  WHERE t IS NOT NULL AND t != '';
END;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
  DELETE FROM messages_fts WHERE rowid = old.id;
END;
CREATE TRIGGER messages_fts_update AFTER UPDATE OF parts ON messages BEGIN
  DELETE FROM messages_fts WHERE rowid = old.id;
  INSERT INTO messages_fts (rowid, body)
  SELECT new.id, t FROM (
    SELECT group_concat(json_extract(value, '$.text'), char(10)) AS t
    FROM json_each(new.parts) WHERE json_extract(value, '$.kind') = 'text')
  WHERE t IS NOT NULL AND t != '';
END;
INSERT INTO messages_fts (rowid, body)
SELECT id, t FROM (
  SELECT m.id AS id, (SELECT group_concat(json_extract(value, '$.text'), char(10))
                      FROM json_each(m.parts)
                      WHERE json_extract(value, '$.kind') = 'text') AS t
  FROM messages m)
WHERE t IS NOT NULL AND t != '';
-- Sentence embeddings of messages for the semantic half of recall (only with the
-- heron[embeddings] extra); filled lazily, one row per message and model.
CREATE TABLE message_vectors (
  message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
  model TEXT NOT NULL,
  vector BLOB NOT NULL,
  PRIMARY KEY (message_id, model)
)
"""


# PostgreSQL's own full-text search in place of FTS5: the text parts of each message as a
# tsvector kept by the database itself (a stored generated column, so no writer can forget
# it, as the triggers above ensure on SQLite), under a GIN index. Vectors are bytea.
POSTGRES_SQL = (
    SQL[: SQL.index("-- Full-text index")]
    + """ALTER TABLE messages ADD COLUMN body_tsv tsvector GENERATED ALWAYS AS (
  to_tsvector('english', jsonb_path_query_array(parts::jsonb, '$[*] ? (@.kind == "text").text'))
) STORED;
CREATE INDEX messages_body_tsv ON messages USING GIN (body_tsv);
"""
    + SQL[SQL.index("-- Sentence embeddings") :].replace("BLOB", "BYTEA")
)


def apply(conn: sqlite3.Connection) -> None:
    run_script(conn, SQL)


def run_script(conn: sqlite3.Connection, sql: str) -> None:
    """Statement by statement: the triggers hold semicolons, so the default split would cut
    them; `sqlite3.complete_statement` knows where each one really ends."""
    pending = ""
    for line in sql.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            conn.execute(pending)
            pending = ""
    if pending.strip():
        conn.execute(pending)
