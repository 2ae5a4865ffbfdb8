"""The browser UI of `heron serve`: static files (heron/web/static/, vendored ES modules, no build
step) and the transcript builder (transcript.py) the REST routes serve it from."""
