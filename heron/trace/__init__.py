"""Traces: every model request and tool effect of a run, recorded content-addressed as it
happens (recorder.py, blobs.py), read back (read.py, render.py, diff.py) and priced (prices.py).
The trace records what it is given and imports neither the engine, the prompt nor the tools."""
