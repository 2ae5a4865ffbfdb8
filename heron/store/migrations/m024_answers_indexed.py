"""The person's answers to `ask_user` are searched like their messages.

An answer reaches the record only as the result of the `ask_user` call ("The user answered:
…", heron/proactive/ask.py), and the full-text index held only text parts, so recall_history,
auto-recall, `heron memory recall` and `conversations search` never found what the person
answered. The index now also holds a tool result that starts with those words (the result
only ask_user writes for an answer); rows that already hold one are indexed again.
"""

from __future__ import annotations

import sqlite3

from heron.store.migrations.m004_memory import run_script

ANSWERED = "The user answered: "  # as ask_user words it (heron/store/records.py ANSWERED)


def _body(parts: str) -> str:
    """SQLite: the indexed text of a row's `parts`: its text parts and answers, by lines."""
    return f"""(SELECT group_concat(t, char(10)) FROM (
    SELECT CASE json_extract(value, '$.kind')
      WHEN 'text' THEN json_extract(value, '$.text')
      WHEN 'tool_result' THEN CASE
        WHEN substr(json_extract(value, '$.content'), 1, {len(ANSWERED)}) = '{ANSWERED}'
         AND NOT json_extract(value, '$.is_error') THEN json_extract(value, '$.content') END
    END AS t FROM json_each({parts})))"""


SQL = f"""DROP TRIGGER messages_fts_insert;
DROP TRIGGER messages_fts_update;
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
  INSERT INTO messages_fts (rowid, body)
  SELECT new.id, t FROM (SELECT {_body("new.parts")} AS t) WHERE t IS NOT NULL AND t != '';
END;
CREATE TRIGGER messages_fts_update AFTER UPDATE OF parts ON messages BEGIN
  DELETE FROM messages_fts WHERE rowid = old.id;
  INSERT INTO messages_fts (rowid, body)
  SELECT new.id, t FROM (SELECT {_body("new.parts")} AS t) WHERE t IS NOT NULL AND t != '';
END;
DELETE FROM messages_fts WHERE rowid IN (
  SELECT id FROM messages WHERE instr(parts, '{ANSWERED}') > 0);
INSERT INTO messages_fts (rowid, body)
SELECT id, t FROM (SELECT m.id AS id, {_body("m.parts")} AS t
  FROM messages m WHERE instr(m.parts, '{ANSWERED}') > 0)
WHERE t IS NOT NULL AND t != '';
"""

# PostgreSQL's generated column, made again with the answers in it (a generated column's
# expression cannot be altered in place); heron/memory/records.py `_BODY` reads the same.
ANSWERS_PATH = (
    '$[*] ? (@.kind == "tool_result" && @.is_error == false'
    f' && @.content starts with "{ANSWERED}").content'
)
POSTGRES_SQL = f"""ALTER TABLE messages DROP COLUMN body_tsv;
ALTER TABLE messages ADD COLUMN body_tsv tsvector GENERATED ALWAYS AS (
  to_tsvector('english', jsonb_path_query_array(parts::jsonb, '$[*] ? (@.kind == "text").text')
    || jsonb_path_query_array(parts::jsonb, '{ANSWERS_PATH}'))
) STORED;
CREATE INDEX messages_body_tsv ON messages USING GIN (body_tsv);
"""


def apply(conn: sqlite3.Connection) -> None:
    run_script(conn, SQL)
