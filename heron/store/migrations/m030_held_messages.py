"""The person's messages for a conversation whose turn runs, kept on disk until they are stored.

A follow-up sent while a turn runs (mail, read by that turn) or queued behind it waited in the
process's memory until the turn stored it: a kill -9, the OOM killer or a power cut lost it,
though its sender had been told it was taken. Each is written here first (heron/store/held.py),
and deleted in the transaction that stores it in its conversation. What a dead process left here
goes into its conversation as the person's unanswered message when the next turn there starts,
or a serve does.
"""

SQL = """
-- One row per message of the person waiting for `conversation_key`: the message as it is to be
-- stored (its parts, attachments by reference, and meta) and the process that holds it in
-- memory (`owner` is unique to that process; `host` and `pid` tell whether it still runs).
CREATE TABLE held_messages (
  id INTEGER PRIMARY KEY,
  conversation_key TEXT NOT NULL,
  agent TEXT NOT NULL,
  parts TEXT NOT NULL,
  meta TEXT,
  owner TEXT NOT NULL,
  host TEXT NOT NULL,
  pid INTEGER NOT NULL,
  created REAL NOT NULL
);
CREATE INDEX held_messages_key ON held_messages(conversation_key, id);
"""
