"""The vendored browser libraries are the pinned ones: every file under heron/web/static/vendor/
matches the sha256 that scripts/vendor_web.py wrote when it copied it from the checked tarball,
and the manifest names exactly the pins of the script (offline: nothing is downloaded)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATIC = ROOT / "heron" / "web" / "static"


def _script():
    spec = importlib.util.spec_from_file_location("vendor_web", ROOT / "scripts" / "vendor_web.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules["vendor_web"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_vendored_files_match_the_manifest_and_the_pins():
    vendor = _script()
    assert vendor.check() == []
    manifest = json.loads((STATIC / "vendor" / "MANIFEST.json").read_text())
    assert {"htm.js", "preact.js", "preact-hooks.js", "marked.js", "purify.js"} <= set(
        manifest["files"]
    )
    assert any(p.startswith("LICENSE") for p in manifest["files"])


def test_a_changed_vendored_file_is_caught(tmp_path, monkeypatch):
    vendor = _script()
    copy = tmp_path / "vendor"
    copy.mkdir()
    for path in json.loads((STATIC / "vendor" / "MANIFEST.json").read_text())["files"]:
        (copy / path).parent.mkdir(parents=True, exist_ok=True)
        (copy / path).write_bytes((STATIC / "vendor" / path).read_bytes())
    (copy / "MANIFEST.json").write_bytes((STATIC / "vendor" / "MANIFEST.json").read_bytes())
    monkeypatch.setattr(vendor, "VENDOR", copy)
    monkeypatch.setattr(vendor, "MANIFEST", copy / "MANIFEST.json")
    assert vendor.check() == []
    (copy / "marked.js").write_text("export const marked = 1;")
    assert vendor.check() == ["marked.js differs from its pinned hash"]


def test_the_rewritten_imports_resolve_to_vendored_files():
    """The browser resolves no bare specifier without an import map (refused inline by the
    CSP): every import in the UI's modules is a relative path to a file that exists."""
    for module in [STATIC / "app.js", *sorted((STATIC / "vendor").glob("*.js"))]:
        text = module.read_text()
        for spec in re.findall(r'from\s*"([^"]+)"', text):
            assert spec.startswith("./"), f"{module.name} imports {spec}"
            assert (module.parent / spec).exists(), f"{module.name}: {spec} is missing"


def test_the_page_has_no_inline_script():
    html = (STATIC / "index.html").read_text()

    for tag in re.findall(r"<script\b[^>]*>(.*?)</script>", html, re.S):
        assert tag.strip() == ""
    assert 'src="/app.js"' in html and "onclick" not in html.lower()
