"""The web UI's speed, in headless Chromium against a real `heron serve` in a child process.

- render_2000_ms: from navigation start until a 2,000-message conversation is in the page and
  drawn, to its newest message (the transcript's newest page, docs/web.md), read from the
  store, its Markdown rendered, and the frame after that laid out and painted (timed in the
  page). Target < 1,500 ms.
- delta_p95_ms: from the moment the model hands the loop a streamed delta to the moment the
  page's WebSocket receives it, p95 over 200 deltas sent 10 ms apart (each delta carries its
  own send time; one machine, one clock). Target < 50 ms.
- rss_10_tabs_mb: the serve process's resident memory with 10 tabs attached to one
  conversation, after a reply streamed to all of them. Target < 200 MB.
- tabs_cpu_ms, serve_cpu_ms: the CPU time the browser's page processes (all 10 tabs) and the
  serve used while the reply streamed, from /proc. The delay figures depend on how busy the
  machine is; these say how much of it the UI and the serve take themselves.

    .venv/bin/python bench/web.py [--json] [--long]

--long streams a longer reply as a model writes one: 600 deltas, a blank line after every 20
(30 paragraphs, about 13 kB), where drawing the whole reply again on every frame costs most.

Needs Debian's chromium (make chromium) and the dev extra (playwright).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # web_harness: the chromium launch the tests use

MESSAGES = 2_000
# The stream; --long sets both (through the environment, which the serve's process inherits).
DELTAS = int(os.environ.get("BENCH_DELTAS", "200"))
PARAGRAPH = int(os.environ.get("BENCH_PARAGRAPH", "0"))  # deltas a paragraph (0: one paragraph)
TABS = int(os.environ.get("BENCH_TABS", "10"))


class StampModel:
    """Streams DELTAS deltas 10 ms apart, each holding the wall time it was handed over (and
    with PARAGRAPH, a blank line after every PARAGRAPH of them)."""

    name = "scripted"
    model = "bench"

    async def chat(self, request: Any, on_event: Any = None) -> Any:
        from heron.messages import Reply, Text, Usage
        from heron.request import StreamEvent

        pieces = []
        for n in range(1, DELTAS + 1):
            await asyncio.sleep(0.01)
            end = "\n\n" if PARAGRAPH and n % PARAGRAPH == 0 else ""
            piece = f"<t={time.time() * 1000:.3f}> {end}"
            pieces.append(piece)
            if on_event is not None:
                on_event(StreamEvent("text", piece))
        return Reply([Text("".join(pieces))], "done", Usage(10, DELTAS))

    def payload(self, request: Any) -> dict[str, Any]:
        return {"model": self.model}

    async def aclose(self) -> None:
        return None


def child(port: int) -> None:
    """The serve under test, in its own process (so its RSS is its own)."""
    from heron.config import Settings
    from heron.serve.main import serve

    asyncio.run(serve(Settings.load(), port=port, provider=StampModel(), signals=True))


def seed(home: Path) -> None:
    """A conversation `big` of MESSAGES messages (half the user's, half Markdown replies)."""
    from heron.config import Settings
    from heron.messages import Message, Text
    from heron.store import Store

    os.environ["HERON_HOME"] = str(home)
    store = Store(Settings.load().paths.ensure().db)
    conv = store.open_conversation("big")
    for i in range(MESSAGES // 2):
        store.append(conv.id, Message("user", [Text(f"Question {i}: how do herons fish?")]))
        reply = f"Answer {i}: they **wait** and strike.\n\n- still water\n- `patience`\n"
        store.append(conv.id, Message("assistant", [Text(reply)]))
    store.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_login(proc: subprocess.Popen[str], home: Path) -> str:
    """A login address once the serve listens (every bind needs a login): its output is a
    pipe, where it prints none, so it is asked for as `heron web` does."""
    from heron.channels.remote import serve_login

    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("Log in: "):
            login = serve_login(home)
            if login is None:
                raise SystemExit("heron serve gave no login address over its control socket")
            return login
    raise SystemExit(f"heron serve exited with {proc.wait()} before it said how to log in")


@contextmanager
def serve_child(script: str, home: Path) -> Iterator[tuple[str, str, int]]:
    """`heron serve` of `home` in a child process (`script --child PORT`, so its RSS is its
    own): its address, the login address it printed, its pid. Stopped on the way out."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, script, "--child", str(port)],
        env={**os.environ, "HERON_HOME": str(home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        yield f"http://127.0.0.1:{port}", _wait_login(proc, home), proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, int]:
    """A process's parent and its CPU time so far (user + system, clock ticks)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rfind(")") + 2 :].split()  # the name in parentheses may hold spaces
    return int(fields[1]), int(fields[11]) + int(fields[12])


def cpu_ms(pid: int) -> float:
    return _stat(pid)[1] * 1000 / TICKS


def renderers_cpu_ms() -> float:
    """CPU time so far of the Chromium page processes started under this process."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parents[int(entry.name)], ticks[int(entry.name)] = _stat(int(entry.name))
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue  # gone meanwhile
        if b"--type=renderer" not in cmdline:
            ticks.pop(int(entry.name))
    mine = os.getpid()

    def ours(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == mine:
                return True
        return False

    return sum(t for pid, t in ticks.items() if ours(pid)) * 1000 / TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# Checked at each frame: once the newest message is in the page (and with it every message
# the page draws at first: all of them, or since the transcript is read in pages its newest
# page), that frame is laid out and painted, and a task queued from its callback runs after it.
_RENDERED = """() => new Promise((done) => {
  const check = () => {
    const all = document.querySelectorAll('.msg.assistant');
    const last = all[all.length - 1];
    if (last && last.textContent.includes('Answer %d:')) setTimeout(() => done(performance.now()));
    else requestAnimationFrame(check);
  };
  check();
})"""

_RECORD = """
window.__arrivals = [];
// Resolved once every delta arrived: waiting on it costs nothing while the reply streams.
window.__all = new Promise((done) => { window.__arrived = done; });
const Native = window.WebSocket;
window.WebSocket = class extends Native {
  constructor(...a) {
    super(...a);
    this.addEventListener("message", (e) => {
      const now = performance.timeOrigin + performance.now();
      const ev = JSON.parse(e.data);
      if (ev.type !== "delta") return; // the final answer repeats every stamp: not a delta
      for (const m of ev.text.matchAll(/<t=([0-9.]+)>/g)) {
        window.__arrivals.push(now - Number(m[1]));
      }
      if (window.__arrivals.length >= %d) window.__arrived();
    });
  }
};
"""


def measure(url: str, login: str, pid: int) -> dict[str, float]:
    from web_harness import chromium, log_in, logged_in

    token = log_in(login)
    with chromium() as browser:
        first = logged_in(browser, url, token)
        page = first.new_page()
        page.goto(url + "/#c=big")
        render = page.evaluate(_RENDERED % (MESSAGES // 2 - 1))
        first.close()

        context = logged_in(browser, url, token)
        tabs = [context.new_page() for _ in range(TABS)]
        tabs[0].add_init_script(_RECORD % DELTAS)  # the measuring tab
        for tab in tabs:
            tab.goto(url + "/#c=personal")
            tab.get_by_role("textbox", name="message").wait_for()
        box = tabs[0].get_by_role("textbox", name="message")
        box.fill("stream please")
        tabs_before, serve_before = renderers_cpu_ms(), cpu_ms(pid)
        box.press("Enter")
        tabs[0].evaluate("window.__all")
        tabs_cpu, serve_cpu = renderers_cpu_ms() - tabs_before, cpu_ms(pid) - serve_before
        for tab in tabs:
            tab.wait_for_function("() => !document.querySelector('.live')", timeout=60000)
        delays = sorted(tabs[0].evaluate("window.__arrivals"))
        rss = rss_mb(pid)
        context.close()
    p95 = delays[int(0.95 * (len(delays) - 1))]
    return {
        "render_2000_ms": round(render, 1),
        "delta_p50_ms": round(statistics.median(delays), 2),
        "delta_p95_ms": round(p95, 2),
        "rss_10_tabs_mb": round(rss, 1),
        "tabs_cpu_ms": round(tabs_cpu),
        "serve_cpu_ms": round(serve_cpu),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="The web UI's speed in headless Chromium.")
    parser.add_argument("--json", action="store_true", help="print one JSON line at the end")
    parser.add_argument("--long", action="store_true", help="a 600-delta reply in paragraphs")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.long:
        global DELTAS, PARAGRAPH
        os.environ["BENCH_DELTAS"], os.environ["BENCH_PARAGRAPH"] = "600", "20"
        DELTAS, PARAGRAPH = 600, 20
    if args.child:
        child(args.child)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        seed(home)
        with serve_child(__file__, home) as (url, login, pid):
            figures = measure(url, login, pid)
    print(f"2,000-message conversation rendered: {figures['render_2000_ms']:.0f} ms (< 1,500)")
    print(
        f"delta to the browser: p50 {figures['delta_p50_ms']:.1f} ms, "
        f"p95 {figures['delta_p95_ms']:.1f} ms (< 50) over {DELTAS} deltas"
    )
    print(f"serve RSS with {TABS} tabs: {figures['rss_10_tabs_mb']:.0f} MB (< 200)")
    print(
        f"CPU while the reply streamed: the {TABS} tabs {figures['tabs_cpu_ms']:.0f} ms, "
        f"the serve {figures['serve_cpu_ms']:.0f} ms"
    )
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
