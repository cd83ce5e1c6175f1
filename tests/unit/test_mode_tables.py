"""The container wing's variants are tables, chosen once: a workspace mode is a row of
``backend.MODES`` (its durable variant a row of ``modes/durable.DURABLE_MODES``), a lifetime
a class of ``session/lifetime.py``. A mode without a durable row works, and a durable session
on it is refused by name (docs/architecture.md, "Adding a workspace mode or a lifetime")."""

from __future__ import annotations

from typing import Any

import pytest

from toolseam.backends.containers.backend import MODES
from toolseam.backends.containers.modes.durable import DURABLE_MODES, durable_mode
from toolseam.backends.containers.options import ContainerOptions
from toolseam.policy.settings import Settings
from toolseam.seam.errors import ConfigurationError
from toolseam.session.durable import Durable
from toolseam.session.lifetime import Ephemeral, lifetime_for


def test_every_mode_has_its_durable_row() -> None:
    assert set(MODES) == set(DURABLE_MODES) == {"bind", "copy"}
    options = ContainerOptions()
    for name, make in MODES.items():
        mode = make(options)
        assert mode.name == name
        durable: Any = durable_mode(mode, options, "s" * 43, 60.0, None)
        assert durable.name == name and hasattr(durable, "detach")


def test_a_mode_without_a_durable_row_is_refused_by_name() -> None:
    class Third:
        name = "tmpfs"

    with pytest.raises(ConfigurationError, match="the tmpfs workspace mode cannot keep a session"):
        durable_mode(Third(), ContainerOptions(), "s" * 43, 60.0, None)  # type: ignore[arg-type]


def test_the_lifetime_is_chosen_once_from_the_settings() -> None:
    assert isinstance(lifetime_for(Settings()), Ephemeral)
    durable = lifetime_for(Settings(orphan_timeout_s=30))
    assert isinstance(durable, Durable) and durable.orphan_timeout_s == 30
    assert not durable.adopted and len(durable.secret) >= 43
    assert lifetime_for(Settings(orphan_timeout_s=30)).secret != durable.secret  # type: ignore[attr-defined]
