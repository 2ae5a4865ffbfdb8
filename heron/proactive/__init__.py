"""Work that runs when nobody is typing: subagents, goals, questions that wait, the nightly
review of memory, and (with `heron serve`) schedules and the heartbeat. See docs/proactive.md."""
