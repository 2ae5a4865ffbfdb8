"""Scaling out on PostgreSQL: turns as DBOS workflows run by worker processes (docs/scale.md).

`heron worker` (heron/scale/worker.py) runs an ordinary Engine and AgentLoop whose turns arrive
as DBOS workflows, one per inbound message, on a queue partitioned by conversation (at most
one turn of a conversation runs at a time, across every worker). `heron serve --workers N`
keeps its web and control face (heron/scale/front.py: a `FrontLoop` that enqueues instead of
running) and starts N workers. What a turn streams reaches the face through PostgreSQL
(LISTEN/NOTIFY, heron/scale/notes.py).
"""
