"""A model call stopped mid-stream (Ctrl-C, /stop) keeps what it streamed, and its turn says
that its usage is unknown.

The call's row is written with the exact request as every call's is; `streamed` holds the parts
that arrived before the stop and the usage the provider had sent by then, if any (NULL: the call
ran to its end or failed). A turn with such a call has `usage_unknown` set: the tokens it was
billed for are not all known, so its cost is shown as unknown (`?`), never as $0.
"""

SQL = """ALTER TABLE model_calls ADD COLUMN streamed TEXT;
ALTER TABLE turns ADD COLUMN usage_unknown INTEGER NOT NULL DEFAULT 0"""
