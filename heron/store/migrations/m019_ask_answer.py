"""The queued message that answered a question (heron/proactive/ask.py on a worker).

With workers (heron/scale/), a message typed while a worker's turn waits on `ask_user` is
enqueued in its own right and also handed to that turn, which takes it as the answer. When
the message's own workflow comes up it must know the message was taken, or it would be
answered a second time as a new turn: the question's row names it.
"""

SQL = "ALTER TABLE runs ADD COLUMN answered_by TEXT"
