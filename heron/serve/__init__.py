"""`heron serve`: one process that owns the AgentLoop of a home and serves it to the browser
(/ws, heron/serve/app.py) and to terminal clients (the control socket, heron/serve/control.py).
"""
