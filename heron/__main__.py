"""`python -m heron`: the `heron` command, for when the script is not on PATH."""

from heron.cli import main

main()
