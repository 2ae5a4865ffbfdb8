"""Each message's parent, readable from an index alone.

Auto-recall asks whether a hit is on its conversation's current branch by walking the branch
from the head down to it, one parent at a time (heron/memory/records.py `on_branch`). Read
through the table, every step lands on a page of whole rows; this index holds only (id,
parent_id), hundreds to a page, so the walk reads a few pages where it read one a step: a walk
of 500 messages takes about half the time (0.67 -> 0.37 ms at 100,000 messages).
"""

SQL = "CREATE INDEX messages_parent_of ON messages (id, parent_id)"
