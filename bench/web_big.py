"""The web UI on a big home, in headless Chromium against a real `heron serve` in a child process.

The home: a conversation `big` of TURNS turns (a question and a Markdown reply each, a tool call
and its result every 7th turn: 22,856 messages at 10,000 turns, the size QA17f's report #7
found taking 4 s and 0.6-1 GB of heap to open) and SMALL conversations of 30 turns.

- open_ms: from navigation start (the page loaded at `#c=big`) until the newest reply is in
  the page and the frame after it is drawn (timed in the page).
- dom_nodes, heap_held_mb, heap_mb: the page's elements and its JS heap (CDP's
  JSHeapUsedSize) once it is open: as the tab holds it, and after a garbage collection.
- switch_away_ms: from the click on another conversation in the list until that one's newest
  reply is drawn (the big one's DOM torn down meanwhile).
- reopen_ms: the big one opened again (by its address: the list's first page may not hold
  it), until its newest reply is drawn.
- earlier_ms: with a paged transcript, from scrolling to the top until the page before is in
  the page and drawn (null when the UI draws the whole branch at once).
- serve_rss_mb: the serve's resident memory before the page, after the big one opened, and at
  the end.

    .venv/bin/python bench/web_big.py [--json] [--turns N]

The serve's code is whatever `heron` imports (PYTHONPATH), so one script measures two trees:
run it alternately on each and quote the load average with every figure (docs/performance.md).
Needs Debian's chromium (make chromium) and the dev extra (playwright).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # web.py: the serve child, /proc reads
from web import child, rss_mb, serve_child

SMALL = 60
WORDS = [
    "heron",
    "river",
    "fish",
    "patience",
    "garden",
    "passport",
    "invoice",
    "budget",
    "python",
    "kernel",
    "lisbon",
    "coffee",
    "meeting",
    "schedule",
    "report",
    "draft",
    "review",
    "deploy",
    "server",
    "memory",
    "recall",
    "travel",
]


def _sentence(n: int, salt: int) -> str:
    return " ".join(WORDS[(salt * 7 + i * 3) % len(WORDS)] for i in range(n)).capitalize() + "."


def seed(home: Path, turns: int) -> None:
    """The big conversation, then SMALL short ones (newer: the list shows them first)."""
    from heron.config import Settings
    from heron.messages import Message, Text, ToolCall, ToolResult, Usage
    from heron.store import Store

    os.environ["HERON_HOME"] = str(home)
    store = Store(Settings.load().paths.ensure().db)
    plan = [("big", turns)] + [(f"small-{n:02d}", 30) for n in range(SMALL)]
    for key, count in plan:
        conv = store.open_conversation(key)
        with store.transaction():
            for t in range(count):
                asked = Message("user", [Text(f"[{key} #{t}] " + _sentence(12 + t % 20, t))])
                turn, _ = store.begin_turn(conv.id, f"run-{key}-{t}", asked)
                if t % 7 == 3:
                    call = ToolCall(f"call-{key}-{t}", "bash", {"command": f"echo {t}"})
                    store.append(conv.id, Message("assistant", [call]), turn_id=turn)
                    result = ToolResult(call.id, f"{t}\n[exit code 0]")
                    store.append(conv.id, Message("user", [result]), turn_id=turn)
                reply = f"{key} answer {t}: **{_sentence(8, t)}**\n\n- {_sentence(6, t + 1)}\n"
                store.append(conv.id, Message("assistant", [Text(reply)]), turn_id=turn)
                store.finish_turn(
                    turn,
                    status="done",
                    stop_reason="end_turn",
                    usage=Usage(100, 10, 0, 0),
                    model_calls=1,
                    tool_calls=int(t % 7 == 3),
                )
    store.close()


# Resolves at the frame after the newest reply of `key` (its text) is in the page.
_DRAWN = """(said) => new Promise((done) => {
  const check = () => {
    const all = document.querySelectorAll('.msg.assistant');
    const last = all[all.length - 1];
    if (last && last.textContent.includes(said)) setTimeout(() => done(performance.now()));
    else requestAnimationFrame(check);
  };
  check();
})"""

# Opens `key` (its link in the list, else its address, as a bookmark does) and resolves once
# its newest reply (`said`) is drawn.
_SWITCH = """([key, said]) => new Promise((done) => {
  const t0 = performance.now();
  const link = document.querySelector(`a[href="#c=${key}"]`);
  if (link) link.click(); else location.hash = `c=${key}`;
  const check = () => {
    const all = document.querySelectorAll('.msg.assistant');
    const last = all[all.length - 1];
    if (last && last.textContent.includes(said)) setTimeout(() => done(performance.now() - t0));
    else requestAnimationFrame(check);
  };
  check();
})"""

# Scrolls the transcript to its top and resolves once more messages are drawn (null: the UI
# has no earlier page to read).
_EARLIER = """() => new Promise((done) => {
  if (!document.querySelector('.messages .earlier')) return done(null);
  const before = document.querySelectorAll('.msg').length;
  const t0 = performance.now();
  document.querySelector('.messages').scrollTop = 0;
  const check = () => document.querySelectorAll('.msg').length > before
    ? setTimeout(() => done(performance.now() - t0)) : requestAnimationFrame(check);
  check();
})"""


def _heap_mb(page: Any) -> tuple[float, float]:
    """The page's JS heap in use as it is (garbage of the drawing included: what the tab
    holds until the collector runs), and after a garbage collection."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("Performance.enable")

    def used() -> float:
        metrics = cdp.send("Performance.getMetrics")["metrics"]
        return round(next(m["value"] for m in metrics if m["name"] == "JSHeapUsedSize") / 2**20, 1)

    held = used()
    cdp.send("HeapProfiler.collectGarbage")
    return held, used()


