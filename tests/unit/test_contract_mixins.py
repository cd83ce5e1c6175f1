"""The contract suite's classes are mixed into one binding (``ContainerBinding`` takes eight of
them), so a helper two of them both define is resolved by the binding's base order, not by the
class whose tests call it. ``HostileContract`` and ``JobContract`` both had a ``_toolkit``: every
hostile case ran with the job contract's detach policy and its 300 ms default, and
``test_kill_minus_one_spares_the_session`` came back "still running after 300 ms" whenever a
loaded machine took longer (the rootless flake of docs/testing.md)."""

from __future__ import annotations

import inspect

from toolseam.testing import contract


def _contracts() -> list[type]:
    return [cls for _, cls in inspect.getmembers(contract, inspect.isclass)
            if issubclass(cls, contract._Bound) and cls is not contract._Bound
            and cls.__module__ == contract.__name__]


def test_no_two_contracts_define_the_same_helper() -> None:
    owners: dict[str, list[str]] = {}
    for cls in _contracts():
        for name in vars(cls):
            if not (name.startswith("__") or name.startswith("test_")):
                owners.setdefault(name, []).append(cls.__name__)
    assert {name: who for name, who in owners.items() if len(who) > 1} == {}

