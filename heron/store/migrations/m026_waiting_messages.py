"""Messages of background work that wait for a running turn, kept on disk while they wait.

What a monitor or the heartbeat says with `message` to a conversation whose turn runs is not
written into that turn's rows (heron/agent/relay.py): it waits for the turn to end. It waits
here, written before the `message` tool answers, so a crash or a kill -9 of the process whose
turn it waits for loses nothing: whoever next holds that conversation's lease moves it into the
conversation (heron/store/waiting.py), deleting it here in the same transaction.
"""

SQL = """
-- One row per message waiting for the conversation `conversation_key`: its text, who said it
-- (for the model's label) and the conversation whose turn said it.
CREATE TABLE waiting_messages (
  id INTEGER PRIMARY KEY,
  conversation_key TEXT NOT NULL,
  agent TEXT NOT NULL,
  text TEXT NOT NULL,
  who TEXT NOT NULL,
  spoken_in TEXT NOT NULL,
  created REAL NOT NULL
);
CREATE INDEX waiting_messages_key ON waiting_messages(conversation_key, id);
"""