def measure(url: str, login: str, pid: int, turns: int) -> dict[str, Any]:
    from web_harness import chromium, log_in, logged_in

    token = log_in(login)
    newest = f"big answer {turns - 1}:"
    rss_before = rss_mb(pid)
    with chromium() as browser:
        context = logged_in(browser, url, token)
        page = context.new_page()
        page.set_default_timeout(120_000)
        page.goto(url + "/#c=big")
        opened = page.evaluate(_DRAWN, newest)
        page.wait_for_timeout(500)  # the frames that settle it at its end
        nodes = page.evaluate("document.querySelectorAll('*').length")
        heap_held, heap = _heap_mb(page)
        rss_open = rss_mb(pid)
        earlier = page.evaluate(_EARLIER)
        last = f"small-{SMALL - 1:02d}"
        away = page.evaluate(_SWITCH, [last, f"{last} answer 29:"])
        back = page.evaluate(_SWITCH, ["big", newest])
        rss_end = rss_mb(pid)
        context.close()
    return {
        "turns": turns,
        "open_ms": round(opened),
        "dom_nodes": nodes,
        "heap_held_mb": heap_held,
        "heap_mb": heap,
        "earlier_ms": None if earlier is None else round(earlier),
        "switch_away_ms": round(away),
        "reopen_ms": round(back),
        "serve_rss_mb": [round(rss_before), round(rss_open), round(rss_end)],
        "load": float(Path("/proc/loadavg").read_text().split()[0]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="The web UI on a big conversation.")
    parser.add_argument("--json", action="store_true", help="print one JSON line at the end")
    parser.add_argument("--turns", type=int, default=10_000, help="turns of the big one")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        started = time.perf_counter()
        seed(home, args.turns)
        seeded = time.perf_counter() - started
        with serve_child(__file__, home) as (url, login, pid):
            figures = measure(url, login, pid, args.turns)
    before, opened, end = figures["serve_rss_mb"]
    print(f"home seeded in {seeded:.1f} s; load average {figures['load']}")
    print(f"big conversation ({args.turns:,} turns) open, newest drawn: {figures['open_ms']} ms")
    print(
        f"then: {figures['dom_nodes']:,} DOM nodes, JS heap {figures['heap_held_mb']} MB,"
        f" {figures['heap_mb']} MB after a garbage collection"
    )
    if figures["earlier_ms"] is not None:
        print(f"the page before, scrolled to the top: {figures['earlier_ms']} ms")
    print(f"switch away to a 30-turn one: {figures['switch_away_ms']} ms")
    print(f"open the big one again: {figures['reopen_ms']} ms")
    print(f"serve RSS: {before} MB before, {opened} MB open, {end} MB at the end")
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
