"""The xdist controller warms pytest's cache of rewritten test modules (tests/rewrite_cache.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import rewrite_cache

MODULE = "def test_sum():\n    total = 1 + 1\n    assert total == 2, 'arithmetic'\n"


def _modules(folder: Path, count: int) -> list[Path]:
    folder.mkdir()
    files = [folder / f"test_mod{index}.py" for index in range(count)]
    for path in files:
        path.write_text(MODULE)
    return files


# A pytest release that moves its private names only makes the suite slower (every worker
# rewrites again, as before), so it must not turn a newcomer's first `make test` red: these
# tests skip, saying what moved, and conftest.py warns once.
pytestmark = pytest.mark.skipif(
    rewrite_cache.UNAVAILABLE is not None,
    reason=f"this pytest moved what tests/rewrite_cache.py uses ({rewrite_cache.UNAVAILABLE})",
)


def test_warm_writes_the_cache_pytest_reads(tmp_path, pytestconfig, monkeypatch):
    """What warm writes is what pytest's own import reads: a worker rewrites nothing."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    files = _modules(tmp_path / "suite", 3)
    assert all(rewrite_cache.is_stale(path) for path in files)

    assert rewrite_cache.warm(pytestconfig, files, processes=2) == files

    assert not any(rewrite_cache.is_stale(path) for path in files)
    # Fresh again only when the source changes; a second warm rewrites nothing.
    assert rewrite_cache.warm(pytestconfig, files, processes=2) == []
    files[0].write_text(MODULE + "\n\ndef test_more():\n    assert True\n")
    assert rewrite_cache.warm(pytestconfig, files, processes=2) == [files[0]]


def test_rewritten_module_keeps_pytests_assert_message(tmp_path, pytestconfig, monkeypatch):
    """The cached code is pytest's rewrite: its assert explains itself, as a worker's would."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    (path,) = _modules(tmp_path / "suite", 1)
    path.write_text("def test_sum():\n    total = 1 + 1\n    assert total == 3\n")
    rewrite_cache.warm(pytestconfig, [path], processes=1)

    code = rewrite_cache._read_pyc(path, rewrite_cache.cached_pyc(path))
    assert code is not None
    namespace: dict[str, object] = {}
    exec(code, namespace)
    with pytest.raises(AssertionError, match=r"assert 2 == 3"):
        namespace["test_sum"]()  # type: ignore[operator]


def test_no_cache_when_python_writes_no_bytecode(tmp_path, pytestconfig, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    files = _modules(tmp_path / "suite", 1)
    assert rewrite_cache.warm(pytestconfig, files, processes=1) == []
    assert not (tmp_path / "suite" / "__pycache__").exists()


def test_modules_of_run_are_the_runs_test_modules(tmp_path, pytestconfig, monkeypatch):
    files = _modules(tmp_path / "suite", 2)
    (tmp_path / "suite" / "helpers.py").write_text("")
    monkeypatch.setattr(pytestconfig, "args", [str(tmp_path / "suite"), f"{files[0]}::test_sum"])
    assert rewrite_cache.modules_of_run(pytestconfig) == files
