"""What an idle `heron serve` costs with one browser tab open: CPU time of the serve process
over a wall-clock window in which nothing happens but the tab staying attached.

A real `heron serve --port 0` subprocess on a fresh home (its model a fake OpenAI-compatible
server on 127.0.0.1, never called), one /ws client logged in as a browser is and attached to
`personal`; after `--settle` seconds, the serve's user+system CPU time (Linux /proc) over
`--seconds`. The serve runs whatever Heron its PYTHONPATH gives (run it once with each
checkout, alternately, to compare two versions). The figure is CPU milliseconds per minute and
the same as a percentage of one core; with a tab open the serve reads the turn leases once a
second (heron/serve/elsewhere.py), which is most of what it does at rest.

    PYTHONPATH=. .venv/bin/python bench/serve_idle.py [--seconds 60] [--settle 5] [--json]

Then, in this process on the same home, the median time of one read of the leases by the
watcher (`poll_us`; null for a Heron without it).

`--json` prints one line: {"poll_us", "seconds", "cpu_ms", "cpu_ms_per_minute", "cpu_percent",
"load"}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cli.py, web.py: a serve, its CPU
from cli import environment, start_serve
from web import cpu_ms


async def attached_tab(login: str) -> object:
    """A /ws client logged in through the login address, attached to `personal`."""
    import httpx
    from websockets.asyncio.client import connect

    from heron.serve.auth import COOKIE

    url = "{0.scheme}://{0.netloc}".format(urlsplit(login))
    async with httpx.AsyncClient() as http:
        token = (await http.get(login)).cookies[COOKIE]
    ws = await connect(
        url.replace("http://", "ws://") + "/ws",
        origin=url,
        additional_headers={"Cookie": f"{COOKIE}={token}"},
    )
    await ws.send(json.dumps({"type": "hello", "conversation": "personal", "last_seq": 0}))
    await ws.recv()  # the welcome
    return ws


async def measure(seconds: float, settle: float) -> dict[str, float | None]:
    from heron.channels.remote import serve_login
    from heron.testing.fake_openai import FakeOpenAIServer

    home = os.environ["HERON_HOME"] = tempfile.mkdtemp(prefix="heron-bench-serve-idle-")
    with FakeOpenAIServer([]) as server:
        serve = start_serve(environment(Path(home), server.base_url))
        try:
            assert serve.stdout is not None
            line = ""
            while not line.startswith("Log in"):  # its start's lines, after the banner
                line = serve.stdout.readline()
                assert line, "heron serve did not say how to log in"
            login = serve_login(Path(home))  # its output is a pipe: no address is printed
            assert login, "heron serve gave no login address over its control socket"
            ws = await attached_tab(login)
            await asyncio.sleep(settle)
            before, started = cpu_ms(serve.pid), time.monotonic()
            await asyncio.sleep(seconds)
            used, took = (cpu_ms(serve.pid) - before) / 1000, time.monotonic() - started
            await ws.close()  # type: ignore[attr-defined]
        finally:
            serve.terminate()
            serve.wait(60)
    return {
        "poll_us": await poll_cost(home, 2000),
        "seconds": round(took, 1),
        "cpu_ms": round(used * 1000, 1),
        "cpu_ms_per_minute": round(used * 1000 * 60 / took, 1),
        "cpu_percent": round(100 * used / took, 3),
        "load": float(Path("/proc/loadavg").read_text().split()[0]),
    }


async def poll_cost(home: str, polls: int) -> float | None:
    """Microseconds per read of the leases by the watcher, on the bench's home (the median of
    `polls`), in this process; None for a Heron without the watcher."""
    try:
        from heron.serve.elsewhere import Watcher
    except ImportError:
        return None
    from heron.config import Settings
    from heron.serve.hub import Hub
    from heron.store import Store

    store = Store(Settings.load().database)
    watcher, took = Watcher(Hub(), store), []
    try:
        for _ in range(polls):
            started = time.perf_counter()
            await watcher.poll()
            took.append(time.perf_counter() - started)
    finally:
        store.close()
    return round(sorted(took)[len(took) // 2] * 1e6, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = asyncio.run(measure(args.seconds, args.settle))
    if args.json:
        print(json.dumps(figures))
        return
    print(
        f"heron serve at rest, one tab open, {figures['seconds']:g} s: "
        f"{figures['cpu_ms']:g} ms CPU ({figures['cpu_ms_per_minute']:g} ms per minute, "
        f"{figures['cpu_percent']:g}% of one core), load {figures['load']}"
    )
    if figures["poll_us"] is not None:
        print(f"one read of the turn leases by the watcher: {figures['poll_us']:g} µs (median)")


if __name__ == "__main__":
    main()
