"""Work the agent does when nobody is typing: subagents, goals, questions that wait and the
nightly review of memory (subagents.py, goals.py, ask.py, review.py), and the scheduler and
heartbeat, run by `heron serve` beside its AgentLoop.

`background.run_proactive(loop, engine, clock)` (a background service of `heron serve`: given
only the loop, it takes the loop's engine and the system clock) runs the scheduler
(scheduler.py: jobs from the store fired as ordinary turns, and the built-in job of the nightly
review, review.py) and the heartbeat (heartbeat.py: HEARTBEAT.md checked every `[agent]
heartbeat_minutes`) until cancelled. Both publish on the loop's bus, so every run is a turn
through the loop's one-turn-per-conversation queue, and both read time from `clock`
(clock.py), fake in tests. `background.run_review_only` is the scheduler of a `heron chat` that
runs without a serve: the review job alone, with the same lease and records.

This file imports nothing: a `heron run` that needs only subagents, goals and questions does
not load the scheduler and its cron parser at start-up.
"""
