"""Warm pytest's cache of rewritten test modules once, before the xdist workers start.

pytest rewrites each test module's asserts (an AST pass in Python: about 7.5 s of CPU for the
suite's ~220 files) and caches the result in `__pycache__/*-pytest-*.pyc`. On a fresh clone
every xdist worker starts with no cache and rewrites every file itself, at the same time as
the others: six workers paid 6 x 7.5 s. The controller rewrites the stale files here, split
over the machine's cores, and the workers then read the cache (docs/testing.md, "Collection").

This uses pytest's own rewriting and cache format (private names of `_pytest`, which a pytest
release may change): when they are missing, nothing is warmed and the workers rewrite as
before, warned of once, and tests/test_rewrite_cache.py skips saying what moved.
"""

from __future__ import annotations

import fnmatch
import multiprocessing
import os
import sys
import warnings
from pathlib import Path

import pytest

try:
    from _pytest.assertion import assertstate_key
    from _pytest.assertion.rewrite import (
        PYC_TAIL,
        _read_pyc,
        _rewrite_test,
        _write_pyc,
        get_cache_dir,
    )

    UNAVAILABLE: str | None = None
except ImportError as error:  # another pytest: the workers rewrite for themselves, as before
    UNAVAILABLE = str(error)

# Set in the controller just before it forks: the children rewrite with its config.
_config: pytest.Config | None = None


def cached_pyc(path: Path) -> Path:
    """Where pytest keeps the rewritten code of the test module at `path`."""
    return get_cache_dir(path) / (path.name[:-3] + PYC_TAIL)


def is_stale(path: Path) -> bool:
    """Whether pytest would rewrite `path` again (no cache, or one of another source)."""
    return _read_pyc(path, cached_pyc(path)) is None


def modules_of_run(config: pytest.Config) -> list[Path]:
    """The test modules the run collects: its paths' files matching `python_files`."""
    patterns = config.getini("python_files")
    base = config.invocation_params.dir
    files: set[Path] = set()
    for arg in config.args:
        path = base / arg.split("::")[0]
        candidates = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in candidates:
            name = file.name
            if file.is_file() and any(fnmatch.fnmatch(name, p) for p in patterns):
                files.add(file.resolve())
    return sorted(files)


def _rewrite_one(path: Path) -> None:
    assert _config is not None
    try:
        source_hash, code = _rewrite_test(path, _config)
    except Exception:  # a module that does not parse: its collection says so, with its line
        return
    _write_pyc(_config.stash[assertstate_key], code, source_hash, cached_pyc(path))


def warm(config: pytest.Config, files: list[Path], processes: int) -> list[Path]:
    """Rewrite the stale ones of `files` into pytest's cache on `processes` forked processes.

    Returns the files rewritten. Does nothing when Python writes no bytecode
    (PYTHONDONTWRITEBYTECODE): pytest then writes no cache either.
    """
    global _config
    if UNAVAILABLE or sys.dont_write_bytecode:
        return []
    stale = [path for path in files if is_stale(path)]
    if not stale:
        return []
    for folder in {get_cache_dir(path) for path in stale}:
        folder.mkdir(parents=True, exist_ok=True)
    _config = config
    try:
        if processes <= 1 or len(stale) == 1:
            for path in stale:
                _rewrite_one(path)
        else:
            with multiprocessing.get_context("fork").Pool(min(processes, len(stale))) as pool:
                pool.map(_rewrite_one, stale, chunksize=1)
    finally:
        _config = None
    return stale


def warm_for_workers(config: pytest.Config) -> None:
    """In an xdist controller about to start workers, warm the cache of the run's tests. A
    pytest whose private names moved or changed only makes the run slower: it is warned of,
    never an error of the run."""
    distributed = config.getoption("dist", "no") != "no"
    is_worker = hasattr(config, "workerinput")
    if not distributed or is_worker or config.getoption("collectonly"):
        return
    if UNAVAILABLE is not None:
        warnings.warn(f"tests/rewrite_cache.py: {UNAVAILABLE}; each worker rewrites", stacklevel=1)
        return
    try:
        warm(config, modules_of_run(config), processes=os.cpu_count() or 1)
    except Exception as error:  # a changed signature: the workers rewrite as before
        warnings.warn(f"tests/rewrite_cache.py could not warm the cache: {error!r}", stacklevel=1)
