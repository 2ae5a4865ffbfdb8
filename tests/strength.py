"""How hard the property tests try: full strength in `make test`, a light pass in
`make test-fast` (HERON_TEST_FAST=1), so the fast loop stays fast without dropping any test."""

from __future__ import annotations

import os

FAST = os.environ.get("HERON_TEST_FAST") == "1"


def examples(full: int, fast: int = 15) -> int:
    """The number of hypothesis examples for a test: `full` normally, `fast` in the fast run."""
    return min(full, fast) if FAST else full
