"""Prompt assembly and the model-facing view of a conversation. Provider-neutral."""
