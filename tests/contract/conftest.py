"""Contract bindings that need an optional capability of their backend (``capability``, a
protocol of ``toolseam.seam.capabilities``) run only where the backend claims it —
``supports(binding.capability_probe(), capability)`` — and are deselected where it does not:
the backend's own answer decides, never a skip written beside the binding."""

from __future__ import annotations

import pytest

from toolseam.seam.capabilities import supports


def _lacks_its_capability(item: pytest.Item) -> bool:
    binding = getattr(item, "cls", None)
    capability = getattr(binding, "capability", None)
    return capability is not None and not supports(binding.capability_probe(), capability)  # type: ignore[union-attr]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    dropped = [item for item in items if _lacks_its_capability(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]
