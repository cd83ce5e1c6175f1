"""Where things are: the checkout the tests run from."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The checkout's root (``tests/support/paths.py`` is two levels below it)."""
TESTS = REPO / "tests"
SUPPORT = TESTS / "support"
"""Scripts the tests run as programs (``hold_job.py``, ``durable_client.py`` …) live here."""
