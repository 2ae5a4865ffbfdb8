"""What scrubbing tool results costs (heron/redact.py): every result is scrubbed before it is
stored or sent, so this is added to every tool call.

For tool outputs of 2 KB, 20 KB (the default result budget) and 1 MB it times `Redactor.clean`
with the patterns on (the default) and off (`[tools] redact = false`: only the configured keys),
and prints the median of several runs in milliseconds. Two shapes of output: "plain" (source
code, log lines, paths and git ids, no secret: the common case, where most patterns are skipped
because their marker is absent) and "secrets" (every eighth line holds a secret of some kind:
`env`, a .env file, headers; the worst case, where every pattern runs).

    python bench/redact.py [--runs 9] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from heron.redact import Redactor

KEY = "sk-test-9f8e7d6c5b4a39281706f5e4d3c2b1a0"
PLAIN = [
    "def scrub_patterns(text: str) -> str:",
    '    """Every pattern-shaped secret in `text` replaced by its mark."""',
    "commit 4f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a39 Fix the parser",
    "2026-12-01 20:41:07 INFO heron.agent.engine turn run_4f2a9c1e8b7d6a5f done in 312 ms",
    "/home/user/projects/heron/tests/test_redact_run.py:42: AssertionError",
    "    for kind, pattern in PATTERNS:  # each a (kind, compiled pattern) pair",
    "The quick brown fox jumps over the lazy dog, again and again, for the benchmark.",
    "-rw-r--r-- 1 user user  4096 Dec  1 20:41 heron/redact.py",
]
SECRETS = [
    "PATH=/usr/local/bin:/usr/bin:/bin",
    f"HERON_API_KEY={KEY}",
    "commit 4f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a39 Fix the parser",
    "2026-12-01 20:41:07 INFO heron.agent.engine turn run_4f2a9c1e8b7d6a5f done in 312 ms",
    "/home/user/projects/heron/tests/test_redact_run.py:42: AssertionError",
    "DB_PASSWORD=hunter22",
    "Authorization: Bearer abcdefghijklmnop1234567890",
    "The quick brown fox jumps over the lazy dog, again and again, for the benchmark.",
]


def _output(lines: list[str], size: int) -> str:
    text, total = [], 0
    while total < size:
        text.append(lines[len(text) % len(lines)])
        total += len(text[-1]) + 1
    return "\n".join(text)[:size]


def _median_ms(redactor: Redactor, text: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        redactor.clean(text)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--json", action="store_true", help="one JSON line of the figures")
    args = parser.parse_args()
    figures: dict[str, float] = {}
    for shape, lines in (("plain", PLAIN), ("secrets", SECRETS)):
        for label, size in (("2kb", 2_000), ("20kb", 20_000), ("1mb", 1_000_000)):
            text = _output(lines, size)
            for mode, patterns in (("patterns", True), ("keys_only", False)):
                redactor = Redactor.of([KEY], patterns=patterns)
                assert KEY not in redactor.clean(text)
                ms = _median_ms(redactor, text, args.runs)
                figures[f"{shape}_{mode}_{label}_ms"] = round(ms, 3)
    if args.json:
        print(json.dumps(figures))
        return
    for name, value in figures.items():
        print(f"{name:34} {value:10.3f}")


if __name__ == "__main__":
    main()
