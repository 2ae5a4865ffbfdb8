"""Heron: an open runtime for a personal AI agent that keeps long conversations whole."""

__version__ = "0.1.0"
