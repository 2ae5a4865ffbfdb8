"""The faces of Heron: `heron run` for scripts, the terminal chat, and information commands."""
