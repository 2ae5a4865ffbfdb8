"""Copy the browser UI's libraries from the npm registry into heron/web/static/vendor/.

Each package is pinned to one version and to the sha512 integrity of its tarball. The script
reads the registry's metadata for that version, refuses when its integrity differs from the pin,
downloads the tarball, hashes it again, and copies the listed ES module files and the licences.
It then writes MANIFEST.json (the sha256 of every copied file), which tests/test_web_vendor.py
checks offline against the committed files.

    .venv/bin/python scripts/vendor_web.py          # fetch and copy (needs the npm registry)
    .venv/bin/python scripts/vendor_web.py --check  # only compare the files with the manifest

The files are committed: installing Heron needs neither npm nor a build step.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import sys
import tarfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REGISTRY = "https://registry.npmjs.org"
ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "heron" / "web" / "static" / "vendor"
MANIFEST = VENDOR / "MANIFEST.json"


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    integrity: str  # sha512 of the tarball, as the registry's `dist.integrity` gives it
    files: dict[str, str]  # path in the tarball (under package/) -> path under vendor/
    # Bare specifiers the browser cannot resolve without an import map (which the CSP's
    # script-src 'self' would refuse inline): rewritten to the vendored file.
    rewrites: dict[str, str] = field(default_factory=dict)
    globs: dict[str, str] = field(default_factory=dict)  # tarball folder -> vendor folder (*.js)


PINS = (
    Pin(
        "htm",
        "3.1.1",
        "sha512-983Vyg8NwUE7JkZ6NmOqpCZ+sh1bKv2iYTlUkzlWmA5JD2acKoxd4KVxbMmxX/85mtfdnDmTFoNKcg5DGAvxNQ==",
        {"dist/htm.module.js": "htm.js", "LICENSE": "LICENSE.htm"},
    ),
    Pin(
        "preact",
        "10.29.0",
        "sha512-wSAGyk2bYR1c7t3SZ3jHcM6xy0lcBcDel6lODcs9ME6Th++Dx2KU+6D3HD8wMMKGA8Wpw7OMd3/4RGzYRpzwRg==",
        {
            "dist/preact.module.js": "preact.js",
            "hooks/dist/hooks.module.js": "preact-hooks.js",
            "LICENSE": "LICENSE.preact",
        },
        rewrites={'from"preact"': 'from"./preact.js"'},
    ),
    Pin(
        "marked",
        "18.2.1",
        "sha512-ii4bxCTCqqwpT86XZWgJNs+ZnAIZksmLGYMViWA7PDIXYIeNo1x6cDdX3JOip9NM/cI6p8z57FxliACboTruMA==",
        {"lib/marked.esm.js": "marked.js", "LICENSE": "LICENSE.marked"},
    ),
    Pin(
        "dompurify",
        "3.5.0",
        "sha512-LYC0ZkE8P1V42JsRYTwMdme/2ET8SpOc5AA2eOFjP/IadvRd2fwiT4TVz5vkfy0XUx12aS2UaRkTnfVPNOv9vw==",
        {
            "dist/purify.es.mjs": "purify.js",
            "LICENSE": "LICENSE.dompurify",
        },
    ),
    Pin(
        "@speed-highlight/core",
        "2.1.0",
        "sha512-KLoDVy82Hm3N09SLf1L5HoqPo+oIPsPn6C5K3Iz3VTSFygs6vV1Rn3kLyV+D5uyMW3wXtGGFzfJ+kKcFtSSBUQ==",
        {
            "dist/index.js": "highlight/index.js",
            "dist/themes/default.css": "highlight/default.css",
            "LICENSE": "highlight/LICENSE",
        },
        globs={"dist/languages/": "highlight/languages/"},
    ),
)


def sri(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read()


def fetch(pin: Pin) -> bytes:
    """The pinned tarball, checked against the registry's metadata and the pin itself."""
    meta = json.loads(_get(f"{REGISTRY}/{pin.name}/{pin.version}"))
    said = meta["dist"]["integrity"]
    if said != pin.integrity:
        raise SystemExit(
            f"{pin.name}@{pin.version}: the registry gives integrity {said}, the pin says "
            f"{pin.integrity}. Check the release before changing the pin."
        )
    data = _get(meta["dist"]["tarball"])
    if sri(data) != pin.integrity:
        raise SystemExit(f"{pin.name}@{pin.version}: the tarball does not match its integrity.")
    return data


def extract(pin: Pin, data: bytes) -> dict[str, bytes]:
    """vendor path -> bytes for the pin's files (rewrites applied to .js files)."""
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = {m.name.removeprefix("package/"): m for m in tar.getmembers() if m.isfile()}
        wanted = dict(pin.files)
        for folder, dest in pin.globs.items():
            for name in members:
                rest = name.removeprefix(folder)
                if name.startswith(folder) and "/" not in rest and rest.endswith(".js"):
                    wanted[name] = dest + rest
        for src, dest in wanted.items():
            if src not in members:
                raise SystemExit(f"{pin.name}@{pin.version} has no {src}")
            body = tar.extractfile(members[src]).read()  # type: ignore[union-attr]
            for old, new in pin.rewrites.items():
                body = body.replace(old.encode(), new.encode())
            out[dest] = body
    return out


def manifest_of(files: dict[str, bytes]) -> dict[str, str]:
    return {path: hashlib.sha256(body).hexdigest() for path, body in sorted(files.items())}


def check() -> list[str]:
    """What differs between the vendored files and MANIFEST.json (empty: all match)."""
    if not MANIFEST.exists():
        return [f"{MANIFEST} is missing: run scripts/vendor_web.py"]
    manifest = json.loads(MANIFEST.read_text())
    problems = []
    pinned = {f"{p.name}@{p.version}": p.integrity for p in PINS}
    if manifest.get("packages") != pinned:
        problems.append("MANIFEST.json names other packages than the pins in the script")
    for path, digest in manifest["files"].items():
        file = VENDOR / path
        if not file.exists():
            problems.append(f"{path} is missing")
        elif hashlib.sha256(file.read_bytes()).hexdigest() != digest:
            problems.append(f"{path} differs from its pinned hash")
    return problems


def vendor() -> None:
    files: dict[str, bytes] = {}
    for pin in PINS:
        print(f"{pin.name}@{pin.version}")
        files.update(extract(pin, fetch(pin)))
    for path, body in files.items():
        target = VENDOR / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(body)
    manifest = {
        "packages": {f"{p.name}@{p.version}": p.integrity for p in PINS},
        "files": manifest_of(files),
    }
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{len(files)} files in {VENDOR}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare with MANIFEST.json")
    args = parser.parse_args()
    if args.check:
        problems = check()
        for line in problems:
            print(line)
        return 1 if problems else 0
    vendor()
    return 0


if __name__ == "__main__":
    sys.exit(main())
