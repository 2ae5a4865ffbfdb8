"""The tool call that asked a question (heron/proactive/ask.py): a transcript shows the
question and the person's answer where that call is, from this row, not from the result's text."""

SQL = "ALTER TABLE runs ADD COLUMN call_id TEXT"
