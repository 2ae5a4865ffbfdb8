"""How hard the property tests try: full strength in `make test`, a light pass in
`make test-fast` (HERON_TEST_FAST=1), so the fast loop stays fast without dropping any test."""

from __future__ import annotations

import os

import pytest

FAST = os.environ.get("HERON_TEST_FAST") == "1"


def examples(full: int, fast: int = 15) -> int:
    """The number of hypothesis examples for a test: `full` normally, `fast` in the fast run."""
    return min(full, fast) if FAST else full


def examples_on(request: pytest.FixtureRequest, full: int, pg: int, fast: int = 15) -> int:
    """`examples` for a property test run once per backend (`new_db`, `db`): `pg` examples on
    PostgreSQL. There the property checks the backend's SQL against the same logic SQLite
    checks at full strength; each example costs a fresh schema and a round trip per statement
    on a server that shares the two cores, so a few histories do what many do on SQLite."""
    params = getattr(request.node, "callspec", None)
    on_pg = params is not None and "postgresql" in params.params.values()
    return examples(pg if on_pg else full, fast)
