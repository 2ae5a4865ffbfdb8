"""The REST routes of `heron serve`, under /api (conversations, transcripts, uploads, memory).

The `web` branch fills this router; heron/serve/app.py includes it behind the same auth as
every other route.
"""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(prefix="/api")
